"""Multi-step EAGLE draft on the GPU, exact: every draft accepted, every output the rule.

Written by sglang-draft-layout (``apply``); ``sglang-draft-layout check`` reports it stale
when it differs from what the tool would write. Needs nothing but this tree: it builds a
tiny Llama target, its exact EAGLE draft and a tokenizer into a temporary folder (the
builder below is the tool's, embedded verbatim), starts this tree's server for every
configuration at once, and sends greedy requests, a batch of 8 near-context prompts
among them. The target's greedy output follows a fixed rule that the draft reproduces, so
every request's accept length is exactly num_steps + 1 (its length is a multiple of
num_steps + 1): a draft layout that loses a slot shows up as a shorter accept length or
a wrong token. SGLANG_DRAFT_LAYOUT_CONFIGS=name,name runs a subset of CONFIGS.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np
import requests
import torch

from sglang.srt.utils import kill_process_tree
from sglang.test.ci.ci_register import register_cuda_ci
from sglang.test.test_utils import CustomTestCase

register_cuda_ci(est_time=240, suite="stage-b-test-1-gpu-small")

# sglang_draft_layout.tiny_models (sglang-draft-layout), verbatim
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


#: name: (attention backend, CUDA graphs, topk, num_steps)
CONFIGS = {
    "flashinfer_cg_k8s5": ("flashinfer", True, 8, 5),
    "flashinfer_nocg_k4s3": ("flashinfer", False, 4, 3),
    "flashinfer_cg_k1s5": ("flashinfer", True, 1, 5),
    "triton_nocg_k1s3": ("triton", False, 1, 3),
    "triton_nocg_k8s5": ("triton", False, 8, 5),
    "triton_cg_k4s3": ("triton", True, 4, 3),
}
SERVER_ARGS = [
    "--host", "127.0.0.1", "--tp-size", "1", "--mem-fraction-static", "0.08",
    "--max-total-tokens", "200000", "--skip-server-warmup",
    "--grammar-backend", "none", "--max-running-requests", "8",
]  # fmt: skip
BASE_PORT = 31000
STARTUP_TIMEOUT = 600
MIN_NEW_TOKENS = 64
NEAR_CONTEXT_BATCHES = 2


def selected_configs():
    """CONFIGS, or the names listed in SGLANG_DRAFT_LAYOUT_CONFIGS."""
    names = os.environ.get("SGLANG_DRAFT_LAYOUT_CONFIGS", "")
    picked = [name.strip() for name in names.split(",") if name.strip()]
    unknown = sorted(set(picked) - set(CONFIGS))
    if unknown:
        raise ValueError(f"unknown configurations {unknown}; known: {sorted(CONFIGS)}")
    return picked or list(CONFIGS)


def new_tokens(num_steps):
    """The smallest multiple of num_steps + 1 from MIN_NEW_TOKENS on."""
    return -(-MIN_NEW_TOKENS // (num_steps + 1)) * (num_steps + 1)


def server_command(models, port, backend, cuda_graph, topk, num_steps):
    """The launch_server command line of one configuration."""
    draft_tokens = num_steps + 1 if topk == 1 else 2 * num_steps + 2
    return [
        sys.executable, "-m", "sglang.launch_server",
        "--model-path", os.path.join(models, "target"), "--port", str(port),
        *SERVER_ARGS, "--attention-backend", backend,
        "--speculative-algorithm", "EAGLE",
        "--speculative-draft-model-path", os.path.join(models, "draft"),
        "--speculative-num-steps", str(num_steps),
        "--speculative-eagle-topk", str(topk),
        "--speculative-num-draft-tokens", str(draft_tokens),
        *(["--cuda-graph-max-bs", "8"] if cuda_graph else ["--disable-cuda-graph"]),
    ]  # fmt: skip


def request_plan(prompts):
    """(tag, prompts, rule continuations) of every request sent to each server."""
    short, rule = prompts["short"], prompts["expected_rule"]
    plan = [(f"short{i}", [text], [rule["short"][i]]) for i, text in enumerate(short)]
    plan.append(("short_batch", short, rule["short"]))
    near_context = [prompts["long_1900"]] * 8
    for batch in range(NEAR_CONTEXT_BATCHES):
        plan.append((f"near_context_batch{batch}", near_context, rule["long_1900"] * 8))
    return plan


def log_tail(path, lines=30):
    with open(path, errors="replace") as log:
        return "".join(log.readlines()[-lines:])


class TestDraftLayoutExact(CustomTestCase):
    @classmethod
    def setUpClass(cls):
        cls.workdir = tempfile.mkdtemp(prefix="draft_layout_exact_")
        cls.servers = {}
        models = os.path.join(cls.workdir, "models")
        _tokenizer, cls.prompts = build_models(models)
        for index, name in enumerate(selected_configs()):
            port = BASE_PORT + 100 * index
            log_path = os.path.join(cls.workdir, f"server_{name}.log")
            with open(log_path, "w") as log:
                process = subprocess.Popen(
                    server_command(models, port, *CONFIGS[name]),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            cls.servers[name] = (process, port, log_path)
        cls.started = time.monotonic()
        cls.ready = {name: cls.wait_healthy(*cls.servers[name]) for name in cls.servers}

    @classmethod
    def wait_healthy(cls, process, port, log_path):
        """None once the server answers /health, else why it did not (with its log)."""
        while time.monotonic() - cls.started < STARTUP_TIMEOUT:
            if process.poll() is not None:
                return f"exited with {process.returncode}:\n{log_tail(log_path)}"
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=5).ok:
                    return None
            except requests.RequestException:
                pass
            time.sleep(1)
        return f"not healthy after {STARTUP_TIMEOUT} s:\n{log_tail(log_path)}"

    @classmethod
    def tearDownClass(cls):
        for process, _port, _log in getattr(cls, "servers", {}).values():
            kill_process_tree(process.pid)
        shutil.rmtree(cls.workdir, ignore_errors=True)

    def check_config(self, name):
        if name not in self.servers:
            self.skipTest(f"{name} not in SGLANG_DRAFT_LAYOUT_CONFIGS")
        process, port, log_path = self.servers[name]
        self.assertIsNone(self.ready[name], f"{name}: server {self.ready[name]}")
        _backend, _cuda_graph, _topk, num_steps = CONFIGS[name]
        length = new_tokens(num_steps)
        sampling = {"temperature": 0, "max_new_tokens": length, "ignore_eos": True}
        errors = []
        for tag, texts, rules in request_plan(self.prompts):
            response = requests.post(
                f"http://127.0.0.1:{port}/generate",
                json={"text": texts, "sampling_params": sampling},
                timeout=300,
            )
            self.assertEqual(
                response.status_code, 200, f"{name} {tag}: {response.text}"
            )
            for index, (output, rule) in enumerate(zip(response.json(), rules)):
                request = f"{name} {tag}[{index}]"
                if output["output_ids"] != rule[:length]:
                    errors.append(f"{request}: output differs from the rule")
                meta = output["meta_info"]
                verify_ct = meta.get("spec_verify_ct", 0)
                if meta["completion_tokens"] != (num_steps + 1) * verify_ct:
                    accept = meta["completion_tokens"] / max(verify_ct, 1)
                    errors.append(
                        f"{request}: accept length {accept:.3f} != {num_steps + 1} "
                        f"({meta['completion_tokens']} tokens in {verify_ct} verifies)"
                    )
        self.assertIsNone(process.poll(), f"{name}: server died\n{log_tail(log_path)}")
        if errors:
            self.fail(f"{len(errors)} requests off the rule:\n" + "\n".join(errors))

    def test_flashinfer_cg_k8s5(self):
        self.check_config("flashinfer_cg_k8s5")

    def test_flashinfer_nocg_k4s3(self):
        self.check_config("flashinfer_nocg_k4s3")

    def test_flashinfer_cg_k1s5(self):
        self.check_config("flashinfer_cg_k1s5")

    def test_triton_nocg_k1s3(self):
        self.check_config("triton_nocg_k1s3")

    def test_triton_nocg_k8s5(self):
        self.check_config("triton_nocg_k8s5")

    def test_triton_cg_k4s3(self):
        self.check_config("triton_cg_k4s3")


if __name__ == "__main__":
    unittest.main()
