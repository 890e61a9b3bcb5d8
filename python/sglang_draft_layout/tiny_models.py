"""Tiny deterministic Llama target, its exact EAGLE draft and a tokenizer, built on the spot.

The GPU test that ``apply`` writes into a fork embeds this module's source, and
benchmark/gpu/make_models.py calls it: one builder. It needs torch, numpy, tokenizers,
transformers and safetensors (what an SGLang install has), nothing from the network.

"Previous-token copy" model: embeddings live in dims 0..127 (random, |e|^2 = 255) plus a
constant 1.0 in dim 255, so rms(e) = 1; every attention head scores relative positions
through RoPE on the constant dim only and peaks sharply at the previous token; v copies
dims 0..127 and o_proj writes the previous token's embedding back; the MLP is zero; lm_head
row j is the embedding of token sigma(j). So the next token after (..., x_{i-1}, x_i) is
sigma^-1(x_{i-1}) with a margin of about 500 logits, and the EAGLE draft (fc = [I, 0], one
layer equal to target layer 0) reproduces the rule exactly: every correct draft is accepted,
and attention reads the previous position's KV slot, so a wrong slot changes the output.
"""

import json
import os

import numpy as np
import torch

V, H, I, NH, NKV, HD = 32000, 256, 512, 4, 2, 64
CTX = 2048
THETA = 10000.0
M_FREQ, A_QK = 8, 14.0  # freq pairs used by the positional pattern, q/k amplitude
C0, C1 = 3.0, 1.0  # o_proj gains layer 0 / layer 1
SEED = 1234
EXPECTED_NEW = 96  # length of the stored rule continuation


def build_tokenizer(path_list):
    """A byte-level BPE tokenizer of V tokens, saved into every folder of path_list."""
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
    )
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # 256 byte-level symbols
    vocab = {t: i for i, t in enumerate(specials)}
    for ch in alphabet:
        vocab[ch] = len(vocab)
    base = (
        [chr(c) for c in range(ord("a"), ord("z") + 1)]
        + [chr(c) for c in range(ord("A"), ord("Z") + 1)]
        + [str(d) for d in range(10)]
        + ["\u0120", "."]
    )  # 64 symbols (\u0120 = space)
    merges = []
    for a in base:  # level 1: 4096 pairs
        for b in base:
            merges.append((a, b))
            vocab[a + b] = len(vocab)
    done = False
    for a in base:  # level 2: pair + char
        for b in base:
            for c in base:
                if len(vocab) >= V:
                    done = True
                    break
                merges.append((a + b, c))
                vocab[a + b + c] = len(vocab)
            if done:
                break
        if done:
            break
    assert len(vocab) == V, len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    tok.add_special_tokens([AddedToken(s, special=True) for s in specials])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=CTX,
    )
    for p in path_list:
        fast.save_pretrained(p)
        cfgp = os.path.join(p, "tokenizer_config.json")
        with open(cfgp) as f:
            cfg = json.load(f)
        cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
        with open(cfgp, "w") as f:
            json.dump(cfg, f, indent=1)
    return fast


def rope_freqs():
    return THETA ** (-np.arange(0, HD, 2) / HD)


def check_positional_pattern():
    """The softmax logit gap between the previous token and any other offset (>= 20 wanted)."""
    th = rope_freqs()[:M_FREQ]
    d = np.arange(-1, 4097)
    f = np.cos(np.outer(d, th)).sum(1)  # score(offset) ~ sum cos((offset-1) th)
    gap = f[d == 0][0] - f[d != 0].max()
    return float(gap * A_QK * A_QK / np.sqrt(HD))


