#!/usr/bin/env python3
"""Checks that Python reads the checkpoints `save_checkpoint` writes (the `convert` example),
against a reference case's expected outputs:

    cargo run --release --example convert -- --from tests/fixtures/reference/tiny --to OUT --format hf
    python3 scripts/check_export.py OUT tests/fixtures/reference/tiny

- a Hugging Face folder is loaded with `Mamba2ForCausalLM.from_pretrained`;
- a state-spaces folder must hold only the keys mamba_ssm's `MambaConfig` and `Mamba2` take
  (mamba_ssm itself needs CUDA to install; its signatures are listed below, from
  mamba_ssm/models/config_mamba.py and mamba_ssm/modules/mamba2.py), and its tensors are
  loaded into the equivalent transformers model under transformers' names.
Then the logits of the case's prompt and the greedy generation must equal the case's.

A hybrid model's folder (Granite 4.0-H, Bamba, Nemotron-H, Falcon-H1, against a case of
tests/fixtures/hybrid) is loaded with `AutoModelForCausalLM.from_pretrained`; its logits must equal
the case's and transformers' greedy tokens its `greedy`.
Needs `pip install torch transformers safetensors`.
"""
import json
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, Mamba2Config, Mamba2ForCausalLM

HYBRIDS = {"granitemoehybrid", "bamba", "nemotron_h", "falcon_h1"}

MAMBA_CONFIG = {"d_model", "d_intermediate", "n_layer", "vocab_size", "ssm_cfg", "attn_layer_idx",
                "attn_cfg", "rms_norm", "residual_in_fp32", "fused_add_norm",
                "pad_vocab_size_multiple", "tie_embeddings"}
MAMBA2_ARGS = {"layer", "d_state", "d_conv", "conv_init", "expand", "headdim", "d_ssm", "ngroups",
               "A_init_range", "D_has_hdim", "rmsnorm", "norm_before_gate", "dt_min", "dt_max",
               "dt_init_floor", "dt_limit", "bias", "conv_bias", "chunk_size", "use_mem_eff_path"}


def state_spaces_model(out):
    with open(f"{out}/config.json") as f:
        conf = json.load(f)
    extra = set(conf) - MAMBA_CONFIG
    assert not extra, f"keys MambaConfig does not take: {extra}"
    ssm = conf["ssm_cfg"]
    extra = set(ssm) - MAMBA2_ARGS
    assert not extra, f"ssm_cfg keys Mamba2 does not take: {extra}"
    assert not ssm["D_has_hdim"] and ssm["rmsnorm"] and not ssm["norm_before_gate"]
    multiple = conf["pad_vocab_size_multiple"]
    vocab = -(-conf["vocab_size"] // multiple) * multiple
    cfg = Mamba2Config(vocab_size=vocab, hidden_size=conf["d_model"], num_hidden_layers=conf["n_layer"],
                       num_heads=ssm["expand"] * conf["d_model"] // ssm["headdim"], head_dim=ssm["headdim"],
                       state_size=ssm["d_state"], n_groups=ssm["ngroups"], conv_kernel=ssm["d_conv"],
                       chunk_size=ssm["chunk_size"], expand=ssm["expand"], use_bias=ssm["bias"],
                       use_conv_bias=ssm["conv_bias"], time_step_limit=tuple(ssm["dt_limit"]),
                       tie_word_embeddings=conf["tie_embeddings"], pad_token_id=None,
                       bos_token_id=None, eos_token_id=None)
    weights = {k.replace("backbone.embedding.", "backbone.embeddings."): v
               for k, v in load_file(f"{out}/model.safetensors").items()}
    model = Mamba2ForCausalLM(cfg)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.backbone.embeddings.weight
    return model


def logits_error(model, exp):
    """The largest difference of `model`'s logits from the case's, relative to their largest
    magnitude (at most 1e-4)."""
    with torch.no_grad():
        logits = model(input_ids=exp["input_ids"], use_cache=False).logits.float()
    err = (logits - exp["logits"]).abs().max().item() / exp["logits"].abs().max().item()
    assert err < 1e-4, f"logits differ by {err:.3g} (relative)"
    return err


def hybrid(out, case):
    """A hybrid folder read by transformers: the case's logits and greedy tokens."""
    model = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    # the experts one by one, as the golden cases were made (the grouped kernels take no f64)
    model.config._experts_implementation = "eager"
    model = model.double().eval()
    exp = load_file(f"{case}/expected.safetensors")
    ids = exp["input_ids"]
    err = logits_error(model, exp)
    with torch.no_grad():
        n = exp["greedy"].shape[1]
        gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=n, min_new_tokens=n, pad_token_id=0)
    assert torch.equal(gen[:, ids.shape[1]:], exp["greedy"]), "greedy tokens differ"
    print(f"{out}: {model.config.model_type} folder read by transformers; logits within "
          f"{err:.1e} of the case's, the same greedy tokens")


def main():
    out, case = sys.argv[1], sys.argv[2]
    with safe_open(f"{out}/model.safetensors", "pt") as f:
        assert f.metadata() == {"format": "pt"}, f.metadata()
    with open(f"{out}/config.json") as f:
        conf = json.load(f)
    if conf.get("model_type") in HYBRIDS:
        return hybrid(out, case)
    is_hf = "hidden_size" in conf
    model = Mamba2ForCausalLM.from_pretrained(out) if is_hf else state_spaces_model(out)
    model = model.double().eval()
    exp = load_file(f"{case}/expected.safetensors")
    ids = exp["input_ids"]
    err = logits_error(model, exp)
    # greedy decoding by its definition (transformers' generate ignores time_step_limit)
    seq = ids
    with torch.no_grad():
        for _ in range(exp["generate_ids"].shape[1]):
            last = model(input_ids=seq, use_cache=False).logits[:, -1]
            seq = torch.cat([seq, last.argmax(-1, keepdim=True)], 1)
    assert torch.equal(seq[:, ids.shape[1]:], exp["generate_ids"]), "greedy generation differs"
    print(f"{out}: {'Hugging Face' if is_hf else 'state-spaces'} format read by transformers; "
          f"logits within {err:.1e} of the case's, the same greedy ids")


if __name__ == "__main__":
    main()
