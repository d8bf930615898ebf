#!/usr/bin/env python3
"""Golden cases of the hybrid language models (Mamba-2 layers with attention and MLPs: Granite
4.0-H, Bamba, Nemotron-H, Falcon-H1) from transformers 5.25's own implementations, in the format of ../shared/tools/make_reference.py:
float64 arithmetic on float32 weights, every parameter moved off its initial value, every
multiplier other than 1.

    pip install torch "transformers==5.25.0" safetensors
    python scripts/make_hybrid_reference.py DIR [CASE ...]

Each case is a folder as `save_pretrained` writes it (config.json, model.safetensors in float32)
plus expected.safetensors:
  input_ids          i64 [B, L]        the prompt
  logits             f32 [B, L, V]     full forward over input_ids, no cache
  layer_out.{i}      f32 [B, L, H]     residual stream after decoder layer i
  hidden_states      f32 [B, L, H]     after the final norm
  ssm_state.{i}      f32 [B, nh, hd, N]  Mamba layer i: SSM state after the prompt
  conv_state.{i}     f32 [B, C, K]     Mamba layer i: the last K pre-conv xBC columns
  key.{i}, value.{i} f32 [B, n_kv, L, head_dim]  attention layer i: the KV cache after the prompt
                                       (keys after the rotary embedding)
  decode_ids         i64 [B, T]        tokens fed one at a time after the prompt
  decode_logits      f32 [B, T, V]     logits of each single-token step through the cache
  loss               f32 [1]           mean next-token cross-entropy over input_ids
  grad.{name}        f32 like the tensor  d loss / d weight, under the names in model.safetensors
  greedy             i64 [B, 24]       transformers' generate(do_sample=False) after input_ids
"""
import os
import sys

import torch
from safetensors.torch import save_file
from safetensors import safe_open
from transformers import (BambaConfig, BambaForCausalLM, FalconH1Config, FalconH1ForCausalLM,
                          GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM, NemotronHConfig,
                          NemotronHForCausalLM)
from transformers.cache_utils import DynamicCache

GREEDY = 24


