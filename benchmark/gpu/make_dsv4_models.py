#!/usr/bin/env python3
"""Build a tiny DeepSeek-V4 target with its MTP draft for SGLang 0.5.12's DeepSeek-V4 path.

Usage: python3 benchmark/gpu/make_dsv4_models.py OUTDIR [--layout mixed|swa] [--config-only]
  -> OUTDIR/target and OUTDIR/draft (the same checkpoint: SGLang 0.5.12 turns a
     DeepseekV4ForCausalLM draft into DeepseekV4ForCausalLMNextN and loads
     model.layers.{num_hidden_layers}.* as its MTP layer), OUTDIR/prompts.json.

What 0.5.12 insists on (models/deepseek_v4.py, layers/attention/deepseek_v4_backend.py,
mem_cache/deepseek_v4_memory_pool.py): one KV head, head_dim 512 of which 64 are rope (the fp8
KV layout is 448 + 2 * 64 + 8 bytes a token), sliding window 128, compress ratios in {0, 4, 128}
(the MTP layer is always 0), index_topk 512 or 1024, a rope_scaling dict (yarn), page size 256
and fp8 KV (set by the server). The checkpoint is unquantised bf16, so the server needs
SGLANG_OPT_FP8_WO_A_GEMM=0 (0.5.12 asserts an fp8 wo_a scale otherwise) and
SGLANG_DSV4_FP4_EXPERTS=0. Sizes otherwise follow DeepSeek-V4 where a kernel might care (64 query
heads, hc_mult 4, 256 routed experts, top 6, sqrtsoftplus, index 64 x 128) and are small where
only a matrix size changes (hidden 1024, q/o lora rank 256, expert width 128, 2 or 3 layers).

Layouts: "mixed" = compress ratios [0, 4, 128] (a sliding-window layer, a C4 layer with its
indexer, a C128 layer: what DeepSeek-V4 interleaves), "swa" = [0, 0].

Weights: the greedy output is a bigram rule, x_{i+1} = nxt(x_i) for a fixed random permutation
nxt, with a logit margin of about 100. Every attention output is kept small (wo_b ~ 1e-3) and
every MLP / expert down_proj is 0, so the residual stream carries the token embedding;
hyper-connection mixing weights are 0 (every stream the same, sinkhorn of a uniform matrix), and
lm_head row nxt(t) = 4.7 * unit(embedding t). The MTP layer takes e_proj = I, h_proj = 0, so it
predicts nxt(x) from the token it is fed: a draft that runs is always accepted (accept length
num_steps + 1). Attention does not decide the output here: these models tell a draft that
crashes or produces NaN from one that runs, not a draft that reads wrong-but-finite KV.
"""
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_models as mm  # noqa: E402  (tokenizer and prompts shared with the Llama models)

V = mm.V  # 32000
H = 1024
N_HEADS, HEAD_DIM, ROPE = 64, 512, 64
Q_LORA, O_LORA, O_GROUPS = 256, 256, 8
WINDOW = 128
HC = 4
MIX_HC = (2 + HC) * HC  # 24
N_EXPERTS, TOPK, I_MOE = 256, 6, 128
INDEX_HEADS, INDEX_DIM, INDEX_TOPK = 64, 128, 512
CTX = 4096
LOGIT_GAIN = 4.7  # correct logit ~ 4.7 * sqrt(H) = 150, wrong ones below ~ 25
SEED = 2468
LAYOUTS = {"mixed": [0, 4, 128], "swa": [0, 0]}


