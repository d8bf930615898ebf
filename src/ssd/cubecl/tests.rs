//! The fused scan against the tensor-op form ([`fused_matches_tensor_ops`]) on
//! `Fusion<CubeBackend>` (what `Wgpu` is) and on the bare `CubeBackend` (the reference: the
//! tensor operations on the CPU; those on each Wgpu backend on one case), and its indices past
//! 2³² on Cuda. Each Wgpu test configures CubeCL first, as a model's `init` does
//! (`cubecl_setup`), so that the tests' processes share the crate's autotune cache.

use burn::backend::Autodiff;

use crate::ssd::backend::SsdAutodiffBackend;
use crate::ssd::fused::ScanProducts;
#[cfg(feature = "cuda-tests")]
use crate::ssd::tests::Tolerance;
use crate::ssd::tests::{fused_matches_tensor_ops, F32_PRODUCTS};
#[cfg(feature = "cuda-tests")]
use {
    crate::ssd::chunked::tests::{assert_within, uniform},
    crate::ssd::fused::FusedKernels,
    crate::ssd::{ssd_chunked, SsdInput},
    burn::tensor::Tensor,
    rand::{rngs::StdRng, SeedableRng},
};
#[cfg(feature = "wgpu")]
use {crate::ssd::tests::tensor_ops_match, burn::backend::wgpu::WgpuDevice};

/// On Cuda: the fused scan's products run on tensor cores (`product.rs`) and Burn's matmul
/// may too (its autotune picks cubek's accelerated kernels where they are fastest), so `f32`
/// operands multiply as TF32, with f16's 10-bit mantissa, on both paths, in different products:
/// the tolerances of the half-precision reference tests (`tests/reference.rs`).
#[cfg(feature = "cuda-tests")]
const TF32_PRODUCTS: Tolerance = Tolerance {
    forward: 1e-2,
    grad: 7.5e-2,
};

/// Chunks longer than the fused scan takes run the tensor operations, on both backend types.
#[cfg(feature = "wgpu")]
#[test]
fn long_chunks_take_the_tensor_operations() {
    use super::FUSED_MAX_CHUNK;
    use crate::ssd::backend::SsdBackend;
    #[cfg(not(feature = "cuda-tests"))]
    use crate::ssd::fused::FusedKernels;
    use burn::tensor::DType;
    type Cube = burn_cubecl::CubeBackend<burn::backend::wgpu::WgpuRuntime, f32, i32, u32>;
    for (q, fused) in [
        (1, true),
        (FUSED_MAX_CHUNK, true),
        (FUSED_MAX_CHUNK + 1, false),
    ] {
        let always = FusedKernels::Always;
        assert_eq!(Cube::has_fused_ssd(DType::F32, q, always), fused, "q = {q}");
        assert_eq!(
            <burn::backend::Wgpu>::has_fused_ssd(DType::F32, q, always),
            fused,
            "q = {q}"
        );
        // autodiff wraps the fused scan of its inner backend, it has none of its own
        assert!(!<Autodiff<burn::backend::Wgpu>>::has_fused_ssd(
            DType::F32,
            q,
            always
        ));
    }
}

/// Wgpu's backend without kernel fusion.
#[cfg(feature = "wgpu")]
type WgpuCube = burn_cubecl::CubeBackend<burn::backend::wgpu::WgpuRuntime, f32, i32, u32>;

/// The reference of the Wgpu tests: the tensor operations on the CPU. On lavapipe nearly all
/// of these tests' time is compiling kernels, above all the candidates of Burn's matmul
/// autotune at each new shape, and the tensor-op form issues many more matmuls than the fused
/// scan; so the fused scan runs on the device, and the tensor operations there only in
/// [`tensor_ops_match`], on the case that takes every branch of them.
#[cfg(feature = "wgpu")]
type Cpu = Autodiff<burn::backend::NdArray>;

