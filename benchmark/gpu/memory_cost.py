#!/usr/bin/env python3
"""What the corrected draft kv_indices sizing costs in a server sized as it would be served
(issue 29, item 4): one SGLang 0.5.12 server at a time, unpatched tree then patched tree, per
configuration, nothing else on the GPU.

Each server: ``--mem-fraction-static 0.85``, no ``--max-total-tokens`` (the KV pool is what
SGLang's own memory profile gives), context 32768 (``--context-length 32768`` with
``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1``: the models' own context is 2048), no piecewise
CUDA graphs (as ab_bench.py), started with ab_bench.start_server (serve_checks.py's command and
environment, the memory probe of trace/sitecustomize.py) and stopped once healthy: no requests
are needed, SGLang sizes everything at start. From the server's own log (:func:`parse_server_log`):
the KV pool (tokens and GB, target and draft), ``max_total_num_tokens``, ``max_running_requests``,
``context_len`` and the free memory when the scheduler is ready, the batch sizes the target
graphs were captured at, and for the target, draft and draft-extend graph captures the time,
the memory taken (SGLang's ``mem usage``: free memory before minus after, in GB with 2 decimals)
and the free memory after; whether a capture began and never ended, and the log's error lines.
From the probe: the draft rows tensor's exact bytes and the allocation of its
``init_cuda_graph_state``. Beside each: the formula of benchmark/kv_indices_memory.py for both
trees at the server's own max_bs (the probe's), topk, steps and context,
``draft_kv_indices_buffer_width(max_bs, topk, ctx) * steps * 4`` bytes patched (int32; 0.5.12:
``max_bs * ctx * steps * 4``, the topk factor missing for FlashInfer and FlashInfer-MLA).

Configurations (CONFIGS): FlashInfer CUDA graphs topk 8 / 5 steps and topk 4 / 3 steps on the
exact 8B-shaped model (make_models.py --shape 8b), FlashInfer-MLA topk 1 / 3 steps on the
DeepSeek-V3-style MLA model (make_deepseek_models.py; 0.5.12's MLA draft backend refuses
topk > 1), each at SGLang's default graph batch and at ``--cuda-graph-max-bs 256``. With EAGLE,
0.5.12 sets ``--max-running-requests`` to 48 unless given, and captures no batch above the
request pool, so the 256 case also gives ``--max-running-requests 256`` (without it the capture
stops at 48 whatever the graph batch).

On the H200, through ab_h200.sh (setup as for the A/B, the run in the background across calls):

    AB_PROGRAM=memory_cost.py DEADLINE_S=1640 WAIT_S=500 bash benchmark/gpu/ab_h200.sh start
    bash benchmark/gpu/ab_h200.sh wait 545
    DEADLINE_IN=<device seconds left - 50> bash benchmark/gpu/ab_h200.sh wait <that + 15>

Output: OUT/memory_cost.json (rewritten after every server) and OUT/memory_cost.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ab_bench  # noqa: E402
import ab_stats  # noqa: E402
import serve_checks  # noqa: E402

TREES = ab_stats.TREES
CONTEXT = 32768
#: (configuration, which models, extra server flags); the models are --models (8B) or --mla-models
CONFIGS = [
    ("flashinfer_cgdef_k8s5", "models", ""),
    ("flashinfer_cgdef_k8s5", "models", "--cuda-graph-max-bs 256 --max-running-requests 256"),
    ("flashinfer_cgdef_k4s3", "models", ""),
    ("flashinfer_cgdef_k4s3", "models", "--cuda-graph-max-bs 256 --max-running-requests 256"),
    ("fimla_cgdef_k1s3", "mla_models", ""),
    ("fimla_cgdef_k1s3", "mla_models", "--cuda-graph-max-bs 256 --max-running-requests 256"),
]
#: kv_indices_memory.py's name of each serve_checks backend
FORMULA_BACKEND = {"flashinfer": "flashinfer", "fimla": "flashinfer_mla"}

# SGLang 0.5.12's log lines (the f-strings are in the wheel: test_memory_cost.py checks them)
KV_CACHE = re.compile(
    r"KV Cache is allocated\. #tokens: (\d+), (?:K size: ([\d.]+) GB, V size: ([\d.]+) GB|" r"KV size: ([\d.]+) GB)"
)
SCHEDULER = re.compile(
    r"max_total_num_tokens=(\d+), chunked_prefill_size=(-?\d+|None), max_prefill_tokens=(\d+), "
    r"max_running_requests=(\d+), context_len=(\d+), available_gpu_mem=(-?[\d.]+) GB"
)
CAPTURE_BS = re.compile(r"Capture cuda graph bs \[([\d, ]*)\]")
CAPTURE = re.compile(
    r"Capture (cuda graph|draft cuda graph|draft extend cuda graph) (begin|end)\."
    r"(?: Time elapsed: ([\d.]+) s\. mem usage=(-?[\d.]+) GB\.)? .*?avail mem=(-?[\d.]+) GB"
)
LOAD_BEGIN = re.compile(r"Load weight begin\. avail mem=(-?[\d.]+) GB")
CAPTURE_NAMES = {
    "cuda graph": "target_graph",
    "draft cuda graph": "draft_graph",
    "draft extend cuda graph": "draft_extend_graph",
}


def parse_server_log(text: str) -> dict:
    """What a 0.5.12 server's log says about its memory: ``kv_cache`` (one entry per pool, the
    target's first, then the draft's: tokens and GB), the scheduler's line (``max_total_num_tokens``,
    ``max_running_requests``, ``context_len``, ``available_gpu_mem_gb``), ``target_graph_bs`` and,
    per capture that ended, its seconds, ``mem_usage_gb`` and ``avail_after_gb``; a capture that
    began and did not end is listed in ``captures_not_ended``."""
    out: dict = {"kv_cache": [], "captures_not_ended": []}
    m = LOAD_BEGIN.search(text)  # the target's: the free memory this server found at its start
    if m:
        out["avail_at_start_gb"] = float(m.group(1))
    for m in KV_CACHE.finditer(text):
        k, v, kv = (float(x) if x else None for x in m.groups()[1:])
        out["kv_cache"].append(
            {
                "tokens": int(m.group(1)),
                "gb": kv if kv is not None else k + v,
                **({"k_gb": k, "v_gb": v} if kv is None else {}),
            }
        )
    m = SCHEDULER.search(text)
    if m:
        out.update(
            max_total_num_tokens=int(m.group(1)),
            max_running_requests=int(m.group(4)),
            context_len=int(m.group(5)),
            available_gpu_mem_gb=float(m.group(6)),
        )
    m = CAPTURE_BS.search(text)
    if m:
        out["target_graph_bs"] = [int(x) for x in m.group(1).split(",") if x.strip()]
    open_captures = []
    for m in CAPTURE.finditer(text):
        name = CAPTURE_NAMES[m.group(1)]
        if m.group(2) == "begin":
            open_captures.append(name)
            continue
        if name in open_captures:
            open_captures.remove(name)
        out[name] = {
            "seconds": float(m.group(3)),
            "mem_usage_gb": float(m.group(4)),
            "avail_after_gb": float(m.group(5)),
        }
    out["captures_not_ended"] = open_captures
    return out


def formulas(backend: str, probe: dict | None, topk: int, steps: int, ctx: int = CONTEXT) -> dict | None:
    """The draft rows by the formula for both trees, at the server's own max_bs (the probe's first
    int argument of init_cuda_graph_state); None without a probe record."""
    if not probe or not probe.get("args"):
        return None
    max_bs = probe["args"][0]
    return {
        "max_bs": max_bs,
        "topk": topk,
        "steps": steps,
        "ctx": ctx,
        **{
            f"{tree}_bytes": ab_stats.formula_rows_bytes(FORMULA_BACKEND[backend], tree, steps, max_bs, topk, ctx)
            for tree in TREES
        },
    }


def gpu_used_mib() -> int | None:
    """The GPU's used memory (MiB, nvidia-smi's first GPU); None without nvidia-smi."""
    try:
        r = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        return int(r.stdout.split()[0]) if r.returncode == 0 else None
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


def wait_gpu_released(limit_s: float, below_mib: int = 1024) -> int | None:
    """Wait (at most ``limit_s``) until the last server's processes have given the GPU's memory
    back, so that each server's memory profile starts on an empty GPU; the used MiB at the end."""
    end = time.time() + max(0.0, limit_s)
    used = gpu_used_mib()
    while used is not None and used >= below_mib and time.time() < end:
        time.sleep(1)
        used = gpu_used_mib()
    return used


