#!/usr/bin/env python3
"""Interleaved A/B of unpatched (A) and patched (B) SGLang 0.5.12 with SGLang's own benchmark.

For each configuration, one pair of servers is started (the same flags as serve_checks.py, one
from each tree; no other server is compiling meanwhile), warmed up with one benchmark run each,
then benchmarked in alternating rounds A B A B ... (``--rounds`` each) by
``python -m sglang.bench_serving --backend sglang --dataset-name random-ids --tokenize-prompt``
(random token ids, no download; the tiny models' own tokenizer) at a fixed seed, request rate
and concurrency, so every round sends the same requests. Then the pair is stopped and the next
configuration starts.

bench_serving runs in one long-lived client process (``--client``), which executes the module
exactly as ``python -m`` does (``runpy``) once per round, so its imports are paid once.

Per configuration: the median output tokens/s of each tree, the patched / unpatched ratio of
round k's pair (median, min, max over rounds), and the median accept length per tree as
bench_serving reports it (the server's ``avg_spec_accept_length``: accepted tokens over verify
steps since the server started, warm-up included). ``--max-seconds`` stops cleanly: rounds
already run are kept and written. Output: OUT/ab_results.json, OUT/ab_summary.md, OUT/rounds/
(bench_serving's JSONL per run), OUT/logs/.

Usage (after ``bash benchmark/gpu/run_on_h200.sh --setup-only``):
  python3 benchmark/gpu/ab_bench.py --models /tmp/sgl_dl/models --site /tmp/sgl_dl/site \\
      --patched /tmp/sgl_dl/patched --out "$OUT" --max-seconds 450
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time

import serve_checks

# the configurations of issue 13: triton eager (both trees correct: parity expected), flashinfer
# with CUDA graphs (max bs 8; the unpatched graph row lacks the topk factor)
CONFIGS = ["triton_nocg_k4s3", "triton_nocg_k1s3", "flashinfer_cg_k4s3", "flashinfer_cg_k8s5"]
TREES = ("unpatched", "patched")  # A, B
#: a `datasets` that bench_serving's imports find on a machine without it (see its docstring)
STANDIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standin")
DONE = "@@AB_ROUND_DONE@@"


def bench_argv(a: argparse.Namespace, port: int, num_prompts: int, output_file: str) -> list[str]:
    """bench_serving's arguments for one run (every flag exists in 0.5.12's parser; see the test)."""
    return [
        "--backend", "sglang", "--dataset-name", "random-ids", "--tokenize-prompt",
        "--host", "127.0.0.1", "--port", str(port),
        "--model", f"{a.models}/target", "--tokenizer", f"{a.models}/target",
        "--num-prompts", str(num_prompts),
        "--random-input-len", str(a.input_len), "--random-output-len", str(a.output_len),
        "--random-range-ratio", str(a.range_ratio),
        "--request-rate", str(a.request_rate), "--max-concurrency", str(a.concurrency),
        "--seed", str(a.seed), "--warmup-requests", "1", "--ready-check-timeout-sec", "0",
        "--disable-tqdm", "--output-file", output_file,
    ]


def client_loop() -> int:
    """--client: for each JSON argv list on stdin, run sglang.bench_serving as ``python -m`` does."""
    import runpy
    import traceback

    for line in sys.stdin:
        sys.argv = ["sglang.bench_serving", *json.loads(line)]
        status = 0
        try:
            runpy.run_module("sglang.bench_serving", run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
        except Exception:
            traceback.print_exc()
            status = 1
        print(f"{DONE} {status}", flush=True)
    return 0


class Client:
    """The long-lived bench_serving client; every run is bounded by a timeout."""

    def __init__(self, a: argparse.Namespace, log_path: str) -> None:
        self.env = dict(os.environ, PYTHONPATH=f"{a.site}:{STANDIN}", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                        TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
        self.log = open(log_path, "a")
        self._start()

    def _start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--client"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=self.env, start_new_session=True)
        serve_checks._SERVERS.append(self.proc)  # killed with the servers on SIGTERM
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc, self.lines), daemon=True).start()

    def _read(self, proc: subprocess.Popen, lines: queue.Queue) -> None:
        for line in proc.stdout:
            self.log.write(line)
            self.log.flush()
            if line.startswith(DONE):
                lines.put(line)

    def run(self, argv: list[str], timeout: float) -> int | None:
        """bench_serving's exit status, or None when it did not finish within ``timeout`` (the
        client is then replaced, so a late result cannot be taken for the next run's)."""
        self.proc.stdin.write(json.dumps(argv) + "\n")
        self.proc.stdin.flush()
        try:
            return int(self.lines.get(timeout=max(timeout, 0)).split()[1])
        except queue.Empty:
            serve_checks.kill_group(self.proc)
            self._start()
            return None

    def close(self) -> None:
        serve_checks.kill_group(self.proc)
        self.log.close()


