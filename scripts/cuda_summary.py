#!/usr/bin/env python3
"""The summary of one `scripts/cuda-check.sh run`, as JSON on stdout.

Reads the run's work folder: `steps` (a line per step: name, passed / failed / timed_out /
skipped, seconds) and `NAME.out` (each step's output: the bench's and the peers' JSON lines, the
tests' result and worst-error lines). Gives each step's status, the cold start, the tests'
figures, both paths' SSD and LM figures beside mamba_ssm's (the fused path's with each variant
of its intra-chunk products), the default path each type's figures choose and the variant they
choose, the decoding latency, and the issues' goals with the figures that meet them or not.
"""
import json, os, re, sys

work = sys.argv[1]


def lines(name):
    path = os.path.join(work, name + ".out")
    if not os.path.exists(path):
        return []
    with open(path, errors="replace") as f:
        return f.read().splitlines()


def records(name):
    out = []
    for line in lines(name):
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


steps = []
with open(os.path.join(work, "steps")) as f:
    for line in f:
        name, status, seconds = line.split()
        steps.append({"step": name, "status": status, "seconds": int(seconds)})
summary = {"steps": steps}
standin = False


def cold(name):
    global standin
    for r in records(name):
        standin |= bool(r.get("standin"))
        if r.get("mode") == "train":
            return {k: r.get(k) for k in ("first_run_s", "first_done_s", "second_done_s",
                                          "median_s", "kernels_compiled", "ssd", "backend")}
    return None


c, w = cold("cold_start"), cold("warm_start")
summary["cold_start"] = {"cold": c, "warm": w}

tests = {}
for name in ("tests_lib", "tests_suite"):
    out = lines(name)
    tests[name] = {
        "results": [l.strip() for l in out if l.startswith("test result:")],
        "failed": [l.strip() for l in out if re.match(r"^test .* FAILED$", l) or "FAIL " in l],
        "figures": [l.strip() for l in out if "worst" in l or "held-out loss" in l],
    }
summary["tests"] = tests

ssd = []
for dtype in ("f32", "bf16"):
    for r in records("ssd_" + dtype):
        standin |= bool(r.get("standin"))
        if r.get("mode") in ("ssd", "ssd-train"):
            ssd.append({"dtype": dtype, "ssd": r.get("ssd"), "scan_products": r.get("scan_products"),
                        "mode": r["mode"],
                        "ms": r["median_s"] * 1e3, "model_ms_h100": r.get("model_ms_h100"),
                        "model_ms_h200_calibrated": r.get("model_ms_h200_calibrated"),
                        "first_run_s": r.get("first_run_s")})
summary["ssd"] = ssd

lm = []
for r in records("lm_bf16"):
    standin |= bool(r.get("standin"))
    if r.get("mode") in ("train", "forward"):
        lm.append({"ssd": r.get("ssd"), "scan_products": r.get("scan_products"),
                   "mode": r["mode"], "batch": r["config"]["batch"],
                   "tokens_per_s": r.get("tokens_per_s"), "ms": r["median_s"] * 1e3,
                   "device_reserved_mb": r.get("device_reserved_mb")})
summary["lm"] = lm

# the GPU recipe: f32 weights, bf16 compute (train_lm's mixed precision)
mixed = []
for r in records("lm_mixed"):
    standin |= bool(r.get("standin"))
    if r.get("mode") == "train":
        mixed.append({"ssd": r.get("ssd"), "batch": r["config"]["batch"],
                      "mixed_precision": r.get("mixed_precision"),
                      "tokens_per_s": r.get("tokens_per_s"), "ms": r["median_s"] * 1e3,
                      "device_reserved_mb": r.get("device_reserved_mb")})
summary["lm_mixed"] = mixed

# decoding with the tensor step, greedy, bf16
decode = []
for r in records("decode"):
    standin |= bool(r.get("standin"))
    if r.get("mode") == "decode":
        decode.append({"batch": r["config"]["batch"], "ms_per_token": r.get("ms_per_token"),
                       "tokens_per_s": r.get("tokens_per_s")})
summary["decode"] = decode

peers = records("peers")
standin |= any(r.get("standin") for r in peers)
summary["peers"] = [r for r in peers if r.get("part") in ("ssd", "lm", "env")]


def find(rows, **kw):
    for r in rows:
        if all(r.get(k) == v for k, v in kw.items()):
            return r
    return None


