#!/usr/bin/env python3
"""PyTorch CPU baseline for the hybrid models (transformers 5.25's own modeling files).

The hybrid counterpart of ../shared/tools/torch_bench.py, run beside
`cargo run --release --example bench -- --hybrid CONFIG`: the same model (a preset's or any
config.json, random weights, float32), the same random ids, one JSON line per mode.
  forward: prefill, no grad: the prompt's logits and the cache, tokens/s
  decode:  greedy decoding through the cache after the prompt, ms per token and tokens/s
  train:   next-token cross-entropy, backward, AdamW step, tokens/s

  pip install torch "transformers==5.25.0"
  python3 scripts/torch_hybrid_bench.py --config granite-4.0-h-350m --seq-len 512
"""
import argparse, json, os, resource, time

import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.cache_utils import DynamicCache

PRESETS = os.path.join(os.path.dirname(__file__), "..", "src", "checkpoint", "hybrid", "presets")

p = argparse.ArgumentParser()
p.add_argument("--config", default="granite-4.0-h-350m",
               help="a preset name (src/checkpoint/hybrid/presets) or a config.json")
p.add_argument("--seq-len", type=int, default=512)
p.add_argument("--batch", type=int, default=1)
p.add_argument("--decode-tokens", type=int, default=16)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--iters", type=int, default=3)
p.add_argument("--modes", default="forward,decode,train")
a = p.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(0)

path = a.config if os.path.exists(a.config) else os.path.join(PRESETS, a.config + ".json")
with open(path) as f:
    fields = json.load(f)
cfg = AutoConfig.for_model(**fields)
model = AutoModelForCausalLM.from_config(cfg).float()
ids = torch.randint(0, cfg.vocab_size, (a.batch, a.seq_len))
common = dict(config=a.config, params=sum(t.numel() for t in model.parameters()), seq_len=a.seq_len,
              batch=a.batch, threads=a.threads, impl="pytorch-transformers",
              transformers=__import__("transformers").__version__, torch=torch.__version__)


def timed(run):
    """Warm-up once, then the median seconds of --iters runs."""
    run()
    ts = []
    for _ in range(a.iters):
        t0 = time.perf_counter(); run(); ts.append(time.perf_counter() - t0)
    return sorted(ts)[len(ts) // 2]


def prefill():
    cache = DynamicCache(config=cfg)
    out = model(input_ids=ids, cache=cache, use_cache=True)
    return out.logits, getattr(out, "cache", None) or cache


def report(mode, **values):
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(dict(mode=mode, **values, peak_rss_mb=rss, **common)), flush=True)


modes = a.modes.split(",")
if "forward" in modes:
    model.eval()
    with torch.no_grad():
        med = timed(prefill)
    report("forward", tokens_per_s=a.batch * a.seq_len / med, median_s=med)
if "decode" in modes:
    model.eval()
    with torch.no_grad():
        logits, cache = prefill()
        token = logits[:, -1].argmax(-1, keepdim=True)
        ts = []
        for t in range(a.decode_tokens + 1):
            pos = torch.full((a.batch, 1), a.seq_len + t)
            t0 = time.perf_counter()
            out = model(input_ids=token, position_ids=pos, cache=cache, use_cache=True)
            cache = getattr(out, "cache", None) or cache
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            ts.append(time.perf_counter() - t0)
    med = sorted(ts[1:])[len(ts[1:]) // 2]  # the first step warms up
    report("decode", ms_per_token=med * 1e3, tokens_per_s=a.batch / med, median_s=med,
           prompt=a.seq_len, decode_tokens=a.decode_tokens)
if "train" in modes:
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad()
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        opt.step()

    med = timed(step)
    report("train", tokens_per_s=a.batch * a.seq_len / med, median_s=med)