def start_server(name: str, port: int, a: argparse.Namespace) -> subprocess.Popen:
    cfg = serve_checks.parse(name)
    log = open(os.path.join(a.logdir, f"server_{name}.log"), "w")
    env = serve_checks.server_env(cfg, a, os.path.join(a.logdir, f"trace_{name}.txt"))
    proc = subprocess.Popen(serve_checks.server_cmd(cfg, a.models, port, a), stdout=log,
                            stderr=subprocess.STDOUT, env=env, start_new_session=True)
    serve_checks._SERVERS.append(proc)
    return proc


def wait_healthy(procs: dict[str, tuple[subprocess.Popen, int]], until: float) -> dict[str, str]:
    """Wait for every server's /health; {name: error} for those not healthy by ``until``."""
    pending = dict(procs)
    errors = {}
    while pending and time.time() < until:
        for name, (proc, port) in list(pending.items()):
            if proc.poll() is not None:
                errors[name] = f"server exited rc={proc.returncode} during startup"
                del pending[name]
                continue
            try:
                if serve_checks.http(port, "/health", timeout=5)[0] == 200:
                    del pending[name]
            except Exception:
                pass
        time.sleep(1)
    errors.update({name: "not healthy before the startup timeout / deadline" for name in pending})
    return errors


def read_round(path: str) -> dict | None:
    """The last result bench_serving appended to ``path``, or None."""
    try:
        with open(path) as f:
            lines = [line for line in f if line.strip()]
    except OSError:
        return None
    if not lines:
        return None
    r = json.loads(lines[-1])
    return {k: r.get(k) for k in ("completed", "duration", "total_output_tokens", "output_throughput",
                                  "accept_length", "median_tpot_ms", "median_ttft_ms")}


def summarize(config: str, rounds: dict[str, list[dict]], expected_completed: int) -> dict:
    """Medians per tree, and the ratio of each round's pair (round k of B over round k of A)."""
    good = {tree: [r for r in rounds[tree] if r and r.get("completed") == expected_completed]
            for tree in TREES}
    out = {"config": config, "rounds": {tree: len(good[tree]) for tree in TREES}}
    for tree in TREES:
        tps = [r["output_throughput"] for r in good[tree]]
        acc = [r["accept_length"] for r in good[tree] if r.get("accept_length") is not None]
        out[f"{tree}_tokens_per_s"] = statistics.median(tps) if tps else None
        out[f"{tree}_accept_length"] = statistics.median(acc) if acc else None
    pairs = [(a, b) for a, b in zip(rounds["unpatched"], rounds["patched"])
             if a in good["unpatched"] and b in good["patched"]]
    ratios = [b["output_throughput"] / a["output_throughput"] for a, b in pairs]
    out["pairs"] = len(ratios)
    out["ratio_median"] = statistics.median(ratios) if ratios else None
    out["ratio_min"] = min(ratios) if ratios else None
    out["ratio_max"] = max(ratios) if ratios else None
    return out


