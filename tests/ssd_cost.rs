//! The cost model of the fused GPU scan (`mamba2_burn::ssd::cost`) at the shape of one
//! mamba2-130m layer in training (batch 8 × 2,048 tokens, 24 heads of 64, one group, state 128,
//! chunks of 256): its arithmetic against the products' formulas, and the budgets it holds.
//! `cargo run --release --example bench -- --mode ssd-cost --preset 130m --batch 8` prints it.

use mamba2_burn::ssd::cost::{
    backward_launches, calibration_occupancy, chunk_scan_product_flops, forward_launches, heavy,
    occupancy, totals, Launch, LaunchKind, Pass, Rates, ScanShape,
};
use mamba2_burn::ScanProducts;

/// CubeCL's profile of one 130m layer's fused scan in bf16 on an NVIDIA H200, 2026-12-04, at
/// 477a759 (each launch synchronised: kernel times, steady state; `../shared/docs/gpu-notes.md`,
/// "Measured on an NVIDIA H200"): µs per launch, forward then gradient, in the order the code
/// issues them.
const H200_PROFILE_US: [f64; 19] = [
    167.0, 49.0, 86.0, 67.0, 83.0, 869.0, // forward
    191.0, 45.0, 139.0, 64.0, 89.0, 141.0, 876.0, 1371.0, 137.0, 51.0, 41.0, 47.0, 44.0,
];

fn layer_130m() -> ScanShape {
    ScanShape::new(8, 2048, 24, 1, 64, 128, 256)
}

/// The forward's contractions, each once: `C·Bᵀ` per group (`2·b·c·g·q²·n`), the chunk states
/// and the entering states' output `C·S_inᵀ` (`2·b·c·h·q·p·n` each) as products; the
/// intra-chunk product inside `chunk_scan`'s tiles, over the tiles on and below the diagonal
/// only (36 of the 64 tile pairs of a chunk of 256 in tiles of 32).
#[test]
fn forward_products_are_the_contractions_of_the_scan_once() {
    let s = layer_130m();
    let (b, c, g, h, p, n, q) = (8.0, 8.0, 1.0, 24.0, 64.0, 128.0, 256.0);
    assert_eq!(s.c(), 8);
    let launches = forward_launches(s);
    let products: Vec<_> = launches
        .iter()
        .filter(|x| x.kind == LaunchKind::Product)
        .collect();
    assert_eq!(products.len(), 3);
    let flops = totals(&launches, &Rates::h100(4)).product_flops;
    assert_eq!(
        flops,
        2.0 * b * c * g * q * q * n + 2.0 * 2.0 * b * c * h * q * p * n
    );
    let tiled = chunk_scan_product_flops(s);
    let causal = 2.0 * b * c * h * q * q * p * 36.0 / 64.0;
    assert_eq!(tiled, causal);
    let scan = launches
        .iter()
        .find(|x| x.kind == LaunchKind::Tiled)
        .expect("the tiled output");
    assert!(scan.other_flops > tiled);
    // the gradient's products: C·Bᵀ and the chunk states again, the entering states' gradient
    // (dy·exp(cs))ᵀ·C, the per-head parts C·S_inᵀ and B·G_outᵀ, and two per group for each of
    // dB and dC; its decay-weighted contractions run in its tiled kernels
    let backward = totals(&backward_launches(s), &Rates::h100(4)).product_flops;
    let scores = 2.0 * b * c * g * q * q * n;
    let states = 2.0 * b * c * h * q * p * n;
    assert_eq!(backward, 3.0 * scores + 6.0 * states);
}

/// Both passes within their budgets: at most 6 launches forward and 14 backward, no launch
/// writes a per-head `b·c·h·q²` buffer, and no kernel's threads walk along a chunk (the
/// products' and the tiled kernels' chains are their contractions).
#[test]
fn passes_fit_their_budgets() {
    let s = layer_130m();
    let (forward, backward) = (forward_launches(s), backward_launches(s));
    assert!(forward.len() <= 6, "{} launches forward", forward.len());
    assert!(backward.len() <= 14, "{} launches backward", backward.len());
    for x in forward.iter().chain(&backward) {
        assert!(!x.per_head_square, "{} writes b·c·h·q² elements", x.name);
        if x.kind == LaunchKind::Kernel {
            assert!(x.serial < s.q, "{}: a chain of {}", x.name, x.serial);
        }
    }
}