def rule_embeddings(g):
    """Token embeddings (dims 0..127 random with |e|^2 = 255, dim 255 = 1.0), the permutation
    sigma and lm_head row j = e_{sigma(j)}: the part of the rule shared with the DeepSeek models.
    """
    E = torch.zeros(V, H)
    E[:, :128] = torch.randn(V, 128, generator=g)
    E[:, :128] *= (255.0**0.5) / E[:, :128].norm(dim=1, keepdim=True)
    E[:, 255] = 1.0
    sigma = torch.randperm(V, generator=g)
    return E, sigma, E[sigma].clone()


def make_weights(g):
    """Embeddings, lm_head, sigma and the two layers' weights of the target."""
    E, sigma, lm_head = rule_embeddings(g)

    th = torch.tensor(rope_freqs()[:M_FREQ], dtype=torch.float32)
    u_q = torch.zeros(HD)
    u_q[:M_FREQ] = 1.0  # neox halves: (m, m+32)
    u_k = torch.zeros(HD)
    u_k[:M_FREQ] = torch.cos(th)
    u_k[HD // 2 : HD // 2 + M_FREQ] = torch.sin(th)

    def attn(c_out):
        q = torch.zeros(NH * HD, H)
        k = torch.zeros(NKV * HD, H)
        v = torch.zeros(NKV * HD, H)
        o = torch.zeros(H, NH * HD)
        for h in range(NH):
            q[h * HD : (h + 1) * HD, 255] = A_QK * u_q
        for kv in range(NKV):
            k[kv * HD : (kv + 1) * HD, 255] = A_QK * u_k
            v[kv * HD : (kv + 1) * HD, kv * HD : (kv + 1) * HD] = torch.eye(HD)
        # q-head 0 uses kv head 0 (dims 0..63), q-head 2 uses kv head 1 (dims 64..127)
        o[0:64, 0:64] = c_out * torch.eye(HD)
        o[64:128, 2 * HD : 3 * HD] = c_out * torch.eye(HD)
        return q, k, v, o

    def mlp():
        return (
            torch.randn(I, H, generator=g) * 0.02,
            torch.randn(I, H, generator=g) * 0.02,
            torch.zeros(H, I),
        )

    layers = []
    for li, c in enumerate([C0, C1]):
        q, k, v, o = attn(c)
        gate, up, down = mlp()
        ln_in = torch.ones(H)
        if li == 1:
            ln_in[255] = (1 + C0 * C0) ** 0.5  # undo the rms shrink of the constant dim
        layers.append(
            dict(
                q=q,
                k=k,
                v=v,
                o=o,
                gate=gate,
                up=up,
                down=down,
                ln_in=ln_in,
                ln_post=torch.ones(H),
            )
        )
    return E, lm_head, sigma, layers


def save_checkpoint(path, architecture, num_layers, sd, dtype):
    """config.json (Llama dimensions) and model.safetensors of one model folder."""
    from safetensors.torch import save_file
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
    save_file(
        {k: v.to(dtype).contiguous() for k, v in sd.items()},
        os.path.join(path, "model.safetensors"),
        metadata={"format": "pt"},
    )


def save_target(path, E, lm_head, layers, dtype):
    """The two-layer LlamaForCausalLM target."""
    sd = {
        "model.embed_tokens.weight": E,
        "lm_head.weight": lm_head,
        "model.norm.weight": torch.ones(H),
    }
    for i, L in enumerate(layers):
        p = f"model.layers.{i}."
        sd.update(
            {
                p + "self_attn.q_proj.weight": L["q"],
                p + "self_attn.k_proj.weight": L["k"],
                p + "self_attn.v_proj.weight": L["v"],
                p + "self_attn.o_proj.weight": L["o"],
                p + "mlp.gate_proj.weight": L["gate"],
                p + "mlp.up_proj.weight": L["up"],
                p + "mlp.down_proj.weight": L["down"],
                p + "input_layernorm.weight": L["ln_in"],
                p + "post_attention_layernorm.weight": L["ln_post"],
            }
        )
    save_checkpoint(path, "LlamaForCausalLM", 2, sd, dtype)


def save_draft(path, E, layers, dtype):
    """EAGLE-1 draft in the layout SGLang's LlamaForCausalLMEagle loads (no 'model.')."""
    L = layers[0]
    fc = torch.zeros(H, 2 * H)
    fc[:, :H] = torch.eye(H)  # fc(cat(embed, target_hidden)) = embed
    sd = {
        "embed_tokens.weight": E,
        "fc.weight": fc,
        "fc.bias": torch.zeros(H),
        "layers.0.self_attn.q_proj.weight": L["q"],
        "layers.0.self_attn.k_proj.weight": L["k"],
        "layers.0.self_attn.v_proj.weight": L["v"],
        "layers.0.self_attn.o_proj.weight": L["o"],
        "layers.0.mlp.gate_proj.weight": L["gate"],
        "layers.0.mlp.up_proj.weight": L["up"],
        "layers.0.mlp.down_proj.weight": L["down"],
        "layers.0.post_attention_layernorm.weight": L["ln_post"],
    }
    save_checkpoint(path, "LlamaForCausalLMEagle", 1, sd, dtype)


def make_prompts(tok, g):
    """Short prompts, one of about 1000 tokens and one near the context (about 1900)."""
    words = [
        "alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "seven", "orange",
        "quiet", "Paris", "engine", "42", "tree", "house", "light", "blue", "fast",
    ]  # fmt: skip
    short = [
        "The capital of France is",
        "Once upon a time,",
        "1 2 3 4 5 6 7 8",
        "def fib(n): return",
        "Hello world. This is a tiny random model speaking",
    ]

    def text_of(ntok):
        out = []
        while True:
            out.append(words[int(torch.randint(len(words), (1,), generator=g))])
            if len(tok(" ".join(out))["input_ids"]) >= ntok:
                return " ".join(out)

    long_1k = text_of(1000)
    long_near_ctx = text_of(1900)  # + 72 new tokens + 12 draft tokens < 2048
    return {
        "short": short,
        "long_1k": long_1k,
        "long_1900": long_near_ctx,
        "n_tokens": {
            "long_1k": len(tok(long_1k)["input_ids"]),
            "long_1900": len(tok(long_near_ctx)["input_ids"]),
        },
    }


def rule_continuation(ids, sigma_inv, n):
    """Expected greedy continuation under the designed rule x_{i+1} = sigma^-1(x_{i-1})."""
    seq = list(ids)
    for _ in range(n):
        seq.append(int(sigma_inv[seq[-2]]))
    return seq[len(ids) :]


def build_models(out):
    """out/target, out/draft (bf16) and out/prompts.json (prompts and rule continuations)."""
    tgt, dft = os.path.join(out, "target"), os.path.join(out, "draft")
    os.makedirs(tgt, exist_ok=True)
    os.makedirs(dft, exist_ok=True)
    g = torch.Generator().manual_seed(SEED)
    tok = build_tokenizer([tgt, dft])
    E, lm_head, sigma, layers = make_weights(g)
    save_target(tgt, E, lm_head, layers, torch.bfloat16)
    save_draft(dft, E, layers, torch.bfloat16)
    sigma_inv = torch.empty_like(sigma)
    sigma_inv[sigma] = torch.arange(V)
    prompts = make_prompts(tok, torch.Generator().manual_seed(7))
    # expected outputs by the designed rule (independent of any attention implementation)
    exp = {}
    for name, ps in [
        ("short", prompts["short"]),
        ("long_1k", [prompts["long_1k"]]),
        ("long_1900", [prompts["long_1900"]]),
    ]:
        exp[name] = [
            rule_continuation(tok(p)["input_ids"], sigma_inv, EXPECTED_NEW) for p in ps
        ]
    prompts["expected_rule"] = exp
    prompts["positional_softmax_gap"] = check_positional_pattern()
    with open(os.path.join(out, "prompts.json"), "w") as f:
        json.dump(prompts, f)
    return tok, prompts