def measure(
    config: str, models: str, extra: str, tree: str, port: int, a: argparse.Namespace, deadline: ab_bench.Deadline
) -> dict:
    """Start one server of ``tree``, wait until it is healthy (or exits, or the deadline), stop it,
    read its log and its probe."""
    name = f"{config}_{tree}"
    cfg = serve_checks.parse(name)
    tag = f"{name}_{'bs256' if '256' in extra else 'bsdefault'}"  # its logs' names
    server_a = argparse.Namespace(**{**vars(a), "models": models, "logdir": a.logdir})
    extra_args = " ".join(
        x for x in ("--disable-piecewise-cuda-graph", f"--context-length {CONTEXT}", extra, a.extra_args) if x
    )
    gpu_used_before = wait_gpu_released(min(60.0, deadline.left() - a.min_server_seconds / 2))
    t0 = time.time()
    proc = ab_bench.start_server(name, port, server_a, extra_args)
    errors = ab_bench.wait_healthy({name: (proc, port)}, t0 + min(deadline.left() - 10, a.startup_timeout))
    startup = round(time.time() - t0, 1)
    serve_checks.kill_group(proc)
    try:  # what the launcher's group left (the scheduler, the detokenizer)
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for prefix, ext in (("server", ".log"), ("memprobe", ".jsonl")):  # the next server of this name writes its own
        src, dst = (os.path.join(a.logdir, f"{prefix}_{n}{ext}") for n in (name, tag))
        if os.path.exists(src):
            os.replace(src, dst)
    log_path = os.path.join(a.logdir, f"server_{tag}.log")
    with open(log_path, errors="replace") as f:
        log = parse_server_log(f.read())
    probes = ab_bench.read_memprobe(os.path.join(a.logdir, f"memprobe_{tag}.jsonl"))
    return {
        "config": config,
        "tree": tree,
        "extra_args": extra_args,
        "startup_s": startup,
        "gpu_used_mib_before": gpu_used_before,
        "healthy": not errors,
        "errors": list(errors.values()) + (serve_checks.error_lines(log_path) if errors else []),
        "log": log,
        "probe": probes,
        "formula": formulas(cfg["backend"], probes[0] if probes else None, cfg["topk"], cfg["steps"]),
    }