/// Every launch that carries more than 5% of a pass's FLOPs or bytes fills an H100 at least
/// twice over: 264 cubes (132 SMs).
#[test]
fn heavy_launches_fill_the_gpu() {
    let s = layer_130m();
    for launches in [forward_launches(s), backward_launches(s)] {
        let heavy = heavy(&launches, 0.05);
        assert!(!heavy.is_empty());
        for x in heavy {
            assert!(x.cubes >= 264, "{} has {} cubes", x.name, x.cubes);
        }
    }
}

/// A launch's estimate is its fixed cost plus the larger of compute and memory time, and
/// grows with the batch.
#[test]
fn estimates_follow_the_roofline() {
    let rates = Rates::h100(4);
    let s = layer_130m();
    for x in forward_launches(s).iter().chain(&backward_launches(s)) {
        let compute = x.product_flops / rates.product_flops + x.other_flops / rates.other_flops;
        let memory = (x.bytes_read + x.bytes_written) / rates.bytes;
        let t = x.seconds(&rates);
        assert!(
            t >= rates.launch + compute && t >= rates.launch + memory,
            "{}",
            x.name
        );
        assert!(t <= rates.launch + compute + memory, "{}", x.name);
    }
    let one = ScanShape { b: 1, ..s };
    let time = |s| {
        totals(&forward_launches(s), &rates).seconds + totals(&backward_launches(s), &rates).seconds
    };
    assert!(time(s) > 4.0 * time(one));
}

/// In half precision the products' operands and the layouts take half the bytes (the decays,
/// states, sums and most products' outputs stay `f32`): no launch moves more but the forward's
/// state recurrence, which writes its states a second time as half-precision operands (in
/// `f32` the `f32` states serve), and the pass as a whole markedly less.
#[test]
fn half_precision_operands_move_fewer_bytes() {
    let rates = Rates::h100(4);
    let full = layer_130m();
    let half = ScanShape {
        element_bytes: 2,
        ..full
    };
    for (f, h) in [
        (forward_launches(full), forward_launches(half)),
        (backward_launches(full), backward_launches(half)),
    ] {
        assert_eq!(f.len(), h.len());
        // [b, c+1, h, p, n] in two bytes
        let copy = (2 * full.b * (full.c() + 1) * full.h * full.p * full.n) as f64;
        for (a, b) in f.iter().zip(&h) {
            assert_eq!(a.name, b.name);
            let (bytes_f, bytes_h) = (
                a.bytes_read + a.bytes_written,
                b.bytes_read + b.bytes_written,
            );
            if a.name == "pass_states" && a.pass == Pass::Forward {
                assert_eq!(bytes_h, bytes_f + copy, "{}", a.name);
            } else {
                assert!(bytes_h <= bytes_f, "{}", a.name);
            }
        }
        let (f, h) = (totals(&f, &rates).bytes, totals(&h, &rates).bytes);
        assert!(h < 0.8 * f, "{h} vs {f}");
    }
}

/// The model calibrated on the H200 (`Rates::h200_calibrated`) against that machine's
/// profile at the same shape: every launch's estimate within 1.5× of its measured time either
/// way, and the layer's total within 1.2×.
#[test]
fn calibrated_estimates_land_within_1_5x_of_the_h200_profile() {
    let s = ScanShape {
        element_bytes: 2,
        ..layer_130m()
    };
    let rates = Rates::h200_calibrated(2);
    let launches: Vec<_> = forward_launches(s)
        .into_iter()
        .chain(backward_launches(s))
        .collect();
    assert_eq!(launches.len(), H200_PROFILE_US.len());
    // the code as profiled: its `chunk_prep` copied B and C from the first head of each group
    // alone (`q·n / 256` strides of the cube's 256 threads; the group's heads share them since
    // 2026-12-06), the rest as it is now
    let strides = (s.q * s.n).div_ceil(256);
    let launches: Vec<Launch> = launches
        .into_iter()
        .map(|x| match x.name {
            "chunk_prep" => Launch {
                serial: x.serial + strides - strides.div_ceil(s.r()),
                ..x
            },
            _ => x,
        })
        .collect();
    let mut worst: f64 = 1.0;
    for (x, measured) in launches.iter().zip(H200_PROFILE_US) {
        let estimate = x.seconds(&rates) * 1e6;
        let ratio = estimate / measured;
        println!(
            "{:?} {}: {estimate:.0} µs estimated, {measured:.0} measured",
            x.pass, x.name
        );
        assert!(
            (1.0 / 1.5..=1.5).contains(&ratio),
            "{:?} {}: {estimate:.0} µs estimated, {measured:.0} measured",
            x.pass,
            x.name
        );
        worst = worst.max(ratio.max(1.0 / ratio));
    }
    let estimate: f64 = launches.iter().map(|x| x.seconds(&rates)).sum::<f64>() * 1e6;
    let measured: f64 = H200_PROFILE_US.iter().sum();
    println!("layer: {estimate:.0} µs estimated, {measured:.0} measured; worst launch {worst:.2}×");
    assert!((1.0 / 1.2..=1.2).contains(&(estimate / measured)));
}

