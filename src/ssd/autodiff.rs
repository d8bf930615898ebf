//! [`SsdBackend`] for `Autodiff<B>`: where `B` has fused SSD kernels, one autodiff node for the
//! whole scan whose backward is `B`'s fused gradient, keeping only the inputs (the kernels
//! recompute the decays, the chunk states and `y`); elsewhere autodiff differentiates the
//! tensor-op form.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::{Autodiff, NodeId};
use burn::tensor::ops::FloatTensor;
use burn::tensor::ops::ModuleOps;
use burn::tensor::{DType, Shape, Tensor, TensorMetadata};

use super::backend::{tensor_ops, SsdBackend, SsdPrimitives};
use super::fused::{FusedKernels, ScanProducts};
use super::primitive::{float, primitive};
use super::projection::ProjectionBackend;
use crate::precision::{cast_to, compute_dtype};

/// The backward of the fused scan over `N` differentiable inputs: x, dt, a, B, C and, when
/// given, the initial state.
#[derive(Debug)]
struct SsdBackward;

/// What the backward keeps: the checkpointed inputs, the document starts (data, not
/// differentiated), the chunk length, the path and the shapes of the two outputs.
#[derive(Debug, Clone)]
struct SsdState<B: SsdBackend> {
    nodes: Vec<NodeId>,
    starts: Option<FloatTensor<B>>,
    chunk_size: usize,
    kernels: FusedKernels,
    products: ScanProducts,
    y_shape: Shape,
    state_shape: Shape,
}

impl<B: SsdBackend, const N: usize> Backward<B, N> for SsdBackward {
    type State = SsdState<B>;