def perturb(model, g):
    """Move every parameter off its initial value, so that every term shows in the outputs; and
    the sigmoid routers' correction bias (a buffer, saved with the weights), so that it changes
    the choice of experts."""
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.2 * torch.randn(b.shape, generator=g))
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.log(torch.empty_like(p).uniform_(0.5, 8.0, generator=g)))
            elif name.endswith("dt_bias"):
                p.add_(torch.randn(p.shape, generator=g) * 0.5)
            elif name.endswith(".D"):
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.endswith("norm.weight") or name.endswith("norm_f.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                # linear and embedding weights: a larger spread than the 0.02 of the init, so that
                # attention is not uniform and the logits are not flat
                p.copy_(torch.randn(p.shape, generator=g) * (0.5 / p.shape[-1] ** 0.5))


def granite(layer_types, *, vocab=64, hidden=32, heads=4, kv_heads=2, mamba_heads=4, state=8,
            groups=2, chunk=8, rope=True, attention_bias=False, proj_bias=False, conv_bias=True,
            tie=False, embedding_multiplier=3.0, dt_limit=(0.0, float("inf")), experts=0, top_k=2):
    return GraniteMoeHybridConfig(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=len(layer_types),
        layer_types=list(layer_types), num_attention_heads=heads, num_key_value_heads=kv_heads,
        num_local_experts=experts, num_experts_per_tok=top_k, shared_intermediate_size=48,
        intermediate_size=40,
        mamba_n_heads=mamba_heads, mamba_d_state=state, mamba_n_groups=groups, mamba_d_conv=4,
        mamba_expand=2, mamba_chunk_size=chunk, mamba_conv_bias=conv_bias,
        mamba_proj_bias=proj_bias, attention_bias=attention_bias,
        position_embedding_type="rope" if rope else None,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        embedding_multiplier=embedding_multiplier, residual_multiplier=0.6, attention_multiplier=0.3,
        logits_scaling=2.5, rms_norm_eps=1e-5, time_step_limit=tuple(dt_limit),
        tie_word_embeddings=tie, pad_token_id=None, bos_token_id=None, eos_token_id=None,
        max_position_embeddings=256)


def bamba(attn_layer_indices, n_layers, *, vocab=64, hidden=32, heads=4, kv_heads=2,
          mamba_heads=4, state=8, groups=2, chunk=8, tie=False, rotary=0.5):
    # no multipliers in this family; the rotary embedding turns only part of each head
    return BambaConfig(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=n_layers,
        attn_layer_indices=list(attn_layer_indices), num_attention_heads=heads,
        num_key_value_heads=kv_heads, intermediate_size=48, mamba_n_heads=mamba_heads,
        mamba_d_state=state, mamba_n_groups=groups, mamba_d_conv=4, mamba_expand=2,
        mamba_chunk_size=chunk, mamba_conv_bias=True, mamba_proj_bias=True, attention_bias=True,
        mlp_bias=True, rope_parameters={"rope_type": "default", "rope_theta": 300.0,
                                        "partial_rotary_factor": rotary},
        rms_norm_eps=1e-5, tie_word_embeddings=tie, pad_token_id=None, bos_token_id=None,
        eos_token_id=None, max_position_embeddings=256)


def nemotron_h(pattern, *, vocab=64, hidden=32, heads=4, kv_heads=2, head_dim=12, mamba_heads=6,
               mamba_head_dim=8, state=8, groups=2, chunk=8, tie=True):
    # the `E` layers: 8 relu² experts in 4 groups of 2, 3 a token from the 2 best groups, the
    # chosen sigmoid scores normalised and scaled, a shared expert of its own width
    # one operation per layer; the Mamba width (heads · head_dim) and the attention's
    # (heads · head_dim) both differ from the residual stream's; `tie_word_embeddings` is set,
    # which this family ignores (its head is always its own tensor)
    return NemotronHConfig(
        vocab_size=vocab, hidden_size=hidden, hybrid_override_pattern=pattern,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        intermediate_size=40, mlp_hidden_act="relu2", mlp_bias=True, mamba_num_heads=mamba_heads,
        mamba_head_dim=mamba_head_dim, ssm_state_size=state, n_groups=groups, conv_kernel=4,
        chunk_size=chunk, use_bias=True, use_conv_bias=True, layer_norm_epsilon=1e-5,
        n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=24,
        moe_shared_expert_intermediate_size=36, n_group=4, topk_group=2, norm_topk_prob=True,
        routed_scaling_factor=1.7, tie_word_embeddings=tie, pad_token_id=None, bos_token_id=None,
        eos_token_id=None, max_position_embeddings=256)


def falcon_h1(n_layers, *, vocab=64, hidden=32, heads=4, kv_heads=2, d_ssm=48, mamba_heads=6,
              state=8, groups=2, chunk=8, rms_norm=True, proj_bias=True, projectors_bias=False,
              tie=False, embedding_multiplier=2.0):
    # attention and Mamba side by side in every layer; every μP multiplier other than 1
    return FalconH1Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=48, num_hidden_layers=n_layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, mamba_d_ssm=d_ssm,
        mamba_n_heads=mamba_heads, mamba_d_state=state, mamba_n_groups=groups, mamba_d_conv=4,
        mamba_expand=2, mamba_chunk_size=chunk, mamba_conv_bias=True, mamba_proj_bias=proj_bias,
        projectors_bias=projectors_bias, mamba_rms_norm=rms_norm, mamba_norm_before_gate=True,
        attention_bias=True, mlp_bias=True,
        rope_parameters={"rope_type": "default", "rope_theta": 300.0},
        lm_head_multiplier=0.7, embedding_multiplier=embedding_multiplier, mlp_multipliers=[1.3, 0.8],
        key_multiplier=0.6, attention_in_multiplier=1.2, attention_out_multiplier=0.9,
        ssm_multipliers=[0.9, 1.1, 1.2, 0.8, 1.3], ssm_in_multiplier=1.4, ssm_out_multiplier=0.75,
        rms_norm_eps=1e-5, tie_word_embeddings=tie, pad_token_id=None, bos_token_id=None,
        eos_token_id=None, max_position_embeddings=256)


