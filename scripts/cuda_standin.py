#!/usr/bin/env python3
"""Stand-ins for `scripts/cuda-check.sh dry-run`: the bench, the two test binaries and the peer
tool, by the name they are called under. Each prints lines in the format of the real one (the
bench's and the peers' JSON lines, libtest's result lines and the tests' worst-error lines),
every figure a placeholder marked `"standin": true` or `(stand-in)`, after a short sleep. They
check the script's steps, limits and summary, not a GPU.
"""
import json, os, sys, time

name = os.path.basename(sys.argv[0])
args = sys.argv[1:]
if name.endswith(".py"):  # run as `python3 cuda_standin.py`: the peer tool
    name = "peer"
time.sleep(float(os.environ.get("STANDIN_SLEEP", "0.2")))


def arg(flag, default):
    return args[args.index(flag) + 1] if flag in args else default


def out(**kw):
    print(json.dumps(dict(kw, standin=True)), flush=True)


if name == "bench":
    modes = arg("--mode", "train").split(",")
    batches = [int(b) for b in arg("--batch", "1").split(",")]
    paths = arg("--ssd", "fused").split(",")
    variants = arg("--scan-products", "tiled").split(",")
    dtype = arg("--dtype", "f32")
    out(mode="setup", since_start_s=0.0, cubecl_cache=os.environ.get("MAMBA2_BURN_CUBECL_CACHE"))
    t = 0.0
    if "ssd-cost" in modes:
        for products in variants:
            out(mode="ssd-cost", summary=True, scan_products=products, ssd_train_ms_h100=0.0)
    runs = [(p, v) for p in paths for v in (variants[:1] if p == "tensor-ops" else variants)]
    for batch in batches:
        for path, products in runs:
            for mode in modes:
                if mode == "ssd-cost":
                    continue
                t += 1.0
                line = dict(mode=mode, median_s=0.001, iters=int(arg("--iters", "5")),
                            first_run_s=1.0, first_done_s=t, second_done_s=t + 0.001,
                            backend="cuda-" + dtype, ssd=path, scan_products=products,
                            mixed_precision=arg("--mixed-precision", None),
                            config={"batch": batch, "seq_len": 2048, "n_layer": 24},
                            kernels_compiled={"first_run": 0, "last_run": 0})
                if mode in ("train", "forward", "ssd-train"):
                    line["tokens_per_s"] = batch * 2048 / 0.001
                if mode == "decode":
                    line["ms_per_token"] = 1.0
                    line["tokens_per_s"] = batch / 0.001
                if mode in ("ssd", "ssd-train"):
                    line["model_ms_h100"] = 0.0
                    line["model_ms_h200_calibrated"] = 0.0
                out(**line)
elif name in ("mamba2_burn", "suite"):
    tests = {
        "mamba2_burn": ["ssd::cubecl::tests::fused_matches_tensor_ops_on_cuda",
                        "ssd::cubecl::tests::indices_past_u32_read_the_right_elements_on_cuda"],
        "suite": ["reference::cuda::reference_cases_cuda", "paths::cuda::chunked_matches_sequential"],
    }[name]
    print(f"\nrunning {len(tests)} tests")
    for t in tests:
        print(f"test {t} ... ok")
    print("fused vs tensor operations: worst relative error 0.00e0 (outputs, states), 0.00e0 (gradients) (stand-in)",
          file=sys.stderr)
    print(f"\ntest result: ok. {len(tests)} passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.20s (stand-in)\n")
elif name == "peer":
    out(part="env", torch="stand-in", triton="stand-in", gpu="stand-in", autotune_configs=2)
    for dtype in arg("--dtypes", "bf16").split(","):
        out(part="ssd", impl="mamba_ssm-triton", dtype=dtype, forward_ms=1.0, train_ms=1.0)
        for batch in [int(b) for b in arg("--batches", "1,8").split(",")]:
            out(part="lm", impl="mamba_ssm", dtype=dtype, batch=batch, train_tokens_per_s=1.0,
                forward_tokens_per_s=1.0)
else:
    sys.exit(f"cuda_standin.py: no stand-in for {name}")