def compare(servers: list[dict]) -> list[dict]:
    """Per (configuration, extra flags): the two trees side by side, the measured differences
    beside the formula's."""
    rows = []
    for key in dict.fromkeys((s["config"], s["extra_args"]) for s in servers):
        by_tree = {s["tree"]: s for s in servers if (s["config"], s["extra_args"]) == key}
        if set(by_tree) != set(TREES):
            continue
        a, b = by_tree["unpatched"], by_tree["patched"]

        def both(get):
            try:
                return [get(a), get(b)]
            except (KeyError, IndexError, TypeError):
                return None

        row = {
            "config": key[0],
            "extra_args": key[1],
            "kv_pool_tokens": both(lambda s: s["log"]["kv_cache"][0]["tokens"]),
            "max_running_requests": both(lambda s: s["log"]["max_running_requests"]),
            "draft_graph_mem_gb": both(lambda s: s["log"]["draft_graph"]["mem_usage_gb"]),
            "avail_after_draft_graph_gb": both(lambda s: s["log"]["draft_graph"]["avail_after_gb"]),
            "available_gpu_mem_gb": both(lambda s: s["log"]["available_gpu_mem_gb"]),
            "avail_at_start_gb": both(lambda s: s["log"]["avail_at_start_gb"]),
            "rows_bytes": both(lambda s: s["probe"][0]["rows_bytes"]),
            "formula_bytes": both(lambda s: s["formula"][f"{s['tree']}_bytes"]),
        }
        if row["draft_graph_mem_gb"] and row["formula_bytes"]:
            row["draft_graph_mem_diff_gb"] = round(row["draft_graph_mem_gb"][1] - row["draft_graph_mem_gb"][0], 2)
            row["formula_diff_gb"] = round((row["formula_bytes"][1] - row["formula_bytes"][0]) / 2**30, 3)
        rows.append(row)
    return rows


