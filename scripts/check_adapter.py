#!/usr/bin/env python3
"""Checks that PEFT reads the adapters a LoRA fine-tune writes (the run's `adapter/`): the base
model with them, as `peft.PeftModel.from_pretrained` loads it, gives the logits of the run's
`model/` (the adapters merged into the weights), and so does PEFT's own merge.

    cargo run --release --features tokenizer --example train -- --task lm --text FILE \\
        --init-from BASE --lora-rank 8 --artifacts RUN
    python3 scripts/check_adapter.py BASE RUN

BASE is the folder the run started from, in transformers' layout (a Mamba-2 folder as
`Mamba2ForCausalLM` saves it, or a hybrid's). Needs `pip install torch transformers peft`.
"""
import sys

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM


def load(folder):
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64,
                                                 attn_implementation="eager")
    model.config._experts_implementation = "eager"
    return model.eval()


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


def main(base, run):
    merged = load(f"{run}/model")
    vocab = merged.config.vocab_size
    ids = torch.arange(3, 3 + 2 * 24).remainder(vocab).reshape(2, 24) * 7 % vocab
    expected = logits(merged, ids)
    adapted = PeftModel.from_pretrained(load(base), f"{run}/adapter").eval()
    scale = expected.abs().max().item()
    err = (logits(adapted, ids) - expected).abs().max().item() / scale
    change = (logits(load(base), ids) - expected).abs().max().item() / scale
    folded = adapted.merge_and_unload()
    err_merged = (logits(folded, ids) - expected).abs().max().item() / scale
    print(f"base + adapter against the merged model: {err:.3g} (relative; the adapters "
          f"change the logits by {change:.3g}); PEFT's merge: {err_merged:.3g}")
    assert change > 1e-3, "the adapters change nothing: the check could not fail"
    assert err < 1e-5 and err_merged < 1e-5


if __name__ == "__main__":
    main(*sys.argv[1:3])