/// Every kernel of the scan, in each variant and type, has its occupancy on sm_90 from
/// docs/cuda-kernels.md (a kernel renamed or added without the table regenerated fails here),
/// and the products, cubek's, none.
#[test]
fn every_kernel_reads_its_occupancy_from_the_kernel_table() {
    for products in [
        ScanProducts::Tiled,
        ScanProducts::Transient,
        ScanProducts::TensorCores,
    ] {
        for element_bytes in [2, 4] {
            let s = ScanShape {
                element_bytes,
                products,
                ..layer_130m()
            };
            for x in forward_launches(s).into_iter().chain(backward_launches(s)) {
                match x.kind {
                    LaunchKind::Product => assert_eq!(x.occupancy, None, "{}", x.name),
                    LaunchKind::Kernel | LaunchKind::Tiled => {
                        let o = x.occupancy.unwrap_or_else(|| {
                            panic!(
                                "{products:?} {element_bytes} B {}: not in the table",
                                x.name
                            )
                        });
                        assert!(o > 0.0 && o <= 1.0, "{}: {o}", x.name);
                    }
                }
            }
        }
    }
    // the table's figures, not a default: the tiled kernels hold fewer warps than the
    // element-wise ones (64-thread cubes at 96–128 registers against 256 at about 32)
    let tiled = occupancy("score_grads", ScanProducts::Tiled, 2).unwrap();
    let prep = occupancy("chunk_prep", ScanProducts::Tiled, 2).unwrap();
    assert!(
        tiled < 0.5 && prep > 0.9,
        "score_grads {tiled}, chunk_prep {prep}"
    );
    let reference = calibration_occupancy();
    assert!(reference > 0.0 && reference < 0.5, "{reference}");
}

/// The calibrated rate off tensor cores scales with a kernel's occupancy over the one it was
/// fitted at: half the warps, twice the time of a kernel its arithmetic bounds; a data sheet's
/// peaks do not scale.
#[test]
fn occupancy_scales_the_arithmetic_off_tensor_cores() {
    let s = ScanShape {
        element_bytes: 2,
        ..layer_130m()
    };
    let calibrated = Rates::h200_calibrated(2);
    let scan = forward_launches(s)
        .into_iter()
        .find(|x| x.name == "chunk_scan")
        .unwrap();
    let occupancy = scan.occupancy.unwrap();
    let compute = |x: &Launch, rates: &Rates| x.seconds(rates) - rates.launch;
    let halved = Launch {
        occupancy: Some(occupancy / 2.0),
        ..scan.clone()
    };
    let ratio = compute(&halved, &calibrated) / compute(&scan, &calibrated);
    assert!((ratio - 2.0).abs() < 1e-9, "{ratio}");
    let at_reference = Launch {
        occupancy: Some(calibrated.occupancy),
        ..scan.clone()
    };
    let expected = scan.other_flops / calibrated.other_flops;
    assert!((compute(&at_reference, &calibrated) - expected).abs() < 1e-12);
    let peak = Rates::h100(2);
    assert_eq!(halved.seconds(&peak), scan.seconds(&peak));
}

/// The scan's estimated time in one mamba2-130m training step (24 layers, each a forward and a
/// gradient) on an H200 as calibrated (`Rates::h200_calibrated`, the code as it ran there):
/// at most 125 ms with `bf16` operands and 140 ms with `f32` (TF32 on tensor cores): what the
/// code costs today, held so that no change makes it slower unnoticed. The goal of the
/// tensor-core tiles is 36 ms (1.5 ms a layer).
#[test]
fn training_step_estimate_fits_its_budget() {
    for (element_bytes, budget) in [(4, 140.0), (2, 125.0)] {
        let s = ScanShape {
            element_bytes,
            ..layer_130m()
        };
        let rates = Rates::h200_calibrated(element_bytes);
        let layer = totals(&forward_launches(s), &rates).seconds
            + totals(&backward_launches(s), &rates).seconds;
        let ms = 24.0 * layer * 1e3;
        println!("{element_bytes}-byte operands: {ms:.1} ms");
        assert!(
            ms <= budget,
            "{ms:.1} ms with {element_bytes}-byte operands"
        );
    }
}