MODELS = {GraniteMoeHybridConfig: GraniteMoeHybridForCausalLM, BambaConfig: BambaForCausalLM,
          NemotronHConfig: NemotronHForCausalLM, FalconH1Config: FalconH1ForCausalLM}


CASES = {
    # Mamba, attention (RoPE, GQA 4:2), Mamba; biases on every projection; several chunks
    "granite_dense": dict(config=lambda: granite(
        ["linear_attention", "full_attention", "linear_attention"], attention_bias=True,
        proj_bias=True), batch=2, seq=21, seed=11),
    # as Granite 4.0-H's MoE models are: 4 experts (2 a token) beside the shared MLP in every
    # layer, attention without positions (NoPE), no biases; here attention first, one KV head for
    # 4 query heads, tied embeddings. (With NoPE a bias on k_proj adds the same amount to every
    # score of a query, which the softmax cancels: its gradient is zero, and transformers' f32
    # softmax leaves only rounding noise to compare with.)
    "granite_moe_nope_tied": dict(config=lambda: granite(
        ["full_attention", "linear_attention", "linear_attention", "full_attention"], kv_heads=1,
        rope=False, tie=True, groups=1, chunk=4, embedding_multiplier=0.4, experts=4, top_k=2),
        batch=2, seq=13, seed=13),
    # Bamba: Mamba, attention (partial RoPE: 4 of 8 channels), Mamba, attention; biases on every
    # projection and the MLP; tied embeddings
    "bamba_partial_rope": dict(config=lambda: bamba([1, 3], 4, tie=True), batch=2, seq=19,
                               seed=17),
    # Nemotron-H: Mamba, attention (NoPE, head_dim 12), relu² MLP, Mamba, mixture of experts;
    # one operation per layer; Mamba width 48 for a stream of 32
    "nemotron_h_moe": dict(config=lambda: nemotron_h("M*-ME"), batch=2, seq=21, seed=19),
    # Falcon-H1: three layers of Mamba (width 48, norm before the gate, in_proj biased and
    # out_proj not) beside attention (full RoPE, GQA 4:2), every μP multiplier other than 1
    "falcon_h1_mup": dict(config=lambda: falcon_h1(3), batch=2, seq=19, seed=23),
    # Falcon-H1's defaults: no gated norm (y · silu(z)), width expand · hidden (d_ssm null),
    # out_proj biased and in_proj not, one group, chunks of 4 (a seed whose greedy tokens are
    # not one token repeated)
    "falcon_h1_plain": dict(config=lambda: falcon_h1(
        2, d_ssm=None, mamba_heads=4, rms_norm=False, proj_bias=False, projectors_bias=True,
        chunk=4, groups=1, embedding_multiplier=0.3), batch=2, seq=11, seed=31),
}


def as_saved(name, grad, saved):
    """A tensor shaped like parameter `name` (its value, its gradient) under the parameter's
    name(s) in the saved file: Nemotron-H saves `model.` as
    `backbone.`; the experts, which transformers holds stacked (`[experts, out, in]`), are saved
    as Granite's `input_linear` / `output_linear` and Nemotron-H's one tensor per expert, and
    Granite's router as `router.layer`."""
    if name != "lm_head.weight" and any(k.startswith("backbone.") for k in saved):
        name = "backbone." + name.removeprefix("model.")
    renames = {"experts.gate_up_proj": "input_linear.weight",
               "experts.down_proj": "output_linear.weight", "router.weight": "router.layer.weight"}
    for old, new in renames.items():
        if ".block_sparse_moe." in name and name.endswith(old):
            name = name.removesuffix(old) + new
    if name.endswith((".experts.up_proj", ".experts.down_proj")) and name not in saved:
        head, linear = name.rsplit(".", 1)
        return {f"{head}.{e}.{linear}.weight": g for e, g in enumerate(grad)}
    assert name in saved or name == "lm_head.weight", f"{name} is not in the saved file"
    return {name: grad}