# the variant of the fused path's intra-chunk products per type: the fastest in the sum of
# that type's measurements in which every variant ran (one layer's SSD forward and training;
# in bf16 also the LM's training and forward at batch 8); the fused path's figures below are
# the chosen variant's
VARIANTS = ("tiled", "transient", "tensor-cores")
products = {}
for dtype in ("f32", "bf16"):
    rows = [[find(ssd, dtype=dtype, ssd="fused", scan_products=v, mode=mode) for v in VARIANTS]
            for mode in ("ssd", "ssd-train")]
    if dtype == "bf16":
        rows += [[find(lm, ssd="fused", scan_products=v, mode=mode, batch=8) for v in VARIANTS]
                 for mode in ("train", "forward")]
    ran = [v for k, v in enumerate(VARIANTS) if any(r[k] for r in rows)]
    rows = [r for r in rows if all(r[VARIANTS.index(v)] for v in ran)]
    totals = {v: sum(r[VARIANTS.index(v)]["ms"] for r in rows) for v in ran}
    products[dtype] = min(totals, key=totals.get) if rows and totals else None
    summary.setdefault("scan_products_ms", {})[dtype] = totals
summary["scan_products"] = products


def fused(rows, of, **kw):
    """The fused path's row of the variant chosen for type `of` (tiled where none was)."""
    return find(rows, ssd="fused", scan_products=products.get(of) or "tiled", **kw)


# the default path per type: fused (its chosen variant) where it is at least as fast as the
# tensor operations in every measurement of that type (one layer's SSD forward and training;
# in bf16 also the LM)
default = {}
for dtype in ("f32", "bf16"):
    verdict, compared = "fused", 0
    for mode in ("ssd", "ssd-train"):
        f, t = fused(ssd, dtype, dtype=dtype, mode=mode), find(ssd, dtype=dtype, ssd="tensor-ops", mode=mode)
        if f and t:
            compared += 1
            if f["ms"] > t["ms"]:
                verdict = "tensor-ops"
    if dtype == "bf16":
        for mode in ("train", "forward"):
            f = fused(lm, dtype, mode=mode, batch=8)
            t = find(lm, ssd="tensor-ops", mode=mode, batch=8)
            if f and t:
                compared += 1
                if f["tokens_per_s"] < t["tokens_per_s"]:
                    verdict = "tensor-ops"
    default[dtype] = verdict if compared else None
summary["default_path"] = default

goals = {}
if c:
    goals["first_130m_step_within_30_s_cold"] = {"s": c["first_done_s"], "met": c["first_done_s"] <= 30}
if w:
    goals["first_130m_step_within_5_s_warm"] = {"s": w["first_done_s"], "met": w["first_done_s"] <= 5}
peer_ssd = find(summary["peers"], part="ssd", dtype="bf16")
ours = fused(ssd, "bf16", dtype="bf16", mode="ssd-train")
if ours:
    goals["ssd_layer_train_within_1_5_ms_bf16"] = {"ms": ours["ms"], "met": ours["ms"] <= 1.5,
                                                   "scan_products": ours["scan_products"]}
    if peer_ssd:
        goals["ssd_layer_train_vs_mamba_ssm"] = {"ms": ours["ms"], "mamba_ssm_ms": peer_ssd["train_ms"],
                                                  "speedup": peer_ssd["train_ms"] / ours["ms"]}
for batch in (8,):
    best = max((r["tokens_per_s"] for r in lm if r["mode"] == "train" and r["batch"] == batch), default=None)
    peer = find(summary["peers"], part="lm", dtype="bf16", batch=batch)
    if best:
        g = {"tokens_per_s": best}
        if peer and "train_tokens_per_s" in peer:
            g["mamba_ssm_tokens_per_s"] = peer["train_tokens_per_s"]
            g["speedup"] = best / peer["train_tokens_per_s"]
        if batch == 8:
            g["met"] = best >= 250e3
        goals[f"lm_130m_train_batch_{batch}" + ("_at_least_250k" if batch == 8 else "")] = g
recipe = find(mixed, batch=8)
if recipe and recipe["tokens_per_s"]:
    g = {"tokens_per_s": recipe["tokens_per_s"], "met": recipe["tokens_per_s"] >= 250e3}
    peer = find(summary["peers"], part="lm", dtype="bf16", batch=8)
    if peer and "train_tokens_per_s" in peer:
        g["mamba_ssm_tokens_per_s"] = peer["train_tokens_per_s"]
        g["speedup"] = recipe["tokens_per_s"] / peer["train_tokens_per_s"]
    goals["lm_130m_train_mixed_bf16_batch_8_at_least_250k"] = g
one = find(decode, batch=1)
if one and one["ms_per_token"] is not None:
    goals["decode_130m_batch_1_within_2_ms_per_token"] = {"ms_per_token": one["ms_per_token"],
                                                          "met": one["ms_per_token"] <= 2.0}
summary["goals"] = goals
summary["dry_run"] = standin
print(json.dumps(summary, indent=1))