def config_dict(ratios):
    n = len(ratios)
    return {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "vocab_size": V,
        "hidden_size": H,
        "num_hidden_layers": n,
        "num_nextn_predict_layers": 1,
        "num_attention_heads": N_HEADS,
        "num_key_value_heads": 1,
        "head_dim": HEAD_DIM,
        "qk_rope_head_dim": ROPE,
        "qk_nope_head_dim": HEAD_DIM - ROPE,
        "v_head_dim": HEAD_DIM,
        "kv_lora_rank": HEAD_DIM,
        "q_lora_rank": Q_LORA,
        "o_lora_rank": O_LORA,
        "o_groups": O_GROUPS,
        "sliding_window": WINDOW,
        "window_size": WINDOW,
        "compress_ratios": list(ratios) + [0],
        "compress_rope_theta": 160000,
        "rope_theta": 10000,
        "rope_scaling": {
            "type": "yarn",
            "factor": 16,
            "original_max_position_embeddings": 256,
            "beta_fast": 32,
            "beta_slow": 1,
        },
        "max_position_embeddings": CTX,
        "index_n_heads": INDEX_HEADS,
        "index_head_dim": INDEX_DIM,
        "index_topk": INDEX_TOPK,
        "hc_mult": HC,
        "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6,
        "n_routed_experts": N_EXPERTS,
        "n_shared_experts": 1,
        "num_experts_per_tok": TOPK,
        "moe_intermediate_size": I_MOE,
        "intermediate_size": I_MOE,
        "routed_scaling_factor": 1.5,
        "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc",
        "n_group": 8,
        "topk_group": 8,
        "norm_topk_prob": True,
        "first_k_dense_replace": 0,
        "moe_layer_freq": 1,
        "num_hash_layers": 0,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
    }


def rand(g, *shape, std=0.02):
    return torch.randn(*shape, generator=g) * std


def compressor(g, prefix, ratio, head_dim):
    coff = 2 if ratio == 4 else 1
    return {
        prefix + "wkv.weight": rand(g, coff * head_dim, H),
        prefix + "wgate.weight": rand(g, coff * head_dim, H),
        prefix + "ape": torch.zeros(ratio, coff * head_dim),
        prefix + "norm.weight": torch.ones(head_dim),
    }


def decoder_layer(g, p, ratio):
    """The weights of one DeepseekV4DecoderLayer under prefix p (HF-style names)."""
    a = p + "self_attn."
    sd = {
        a + "attn_sink": torch.zeros(N_HEADS),
        a + "wq_a.weight": rand(g, Q_LORA, H),
        a + "q_norm.weight": torch.ones(Q_LORA),
        a + "wq_b.weight": rand(g, N_HEADS * HEAD_DIM, Q_LORA),
        a + "wkv.weight": rand(g, HEAD_DIM, H),
        a + "kv_norm.weight": torch.ones(HEAD_DIM),
        a + "wo_a.weight": rand(g, O_GROUPS * O_LORA, N_HEADS * HEAD_DIM // O_GROUPS),
        a + "wo_b.weight": rand(g, H, O_GROUPS * O_LORA, std=1e-3),
    }
    if ratio:
        sd.update(compressor(g, a + "compressor.", ratio, HEAD_DIM))
    if ratio == 4:
        sd.update(
            {
                a + "indexer.wq_b.weight": rand(g, INDEX_HEADS * INDEX_DIM, Q_LORA),
                a + "indexer.weights_proj.weight": rand(g, INDEX_HEADS, H),
            }
        )
        sd.update(compressor(g, a + "indexer.compressor.", 4, INDEX_DIM))
    m = p + "mlp."
    sd.update({m + "gate.weight": rand(g, N_EXPERTS, H), m + "gate.e_score_correction_bias": torch.zeros(N_EXPERTS)})
    for e in [f"experts.{i}." for i in range(N_EXPERTS)] + ["shared_experts."]:
        sd.update(
            {
                m + e + "gate_proj.weight": rand(g, I_MOE, H),
                m + e + "up_proj.weight": rand(g, I_MOE, H),
                m + e + "down_proj.weight": torch.zeros(H, I_MOE),
            }
        )
    sd.update({p + "input_layernorm.weight": torch.ones(H), p + "post_attention_layernorm.weight": torch.ones(H)})
    for k in ("attn", "ffn"):
        sd.update(
            {
                p + f"hc_{k}_fn": torch.zeros(MIX_HC, HC * H),
                p + f"hc_{k}_base": torch.zeros(MIX_HC),
                p + f"hc_{k}_scale": torch.ones(3),
            }
        )
    return sd


FP32_SUFFIXES = ("attn_sink", "e_score_correction_bias", ".ape", "compressor.norm.weight", "_fn", "_base", "_scale")


def state_dict(ratios, g):
    E = torch.randn(V, H, generator=g)
    E = E / E.norm(dim=1, keepdim=True) * H**0.5  # rms 1 per row
    nxt = torch.randperm(V, generator=g)
    lm_head = torch.empty(V, H)
    lm_head[nxt] = LOGIT_GAIN * E / H**0.5  # row nxt(t) = gain * unit(e_t)
    sd = {
        "model.embed_tokens.weight": E,
        "lm_head.weight": lm_head,
        "model.norm.weight": torch.ones(H),
        "model.hc_head_fn": torch.zeros(HC, HC * H),
        "model.hc_head_base": torch.zeros(HC),
        "model.hc_head_scale": torch.ones(1),
    }
    for i, r in enumerate(ratios):
        sd.update(decoder_layer(g, f"model.layers.{i}.", r))
    p = f"model.layers.{len(ratios)}."  # the MTP layer, DeepSeek-V3 style
    sd.update(decoder_layer(g, p, 0))
    sd.update(
        {
            p + "enorm.weight": torch.ones(H),
            p + "hnorm.weight": torch.ones(H),
            p + "e_proj.weight": torch.eye(H),
            p + "h_proj.weight": torch.zeros(H, H),
            p + "shared_head.norm.weight": torch.ones(H),
            p + "hc_head_fn": torch.zeros(HC, HC * H),
            p + "hc_head_base": torch.zeros(HC),
            p + "hc_head_scale": torch.ones(1),
        }
    )
    return sd, nxt


def save(path, sd, ratios):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config_dict(ratios), f, indent=1)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}, f)
    if sd is None:
        return
    from safetensors.torch import save_file

    out = {k: (v.float() if k.endswith(FP32_SUFFIXES) else v.to(torch.bfloat16)).contiguous() for k, v in sd.items()}
    save_file(out, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})


