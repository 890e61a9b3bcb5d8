"""An exact model at a served model's cost: Llama-3.1-8B shapes carrying the tiny model's rule.

``make_models.py --shape 8b OUT`` calls :func:`build` (on the GPU: about a minute, most of it
writing 15 GB of bf16 safetensors). Same tokenizer, prompts and rule as the tiny model
(``sglang_draft_layout.tiny_models``): the next token is sigma^-1 of the token two positions
back, read through attention from the previous position's KV, and the EAGLE draft reproduces it,
so outputs must equal the rule and a correct draft is always accepted.

Shapes (Llama-3.1-8B): hidden 4096, 32 layers, 32 query / 8 KV heads of 128, intermediate
14336, vocab 32000 (the tiny model's tokenizer), RoPE theta 10000, context 2048 (as the tiny
model: at this context the unpatched FlashInfer CUDA-graph row overflows with the benchmark's
512-1536-token requests, as it does at 128k with 64k-token ones).

* Embeddings: dims 0..127 random with |e|^2 = H - 1, dim H - 1 = 1.0, so rms(e) = 1 (the EAGLE
  draft's layer 0 has no input norm); lm_head row j = e_sigma(j).
* Layers 0 and 1 carry the rule, as the tiny model's two layers: every head's q and k read only
  the constant dim and score relative positions through RoPE (16 frequency pairs, peak at the
  previous token, softmax gap >= 20 logits up to 4096 positions); KV head 0's v copies dims
  0..127; o_proj writes query head 0's output back (gain 3 in layer 0, 1 in layer 1); the MLP's
  down_proj is zero.
* Layers 2..31 do real work and add nothing: random q, k, v, gate and up projections (real
  attention over random scores, a real SiLU MLP), o_proj = 0 and down_proj = 0, so their
  residual contribution is exactly zero.
* Draft (LlamaForCausalLMEagle): fc = [I, 0] (the token embedding), one layer equal to layer 0.

:func:`check_rule` runs the rule layers in float32 on the GPU over random tokens (the next
token of every position must be the rule's) before anything is saved.
"""

from __future__ import annotations

import json
import math
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

from sglang_draft_layout.tiny_models import (  # noqa: E402
    EXPECTED_NEW,
    SEED,
    build_tokenizer,
    make_prompts,
    rule_continuation,
)

V, H, I, LAYERS, NH, NKV, HD = 32000, 4096, 14336, 32, 32, 8, 128
CTX = 2048
THETA = 10000.0
M_FREQ, A_QK = 16, 14.0
C0, C1 = 3.0, 1.0
RULE_LAYERS = 2
ZERO_LAYER_STD = 0.02
SHARD_LAYERS = 8  # target layers per safetensors shard


def positional_gap(max_offset: int = 4096) -> float:
    """Softmax logit gap between the previous token and any other offset in 0..max_offset."""
    th = THETA ** (-np.arange(0, HD, 2) / HD)[:M_FREQ]
    d = np.arange(-1, max_offset + 1)
    f = np.cos(np.outer(d, th)).sum(1)
    return float((f[d == 0][0] - f[d != 0].max()) * A_QK * A_QK / math.sqrt(HD))


