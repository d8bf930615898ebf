//! [`SsdBackend`] for `Fusion<B>`, what `burn::backend::Wgpu` and `Cuda` are: the scan and its
//! gradient as custom operations of the fusion stream, each running `B`'s kernels on the
//! stream's tensors (the fused element-wise work around them stays with the fuser).

use std::marker::PhantomData;

use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape, TensorMetadata};
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};

use crate::precision::compute_dtype;
use crate::ssd::backend::{tensor_ops, SsdBackend, SsdGrads, SsdPrimitives};
use crate::ssd::fused::{FusedKernels, ScanProducts};
use crate::ssd::projection::ProjectionBackend;

/// Which optional inputs an operation has, the chunk length, the path and the products: the inputs of the
/// custom operation are x, dt, a, B, C, then the initial state and the starts when present.
#[derive(Clone, Copy, Debug)]
struct Layout {
    has_initial: bool,
    has_starts: bool,
    chunk_size: usize,
    kernels: FusedKernels,
    products: ScanProducts,
}

impl Layout {
    fn of<B: burn::tensor::backend::Backend>(inputs: &SsdPrimitives<B>) -> Self {
        Self {
            has_initial: inputs.initial_state.is_some(),
            has_starts: inputs.starts.is_some(),
            chunk_size: inputs.chunk_size,
            kernels: inputs.kernels,
            products: inputs.products,
        }
    }

    /// The operation's first inputs as the SSD's, read from `handles`.
    fn inputs<B: FusionBackend>(
        &self,
        ir: &[TensorIr],
        handles: &mut HandleContainer<<B::FusionRuntime as FusionRuntime>::FusionHandle>,
    ) -> SsdPrimitives<B> {
        let mut get = |i: usize| handles.get_float_tensor::<B>(&ir[i]);
        let (x, dt, a, b, c) = (get(0), get(1), get(2), get(3), get(4));
        let mut next = 5;
        let initial_state = self.has_initial.then(|| {
            next += 1;
            handles.get_float_tensor::<B>(&ir[next - 1])
        });
        let starts = self
            .has_starts
            .then(|| handles.get_float_tensor::<B>(&ir[next]));
        SsdPrimitives {
            x,
            dt,
            a,
            b,
            c,
            initial_state,
            starts,
            chunk_size: self.chunk_size,
            kernels: self.kernels,
            products: self.products,
        }
    }

    /// How many inputs of the SSD the operation has.
    fn count(&self) -> usize {
        5 + self.has_initial as usize + self.has_starts as usize
    }
}

/// The SSD's inputs as the fusion stream's tensors, in the [`Layout`] order.
fn stream_inputs<R: FusionRuntime>(
    inputs: SsdPrimitives<Fusion<impl FusionBackend<FusionRuntime = R>>>,
) -> Vec<burn_fusion::FusionTensor<R>> {
    let mut all = vec![inputs.x, inputs.dt, inputs.a, inputs.b, inputs.c];
    all.extend(inputs.initial_state);
    all.extend(inputs.starts);
    all
}

/// The forward scan as a stream operation.
#[derive(Clone, Debug)]
struct ScanOp<B> {
    desc: CustomOpIr,
    layout: Layout,
    _backend: PhantomData<B>,
}

impl<B: FusionBackend + SsdBackend> Operation<B::FusionRuntime> for ScanOp<B> {
    fn execute(
        &self,
        handles: &mut HandleContainer<<B::FusionRuntime as FusionRuntime>::FusionHandle>,
    ) {
        let inputs = self.layout.inputs::<B>(&self.desc.inputs, handles);
        let (y, state) = B::ssd_chunked(inputs);
        handles.register_float_tensor::<B>(&self.desc.outputs[0].id, y);
        handles.register_float_tensor::<B>(&self.desc.outputs[1].id, state);
    }
}

/// The gradient as a stream operation: inputs as [`ScanOp`]'s, then the outputs' gradients.
#[derive(Clone, Debug)]
struct GradOp<B> {
    desc: CustomOpIr,
    layout: Layout,
    _backend: PhantomData<B>,
}

