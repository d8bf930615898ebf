//! What runs on the offline CUDA backend: the fused SSD, forward and backward, in every
//! `ScanProducts` variant and operand type, at the 130m training shape and at each golden
//! case's shape, with and without an initial state and packed documents; and one training step
//! of the 130m LM as CUDA users run it (`Fusion<CubeBackend>`, bf16, Burn's kernels with it).

use std::path::Path;

use burn::backend::Autodiff;
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, Int, IntDType, Tensor};
use burn_cubecl::CubeBackend;
use mamba2_burn::checkpoint::read_config;
use mamba2_burn::ssd::{
    override_fused_kernels, override_scan_products, ssd_chunked, FusedKernels, ScanProducts,
    SsdAutodiffBackend, SsdInput,
};
use mamba2_burn::{Mamba2Lm, Mamba2LmConfig};

use crate::offline::{set_context, OfflineCuda, OfflineDevice};

/// The backend of the SSD's checks: the bare `CubeBackend` (the fused scan's own launches).
pub type Cube = CubeBackend<OfflineCuda, f32, i32, u8>;
/// What `burn::backend::Cuda` is, on the offline runtime.
pub type Fused = burn_fusion::Fusion<Cube>;

/// The scan's dimensions (`ssd` module letters).
#[derive(Clone, Debug)]
pub struct ScanShape {
    /// Where the shape comes from: `130m` or a golden case's folder.
    pub name: String,
    pub b: usize,
    pub l: usize,
    pub h: usize,
    pub p: usize,
    pub g: usize,
    pub n: usize,
    pub q: usize,
}

/// One layer of mamba2-130m at the training batch (8 × 2,048): 24 heads of 64, one group,
/// 128 states, chunks of 256.
pub fn shape_130m() -> ScanShape {
    let config = Mamba2LmConfig::published("mamba2-130m").expect("a published preset");
    let m = &config.backbone.mixer;
    ScanShape {
        name: "130m".into(),
        b: 8,
        l: 2048,
        h: m.nheads(),
        p: m.headdim,
        g: m.ngroups,
        n: m.d_state,
        q: m.chunk_size,
    }
}

/// The scan's shape in each golden case of `root` (its `config.json`, and the batch and length
/// of its prompt in `expected.safetensors`).
pub fn golden_shapes(root: &Path) -> Result<Vec<ScanShape>, String> {
    let mut dirs: Vec<_> = std::fs::read_dir(root)
        .map_err(|e| format!("{}: {e}", root.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("config.json").is_file() && p.join("expected.safetensors").is_file())
        .collect();
    dirs.sort();
    dirs.iter()
        .map(|dir| {
            let (config, _) = read_config(dir).map_err(|e| e.to_string())?;
            let bytes = std::fs::read(dir.join("expected.safetensors"))
                .map_err(|e| format!("{}: {e}", dir.display()))?;
            let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes)
                .map_err(|e| format!("{}: {e}", dir.display()))?;
            let tensors = meta.tensors();
            let prompt = ["input_ids", "inputs_embeds"]
                .iter()
                .find_map(|name| tensors.get(*name))
                .ok_or_else(|| format!("{}: no input_ids or inputs_embeds", dir.display()))?;
            let m = &config.backbone.mixer;
            Ok(ScanShape {
                name: dir.file_name().unwrap().to_string_lossy().into_owned(),
                b: prompt.shape[0],
                l: prompt.shape[1],
                h: m.nheads(),
                p: m.headdim,
                g: m.ngroups,
                n: m.d_state,
                q: m.chunk_size,
            })
        })
        .collect()
}

/// The operand types of the fused scan.
pub const DTYPES: [(FloatDType, &str); 3] = [
    (FloatDType::F32, "f32"),
    (FloatDType::F16, "f16"),
    (FloatDType::BF16, "bf16"),
];