    fn backward(
        self,
        ops: Ops<Self::State, N>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let state = ops.state;
        let mut inputs: Vec<FloatTensor<B>> = state
            .nodes
            .iter()
            .map(|id| checkpointer.retrieve_node_output(*id))
            .collect();
        let initial_state = (N == 6).then(|| inputs.pop().expect("six inputs"));
        let [x, dt, a, b, c]: [FloatTensor<B>; 5] = inputs.try_into().expect("five");
        // the output is y and the final state, flattened and concatenated
        let grad = float::<B, 1>(grads.consume::<B>(&ops.node));
        let (ny, ns) = (
            state.y_shape.num_elements(),
            state.state_shape.num_elements(),
        );
        let y_dims: [usize; 4] = state.y_shape.dims();
        let state_dims: [usize; 4] = state.state_shape.dims();
        let grad_y = grad.clone().narrow(0, 0, ny).reshape(y_dims);
        let grad_state = grad.narrow(0, ny, ns).reshape(state_dims);
        let g = B::ssd_chunked_backward(
            SsdPrimitives {
                x,
                dt,
                a,
                b,
                c,
                initial_state,
                starts: state.starts,
                chunk_size: state.chunk_size,
                kernels: state.kernels,
                products: state.products,
            },
            primitive(grad_y),
            primitive(grad_state),
        );
        let mut each = vec![g.x, g.dt, g.a, g.b, g.c];
        each.extend(g.initial_state);
        for (parent, grad) in ops.parents.iter().zip(each) {
            if let Some(node) = parent {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

/// The backward of a fused projection over `N` differentiable inputs: x, the weight and, when
/// given, the bias.
#[derive(Debug)]
struct ProjectionBackward;

/// What a projection's backward keeps: its two matrix operands (the products need both) and
/// the bias's type.
#[derive(Debug, Clone)]
struct ProjectionState<B: ProjectionBackend> {
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<DType>,
}

impl<B: ProjectionBackend, const N: usize> Backward<B, N> for ProjectionBackward {
    type State = ProjectionState<B>;

    fn backward(
        self,
        ops: Ops<Self::State, N>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let grad = grads.consume::<B>(&ops.node);
        let state = ops.state;
        let g = B::projection_backward(state.x, state.weight, state.bias, grad);
        let mut each = vec![g.x, g.weight];
        each.extend(g.bias);
        for (parent, grad) in ops.parents.iter().zip(each) {
            if let Some(node) = parent {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

/// The fused projection of `inputs` (x, weight and maybe the bias) as one autodiff node.
fn projection_node<B: ProjectionBackend, C: CheckpointStrategy, const N: usize>(
    inputs: [FloatTensor<Autodiff<B, C>>; N],
) -> FloatTensor<Autodiff<B, C>> {
    let nodes = inputs.each_ref().map(|t| t.node.clone());
    let (x, weight) = (inputs[0].primitive.clone(), inputs[1].primitive.clone());
    let bias = inputs.get(2).map(|b| b.primitive.clone());
    let bias_type = bias.as_ref().map(|b| b.dtype());
    let y = B::projection(x.clone(), weight.clone(), bias);
    match ProjectionBackward
        .prepare::<C>(nodes)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(
            ProjectionState {
                x,
                weight,
                bias: bias_type,
            },
            y,
        ),
        OpsKind::UnTracked(prep) => prep.finish(y),
    }
}

impl<B: ProjectionBackend, C: CheckpointStrategy> ProjectionBackend for Autodiff<B, C> {
    fn projection(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        if !B::has_fused_projection(x.dtype()) {
            return <Self as ModuleOps<Self>>::linear(x, weight, bias);
        }
        match bias {
            Some(bias) => projection_node::<B, C, 3>([x, weight, bias]),
            None => projection_node::<B, C, 2>([x, weight]),
        }
    }
}

impl<B: SsdBackend, C: CheckpointStrategy> SsdBackend for Autodiff<B, C> {
    fn ssd_chunked(inputs: SsdPrimitives<Self>) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let dtype = inputs.x.dtype();
        if !B::has_fused_ssd(dtype, inputs.chunk_size, inputs.kernels) {
            return tensor_ops(inputs);
        }
        let SsdPrimitives {
            x,
            dt,
            a,
            b,
            c,
            initial_state,
            starts,
            chunk_size,
            kernels,
            products,
        } = inputs;
        let starts = starts.map(|s| s.primitive);
        let mut tracked = vec![x, dt, a, b, c];
        tracked.extend(initial_state);
        let inner =
            |tensors: &[FloatTensor<Self>], starts: Option<FloatTensor<B>>| SsdPrimitives::<B> {
                x: tensors[0].primitive.clone(),
                dt: tensors[1].primitive.clone(),
                a: tensors[2].primitive.clone(),
                b: tensors[3].primitive.clone(),
                c: tensors[4].primitive.clone(),
                initial_state: tensors.get(5).map(|t| t.primitive.clone()),
                starts,
                chunk_size,
                kernels,
                products,
            };
        let forward = |inputs: SsdPrimitives<B>| {
            let (y, state) = B::ssd_chunked(inputs);
            let (y_shape, state_shape) = (y.shape(), state.shape());
            let y = cast_to(float::<B, 4>(y), compute_dtype(dtype));
            let flat = Tensor::cat(
                vec![
                    y.reshape([y_shape.num_elements()]),
                    float::<B, 4>(state).reshape([state_shape.num_elements()]),
                ],
                0,
            );
            (primitive(flat), y_shape, state_shape)
        };
        let output = if tracked.len() == 6 {
            register::<B, C, 6>(
                &tracked,
                starts,
                chunk_size,
                (kernels, products),
                inner,
                forward,
            )
        } else {
            register::<B, C, 5>(
                &tracked,
                starts,
                chunk_size,
                (kernels, products),
                inner,
                forward,
            )
        };
        let (flat, y_shape, state_shape) = output;
        let flat = float::<Self, 1>(flat);
        let (ny, ns) = (y_shape.num_elements(), state_shape.num_elements());
        let y = flat
            .clone()
            .narrow(0, 0, ny)
            .reshape::<4, _>(y_shape.dims::<4>());
        let y = cast_to(y, dtype);
        let state = flat
            .narrow(0, ny, ns)
            .reshape::<4, _>(state_shape.dims::<4>());
        (primitive(y), primitive(state))
    }
}

/// The result of the fused forward: the flat output and the shapes of `y` and the state.
type Flat<B> = (FloatTensor<B>, Shape, Shape);

/// Runs the fused forward and registers its backward with the `N` tracked inputs as parents.
fn register<B: SsdBackend, C: CheckpointStrategy, const N: usize>(
    tracked: &[FloatTensor<Autodiff<B, C>>],
    starts: Option<FloatTensor<B>>,
    chunk_size: usize,
    (kernels, products): (FusedKernels, ScanProducts),
    inner: impl Fn(&[FloatTensor<Autodiff<B, C>>], Option<FloatTensor<B>>) -> SsdPrimitives<B>,
    forward: impl Fn(SsdPrimitives<B>) -> Flat<B>,
) -> Flat<Autodiff<B, C>> {
    let nodes: [_; N] = std::array::from_fn(|i| tracked[i].node.clone());
    match SsdBackward.prepare::<C>(nodes).compute_bound().stateful() {
        OpsKind::Tracked(mut prep) => {
            let ids = tracked.iter().map(|t| prep.checkpoint(t)).collect();
            let (flat, y_shape, state_shape) = forward(inner(tracked, starts.clone()));
            let state = SsdState {
                nodes: ids,
                starts,
                chunk_size,
                kernels,
                products,
                y_shape: y_shape.clone(),
                state_shape: state_shape.clone(),
            };
            (prep.finish(state, flat), y_shape, state_shape)
        }
        OpsKind::UnTracked(prep) => {
            let (flat, y_shape, state_shape) = forward(inner(tracked, starts));
            (prep.finish(flat), y_shape, state_shape)
        }
    }
}