/// The fused scan on `B` (a Wgpu backend) with `products` against the tensor operations on
/// the CPU, on every case.
#[cfg(feature = "wgpu")]
fn fused_matches_cpu<B: SsdAutodiffBackend<Device = WgpuDevice>>(products: ScanProducts) {
    crate::cubecl_setup::setup_cubecl();
    fused_matches_tensor_ops::<B, Cpu>(
        &WgpuDevice::default(),
        &Default::default(),
        products,
        F32_PRODUCTS,
    );
}

/// The fused scan on `Wgpu` as users get it (`Fusion<CubeBackend>`), and the tensor operations
/// there on one case.
#[cfg(feature = "wgpu")]
#[test]
#[ignore = "needs a device driver: run with -- --ignored"]
fn fused_matches_tensor_ops_on_wgpu() {
    fused_matches_cpu::<Autodiff<burn::backend::Wgpu>>(ScanProducts::Tiled);
    tensor_ops_match::<Autodiff<burn::backend::Wgpu>, Cpu>(
        &WgpuDevice::default(),
        &Default::default(),
        F32_PRODUCTS,
    );
}

/// The transient products (each head's matrices through the matmul) on Wgpu: the same cases,
/// the same tolerance.
#[cfg(feature = "wgpu")]
#[test]
#[ignore = "needs a device driver: run with -- --ignored"]
fn transient_products_match_tensor_ops_on_wgpu() {
    fused_matches_cpu::<Autodiff<burn::backend::Wgpu>>(ScanProducts::Transient);
}

/// The tiles' products on fragments (`ScanProducts::TensorCores`) on Wgpu: lavapipe has no
/// tensor cores, so the fragments' products run on its ordinary cores, and everything of the
/// variant but its three `cmma` calls is checked: the staging in shared memory in the operand
/// type, the planes' layout, the accumulator tile. The same cases, the same tolerance.
#[cfg(feature = "wgpu")]
#[test]
#[ignore = "needs a device driver: run with -- --ignored"]
fn tensor_core_products_match_tensor_ops_on_wgpu() {
    fused_matches_cpu::<Autodiff<burn::backend::Wgpu>>(ScanProducts::TensorCores);
}

/// The same on the bare `CubeBackend` (Wgpu without kernel fusion), and its tensor operations
/// on one case.
#[cfg(feature = "wgpu")]
#[test]
#[ignore = "needs a device driver: run with -- --ignored"]
fn fused_matches_tensor_ops_on_cube_backend_without_fusion() {
    fused_matches_cpu::<Autodiff<WgpuCube>>(ScanProducts::Tiled);
    tensor_ops_match::<Autodiff<WgpuCube>, Cpu>(
        &WgpuDevice::default(),
        &Default::default(),
        F32_PRODUCTS,
    );
}

#[cfg(feature = "cuda-tests")]
#[test]
#[ignore = "needs a device driver: run with -- --ignored"]
fn fused_matches_tensor_ops_on_cuda() {
    for products in [
        ScanProducts::Tiled,
        ScanProducts::Transient,
        ScanProducts::TensorCores,
    ] {
        let device = Default::default();
        fused_matches_tensor_ops::<Autodiff<burn::backend::Cuda>, Autodiff<burn::backend::Cuda>>(
            &device,
            &device,
            products,
            TF32_PRODUCTS,
        );
    }
}