def markdown_table(summaries: list[dict]) -> str:
    def num(x, fmt):
        return "-" if x is None else format(x, fmt)

    rows = ["| config | rounds A / B | unpatched tokens/s | patched tokens/s | patched / unpatched (min-max) "
            "| accept length unpatched | accept length patched |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for s in summaries:
        ratio = "-" if s["ratio_median"] is None else \
            f"{s['ratio_median']:.3f} ({s['ratio_min']:.3f}-{s['ratio_max']:.3f})"
        rows.append(f"| {s['config']} | {s['rounds']['unpatched']} / {s['rounds']['patched']} | "
                    f"{num(s['unpatched_tokens_per_s'], '.1f')} | {num(s['patched_tokens_per_s'], '.1f')} | "
                    f"{ratio} | {num(s['unpatched_accept_length'], '.3f')} | "
                    f"{num(s['patched_accept_length'], '.3f')} |")
    return "\n".join(rows) + "\n"


def run_config(config: str, index: int, a: argparse.Namespace, client: Client, deadline: float) -> dict:
    """One pair of servers: start, warm up, alternate rounds, stop. Returns raw rounds and notes."""
    record = {"config": config, "rounds": {tree: [] for tree in TREES}, "notes": []}
    servers = {}
    for j, tree in enumerate(TREES):
        name = f"{config}_{tree}"
        port = a.base_port + 2 * index * a.port_step + j * a.port_step
        servers[name] = (start_server(name, port, a), port)
    try:
        t0 = time.time()
        errors = wait_healthy(servers, min(deadline, t0 + a.startup_timeout))
        record["startup_s"] = round(time.time() - t0, 1)
        if errors:
            record["notes"] += [f"{n}: {e}" for n, e in errors.items()]
            for name in errors:
                record["notes"] += serve_checks.error_lines(os.path.join(a.logdir, f"server_{name}.log"))
            return record
        rounds_dir = os.path.join(a.out, "rounds")
        for k in range(-1, a.rounds):  # round -1: warm-up, not counted
            for tree in TREES:
                name = f"{config}_{tree}"
                proc, port = servers[name]
                left = deadline - time.time()
                if left < 5 or proc.poll() is not None:
                    record["notes"].append(f"stopped before round {k} of {tree}: "
                                           + ("deadline" if left < 5 else f"server exited rc={proc.returncode}"))
                    return record
                tag = "warmup" if k < 0 else f"round{k}"
                path = os.path.join(rounds_dir, f"{name}_{tag}.jsonl")
                prompts = a.warmup_prompts if k < 0 else a.num_prompts
                status = client.run(bench_argv(a, port, prompts, path), min(a.round_timeout, left))
                if status is None:
                    record["notes"].append(f"{name} {tag}: bench_serving did not finish in time")
                    return record
                result = read_round(path)
                if k >= 0:
                    record["rounds"][tree].append(result if status == 0 else None)
                if status != 0 or result is None:
                    record["notes"].append(f"{name} {tag}: bench_serving exit {status}")
        return record
    finally:
        for proc, _ in servers.values():
            serve_checks.kill_group(proc)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--models")
    ap.add_argument("--site", help="folder holding the unpatched sglang/ (and its deps)")
    ap.add_argument("--patched", help="folder holding the patched copy sglang/")
    ap.add_argument("--out")
    ap.add_argument("--configs", nargs="+", default=CONFIGS, help="BACKEND_CG_MODE stems (serve_checks names)")
    ap.add_argument("--rounds", type=int, default=5, help="measured rounds per tree (>= 5)")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--warmup-prompts", type=int, default=16)
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--range-ratio", type=float, default=0.5, help="lengths drawn from [len * ratio, len]")
    ap.add_argument("--request-rate", type=float, default=float("inf"))
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-seconds", type=float, default=450, help="stop cleanly this long after start")
    ap.add_argument("--min-config-seconds", type=float, default=120,
                    help="start a configuration only with this much time left")
    ap.add_argument("--startup-timeout", type=float, default=240)
    ap.add_argument("--round-timeout", type=float, default=90)
    ap.add_argument("--base-port", type=int, default=20000)
    ap.add_argument("--port-step", type=int, default=1200, help="as serve_checks.py: SGLang takes ports above its own")
    ap.add_argument("--mem-fraction", type=float, default=0.08)
    ap.add_argument("--max-total-tokens", type=int, default=200000)
    ap.add_argument("--extra-args", default=os.environ.get("EXTRA_ARGS", ""))
    a = ap.parse_args(argv)
    if not a.client:
        missing = [f"--{k}" for k in ("models", "site", "patched", "out") if not getattr(a, k)]
        if missing:
            ap.error(f"required: {' '.join(missing)}")
        if a.rounds < 5:
            ap.error("--rounds must be at least 5")
        for stem in a.configs:
            try:
                serve_checks.parse(f"{stem}_patched")
            except (AssertionError, ValueError):
                ap.error(f"not a serve_checks.py configuration: {stem} (BACKEND_CG_kTOPKsSTEPS)")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.client:
        return client_loop()
    deadline = time.time() + a.max_seconds
    a.logdir = os.path.join(a.out, "logs")
    os.makedirs(os.path.join(a.out, "rounds"), exist_ok=True)
    os.makedirs(a.logdir, exist_ok=True)
    client = Client(a, os.path.join(a.logdir, "bench_serving.log"))
    records, summaries = [], []
    try:
        for index, config in enumerate(a.configs):
            if deadline - time.time() < a.min_config_seconds:
                records.append({"config": config, "rounds": {t: [] for t in TREES},
                                "notes": ["not started: deadline"]})
            else:
                records.append(run_config(config, index, a, client, deadline))
            summaries = [dict(summarize(r["config"], r["rounds"], a.num_prompts),
                              notes=r["notes"], startup_s=r.get("startup_s")) for r in records]
            write_outputs(a, records, summaries)
            print(f"[{a.max_seconds - (deadline - time.time()):.0f}s] {config}: "
                  f"{json.dumps(summaries[-1])}", flush=True)
    finally:
        client.close()
        serve_checks.kill_all()
    print(markdown_table(summaries))
    return 0


def write_outputs(a: argparse.Namespace, records: list[dict], summaries: list[dict]) -> None:
    settings = {k: getattr(a, k) for k in ("rounds", "num_prompts", "warmup_prompts", "input_len", "output_len",
                                          "range_ratio", "request_rate", "concurrency", "seed", "extra_args")}
    settings["request_rate"] = str(settings["request_rate"])
    with open(os.path.join(a.out, "ab_results.json"), "w") as f:
        json.dump({"settings": settings, "summaries": summaries, "records": records}, f, indent=1)
    with open(os.path.join(a.out, "ab_summary.md"), "w") as f:
        f.write(markdown_table(summaries))


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: (serve_checks.kill_all(), sys.exit(143)))
    sys.exit(main())