def markdown(rows: list[dict]) -> str:
    def pair(x, spec=""):
        return "-" if not x else " / ".join("-" if v is None else format(v, spec) for v in x)

    out = [
        "| config | flags | KV pool tokens A / B | max running A / B | draft graph capture GB A / B (diff) | "
        "formula rows bytes A / B (diff GiB) | rows measured bytes A / B | free after capture GB A / B | "
        "free at start GB A / B |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        out.append(
            f"| {r['config']} | {r['extra_args']} | {pair(r['kv_pool_tokens'], ',')} | "
            f"{pair(r['max_running_requests'])} | {pair(r['draft_graph_mem_gb'], '.2f')} "
            f"({r.get('draft_graph_mem_diff_gb', '-')}) | {pair(r['formula_bytes'], ',')} "
            f"({r.get('formula_diff_gb', '-')}) | {pair(r['rows_bytes'], ',')} | "
            f"{pair(r['avail_after_draft_graph_gb'], '.2f')} | {pair(r.get('avail_at_start_gb'), '.2f')} |"
        )
    return "\n".join(out) + "\n"


def mla_models(a: argparse.Namespace) -> str | None:
    """--mla-models, built there with make_deepseek_models.py when missing (SGLang's site first on
    the path, as run_deepseek_on_h200.sh builds them); None when that fails."""
    if not os.path.exists(os.path.join(a.mla_models, "prompts.json")):
        env = dict(os.environ, PYTHONPATH=a.site)
        subprocess.run(
            [
                sys.executable,
                os.path.join(os.path.dirname(os.path.abspath(__file__)), "make_deepseek_models.py"),
                a.mla_models,
            ],
            env=env,
        )
    return a.mla_models if os.path.exists(os.path.join(a.mla_models, "prompts.json")) else None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", required=True, help="the exact 8B-shaped models (make_models.py --shape 8b)")
    ap.add_argument(
        "--mla-models",
        help="the MLA models (make_deepseek_models.py; built when missing; default: " "ds_models beside --models)",
    )
    ap.add_argument("--site", required=True)
    ap.add_argument("--patched", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", help="server logs and probes (default: OUT)")
    ap.add_argument("--deadline-file")
    ap.add_argument("--max-seconds", type=float, default=540)
    ap.add_argument("--startup-timeout", type=float, default=420)
    ap.add_argument("--min-server-seconds", type=float, default=150, help="start a server only with this much left")
    ap.add_argument("--mem-fraction", type=float, default=0.85)
    ap.add_argument("--base-port", type=int, default=21000)
    ap.add_argument("--extra-args", default=os.environ.get("EXTRA_ARGS", ""))
    ap.add_argument("--configs", nargs="+", type=int, help="indices into CONFIGS (default: all)")
    a = ap.parse_args(argv)
    a.mla_models = a.mla_models or os.path.join(os.path.dirname(os.path.abspath(a.models)), "ds_models")
    a.max_total_tokens = a.max_running_requests = None  # SGLang's own (serve_checks.server_cmd omits both)
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    t_start = time.time()
    deadline = ab_bench.Deadline(t_start + a.max_seconds, a.deadline_file)
    a.logdir = os.path.join(a.work or a.out, "logs")
    os.makedirs(a.logdir, exist_ok=True)
    os.environ["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] = "1"  # the servers' environment copies it
    servers, notes = [], []
    chosen = [CONFIGS[i] for i in a.configs] if a.configs else CONFIGS
    try:
        for index, (config, which, extra) in enumerate(chosen):
            models = a.models if which == "models" else mla_models(a)
            if models is None:
                notes.append(f"{config} {extra}: no MLA models in {a.mla_models}")
                continue
            for j, tree in enumerate(TREES):
                if deadline.left() < a.min_server_seconds:
                    notes.append(f"{config}_{tree} {extra}: not started, {deadline.left():.0f} s left")
                    continue
                servers.append(measure(config, models, extra, tree, a.base_port + 10 * (2 * index + j), a, deadline))
                rows = compare(servers)
                with open(os.path.join(a.out, "memory_cost.json"), "w") as f:
                    json.dump(
                        {
                            "settings": {
                                "mem_fraction": a.mem_fraction,
                                "context": CONTEXT,
                                "extra_args": a.extra_args,
                                "elapsed_s": round(time.time() - t_start, 1),
                            },
                            "comparison": rows,
                            "servers": servers,
                            "notes": notes,
                        },
                        f,
                        indent=1,
                    )
                with open(os.path.join(a.out, "memory_cost.md"), "w") as f:
                    f.write(markdown(rows) + "".join(f"\n- {n}" for n in notes))
                print(
                    f"[{time.time() - t_start:.0f}s] {config}_{tree} {extra}: healthy={servers[-1]['healthy']} "
                    f"startup {servers[-1]['startup_s']} s",
                    flush=True,
                )
    finally:
        serve_checks.kill_all()
    print(markdown(compare(servers)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