/// A scan whose scores `C·Bᵀ` and their gradient (`[b, c, g, q, q]`, one group per head
/// here, 18 GiB of `f32` each) hold more than 2³² elements: the output and gradients of its
/// last eight heads (and groups) equal those of a scan of those alone (every buffer of that one
/// below 2³²), so an index that wrapped at 2³² would read another group's or chunk's values.
/// About 45 GB of device memory: Cuda only (WGSL has no 64-bit integers).
#[cfg(feature = "cuda-tests")]
fn indices_past_u32<B: SsdAutodiffBackend>(device: &B::Device) {
    let (b, h, p, g, n, q) = (1, 72, 2, 72, 2, 256);
    let l = 960 * q;
    assert!(b * (l / q) * g * q * q > u32::MAX as usize);
    let mut rng = StdRng::seed_from_u64(43);
    let x = uniform::<B, 4>(&mut rng, [b, l, h, p], -1.0..1.0, device);
    let dt = uniform::<B, 3>(&mut rng, [b, l, h], 0.001..0.1, device);
    let a = uniform::<B, 1>(&mut rng, [h], -1.0..-0.1, device);
    let b_mat = uniform::<B, 4>(&mut rng, [b, l, g, n], -1.0..1.0, device);
    let c_mat = uniform::<B, 4>(&mut rng, [b, l, g, n], -1.0..1.0, device);
    let w_y = uniform::<B, 4>(&mut rng, [b, l, h, p], -1.0..1.0, device);
    let heads = h - 8..h;
    let run = |x: Tensor<B, 4>,
               dt: Tensor<B, 3>,
               a: Tensor<B, 1>,
               b_mat: Tensor<B, 4>,
               c_mat: Tensor<B, 4>,
               w_y: Tensor<B, 4>| {
        let leaves = (
            x.require_grad(),
            dt.require_grad(),
            a.require_grad(),
            b_mat.require_grad(),
            c_mat.require_grad(),
        );
        let input = SsdInput::new(
            leaves.0.clone(),
            leaves.1.clone(),
            leaves.2.clone(),
            leaves.3.clone(),
            leaves.4.clone(),
            q,
        )
        .fused_kernels(FusedKernels::Always);
        let (y, state) = ssd_chunked(input);
        let grads = (y.clone() * w_y).sum().backward();
        (
            y.inner(),
            state.inner(),
            [
                leaves.0.grad(&grads).expect("dx"),
                leaves.3.grad(&grads).expect("dB"),
                leaves.4.grad(&grads).expect("dC"),
            ],
            leaves.1.grad(&grads).expect("ddt"),
            leaves.2.grad(&grads).expect("dA"),
        )
    };
    let whole = run(
        x.clone(),
        dt.clone(),
        a.clone(),
        b_mat.clone(),
        c_mat.clone(),
        w_y.clone(),
    );
    let part = run(
        x.slice([0..b, 0..l, heads.clone()]),
        dt.slice([0..b, 0..l, heads.clone()]),
        a.slice([heads.clone()]),
        b_mat.slice([0..b, 0..l, heads.clone()]),
        c_mat.slice([0..b, 0..l, heads.clone()]),
        w_y.slice([0..b, 0..l, heads.clone()]),
    );
    // the two scans' products may be of different kernels, TF32 or not (`TF32_PRODUCTS`); a
    // wrapped index reads another group's or chunk's values, far outside it
    let (forward, grad) = (TF32_PRODUCTS.forward, TF32_PRODUCTS.grad);
    let last = |t: Tensor<B::InnerBackend, 4>| t.narrow(2, h - 8, 8);
    assert_within("y", last(whole.0), part.0, forward);
    assert_within("final state", whole.1.narrow(1, h - 8, 8), part.1, forward);
    for (name, (w, p)) in ["dx", "dB", "dC"]
        .iter()
        .zip(whole.2.into_iter().zip(part.2))
    {
        assert_within(name, last(w), p, grad);
    }
    assert_within("ddt", whole.3.narrow(2, h - 8, 8), part.3, grad);
    assert_within("dA", whole.4.narrow(0, h - 8, 8), part.4, grad);
}

#[cfg(feature = "cuda-tests")]
#[test]
#[ignore = "needs a GPU with about 40 GB: run with -- --ignored"]
fn indices_past_u32_read_the_right_elements_on_cuda() {
    indices_past_u32::<Autodiff<burn::backend::Cuda>>(&Default::default());
}
