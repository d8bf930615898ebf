//! burn-ndarray's tensors as the scan's slices and back, through burn-ndarray's public types
//! (`NdArrayTensor`, its storage's `view`): an input already in row-major order is read in
//! place, whatever else holds it (autodiff keeps the model's activations); a view in another
//! layout is copied once into row-major order by ndarray at its static rank. Outputs move into
//! tensors without a copy.
//!
//! Why not `TensorData`: `into_data` copies a tensor that is shared, or not in row-major order,
//! element by element through a dynamic-rank iterator (about 30 ns an element), which cost the
//! scan more than its products.

use burn::backend::ndarray::NdArrayTensor;
use burn::tensor::Element;
use ndarray::{ArcArray, ArrayView, CowArray, Dimension, IxDyn};

use super::matmul::Real;

/// The scan's element types as burn-ndarray stores them.
pub(super) trait HostFloat: Real + Element {
    /// The values of a tensor of this type in their layout (`None` for another type).
    fn view(t: &NdArrayTensor) -> Option<ArrayView<'_, Self, IxDyn>>;

    /// Values in row-major order of shape `shape`, as a tensor (no copy).
    fn tensor(values: Vec<Self>, shape: &[usize]) -> NdArrayTensor;
}

impl HostFloat for f32 {
    fn view(t: &NdArrayTensor) -> Option<ArrayView<'_, Self, IxDyn>> {
        match t {
            NdArrayTensor::F32(s) => Some(s.view()),
            _ => None,
        }
    }

    fn tensor(values: Vec<Self>, shape: &[usize]) -> NdArrayTensor {
        NdArrayTensor::from(shared(values, shape))
    }
}

impl HostFloat for f64 {
    fn view(t: &NdArrayTensor) -> Option<ArrayView<'_, Self, IxDyn>> {
        match t {
            NdArrayTensor::F64(s) => Some(s.view()),
            _ => None,
        }
    }

    fn tensor(values: Vec<Self>, shape: &[usize]) -> NdArrayTensor {
        NdArrayTensor::from(shared(values, shape))
    }
}

fn shared<E>(values: Vec<E>, shape: &[usize]) -> ArcArray<E, IxDyn> {
    ArcArray::from_shape_vec(IxDyn(shape), values)
        .expect("the scan's output has its shape's number of values")
}

/// A tensor's values in row-major order at rank `D::NDIM`: borrowed where they already are in
/// that order, else copied once. The caller has cast the tensor to `E` and checked its shape.
pub(super) fn values<E: HostFloat, D: Dimension + 'static>(
    t: &NdArrayTensor,
) -> CowArray<'_, E, D> {
    let view = E::view(t)
        .expect("an input cast to the scan's type")
        .into_dimensionality::<D>()
        .expect("an input of the checked rank");
    if view.is_standard_layout() {
        CowArray::from(view)
    } else {
        CowArray::from(view.as_standard_layout().into_owned())
    }
}

/// The row-major slice of values from [`values`].
pub(super) fn slice<'a, E, D: Dimension>(values: &'a CowArray<'_, E, D>) -> &'a [E] {
    values
        .as_slice()
        .expect("values in row-major order (as_standard_layout)")
}
