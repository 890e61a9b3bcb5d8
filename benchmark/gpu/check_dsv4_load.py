#!/usr/bin/env python3
"""Load a tiny DeepSeek-V4 checkpoint into SGLang 0.5.12's model classes on CPU and check it.

The CPU pre-flight of make_dsv4_models.py: before any GPU time, SGLang's own load_weights must
fill every parameter of the target and of the MTP draft from the checkpoint.

Run (the venv is the test suite's import venv, test/support/sglang_venv.py; TREE is a folder
holding SGLang 0.5.12's sglang/, e.g. ~/.cache/sglang-draft-layout/proof-trees/0.5.12-full):
  python3 benchmark/gpu/make_dsv4_models.py /tmp/dsv4 --layout mixed     # with torch + safetensors
  PY=~/.cache/sglang-draft-layout/proof-venvs/sglang-0.5.12-py311-*/bin/python
  PYTHONPATH=TREE $PY benchmark/gpu/check_dsv4_load.py /tmp/dsv4/target
  ... --list     also print every parameter (shape, dtype, checkpoint source) and buffer
  ... --mutate   self-test: feeds load_weights a broken stream (one tensor dropped per model, one
                 renamed, the draft's wo_b transposed) and must then report FAIL.

What it does (single process, CPU, gloo world size 1, nothing under TREE modified):
  1. ServerArgs(model_path, device="cpu") -> set_global_server_args_for_scheduler,
     init_distributed_environment(gloo) + initialize_model_parallel(1) + initialize_dp_attention
     + initialize_moe_config, as ModelRunner does.
  2. For the target (DeepseekV4ForCausalLM, ModelConfig(path)) and the MTP draft
     (DeepseekV4ForCausalLMNextN, ModelConfig(path, is_draft_model=True)): build the model under
     set_default_torch_dtype(model_config.dtype) on real CPU tensors, fill every parameter with
     NaN, run model.load_weights(safetensors iterator) (real weight_loader shape checks), and
     capture sglang's own warnings ("not found in params_dict", "Some weights are not
     initialized from checkpoints") and any exception.
  3. Independently of sglang's bookkeeping, rebuild every parameter's expected value from the
     checkpoint (fusions: wqkv_a = cat(wq_a, wkv), compressor wkv_gate = cat(wkv, wgate),
     experts w13 = stack(cat(gate, up)), w2 = stack(down), shared gate_up_proj = cat(gate, up);
     ape hotfix; NextN renaming model.layers.N.* -> model.decoder.* / model.*) and compare
     shape, dtype (checkpoint vs parameter) and value. Parameters still NaN were never written.
     Checkpoint tensors that feed no parameter are reported as ignored.
Exit code 0 iff both models load cleanly and every value matches.
"""
import logging
import os
import runpy
import socket
import sys
import traceback

os.environ.setdefault("SGLANG_OPT_FP8_WO_A_GEMM", "0")
os.environ.setdefault("SGLANG_DSV4_FP4_EXPERTS", "0")

MODEL_DIR = next((a for a in sys.argv[1:] if not a.startswith("-")), None)
if MODEL_DIR is None:
    sys.exit("usage: check_dsv4_load.py MODEL_DIR [--list] [--mutate]")
FLAGS = [a for a in sys.argv[1:] if a.startswith("-")]  # --mutate: self-test with a broken stream
sys.argv = ["x"]
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_ns = runpy.run_path(os.path.join(_REPO, "test", "support", "import_probe.py"), run_name="probe_lib")
sys.meta_path.insert(0, _ns["_StandInFinder"]())


# tilelang (a CUDA kernel DSL) is not installed in the CPU venv; layers/deepseek_v4_rope.py imports
# it at module level only to set a log level and build a pass-config dict. A permissive stand-in
# (import_probe's finder with this placeholder): every attribute is an _Any, calling an _Any returns
# an _Any (or, used as a bare decorator, the decorated function unchanged). Nothing the load check
# runs executes a tilelang kernel.
class _Any:
    def __init__(self, name):
        self._name = name

    def __repr__(self):
        return f"<tilelang stand-in {self._name}>"

    def __getattr__(self, a):
        if a.startswith("__"):
            raise AttributeError(a)
        return _Any(f"{self._name}.{a}")

    def __call__(self, *a, **k):
        if len(a) == 1 and not k and callable(a[0]) and not isinstance(a[0], _Any):
            return a[0]
        return _Any(f"{self._name}()")

    def __getitem__(self, k):
        return _Any(f"{self._name}[]")

    def __hash__(self):
        return hash(self._name)

    def __eq__(self, o):
        return isinstance(o, _Any) and o._name == self._name

    def __mro_entries__(self, bases):
        return (object,)