/// The transient products (`ScanProducts::Transient`): the intra-chunk contractions become
/// products over whole `q × q` matrices (`M·x`; `Mᵀ·dy` and `dy·xᵀ` in the gradient), each
/// `2·b·c·h·q²·p` FLOPs on tensor cores, with each head's matrices written once (`M` in both
/// passes and `dy·xᵀ`: the only launches that write `b·c·h·q²` elements); the tiled kernels
/// keep their element-wise work and lose their contractions. Prints both variants' estimates.
#[test]
fn transient_products_move_the_contractions_to_tensor_cores() {
    let tiled = ScanShape {
        element_bytes: 2,
        ..layer_130m()
    };
    let transient = ScanShape {
        products: ScanProducts::Transient,
        ..tiled
    };
    let (forward, backward) = (forward_launches(transient), backward_launches(transient));
    assert!(forward.len() <= 9, "{} launches forward", forward.len());
    assert!(backward.len() <= 19, "{} launches backward", backward.len());
    let square: Vec<&str> = forward
        .iter()
        .chain(&backward)
        .filter(|x| x.per_head_square)
        .map(|x| x.name)
        .collect();
    assert_eq!(square, ["intra_weights", "intra_weights", "dy·xᵀ"]);
    let find = |launches: &[Launch], name: &str| -> Launch {
        launches
            .iter()
            .find(|x| x.name == name)
            .unwrap_or_else(|| panic!("no launch {name}"))
            .clone()
    };
    let s = transient;
    let whole = 2.0 * (s.b * s.c() * s.h * s.q * s.q * s.p) as f64;
    assert_eq!(find(&forward, "M·x").product_flops, whole);
    assert_eq!(find(&backward, "Mᵀ·dy").product_flops, whole);
    assert_eq!(find(&backward, "dy·xᵀ").product_flops, whole);
    // the tiled kernels without their contractions
    for (t, w) in [
        (
            find(&forward_launches(tiled), "chunk_scan"),
            find(&forward, "chunk_scan"),
        ),
        (
            find(&backward_launches(tiled), "chunk_scan_grads"),
            find(&backward, "chunk_scan_grads"),
        ),
        (
            find(&backward_launches(tiled), "score_grads"),
            find(&backward, "score_grads"),
        ),
    ] {
        assert!(w.other_flops < 0.5 * t.other_flops, "{}", t.name);
        assert_eq!(w.kind, LaunchKind::Tiled);
    }
    print_estimates(tiled);
}

/// The tensor-core tiles (`ScanProducts::TensorCores`): the same launches as the tiled
/// variant, each tiled kernel's multiply-adds on tensor cores (the contractions' FLOPs, which
/// the tiled variant counts off them), nothing else changed.
#[test]
fn tensor_core_tiles_move_only_the_multiply_adds() {
    let tiled = ScanShape {
        element_bytes: 2,
        ..layer_130m()
    };
    let cores = ScanShape {
        products: ScanProducts::TensorCores,
        ..tiled
    };
    for (t, x) in [
        (forward_launches(tiled), forward_launches(cores)),
        (backward_launches(tiled), backward_launches(cores)),
    ] {
        assert_eq!(t.len(), x.len());
        for (t, x) in t.iter().zip(&x) {
            assert_eq!(t.name, x.name);
            assert_eq!(
                t.product_flops + t.other_flops,
                x.product_flops + x.other_flops
            );
            assert_eq!(
                t.bytes_read + t.bytes_written,
                x.bytes_read + x.bytes_written
            );
            if t.kind == LaunchKind::Tiled {
                assert!(x.product_flops > t.product_flops, "{}", t.name);
            } else {
                assert_eq!(t.product_flops, x.product_flops, "{}", t.name);
            }
        }
    }
    // chunk_scan's tensor-core FLOPs are its intra-chunk product over the tiles on and below
    // the diagonal
    let scan = forward_launches(cores)
        .into_iter()
        .find(|x| x.name == "chunk_scan")
        .expect("chunk_scan");
    assert_eq!(scan.product_flops, chunk_scan_product_flops(cores));
    print_estimates(tiled);
}

/// One 130m layer's scan in bf16, forward and backward, per variant, at both rates.
fn print_estimates(tiled: ScanShape) {
    for rates in [Rates::h100(2), Rates::h200_calibrated(2)] {
        let layer = |products| {
            let s = ScanShape { products, ..tiled };
            (totals(&forward_launches(s), &rates).seconds
                + totals(&backward_launches(s), &rates).seconds)
                * 1e3
        };
        println!(
            "{}: one 130m layer's scan in bf16, forward and backward: tiled {:.2} ms, transient \
             {:.2} ms, tensor-core tiles {:.2} ms",
            rates.name,
            layer(ScanProducts::Tiled),
            layer(ScanProducts::Transient),
            layer(ScanProducts::TensorCores)
        );
    }
}