impl<B: FusionBackend + SsdBackend> Operation<B::FusionRuntime> for GradOp<B> {
    fn execute(
        &self,
        handles: &mut HandleContainer<<B::FusionRuntime as FusionRuntime>::FusionHandle>,
    ) {
        let ir = &self.desc.inputs;
        let inputs = self.layout.inputs::<B>(ir, handles);
        let k = self.layout.count();
        let grad_y = handles.get_float_tensor::<B>(&ir[k]);
        let grad_state = handles.get_float_tensor::<B>(&ir[k + 1]);
        let g = B::ssd_chunked_backward(inputs, grad_y, grad_state);
        let out = &self.desc.outputs;
        handles.register_float_tensor::<B>(&out[0].id, g.x);
        handles.register_float_tensor::<B>(&out[1].id, g.dt);
        handles.register_float_tensor::<B>(&out[2].id, g.a);
        handles.register_float_tensor::<B>(&out[3].id, g.b);
        handles.register_float_tensor::<B>(&out[4].id, g.c);
        if let Some(s) = g.initial_state {
            handles.register_float_tensor::<B>(&out[5].id, s);
        }
    }
}

/// An output of the stream operation with `shape` and `dtype`.
fn output<R: FusionRuntime>(
    client: &burn_fusion::Client<R>,
    shape: Shape,
    dtype: DType,
) -> TensorIr {
    TensorIr::uninit(client.create_empty_handle(), shape, dtype)
}

/// The projections on Burn's own `linear`, which the fuser sees.
impl<B: FusionBackend + SsdBackend> ProjectionBackend for Fusion<B> {}

impl<B: FusionBackend + SsdBackend> SsdBackend for Fusion<B> {
    fn ssd_chunked(inputs: SsdPrimitives<Self>) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let dtype = inputs.x.dtype();
        if !B::has_fused_ssd(dtype, inputs.chunk_size, inputs.kernels) {
            return tensor_ops(inputs);
        }
        let layout = Layout::of(&inputs);
        let [b, _, h, p] = inputs.x.shape().dims::<4>();
        let n = inputs.b.shape().dims::<4>()[3];
        let client = inputs.x.client.clone();
        let y = output(&client, inputs.x.shape(), dtype);
        let state = output(&client, Shape::new([b, h, p, n]), compute_dtype(dtype));
        let tensors = stream_inputs(inputs);
        let streams = OperationStreams::with_inputs(tensors.iter());
        let ir: Vec<TensorIr> = tensors.into_iter().map(|t| t.into_ir()).collect();
        let desc = CustomOpIr::new("mamba2_ssd_chunked", &ir, &[y, state]);
        let op = ScanOp::<B> {
            desc: desc.clone(),
            layout,
            _backend: PhantomData,
        };
        let [y, state]: [_; 2] = client
            .register(streams, OperationIr::Custom(desc), op)
            .try_into()
            .expect("two outputs");
        (y, state)
    }

    fn has_fused_ssd(dtype: DType, chunk_size: usize, kernels: FusedKernels) -> bool {
        B::has_fused_ssd(dtype, chunk_size, kernels)
    }

    fn ssd_chunked_backward(
        inputs: SsdPrimitives<Self>,
        grad_y: FloatTensor<Self>,
        grad_state: FloatTensor<Self>,
    ) -> SsdGrads<Self> {
        let layout = Layout::of(&inputs);
        let client = inputs.x.client.clone();
        let mut grads = vec![
            output(&client, inputs.x.shape(), inputs.x.dtype()),
            output(&client, inputs.dt.shape(), inputs.dt.dtype()),
            output(&client, inputs.a.shape(), inputs.a.dtype()),
            output(&client, inputs.b.shape(), inputs.b.dtype()),
            output(&client, inputs.c.shape(), inputs.c.dtype()),
        ];
        if let Some(s) = &inputs.initial_state {
            grads.push(output(&client, s.shape(), s.dtype()));
        }
        let mut tensors = stream_inputs(inputs);
        tensors.push(grad_y);
        tensors.push(grad_state);
        let streams = OperationStreams::with_inputs(tensors.iter());
        let ir: Vec<TensorIr> = tensors.into_iter().map(|t| t.into_ir()).collect();
        let desc = CustomOpIr::new("mamba2_ssd_chunked_backward", &ir, &grads);
        let op = GradOp::<B> {
            desc: desc.clone(),
            layout,
            _backend: PhantomData,
        };
        let mut out = client
            .register(streams, OperationIr::Custom(desc), op)
            .into_iter();
        let mut next = || out.next().expect("an output per gradient");
        SsdGrads {
            x: next(),
            dt: next(),
            a: next(),
            b: next(),
            c: next(),
            initial_state: layout.has_initial.then(next),
        }
    }
}