sys.meta_path.insert(0, _ns["_StandInFinder"]("tilelang", _Any))

import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402

from sglang.srt.configs.model_config import ModelConfig  # noqa: E402
from sglang.srt.distributed import (  # noqa: E402
    init_distributed_environment,
    initialize_model_parallel,
)
from sglang.srt.environ import envs  # noqa: E402
from sglang.srt.layers.dp_attention import initialize_dp_attention  # noqa: E402
from sglang.srt.layers.moe.utils import initialize_moe_config  # noqa: E402
from sglang.srt.model_loader.utils import set_default_torch_dtype  # noqa: E402
from sglang.srt.server_args import (  # noqa: E402
    ServerArgs,
    set_global_server_args_for_scheduler,
)

CKPT = os.path.join(MODEL_DIR, "model.safetensors")


# ---------------------------------------------------------------- log capture
class Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record.getMessage())


CAP = Capture()
logging.getLogger("sglang").addHandler(CAP)
logging.getLogger("sglang").setLevel(logging.INFO)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def init_sglang(model_config):
    sa = ServerArgs(model_path=MODEL_DIR, device="cpu")
    set_global_server_args_for_scheduler(sa)
    init_distributed_environment(
        backend="gloo",
        world_size=1,
        rank=0,
        local_rank=0,
        distributed_init_method=f"tcp://127.0.0.1:{free_port()}",
    )
    initialize_model_parallel(tensor_model_parallel_size=1)
    initialize_dp_attention(server_args=sa, model_config=model_config)
    initialize_moe_config(sa)
    return sa


# ---------------------------------------------------------------- checkpoint
class Ckpt:
    def __init__(self, path):
        self.f = safe_open(path, framework="pt")
        self.names = list(self.f.keys())
        self.used = set()

    def __contains__(self, n):
        return n in self.names

    def get(self, n):
        self.used.add(n)
        return self.f.get_tensor(n)

    def iterate(self):
        for n in self.names:
            t = self.f.get_tensor(n)
            if "--mutate" in FLAGS:  # self-test: the checker must flag these
                if n in ("model.layers.0.self_attn.attn_sink", "model.layers.3.e_proj.weight"):
                    continue  # dropped -> never initialised
                if n == "model.layers.1.mlp.gate.e_score_correction_bias":
                    n = "model.layers.1.mlp.gate.bias_typo"  # renamed -> not found
                if n == "model.layers.3.self_attn.wo_b.weight":
                    t = t.t().contiguous()  # wrong shape -> loader assertion (draft)
            yield n, t


def expected_for(pname, is_nextn, nh, ck: Ckpt):
    """(expected tensor, [checkpoint names], checkpoint dtype) for a model parameter name."""
    if is_nextn:
        base = f"model.layers.{nh}."
        if pname.startswith("model.decoder."):
            cname = base + pname[len("model.decoder.") :]
        elif pname.startswith("model."):
            cname = base + pname[len("model.") :]
        else:
            cname = pname
    else:
        cname = pname

    def g(n):
        if n not in ck:
            raise KeyError(n)
        return ck.get(n)

    if cname.endswith(".self_attn.wqkv_a.weight"):
        p = cname[: -len("wqkv_a.weight")]
        srcs = [p + "wq_a.weight", p + "wkv.weight"]
        return torch.cat([g(s) for s in srcs], 0), srcs
    if cname.endswith(".compressor.wkv_gate.weight"):
        p = cname[: -len("wkv_gate.weight")]
        srcs = [p + "wkv.weight", p + "wgate.weight"]
        return torch.cat([g(s) for s in srcs], 0), srcs
    if cname.endswith(".shared_experts.gate_up_proj.weight"):
        p = cname[: -len("gate_up_proj.weight")]
        srcs = [p + "gate_proj.weight", p + "up_proj.weight"]
        return torch.cat([g(s) for s in srcs], 0), srcs
    if cname.endswith(".mlp.experts.w13_weight") or cname.endswith(".mlp.experts.w2_weight"):
        p = cname.rsplit(".", 1)[0] + "."
        w13 = cname.endswith("w13_weight")
        srcs, ts = [], []
        e = 0
        while (p + f"{e}.down_proj.weight") in ck:
            if w13:
                s = [p + f"{e}.gate_proj.weight", p + f"{e}.up_proj.weight"]
                ts.append(torch.cat([g(x) for x in s], 0))
            else:
                s = [p + f"{e}.down_proj.weight"]
                ts.append(g(s[0]))
            srcs += s
            e += 1
        if not ts:
            raise KeyError(p + "0.down_proj.weight")
        return torch.stack(ts, 0), srcs
    return g(cname), [cname]