def bigram_continuation(ids, nxt, n):
    seq = [int(ids[-1])]
    for _ in range(n):
        seq.append(int(nxt[seq[-1]]))
    return seq[1:]


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    out = args[0] if args else "/tmp/dsv4_models"
    layout = sys.argv[sys.argv.index("--layout") + 1] if "--layout" in sys.argv else "mixed"
    ratios = LAYOUTS[layout]
    tgt, dft = os.path.join(out, "target"), os.path.join(out, "draft")
    if "--config-only" in sys.argv:
        for p in (tgt, dft):
            save(p, None, ratios)
        mm.build_tokenizer([tgt, dft])
        print("configs in", out)
        return
    g = torch.Generator().manual_seed(SEED)
    tok = mm.build_tokenizer([tgt, dft])
    sd, nxt = state_dict(ratios, g)
    save(tgt, sd, ratios)
    save(dft, None, ratios)  # the draft is the same checkpoint
    weights = os.path.join(dft, "model.safetensors")
    if not os.path.exists(weights):
        os.link(os.path.join(tgt, "model.safetensors"), weights)
    prompts = mm.make_prompts(tok, torch.Generator().manual_seed(7))
    exp = {}
    for name, ps in [
        ("short", prompts["short"]),
        ("long_1k", [prompts["long_1k"]]),
        ("long_1900", [prompts["long_1900"]]),
    ]:
        exp[name] = [bigram_continuation(tok(p)["input_ids"], nxt, mm.EXPECTED_NEW) for p in ps]
    prompts["expected_rule"] = exp
    prompts["rule"] = "bigram: x_{i+1} = nxt(x_i)"
    prompts["layout"] = {"name": layout, "compress_ratios": ratios}
    with open(os.path.join(out, "prompts.json"), "w") as f:
        json.dump(prompts, f)
    n_params = sum(v.numel() for v in sd.values())
    print(f"dsv4 models ({layout}, compress ratios {ratios}) in {out}: {n_params / 1e6:.0f} M parameters")


if __name__ == "__main__":
    main()
