#!/usr/bin/env python3
"""Build a tiny DeepSeek-V3-style MLA target with its NextN (MTP) draft, whose greedy output is
a fixed rule read through attention, and whose draft reproduces the target exactly.

Usage: python3 benchmark/gpu/make_deepseek_models.py OUTDIR [--check]
  -> OUTDIR/target (DeepseekV3ForCausalLM, 2 dense layers + the NextN layer as model.layers.2),
     OUTDIR/draft (the same checkpoint: SGLang 0.5.12 turns a DeepseekV3ForCausalLM draft into
     DeepseekV3ForCausalLMNextN and loads model.layers.{num_hidden_layers}.*), OUTDIR/prompts.json
  --check: also run a float32 reference of the MLA forward here (CPU) and check the rule.

Same tokenizer, prompts and rule as make_models.py (the Llama models): the next token after
(..., x_{i-1}, x_i) is sigma^-1(x_{i-1}) with a wide logit margin.

MLA dimensions are DeepSeek's (kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128,
v_head_dim 128): FlashInfer's MLA kernels (BatchMLAPagedAttentionWrapper) are built for
head_dim_ckv 512 / head_dim_kpe 64, and the ragged MHA prefill for head_dim_qk 192 / head_dim_vo
128. 16 heads (as DeepSeek-V2-Lite), q_lora_rank None (q_proj), hidden 256.

Weights (hidden dims 0..127 carry a random token embedding with |e|^2 = 255, dim 255 is 1.0):
  * q_proj: q_nope = 0; q_pe = A * u_q from dim 255.  kv_a_proj_with_mqa: c_kv[0:128] = h[0:128],
    k_pe = A * u_k from dim 255 (u_k = u_q rotated by one position, in the interleaved rope
    layout SGLang uses for DeepSeek: rope_interleave true -> is_neox_style False).  With k_nope = 0
    (kv_b_proj's k part, hence w_kc = 0) the score is the rope term alone and peaks at the
    previous position.
  * kv_a_layernorm weight sqrt(255/512) (so the normalised latent of layer 0 equals e), kv_b_proj's
    v part of head 0 = identity on latent dims 0..127, o_proj puts C * v_head0 into dims 0..127.
  * dense MLP with down_proj = 0 (layers 0, 1: first_k_dense_replace = 2); the NextN layer's MoE
    (SGLang makes the NextN layer sparse always) has every expert's and the shared expert's
    down_proj = 0.
  * lm_head row j = e_{sigma(j)}.  NextN: enorm = hnorm = 1, eh_proj = [I, 0] (uses the token
    embedding only), decoder layer = target layer 0, shared_head.norm = 1; SGLang shares the
    target's embed_tokens and lm_head with the draft.
  => the draft at position p (input x_{p+1}) reads x_p from its own KV cache at p - 1 and predicts
  sigma^-1(x_p) = x_{p+2}: every draft token is accepted when the draft KV layout is right
  (accept length num_steps + 1), and a wrong KV slot shows as a lower accept length (draft) or a
  wrong output (target).
"""
import json
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_models as mm  # noqa: E402  (tokenizer, prompts, rule: shared with the Llama models)

V, H = mm.V, mm.H  # 32000, 256
NH = 16
KV_LORA, ROPE, NOPE, VHD = 512, 64, 128, 128
QK = NOPE + ROPE  # 192
I_DENSE = 512
N_EXPERTS, TOPK, I_MOE = 8, 2, 128
CTX = mm.CTX  # 2048
THETA = mm.THETA
M_FREQ = mm.M_FREQ  # 8 rope pairs carry the positional pattern
A_QK = mm.A_QK * (QK / mm.HD) ** 0.25  # same softmax gap as the Llama model under scale 1/sqrt(192)
C0, C1 = mm.C0, mm.C1
SEED = 4321
N_LAYERS = 2


def rope_freqs():
    return THETA ** (-torch.arange(0, ROPE, 2, dtype=torch.float64) / ROPE)


def rope_vectors():
    """u_q, u_k in the interleaved (GPT-J) layout: pair m = dims (2m, 2m+1)."""
    th = rope_freqs()[:M_FREQ]
    u_q = torch.zeros(ROPE, dtype=torch.float64)
    u_k = torch.zeros(ROPE, dtype=torch.float64)
    for m in range(M_FREQ):
        u_q[2 * m] = 1.0
        u_k[2 * m], u_k[2 * m + 1] = math.cos(th[m]), math.sin(th[m])
    return u_q.float(), u_k.float()


def attn_weights(c_out):
    u_q, u_k = rope_vectors()
    q = torch.zeros(NH * QK, H)
    for h in range(NH):
        q[h * QK + NOPE : (h + 1) * QK, 255] = A_QK * u_q
    kv_a = torch.zeros(KV_LORA + ROPE, H)
    kv_a[:128, :128] = torch.eye(128)
    kv_a[KV_LORA:, 255] = A_QK * u_k
    kv_b = torch.zeros(NH * (NOPE + VHD), KV_LORA)  # per head: [k_nope (128), v (128)]
    kv_b[NOPE : NOPE + VHD, :128] = torch.eye(128)  # head 0's v = latent dims 0..127
    o = torch.zeros(H, NH * VHD)
    o[:128, :VHD] = c_out * torch.eye(128)  # head 0's output -> dims 0..127
    kv_ln = torch.full((KV_LORA,), (255.0 / KV_LORA) ** 0.5)
    return dict(q=q, kv_a=kv_a, kv_b=kv_b, o=o, kv_ln=kv_ln)