def ape_hotfix(t, ratio):
    a, b = torch.chunk(t, 2, dim=-1)
    return torch.cat([a, b], 0).view(ratio, -1)


# ---------------------------------------------------------------- one model
def check_model(is_nextn, ck: Ckpt):
    tag = "draft  DeepseekV4ForCausalLMNextN" if is_nextn else "target DeepseekV4ForCausalLM"
    res = {
        "tag": tag,
        "errors": [],
        "notfound": [],
        "uninit": [],
        "nan": [],
        "shape": [],
        "dtype": [],
        "value": [],
        "nockpt": [],
        "ok": 0,
        "ignored": [],
    }
    mc = ModelConfig(MODEL_DIR, is_draft_model=is_nextn)
    hc = mc.hf_config
    print(f"\n=== {tag}: arch={hc.architectures} dtype={mc.dtype}")
    if is_nextn:
        from sglang.srt.models.deepseek_v4_nextn import DeepseekV4ForCausalLMNextN as Cls
    else:
        from sglang.srt.models.deepseek_v4 import DeepseekV4ForCausalLM as Cls
    try:
        with set_default_torch_dtype(mc.dtype), torch.device("cpu"):
            model = Cls(config=hc, quant_config=None)
    except Exception as e:
        res["errors"].append(("construct", "".join(traceback.format_exception(e))))
        return res
    params = dict(model.named_parameters())
    print(f"  constructed: {len(params)} params, " f"{sum(p.numel() for p in params.values()) / 1e6:.1f} M elements")
    with torch.no_grad():
        for p in params.values():
            if p.dtype.is_floating_point:
                p.fill_(float("nan"))

    # remember sglang's own bookkeeping
    n0 = len(CAP.records)
    try:
        model.load_weights(ck.iterate())
    except Exception as e:
        res["errors"].append(("load_weights", "".join(traceback.format_exception(e))))
    logs = CAP.records[n0:]
    for m in logs:
        if "not found in params_dict" in m:
            res["notfound"].append(m)
        if "Some weights are not initialized" in m:
            res["uninit"].append(m)
    print("  sglang log lines during load:")
    for m in logs:
        print("   |", m[:400])

    # independent value check
    nh = hc.num_hidden_layers
    ck.used = set()
    skip_nextn = ("lm_head.weight", "model.embed_tokens.weight")  # shared from target at runtime
    modules = dict(model.named_modules())
    for pname, p in params.items():
        if is_nextn and pname in skip_nextn:
            continue
        got = p.data
        if got.dtype.is_floating_point and torch.isnan(got.float()).any():
            frac = torch.isnan(got.float()).float().mean().item()
            res["nan"].append(f"{pname} {tuple(got.shape)} {got.dtype}: {frac:.1%} never written")
        try:
            exp, srcs = expected_for(pname, is_nextn, nh, ck)
        except KeyError as e:
            res["nockpt"].append(
                f"{pname}: model expects {tuple(got.shape)} {got.dtype}; " f"checkpoint lacks {e.args[0]}"
            )
            continue
        # ape hotfix (post_load_weights, target only, overlap compressors)
        if pname.endswith("compressor.ape"):
            comp = modules[pname[: -len(".ape")]]
            if comp.ape_converted and comp.overlap:
                exp = ape_hotfix(exp.float(), comp.ratio)
        if tuple(exp.shape) != tuple(got.shape):
            res["shape"].append(
                f"{pname}: model {tuple(got.shape)} {got.dtype}, checkpoint "
                f"{tuple(exp.shape)} from {srcs[:2]}{'...' if len(srcs) > 2 else ''}"
            )
            continue
        if exp.dtype != got.dtype:
            res["dtype"].append(f"{pname}: model {got.dtype}, checkpoint {exp.dtype} ({srcs[0]})")
        if not torch.equal(exp.to(got.dtype), got):
            d = (exp.float() - got.float()).abs()
            res["value"].append(f"{pname}: max |diff| {torch.nan_to_num(d, nan=float('inf')).max().item():.3g}")
        else:
            res["ok"] += 1
        if "--list" in FLAGS:
            print(
                f"    {pname:58s} {str(tuple(got.shape)):22s} {str(got.dtype):15s} <- "
                f"{srcs[0]}{f' (+{len(srcs) - 1} more)' if len(srcs) > 1 else ''}"
            )

    if "--list" in FLAGS:
        for bname, b in model.named_buffers():
            print(f"    buffer {bname:51s} {str(tuple(b.shape)):22s} {b.dtype} (computed, not loaded)")

    # checkpoint tensors that feed nothing (beyond the intended per-model split)
    mtp = f"model.layers.{nh}."
    for n in ck.names:
        if n in ck.used:
            continue
        if not is_nextn and n.startswith(mtp):
            continue  # MTP layer, belongs to the draft
        if is_nextn and not n.startswith(mtp) and not n.startswith("mtp."):
            continue  # target weights, not the draft's
        if is_nextn and n in (mtp + "embed_tokens.weight", mtp + "shared_head.head.weight"):
            continue
        res["ignored"].append(f"{n} {tuple(ck.f.get_slice(n).get_shape())} {ck.f.get_slice(n).get_dtype()}")

    # a few explicit spot checks
    spots = []
    if not is_nextn:
        w = params["model.layers.0.self_attn.wqkv_a.weight"]
        spots.append(
            (
                "model.layers.0.self_attn.wqkv_a.weight == cat(wq_a, wkv)",
                torch.equal(
                    w.data,
                    torch.cat(
                        [ck.get("model.layers.0.self_attn.wq_a.weight"), ck.get("model.layers.0.self_attn.wkv.weight")],
                        0,
                    ),
                ),
            )
        )
        spots.append(
            ("lm_head.weight == checkpoint", torch.equal(params["lm_head.weight"].data, ck.get("lm_head.weight")))
        )
    else:
        e = params["model.e_proj.weight"].data
        spots.append(("model.e_proj.weight == I", torch.equal(e, torch.eye(e.shape[0], dtype=e.dtype))))
        spots.append(("model.h_proj.weight == 0", bool((params["model.h_proj.weight"].data == 0).all())))
        spots.append(
            (
                f"model.decoder.self_attn.wq_b.weight == model.layers.{nh}.self_attn.wq_b.weight",
                torch.equal(
                    params["model.decoder.self_attn.wq_b.weight"].data,
                    ck.get(f"model.layers.{nh}.self_attn.wq_b.weight"),
                ),
            )
        )
        spots.append(
            (
                "model.decoder.mlp.experts.w2_weight all 0",
                bool((params["model.decoder.mlp.experts.w2_weight"].data == 0).all()),
            )
        )
        spots.append(
            (
                "decoder compress_ratio == 0 (no compressor)",
                model.model.decoder.self_attn.compress_ratio == 0 and model.model.decoder.self_attn.compressor is None,
            )
        )
    res["spots"] = spots
    del model
    return res