/// Forward and backward of the fused scan on `device` at `shape`, every input in `dtype`
/// (an initial state in `f32`, as the mixer keeps its states); with `extras`, an initial state
/// and packed documents (the kernels' comptime branches for both). The kernels it compiles
/// first are recorded under `label` and the pass.
pub fn ssd<B: SsdAutodiffBackend>(
    device: &B::Device,
    shape: &ScanShape,
    dtype: FloatDType,
    products: ScanProducts,
    extras: bool,
    label: &str,
) {
    let ScanShape {
        b,
        l,
        h,
        p,
        g,
        n,
        q,
        ..
    } = *shape;
    set_context(format!("{label} forward"));
    let x = Tensor::<B, 4>::zeros([b, l, h, p], device)
        .cast(dtype)
        .require_grad();
    let dt = Tensor::<B, 3>::zeros([b, l, h], device)
        .cast(dtype)
        .require_grad();
    let a = Tensor::<B, 1>::zeros([h], device)
        .cast(dtype)
        .require_grad();
    let b_mat = Tensor::<B, 4>::zeros([b, l, g, n], device)
        .cast(dtype)
        .require_grad();
    let c_mat = Tensor::<B, 4>::zeros([b, l, g, n], device)
        .cast(dtype)
        .require_grad();
    let mut input = SsdInput::new(x, dt, a, b_mat, c_mat, q)
        .fused_kernels(FusedKernels::Always)
        .scan_products(products);
    if extras {
        input = input
            .initial_state(Tensor::zeros([b, h, p, n], device).require_grad())
            .document_starts(Tensor::zeros([b, l], device));
    }
    let (y, state) = ssd_chunked(input);
    let (y, state) = (y.sum(), state.sum());
    // the server compiles on its own thread: what was queued is done before the context moves
    B::sync(device).expect("the offline server syncs");
    set_context(format!("{label} backward"));
    let _grads = (y + state).backward();
    B::sync(device).expect("the offline server syncs");
}

/// Every SSD case on the bare `CubeBackend` of `arch`.
pub fn ssd_cases(arch: u32, shapes: &[ScanShape]) {
    let device = OfflineDevice { arch, slot: 0 };
    for products in ScanProducts::ALL {
        let products_name = products.name();
        for (dtype, dtype_name) in DTYPES {
            for shape in shapes {
                for extras in [false, true] {
                    let with = if extras { " +state+docs" } else { "" };
                    let label = format!("ssd {products_name} {dtype_name} {}{with}", shape.name);
                    ssd::<Autodiff<Cube>>(&device, shape, dtype, products, extras, &label);
                }
            }
        }
    }
}

/// One training step of the 130m LM (8 × 2,048, every tensor in `dtype`, AdamW) on `Fusion` over
/// the offline runtime of `arch` (what `burn::backend::Cuda` is), the scan's products as
/// `products` says: the kernels of the fused scan, of Burn's matmul, reductions and
/// element-wise fusion, and of the optimizer. `slot` makes the device a fresh one, whose
/// default float type can still be set.
pub fn lm_step(
    arch: u32,
    slot: u16,
    products: ScanProducts,
    products_name: &str,
    dtype: FloatDType,
) {
    type B = Autodiff<Fused>;
    let device = OfflineDevice { arch, slot };
    burn::tensor::set_default_dtypes::<B>(&device, dtype, IntDType::I32)
        .expect("the step's device is fresh");
    let _fused = override_fused_kernels(FusedKernels::Always);
    let _products = override_scan_products(products);
    let dtype_name = DTYPES
        .iter()
        .find(|(d, _)| *d == dtype)
        .map_or("?", |(_, n)| n);
    let label = format!("lm-130m {products_name} {dtype_name}");
    let config = Mamba2LmConfig::published("mamba2-130m").expect("a published preset");
    // the server compiles on its own thread, and fusion launches late: each part is done
    // before the context moves on
    let sync = || B::sync(&device).expect("the offline server syncs");
    set_context(format!("{label} init"));
    let model: Mamba2Lm<B> = config.init(&device).expect("the published config is valid");
    let ids = Tensor::<B, 2, Int>::zeros([8, 2048], &device);
    sync();
    set_context(format!("{label} forward"));
    let (logits, _) = model.forward(ids, None).expect("shapes are valid");
    let loss = logits.square().mean();
    sync();
    set_context(format!("{label} backward"));
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    sync();
    set_context(format!("{label} optimizer"));
    let mut optim = AdamWConfig::new().init::<B, Mamba2Lm<B>>();
    let _model = optim.step(1e-4, model, grads);
    sync();
}
