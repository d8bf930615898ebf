//! A tensor's float primitive and back: the backend operations take primitives.

use burn::tensor::{backend::Backend, ops::FloatTensor, Tensor, TensorPrimitive};

/// A primitive as a tensor of rank `D`.
pub(crate) fn float<B: Backend, const D: usize>(t: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

/// A tensor's float primitive.
pub(crate) fn primitive<B: Backend, const D: usize>(t: Tensor<B, D>) -> FloatTensor<B> {
    t.into_primitive().tensor()
}