def report(res):
    print(f"\n--- summary: {res['tag']}")
    bad = False
    for k, title in [
        ("errors", "EXCEPTIONS"),
        ("notfound", "sglang 'not found in params_dict'"),
        ("uninit", "sglang 'Some weights are not initialized'"),
        ("nan", "params never written (still NaN)"),
        ("nockpt", "params with no checkpoint source"),
        ("shape", "SHAPE mismatches"),
        ("value", "VALUE mismatches"),
        ("ignored", "checkpoint tensors ignored"),
        ("dtype", "dtype differences (cast silently by the loader)"),
    ]:
        items = res[k]
        if not items:
            print(f"  {title}: none")
            continue
        if k != "dtype":
            bad = True
        print(f"  {title}: {len(items)}")
        for it in items[:40]:
            if isinstance(it, tuple):
                print(f"    [{it[0]}]\n" + "\n".join("      " + l for l in it[1].splitlines()[-25:]))
            else:
                print("    " + it[:600])
        if len(items) > 40:
            print(f"    ... {len(items) - 40} more")
    print(f"  params matching the checkpoint exactly: {res['ok']}")
    for s, ok in res.get("spots", []):
        print(f"  spot check {'PASS' if ok else 'FAIL'}: {s}")
        bad |= not ok
    print(f"  RESULT: {'FAIL' if bad else 'PASS'}")
    return not bad


def main():
    print(f"checkpoint {CKPT}")
    print(
        f"env SGLANG_OPT_FP8_WO_A_GEMM={envs.SGLANG_OPT_FP8_WO_A_GEMM.get()} "
        f"SGLANG_DSV4_FP4_EXPERTS={os.environ.get('SGLANG_DSV4_FP4_EXPERTS')} "
        f"SGLANG_OPT_FUSE_WQA_WKV={envs.SGLANG_OPT_FUSE_WQA_WKV.get()}"
    )
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    init_sglang(ModelConfig(MODEL_DIR))
    ck = Ckpt(CKPT)
    print(f"checkpoint tensors: {len(ck.names)}")
    results = [check_model(False, ck), check_model(True, ck)]
    oks = [report(r) for r in results]
    print("\nOVERALL:", "PASS" if all(oks) else "FAIL")
    sys.exit(0 if all(oks) else 1)


if __name__ == "__main__":
    main()