def make_weights(g):
    E, sigma, lm_head = mm.rule_embeddings(g)
    layers = []
    for li, c in enumerate([C0, C1]):
        L = attn_weights(c)
        L["gate"] = torch.randn(I_DENSE, H, generator=g) * 0.02
        L["up"] = torch.randn(I_DENSE, H, generator=g) * 0.02
        L["down"] = torch.zeros(H, I_DENSE)
        ln_in = torch.ones(H)
        if li == 1:
            ln_in[255] = (1 + C0 * C0) ** 0.5
        L["ln_in"], L["ln_post"] = ln_in, torch.ones(H)
        layers.append(L)
    return E, lm_head, sigma, layers


def config_dict():
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": V,
        "hidden_size": H,
        "intermediate_size": I_DENSE,
        "moe_intermediate_size": I_MOE,
        "num_hidden_layers": N_LAYERS,
        "num_nextn_predict_layers": 1,
        "num_attention_heads": NH,
        "num_key_value_heads": NH,
        "n_shared_experts": 1,
        "n_routed_experts": N_EXPERTS,
        "num_experts_per_tok": TOPK,
        "routed_scaling_factor": 1.0,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "first_k_dense_replace": N_LAYERS,
        "moe_layer_freq": 1,
        "kv_lora_rank": KV_LORA,
        "q_lora_rank": None,
        "qk_rope_head_dim": ROPE,
        "qk_nope_head_dim": NOPE,
        "v_head_dim": VHD,
        "rope_interleave": True,
        "hidden_act": "silu",
        "max_position_embeddings": CTX,
        "rms_norm_eps": 1e-6,
        "rope_theta": THETA,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
        "use_cache": True,
    }


def state_dict(E, lm_head, layers, g):
    sd = {"model.embed_tokens.weight": E, "lm_head.weight": lm_head, "model.norm.weight": torch.ones(H)}

    def put_attn(p, L):
        sd.update(
            {
                p + "input_layernorm.weight": L["ln_in"],
                p + "post_attention_layernorm.weight": L["ln_post"],
                p + "self_attn.q_proj.weight": L["q"],
                p + "self_attn.kv_a_proj_with_mqa.weight": L["kv_a"],
                p + "self_attn.kv_a_layernorm.weight": L["kv_ln"],
                p + "self_attn.kv_b_proj.weight": L["kv_b"],
                p + "self_attn.o_proj.weight": L["o"],
            }
        )

    for i, L in enumerate(layers):
        p = f"model.layers.{i}."
        put_attn(p, L)
        sd.update(
            {
                p + "mlp.gate_proj.weight": L["gate"],
                p + "mlp.up_proj.weight": L["up"],
                p + "mlp.down_proj.weight": L["down"],
            }
        )
    # the NextN (MTP) layer, as DeepSeek-V3 checkpoints store it: model.layers.{num_hidden_layers}
    p = f"model.layers.{N_LAYERS}."
    L0 = dict(layers[0])
    L0["ln_in"] = torch.ones(H)
    put_attn(p, L0)
    eh = torch.zeros(H, 2 * H)
    eh[:, :H] = torch.eye(H)
    sd.update(
        {
            p + "enorm.weight": torch.ones(H),
            p + "hnorm.weight": torch.ones(H),
            p + "eh_proj.weight": eh,
            p + "shared_head.norm.weight": torch.ones(H),
            p + "shared_head.head.weight": lm_head,
            p + "embed_tokens.weight": E,
            p + "mlp.gate.weight": torch.randn(N_EXPERTS, H, generator=g) * 0.02,
            p + "mlp.gate.e_score_correction_bias": torch.zeros(N_EXPERTS),
        }
    )
    for e in list(range(N_EXPERTS)) + ["shared"]:
        q = f"{p}mlp.experts.{e}." if e != "shared" else f"{p}mlp.shared_experts."
        sd.update(
            {
                q + "gate_proj.weight": torch.randn(I_MOE, H, generator=g) * 0.02,
                q + "up_proj.weight": torch.randn(I_MOE, H, generator=g) * 0.02,
                q + "down_proj.weight": torch.zeros(H, I_MOE),
            }
        )
    return sd


def save(path, sd, tok_dirs_done):
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    json.dump(config_dict(), open(os.path.join(path, "config.json"), "w"), indent=1)
    json.dump(
        {"bos_token_id": 1, "eos_token_id": 2, "do_sample": False},
        open(os.path.join(path, "generation_config.json"), "w"),
    )
    out = {}
    for k, v in sd.items():
        out[k] = (v.float() if k.endswith("e_score_correction_bias") else v.to(torch.bfloat16)).contiguous()
    save_file(out, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})