def rule_weights(g: torch.Generator, device: str) -> tuple[torch.Tensor, torch.Tensor, list[dict]]:
    """Embeddings, sigma and the two rule layers (float32, on ``device``)."""
    E = torch.zeros(V, H, device=device)
    E[:, :128] = torch.randn(V, 128, generator=g, device=device)
    E[:, :128] *= (H - 1) ** 0.5 / E[:, :128].norm(dim=1, keepdim=True)
    E[:, H - 1] = 1.0
    sigma = torch.randperm(V, generator=g, device=device)
    th = torch.tensor(THETA ** (-np.arange(0, HD, 2) / HD)[:M_FREQ], dtype=torch.float32, device=device)
    u_q = torch.zeros(HD, device=device)
    u_q[:M_FREQ] = 1.0  # neox halves (m, m + 64)
    u_k = torch.zeros(HD, device=device)
    u_k[:M_FREQ] = torch.cos(th)
    u_k[HD // 2 : HD // 2 + M_FREQ] = torch.sin(th)
    layers = []
    for li, c in enumerate([C0, C1]):
        q = torch.zeros(NH * HD, H, device=device)
        k = torch.zeros(NKV * HD, H, device=device)
        v = torch.zeros(NKV * HD, H, device=device)
        o = torch.zeros(H, NH * HD, device=device)
        q[:, H - 1] = (A_QK * u_q).repeat(NH)
        k[:, H - 1] = (A_QK * u_k).repeat(NKV)
        v[0:HD, 0:HD] = torch.eye(HD, device=device)
        o[0:HD, 0:HD] = c * torch.eye(HD, device=device)  # query head 0 (KV head 0) -> dims 0..127
        ln_in = torch.ones(H, device=device)
        if li == 1:
            ln_in[H - 1] = (1 + C0 * C0) ** 0.5  # undo the rms shrink of the constant dim
        layers.append(
            dict(
                q=q,
                k=k,
                v=v,
                o=o,
                ln_in=ln_in,
                gate=torch.randn(I, H, generator=g, device=device) * ZERO_LAYER_STD,
                up=torch.randn(I, H, generator=g, device=device) * ZERO_LAYER_STD,
                down=torch.zeros(H, I, device=device),
            )
        )
    return E, sigma, layers


def zero_layer(g: torch.Generator, device: str) -> dict:
    """A layer that computes real attention and MLP work and adds exactly zero to the residual."""

    def rnd(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=torch.float32) * ZERO_LAYER_STD

    return dict(
        q=rnd(NH * HD, H),
        k=rnd(NKV * HD, H),
        v=rnd(NKV * HD, H),
        o=torch.zeros(H, NH * HD, device=device),
        gate=rnd(I, H),
        up=rnd(I, H),
        down=torch.zeros(H, I, device=device),
        ln_in=torch.ones(H, device=device),
    )


def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Neox-style rotary embedding of x [T, heads, HD]."""
    inv = THETA ** (-torch.arange(0, HD, 2, device=x.device, dtype=torch.float32) / HD)
    ang = pos[:, None].float() * inv[None]
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]
    a, b = x[..., : HD // 2], x[..., HD // 2 :]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)


def check_rule(E: torch.Tensor, sigma: torch.Tensor, layers: list[dict], n: int = 512, seed: int = 5) -> int:
    """Positions (of n random tokens, bf16-rounded weights, float32 arithmetic) whose greedy next
    token is not the rule's; must be 0."""
    dev = E.device
    bf = lambda t: t.to(torch.bfloat16).float()  # noqa: E731  the served weights are bf16
    ids = torch.randint(0, V, (n,), generator=torch.Generator(dev).manual_seed(seed), device=dev)
    pos = torch.arange(n, device=dev)
    x = bf(E)[ids]
    mask = torch.ones(n, n, device=dev, dtype=torch.bool).tril()
    for L in layers:
        h = _rms(x, bf(L["ln_in"]))
        q = _rope((h @ bf(L["q"]).T).view(n, NH, HD), pos)
        k = _rope((h @ bf(L["k"]).T).view(n, NKV, HD), pos).repeat_interleave(NH // NKV, 1)
        v = (h @ bf(L["v"]).T).view(n, NKV, HD).repeat_interleave(NH // NKV, 1)
        s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(HD)
        p = s.masked_fill(~mask, float("-inf")).softmax(-1)
        x = x + torch.einsum("hqk,khd->qhd", p, v).reshape(n, NH * HD) @ bf(L["o"]).T
        h2 = _rms(x, torch.ones(H, device=dev))
        x = x + (torch.nn.functional.silu(h2 @ bf(L["gate"]).T) * (h2 @ bf(L["up"]).T)) @ bf(L["down"]).T
    logits = _rms(x, torch.ones(H, device=dev)) @ bf(E)[sigma].T
    sigma_inv = torch.empty_like(sigma)
    sigma_inv[sigma] = torch.arange(V, device=dev)
    want = sigma_inv[ids[:-1]]  # position i + 1 predicts sigma^-1(x_i)
    return int((logits[1:].argmax(-1) != want).sum())


def save_config(path: str, architecture: str, num_layers: int) -> None:
    from transformers import LlamaConfig

    cfg = LlamaConfig(
        vocab_size=V,
        hidden_size=H,
        intermediate_size=I,
        num_hidden_layers=num_layers,
        num_attention_heads=NH,
        num_key_value_heads=NKV,
        head_dim=HD,
        max_position_embeddings=CTX,
        rms_norm_eps=1e-6,
        rope_theta=THETA,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        hidden_act="silu",
        torch_dtype="bfloat16",
    )
    cfg.architectures = [architecture]
    cfg.save_pretrained(path)


def layer_tensors(prefix: str, L: dict, with_input_norm: bool = True) -> dict[str, torch.Tensor]:
    names = {
        "q": "self_attn.q_proj",
        "k": "self_attn.k_proj",
        "v": "self_attn.v_proj",
        "o": "self_attn.o_proj",
        "gate": "mlp.gate_proj",
        "up": "mlp.up_proj",
        "down": "mlp.down_proj",
    }
    out = {f"{prefix}{n}.weight": L[k] for k, n in names.items()}
    out[f"{prefix}post_attention_layernorm.weight"] = torch.ones(H, device=L["q"].device)
    if with_input_norm:
        out[f"{prefix}input_layernorm.weight"] = L["ln_in"]
    return out


def _to_cpu_bf16(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.to(torch.bfloat16).contiguous().cpu() for k, v in sd.items()}


def save_target(path: str, E: torch.Tensor, sigma: torch.Tensor, layers: list[dict], g: torch.Generator) -> None:
    """Sharded bf16 safetensors (+ index); zero layers are generated shard by shard on the GPU."""
    from safetensors.torch import save_file

    save_config(path, "LlamaForCausalLM", LAYERS)
    shards = [list(range(s, min(s + SHARD_LAYERS, LAYERS))) for s in range(0, LAYERS, SHARD_LAYERS)]
    weight_map, futures = {}, []
    with ThreadPoolExecutor(max_workers=2) as pool:
        for si, idx in enumerate(shards):
            sd = {}
            if si == 0:
                sd.update(
                    {
                        "model.embed_tokens.weight": E,
                        "lm_head.weight": E[sigma],
                        "model.norm.weight": torch.ones(H, device=E.device),
                    }
                )
            for li in idx:
                L = layers[li] if li < RULE_LAYERS else zero_layer(g, E.device.type)
                sd.update(layer_tensors(f"model.layers.{li}.", L))
            name = f"model-{si + 1:05d}-of-{len(shards):05d}.safetensors"
            cpu = _to_cpu_bf16(sd)
            del sd
            weight_map.update({k: name for k in cpu})
            futures.append(pool.submit(save_file, cpu, os.path.join(path, name), metadata={"format": "pt"}))
        for f in futures:
            f.result()
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)


def save_draft(path: str, E: torch.Tensor, layer0: dict) -> None:
    """EAGLE-1 draft as SGLang's LlamaForCausalLMEagle loads it (no 'model.', no input norm)."""
    from safetensors.torch import save_file

    save_config(path, "LlamaForCausalLMEagle", 1)
    fc = torch.zeros(H, 2 * H, device=E.device)
    fc[:, :H] = torch.eye(H, device=E.device)
    sd = {
        "embed_tokens.weight": E,
        "fc.weight": fc,
        "fc.bias": torch.zeros(H, device=E.device),
        **layer_tensors("layers.0.", layer0, with_input_norm=False),
    }
    save_file(_to_cpu_bf16(sd), os.path.join(path, "model.safetensors"), metadata={"format": "pt"})


def build(out: str, device: str = "cuda") -> tuple[object, dict]:
    """out/target, out/draft and out/prompts.json (the tiny model's prompts and rule continuations)."""
    gap = positional_gap()
    assert gap >= 20, f"positional softmax gap {gap:.1f} < 20"
    tgt, dft = os.path.join(out, "target"), os.path.join(out, "draft")
    os.makedirs(tgt, exist_ok=True)
    os.makedirs(dft, exist_ok=True)
    tok = build_tokenizer([tgt, dft])
    g = torch.Generator(device).manual_seed(SEED)
    with torch.no_grad():
        E, sigma, layers = rule_weights(g, device)
        wrong = check_rule(E, sigma, layers)
        assert wrong == 0, f"rule check: {wrong} of 511 positions predict another token"
        save_draft(dft, E, layers[0])
        save_target(tgt, E, sigma, layers, g)
    sigma_inv = torch.empty_like(sigma)
    sigma_inv[sigma] = torch.arange(V, device=sigma.device)
    sigma_inv = sigma_inv.cpu()
    prompts = make_prompts(tok, torch.Generator().manual_seed(7))
    prompts["expected_rule"] = {
        name: [rule_continuation(tok(p)["input_ids"], sigma_inv, EXPECTED_NEW) for p in ps]
        for name, ps in [
            ("short", prompts["short"]),
            ("long_1k", [prompts["long_1k"]]),
            ("long_1900", [prompts["long_1900"]]),
        ]
    }
    prompts["positional_softmax_gap"] = gap
    prompts["rule_check_wrong_positions"] = wrong
    prompts["shape"] = dict(
        hidden=H,
        layers=LAYERS,
        heads=NH,
        kv_heads=NKV,
        head_dim=HD,
        intermediate=I,
        vocab=V,
        context=CTX,
        rule_layers=RULE_LAYERS,
    )
    with open(os.path.join(out, "prompts.json"), "w") as f:
        json.dump(prompts, f)
    return tok, prompts