def make_case(out, *, config, batch, seq, seed, decode=5):
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1)
    cfg = config()
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    model = MODELS[type(cfg)](cfg).float()
    perturb(model, g)
    model.save_pretrained(out, safe_serialization=True)
    layer_types = list(cfg.layer_types)
    with safe_open(os.path.join(out, "model.safetensors"), "pt") as f:
        saved = set(f.keys())
        # the names (and layouts) of the saved tensors are what the gradients are named by
        for name, p in model.named_parameters():
            for saved_as, value in as_saved(name, p.detach(), saved).items():
                if saved_as in saved:
                    assert torch.equal(f.get_tensor(saved_as), value), f"{saved_as} != {name}"
    vocab = cfg.vocab_size

    model = model.double().eval()
    exp = {}
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    exp["input_ids"] = ids
    outs = {}
    hooks = [layer.register_forward_hook(lambda m, i, o, k=k: outs.__setitem__(k, o))
             for k, layer in enumerate(model.model.layers)]
    with torch.no_grad():
        full = model(input_ids=ids, use_cache=False)
        hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
    for h in hooks:
        h.remove()
    exp["logits"] = full.logits.float()
    exp["hidden_states"] = hidden.float()
    for k in range(len(layer_types)):
        o = outs[k][0] if isinstance(outs[k], tuple) else outs[k]
        exp[f"layer_out.{k}"] = o.float()

    cache = DynamicCache(config=cfg)
    with torch.no_grad():
        pre = model(input_ids=ids, cache=cache, use_cache=True)
    cache = getattr(pre, "cache", None) or cache
    assert torch.allclose(pre.logits, full.logits, atol=1e-9, rtol=1e-9)
    for k, kind in enumerate(layer_types):
        if kind in ("linear_attention", "hybrid"):
            exp[f"ssm_state.{k}"] = cache.layers[k].recurrent_states[0].float().clone()
            exp[f"conv_state.{k}"] = cache.layers[k].conv_states[0].float().clone()
        if kind in ("full_attention", "hybrid"):
            exp[f"key.{k}"] = cache.layers[k].keys.float().clone()
            exp[f"value.{k}"] = cache.layers[k].values.float().clone()
    dec = torch.randint(0, vocab, (batch, decode), generator=g)
    exp["decode_ids"] = dec
    steps = []
    with torch.no_grad():
        for t in range(decode):
            # positions given: Bamba's forward would otherwise restart them at 0 for each step
            pos = torch.full((batch, 1), seq + t, dtype=torch.long)
            o = model(input_ids=dec[:, t:t + 1], position_ids=pos, cache=cache, use_cache=True)
            cache = getattr(o, "cache", None) or cache
            steps.append(o.logits[:, -1])
        steps = torch.stack(steps, 1)
        whole = model(input_ids=torch.cat([ids, dec], 1), use_cache=False).logits[:, seq:]
    err = (whole - steps).abs().max().item()
    if cfg.time_step_limit == (0.0, float("inf")):
        assert err < 1e-6, f"decode disagrees with the full forward: {err}"
        exp["decode_logits"] = steps.float()
    else:
        # transformers' single-token Mamba step ignores time_step_limit (its chunked path
        # clamps): the expected decode logits are the full forward's
        print(f"  note: the step ignores time_step_limit (differs by {err:.3g}); full-forward logits")
        exp["decode_logits"] = whole.float()

    with torch.no_grad():
        gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=GREEDY, min_new_tokens=GREEDY, pad_token_id=0)
    exp["greedy"] = gen[:, seq:].contiguous()

    model.zero_grad()
    logits = model(input_ids=ids, use_cache=False).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, vocab), ids[:, 1:].reshape(-1))
    loss.backward()
    exp["loss"] = loss.detach().float().reshape(1)
    for name, p in model.named_parameters():
        if p.grad is not None:
            for saved_as, grad in as_saved(name, p.grad.float(), saved).items():
                exp[f"grad.{saved_as}"] = grad.contiguous()
    if "lm_head.weight" not in saved:
        exp.pop("grad.lm_head.weight", None)
    save_file({k: v.contiguous() for k, v in exp.items()}, os.path.join(out, "expected.safetensors"))
    print(out, "loss", float(loss.detach()), "greedy", exp["greedy"][0, :8].tolist())


if __name__ == "__main__":
    root, names = sys.argv[1], sys.argv[2:] or list(CASES)
    for name in names:
        make_case(os.path.join(root, name), **CASES[name])