# ---------------------------------------------------------------------------------------------
# float32 reference of DeepseekV2AttentionMLA / DeepseekV2DecoderLayer / DeepseekModelNextN as
# SGLang 0.5.12 computes them (pre-norm, MHA form of MLA; the absorbed form is the same algebra)


def rms(x, w, eps=1e-6):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rope_interleaved(x, pos):
    """x [..., T, 64]; rotate pairs (2m, 2m+1) by pos * theta_m (SGLang is_neox_style=False)."""
    th = rope_freqs().float()
    ang = pos[:, None].float() * th[None, :]  # [T, 32]
    c, s = torch.cos(ang), torch.sin(ang)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def mla(h, L, pos):
    T = h.shape[0]
    q = (h @ L["q"].T).view(T, NH, QK)
    q_nope, q_pe = q[..., :NOPE], q[..., NOPE:]
    lat = h @ L["kv_a"].T
    c_kv, k_pe = rms(lat[:, :KV_LORA], L["kv_ln"]), lat[:, KV_LORA:]
    kv = (c_kv @ L["kv_b"].T).view(T, NH, NOPE + VHD)
    k_nope, v = kv[..., :NOPE], kv[..., NOPE:]
    q_pe = rope_interleaved(q_pe.transpose(0, 1), pos).transpose(0, 1)
    k_pe = rope_interleaved(k_pe, pos)
    s = (torch.einsum("thd,uhd->htu", q_nope, k_nope) + torch.einsum("thd,ud->htu", q_pe, k_pe)) / math.sqrt(QK)
    s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    o = torch.einsum("htu,uhd->thd", torch.softmax(s, -1), v).reshape(T, NH * VHD)
    return o @ L["o"].T


def target_logits(ids, E, lm_head, layers):
    pos = torch.arange(len(ids))
    x = E[ids]
    for L in layers:
        x = x + mla(rms(x, L["ln_in"]), L, pos)
        hh = rms(x, L["ln_post"])
        x = x + (torch.nn.functional.silu(hh @ L["gate"].T) * (hh @ L["up"].T)) @ L["down"].T
    return rms(x, 1.0) @ lm_head.T


def draft_logits(ids, E, lm_head, L0):
    """NextN over the shifted tokens: position p gets input ids[p + 1] (eh_proj = [I, 0])."""
    shifted = ids[1:]
    pos = torch.arange(len(shifted))
    x = rms(E[shifted], 1.0)
    x = x + mla(rms(x, 1.0), L0, pos)  # MoE output is 0 (down_proj = 0)
    return rms(x, 1.0) @ lm_head.T  # logits for the token at p + 2


def check(E, lm_head, layers, sigma_inv, g):
    ids = torch.randint(3, V, (CTX - 48,), generator=g)  # positions up to the longest request
    lt = target_logits(ids, E, lm_head, layers)
    rule_t = sigma_inv[ids[:-1]]  # token at i + 1 = sigma^-1(x_{i-1})
    pred_t = lt[1:].argmax(-1)
    top2 = lt[1:].topk(2, -1).values
    ok_t = (pred_t == rule_t).float().mean().item()
    ld = draft_logits(ids, E, lm_head, dict(layers[0], ln_in=torch.ones(H)))
    pred_d = ld[1:].argmax(-1)  # draft at p >= 1 predicts x_{p+2}
    rule_d = sigma_inv[ids[1:-1]]
    ok_d = (pred_d == rule_d).float().mean().item()
    return {
        "target_rule_match": ok_t,
        "target_min_margin": round((top2[:, 0] - top2[:, 1]).min().item(), 2),
        "draft_rule_match": ok_d,
    }


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    out = args[0] if args else "/tmp/ds_models"
    tgt, dft = os.path.join(out, "target"), os.path.join(out, "draft")
    os.makedirs(tgt, exist_ok=True)
    os.makedirs(dft, exist_ok=True)
    g = torch.Generator().manual_seed(SEED)
    tok = mm.build_tokenizer([tgt, dft])
    E, lm_head, sigma, layers = make_weights(g)
    sd = state_dict(E, lm_head, layers, g)
    for p in (tgt, dft):
        save(p, sd, None)
    sigma_inv = torch.empty_like(sigma)
    sigma_inv[sigma] = torch.arange(V)
    prompts = mm.make_prompts(tok, torch.Generator().manual_seed(7))
    exp = {}
    for name, ps in [
        ("short", prompts["short"]),
        ("long_1k", [prompts["long_1k"]]),
        ("long_1900", [prompts["long_1900"]]),
    ]:
        exp[name] = [mm.rule_continuation(tok(p)["input_ids"], sigma_inv, mm.EXPECTED_NEW) for p in ps]
    prompts["expected_rule"] = exp
    if "--check" in sys.argv:
        prompts["reference_check"] = check(E, lm_head, layers, sigma_inv, torch.Generator().manual_seed(11))
        print("reference check (float32, CPU):", prompts["reference_check"])
    json.dump(prompts, open(os.path.join(out, "prompts.json"), "w"))
    print("deepseek models in", out, "| A_QK", round(A_QK, 3), "| long prompt tokens:", prompts["n_tokens"])


if __name__ == "__main__":
    main()
