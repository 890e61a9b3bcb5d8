#!/usr/bin/env python3
"""Interleaved A/B of unpatched (A) and patched (B) SGLang 0.5.12 that resolves a few percent.

Per configuration, one pair of servers (serve_checks.py's flags, one from each tree, nothing
else on the GPU) goes through:

1. start, both at once; the memory probe (trace/sitecustomize.py, SGL_DL_MEMPROBE) records the
   draft kv_indices CUDA-graph rows each server allocates;
2. exactness: serve_checks.py's request plan on each server in turn (outputs must equal the
   model's rule; on the patched tree every accept length must be num_steps + 1);
3. per concurrency: a warm-up run per tree (``--warmup-waves``, not counted), then a calibration
   run per tree whose rate sets the prompts of a measured round (``--round-seconds`` times
   ``--round-margin`` at the faster tree's rate, whole waves of the concurrency; the same
   requests for both trees);
4. ``--pairs`` pairs of measured rounds (every concurrency per pair), each round one
   ``python -m sglang.bench_serving --backend sglang --dataset-name random-ids`` run at a fixed
   seed, infinite request rate and the given ``--max-concurrency``. A pair whose shorter round
   lasted less than ``--round-seconds`` grows the rounds of the next pairs (ab_bench.grown_prompts;
   both rounds of a pair always have the same prompts). With ``--config-seconds S`` more pairs
   follow while the configuration's measured phase (from its first measured pair on, every
   concurrency) has run less than S seconds and a whole further pair fits before the deadline at
   the round times expected so far (Pair.another_pair); a pair started just before S ran out
   still runs, so the phase can overrun S by one pair. Only the clock decides: the rule never
   looks at the tokens/s, the ratios or their interval, so it cannot stop where the interval
   happens to look good (no optional-stopping bias); the number of pairs depends on how fast the
   machine ran, not on which tree was ahead. Default 0: exactly ``--pairs`` pairs;
5. stop the pair.

Two modes (``--mode``) decide how a pair's two rounds meet the machine:

* ``sequential`` (default): one round after the other, in the order of ab_stats.schedule (the
  first tree alternating pair by pair). Each tree has the GPU and the host to itself, but the two
  rounds see the machine at different times, and on the lent H200 of 2026-12-01 the same tree on
  the same workload ran up to 1.7 times faster in one round than in another 10-60 s away (GPU
  clock at 1980 MHz in 179 of 194 busy samples, the GPU busy a median 29% of the time in eager
  mode: the host's speed drifted). That drift lands in the ratio: sequential pairs cannot
  resolve ±2% there.
* ``together``: every bench_serving run of a pair (warm-up, calibration, each measured pair) runs
  on both servers at the same time, each tree through its own client, both started at once and
  both waited for (ab_stats.together_schedule), so both rounds of a pair see the same machine
  speed. The cost: the two trees contend for the one GPU and the host's CPUs, so each runs slower
  than it would alone, and once the faster tree's round ends the slower one runs its tail alone,
  faster than it ran beside the other; this pulls a ratio that is far from 1 toward 1. Together
  mode answers the parity question (is the ratio 1 within ±2%?); the gain question (how much
  faster is the patched tree?) keeps ``sequential``.
* ``both``: the mode's bias, measured (issue 29). On the same pair of servers, the measured pairs
  alternate between the two modes in the order together, sequential, sequential, together, ...
  (ab_stats.pair_mode), so a drift of the machine that is linear over four pairs favours neither
  mode, and each block of two pairs holds one of each (ab_stats.mode_bias). Warm-up and calibration
  run each tree alone, as sequential mode does; both modes' rounds get the same prompts. With
  ``--cpu-split`` a together pair runs each tree on its half (the halves swapping trees from one
  together pair to the next) and a sequential pair gives the measured tree every CPU ab_bench may
  use, as sequential mode does. The summary gives one row per mode (``sequential (both)``,
  ``together+cpu-split (both)``); report_ab.py the bias with its interval.

``--cpu-split`` (together and both modes; refused in sequential mode): the two trees get disjoint halves of the
CPUs. On the H200 of 2026-12-01 (results/h200-2026-12-01-ab3) together mode resolved triton
with CUDA graphs to ±2% (sd of a pair's log ratio 0.011) but not the eager configurations (sd
0.041-0.103), whose two trees' tokens/s were negatively correlated within a pair (-0.79 to
-0.11): eager decoding is paced by the host (one scheduler thread per server launching
kernels), and the two servers and two clients competed for the same 16 CPUs. With the split,
each tree's server, with everything it spawns, and that tree's client run on one half of the
CPUs ab_bench may use (os.sched_getaffinity(0)): whole physical cores (SMT siblings, as /sys
reports them, stay together), as many on each side, in CPU order (cpu_halves; an odd last core
is left to ab_bench; a single core's siblings are split between the trees).
A server or client is started on its half (:func:`pinned`: the starting thread's affinity, which
the child inherits), and before the warm-up and before every measured pair every thread of each
tree's process group is pinned again (:func:`pin_group`), the halves swapping trees pair by pair
(unpatched on the first half in even pairs), so that a difference between the halves (interrupts
served on CPU 0, say) cancels over the pairs instead of landing in the ratio; the summary's
``ratio_median_by_half`` gives the median ratio for each placement. The record keeps each tree's
half and what the kernel reported after every pinning (``pinning``: processes, threads, the union
of their CPU sets; a note when it is not the half, or when no process is left to pin), each run its
``cpus``; tables show the mode as ``together+cpu-split``. ``OMP_NUM_THREADS`` is set to the half's size for the servers and clients
unless it is set already: GNU OpenMP's default (torch's intra-op threads) already follows the
affinity a process starts with (torch 2.13 CPU: 1 thread when started on 1 of 2 CPUs), so this
only makes it explicit and independent of the OpenMP runtime; SGLang 0.5.12's model runner sets
torch's intra-op threads to 1 anyway when it loads a model on CUDA. Still shared: the GPU, the
last-level cache and memory bandwidth. SGLang moves its scheduler only with
``SGLANG_SET_CPU_AFFINITY`` (off by default) and skips its NUMA binding when the affinity is
already restricted.

bench_serving runs in long-lived client processes (``--client``), which execute the module as
``python -m`` does (``runpy``) once per run, so its imports are paid once: one client for both
trees in sequential mode, one per tree in together and both modes. Every run's record has its ``t_start``
(time.time()) and ``wall_s``, so rounds can be plotted against time.

Per (configuration, concurrency): the patched / unpatched ratio of output tokens/s per pair, its
median, a bootstrap 95% interval, the sd of the log ratios and, with ``--plan``, the plan's TOST
verdict (ab_stats.py); per tree the medians of tokens/s, TTFT and ITL (round medians and p99s)
and of the accept length of the measured rounds: from the server's own decode windows, the
``Decode batch`` lines its log got while each round ran (:func:`server_accept_length`), not
bench_serving's ``accept_length``, which is the server's average since start, exactness and
warm-up included (kept as ``accept_length_since_start``). A round starts only when its expected
length fits before the deadline (``--max-seconds`` from start, ``--deadline-epoch``, or
``--deadline-file``, read at every check), so the run ends cleanly with whole pairs. Output:
OUT/ab_results.json and OUT/ab_summary.md, rewritten after every measured round; rounds' JSONL
and server logs under ``--work`` (default OUT).

Usage (after ``MODEL_SHAPE=8b bash benchmark/gpu/run_on_h200.sh --setup-only``; or
benchmark/gpu/ab_h200.sh, which does both):
  python3 benchmark/gpu/ab_bench.py --models /tmp/sgl_dl/models8b --site /tmp/sgl_dl/site \\
      --patched /tmp/sgl_dl/patched --out "$OUT" --configs flashinfer_cg_k8s5 --concurrencies 32
  (a configuration's own concurrencies: ``--configs flashinfer_cg_k1s3@1,8,32 triton_nocg_k4s3``,
  the second at --concurrencies)
  (parity, both trees at once, each on its own CPUs, pairs for 300 s per configuration:
  ``--mode together --cpu-split --config-seconds 300 --configs triton_nocg_k4s3 ...``)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import queue
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import ab_stats
import serve_checks

# the configurations of issue 19. Parity: both trees are correct in 0.5.12; gain: FlashInfer's
# CUDA-graph row lacks the topk factor in 0.5.12.
PARITY = ["triton_nocg_k1s3", "triton_nocg_k4s3", "flashinfer_nocg_k4s3", "triton_cg_k4s3", "flashinfer_cg_k1s3"]
GAIN = ["flashinfer_cg_k4s3", "flashinfer_cg_k8s5"]
CONFIGS = PARITY + GAIN
TREES = ab_stats.TREES
#: a `datasets` that bench_serving's imports find on a machine without it (see its docstring)
STANDIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standin")
DONE = "@@AB_ROUND_DONE@@"
ROUND_KEYS = (
    "completed",
    "duration",
    "total_output_tokens",
    "output_throughput",
    "accept_length",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "median_tpot_ms",
)


def bench_argv(a: argparse.Namespace, port: int, num_prompts: int, concurrency: int, output_file: str) -> list[str]:
    """bench_serving's arguments for one run (every flag exists in 0.5.12's parser; see the test)."""
    return [
        "--backend",
        "sglang",
        "--dataset-name",
        "random-ids",
        "--tokenize-prompt",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        f"{a.models}/target",
        "--tokenizer",
        f"{a.models}/target",
        "--num-prompts",
        str(num_prompts),
        "--random-input-len",
        str(a.input_len),
        "--random-output-len",
        str(a.output_len),
        "--random-range-ratio",
        str(a.range_ratio),
        "--request-rate",
        "inf",
        "--max-concurrency",
        str(concurrency),
        "--seed",
        str(a.seed),
        "--warmup-requests",
        "1",
        "--ready-check-timeout-sec",
        "0",
        "--disable-tqdm",
        "--output-file",
        output_file,
    ]


def server_extra_args(cfg: dict, max_concurrency: int, extra: str = "") -> str:
    """Flags appended to serve_checks.py's (argparse keeps the last): room for the largest
    concurrency, CUDA graphs up to that batch, no piecewise prefill graphs; no radix cache:
    every round sends the same prompts (fixed seed), so with the cache on a round's prefill work
    would depend on which prompts earlier runs cached (the 2026-12-01 runs had it on); and
    ``--sleep-on-idle``: the idle server of the pair would otherwise spin a CPU core at 100%
    while the other one is measured (SGLang's own IdleSleeper docstring). Both trees alike."""
    args = [
        f"--max-running-requests {max_concurrency}",
        "--disable-piecewise-cuda-graph",
        "--disable-radix-cache",
        "--sleep-on-idle",
    ]
    if cfg["cg"] == "cg":
        args.append(f"--cuda-graph-max-bs {max_concurrency}")
    return " ".join(args + ([extra] if extra else []))


def prompts_for_round(rates: list[float], round_seconds: float, concurrency: int, margin: float) -> int:
    """Prompts of a measured round: ``round_seconds * margin`` at the fastest of ``rates``
    (requests/s; the calibration runs'), rounded up to whole waves of ``concurrency``. The margin
    is room for a machine that runs faster later than while it was calibrated (on 2026-12-01
    eager rounds lasted 12.8-21 s where 20 s were asked)."""
    n = round_seconds * margin * max(rates)
    return max(concurrency, math.ceil(n / concurrency) * concurrency)


def grown_prompts(prompts: int, pair_rounds: list[dict], round_seconds: float, concurrency: int, margin: float) -> int:
    """Prompts of the next pairs after a complete pair of ``prompts``-prompt rounds: unchanged
    while every round lasted ``round_seconds``; else :func:`prompts_for_round` at the rate of the
    fastest short round (more whole waves, never fewer)."""
    short = [r["completed"] / r["duration"] for r in pair_rounds if r["duration"] < round_seconds]
    if not short:
        return prompts
    return max(prompts, prompts_for_round(short, round_seconds, concurrency, margin))


SIBLINGS = "/sys/devices/system/cpu/cpu{}/topology/thread_siblings_list"


def parse_cpu_list(text: str) -> set[int]:
    """The CPUs of a kernel CPU list (``0-3,8``, as in /proc/PID/status' Cpus_allowed_list)."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def format_cpu_list(cpus) -> str:
    """``{0, 1, 2, 3, 8}`` -> ``0-3,8``."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in runs)


def physical_cores(cpus: set[int], siblings: str = SIBLINGS) -> list[list[int]]:
    """``cpus`` grouped by physical core (the SMT siblings the kernel reports; a CPU without that
    file is a core of its own), ordered by first CPU."""
    cores = set()
    for cpu in cpus:
        try:
            with open(siblings.format(cpu)) as f:
                core = parse_cpu_list(f.read()) & cpus
        except (OSError, ValueError):
            core = {cpu}
        cores.add(frozenset(core | {cpu}))
    return sorted(sorted(core) for core in cores)


def cpu_halves(cores: list[list[int]]) -> tuple[list[int], list[int]]:
    """Two disjoint halves of the host's CPUs for ``--cpu-split``: the first and the second
    ``len(cores) // 2`` physical cores in CPU order, so that no core's SMT siblings serve both
    trees and both halves hold as many cores (an odd last core stays with ab_bench itself). With
    a single core its SMT siblings are split instead."""
    if len(cores) < 2:
        cores = [[cpu] for core in cores for cpu in core]
    if len(cores) < 2:
        raise ValueError(f"--cpu-split needs at least 2 CPUs, this process may use {format_cpu_list(sum(cores, []))}")
    n = len(cores) // 2
    return sorted(sum(cores[:n], [])), sorted(sum(cores[n : 2 * n], []))


@contextlib.contextmanager
def pinned(cpus: list[int] | None):
    """Pin the calling thread to ``cpus`` (None: leave it) while the block starts a process: a
    child inherits the CPU affinity of the thread that starts it, and on Linux
    ``os.sched_setaffinity(0, ...)`` sets the calling thread's only (ab_bench's reader threads
    keep theirs). Thread-safe, unlike a ``preexec_fn``; needs no ``taskset``."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def process_group(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` (from /proc/*/stat): a server or client that
    ab_bench started (its own session and group) and everything it spawned, as killpg sees them."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[2]) == pgid:
                        pids.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue  # exited meanwhile
    return sorted(pids)


def pin_group(pgid: int, cpus: list[int]) -> dict:
    """Pin every thread of every process of group ``pgid`` to ``cpus`` (threads and processes
    started later inherit it from the thread that starts them); what the kernel then reports: the
    processes and threads found and the union of their CPU sets."""
    processes = threads = 0
    seen: set[int] = set()
    for pid in process_group(pgid):
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue  # exited meanwhile
        processes += 1
        for tid in tids:
            try:
                os.sched_setaffinity(tid, cpus)
            except OSError:
                pass  # exited meanwhile, or refused: the CPUs read below say which
            try:
                seen |= os.sched_getaffinity(tid)
                threads += 1
            except OSError:
                pass  # exited meanwhile
    return {"processes": processes, "threads": threads, "cpus": format_cpu_list(seen)}


def omp_threads(a: argparse.Namespace, cpus: list[int]) -> int:
    """OMP_NUM_THREADS of a server or client started on ``cpus``: their size; with --mode both and
    --cpu-split the half's (it starts them on every CPU, and its together pairs move them onto a half)."""
    return len(a.cpu_halves[0]) if getattr(a, "mode", None) == "both" and getattr(a, "cpu_halves", None) else len(cpus)


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
    """The long-lived bench_serving client; every run is bounded by a timeout. ``cpus``: the CPUs
    it starts on (--cpu-split; a replacement client starts on the ones it holds then)."""

    def __init__(self, a: argparse.Namespace, log_path: str, cpus: list[int] | None = None) -> None:
        self.cpus = cpus
        self.env = dict(
            os.environ,
            PYTHONPATH=f"{a.site}:{STANDIN}",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            TOKENIZERS_PARALLELISM="false",
            PYTHONUNBUFFERED="1",
        )
        if cpus:
            self.env.setdefault("OMP_NUM_THREADS", str(omp_threads(a, cpus)))
        self.log = open(log_path, "a")
        self._start()

    def _start(self) -> None:
        with pinned(self.cpus):
            self.proc = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--client"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=self.env,
                start_new_session=True,
            )
        serve_checks._SERVERS.append(self.proc)  # killed with the servers on SIGTERM
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc, self.lines), daemon=True).start()

    def _read(self, proc: subprocess.Popen, lines: queue.Queue) -> None:
        for line in proc.stdout:
            self.log.write(line)
            self.log.flush()
            if line.startswith(DONE):
                lines.put((int(line.split()[1]), time.time()))

    def submit(self, argv: list[str]) -> None:
        """Start one bench_serving run; :meth:`wait` for it."""
        self.proc.stdin.write(json.dumps(argv) + "\n")
        self.proc.stdin.flush()

    def wait(self, timeout: float) -> tuple[int | None, float]:
        """(bench_serving's exit status, the time.time() it ended); the status is None when the
        run did not finish within ``timeout`` (the client is then replaced, so a late result
        cannot be taken for the next run's)."""
        try:
            return self.lines.get(timeout=max(timeout, 0))
        except queue.Empty:
            serve_checks.kill_group(self.proc)
            self._start()
            return None, time.time()

    def close(self) -> None:
        serve_checks.kill_group(self.proc)
        self.log.close()


def start_server(
    name: str, port: int, a: argparse.Namespace, extra_args: str, cpus: list[int] | None = None
) -> subprocess.Popen:
    """One server of a pair, in its own session; with ``cpus`` it and all it spawns start there."""
    cfg = serve_checks.parse(name)
    log = open(os.path.join(a.logdir, f"server_{name}.log"), "w")
    opts = SimpleNamespace(
        mem_fraction=a.mem_fraction,
        max_total_tokens=a.max_total_tokens,
        extra_args=extra_args,
        site=a.site,
        patched=a.patched,
        max_running_requests=getattr(a, "max_running_requests", 8),
    )
    env = serve_checks.server_env(cfg, opts, os.path.join(a.logdir, f"trace_{name}.txt"))
    env["SGL_DL_MEMPROBE"] = os.path.join(a.logdir, f"memprobe_{name}.jsonl")
    if cpus:  # OpenMP teams no larger than the half, whatever the OpenMP runtime
        env.setdefault("OMP_NUM_THREADS", str(omp_threads(a, cpus)))
    with pinned(cpus):
        proc = subprocess.Popen(
            serve_checks.server_cmd(cfg, a.models, port, opts),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
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
    return {k: r.get(k) for k in ROUND_KEYS}


#: SGLang 0.5.12's decode log line (srt/observability/scheduler_metrics_mixin.py, report_decode_stats),
#: written every --decode-log-interval (40) decode batches; its accept len is that window's accepted
#: tokens / verified requests (the counters reset after every line)
DECODE_WINDOW = re.compile(r"Decode batch(?: \[\d+\])?, #running-req: (\d+), .*?accept len: (\d+(?:\.\d+)?), ")


def window_accept_length(text: str) -> dict:
    """The accept length of the decode windows the server logged in ``text``: each window's accept
    len weighted by its running requests (a window's verified requests are its 40 batches' sizes,
    which the line's running-request count stands for), and how many windows there were."""
    windows = [(int(m.group(1)), float(m.group(2))) for m in DECODE_WINDOW.finditer(text)]
    weight = sum(running for running, _ in windows)
    return {
        "accept_windows": len(windows),
        "accept_length_windows": sum(r * a for r, a in windows) / weight if weight else None,
    }


def log_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def server_accept_length(path: str, offset: int) -> dict:
    """:func:`window_accept_length` of the whole lines a server's log got from ``offset`` on: the
    windows logged while one run was in flight. The first may hold up to 39 batches of the run
    before (the counters carry over an idle gap), never of the exactness phase, which warm-up and
    calibration follow."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        data = b""
    return window_accept_length(data[: data.rfind(b"\n") + 1].decode("utf-8", "replace"))


def read_memprobe(path: str) -> list[dict]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except OSError:
        return []


def exactness(
    name: str, port: int, proc: subprocess.Popen, a: argparse.Namespace, prompts: dict, deadline: float
) -> dict:
    """serve_checks.py's request plan on one server: outputs against the rule, accept lengths."""
    cfg = serve_checks.parse(name)
    runner = serve_checks.Runner(SimpleNamespace(deadline_s=deadline - time.time(), stress=a.stress), prompts)
    res: dict = {"config": name}
    try:
        runner.requests(res, cfg, port, proc)
    except Exception as exc:  # keep the A/B going; the record says what failed
        res["error"] = repr(exc)
    keep = ("tag", "match_rule", "first_diff", "n_out", "accept_len", "batch_secs")
    res["checks"] = [{k: c.get(k) for k in keep} for c in res.get("checks", [])]
    return {
        k: res.get(k)
        for k in (
            "checks",
            "max_new_tokens",
            "all_match_rule",
            "accept_min",
            "accept_max",
            "accept_mean",
            "accept_all_exact",
            "error",
            "truncated",
        )
    }


class Deadline:
    """When the run must end (a ``time.time()``). ``--deadline-file``, while it holds an epoch,
    overrides the given one and is read at every check, so that a run in the background
    (ab_h200.sh start) can be given the device time that is really left."""

    def __init__(self, epoch: float, path: str | None = None) -> None:
        self.epoch, self.path = epoch, path

    def left(self) -> float:
        if self.path:
            try:
                with open(self.path) as f:
                    return float(f.read()) - time.time()
            except (OSError, ValueError):
                pass
        return self.epoch - time.time()


class Pair:
    """One configuration's two servers and the bench_serving runs against them, each tree's
    through ``clients[tree]`` (one client for both in sequential mode, one each in together mode);
    ``on_round`` is called with the record after every measured round (ab_bench writes its
    outputs then; in together mode after both rounds of a pair)."""

    def __init__(
        self,
        config: str,
        index: int,
        a: argparse.Namespace,
        clients: dict[str, Client],
        deadline: Deadline,
        on_round=lambda record: None,
    ) -> None:
        self.config, self.a, self.clients, self.deadline, self.on_round = config, a, clients, deadline, on_round
        self.cfg = serve_checks.parse(f"{config}_patched")
        self.names = {tree: f"{config}_{tree}" for tree in TREES}
        self.ports = {tree: a.base_port + (2 * index + j) * a.port_step for j, tree in enumerate(TREES)}
        self.procs: dict[str, subprocess.Popen] = {}
        self.concurrencies = a.config_concurrencies[config]
        self.pairs = a.config_pairs.get(config, a.pairs)
        self.record: dict = {
            "config": config,
            "mode": a.mode,
            "concurrencies": self.concurrencies,
            "notes": [],
            "runs": [],
            "rounds": [],
        }
        if a.plan_cells:  # the cells this configuration's verdicts are judged by, as registered
            self.record["plan"] = {
                "file": a.plan,
                "sha256": a.plan_data["sha256"],
                "cells": {str(c): a.plan_cells[(config, c)] for c in self.concurrencies},
            }
        self.record["server_extra_args"] = server_extra_args(self.cfg, max(self.concurrencies), a.extra_args)
        self.cpus: dict[str, list[int]] | None = None  # each tree's CPUs now (--cpu-split)
        if a.cpu_halves:
            self.record["cpu_split"] = [format_cpu_list(half) for half in a.cpu_halves]
            self.record["pinning"] = []

    def left(self) -> float:
        return self.deadline.left()

    def groups(self) -> list[tuple[str, ...]]:
        """The trees that warm up and calibrate at the same time, in turn: both at once (together
        mode), or one after the other (sequential and both)."""
        return [TREES] if self.a.mode == "together" else [(tree,) for tree in TREES]

    def pair_steps(self, k: int) -> list[tuple[int, tuple[str, ...]]]:
        """(concurrency, trees run at once) of measured pair ``k``, in run order."""
        if self.a.mode == "together":
            return [(c, TREES) for kk, c in ab_stats.together_schedule(k + 1, self.concurrencies) if kk == k]
        if self.a.mode == "both":
            return [(c, trees) for kk, c, trees in ab_stats.both_schedule(k + 1, self.concurrencies) if kk == k]
        return [(c, (tree,)) for kk, c, tree in ab_stats.schedule(k + 1, self.concurrencies) if kk == k]

    def cpus_for(self, k: int | None) -> dict[str, list[int]]:
        """--cpu-split: each tree's CPUs in pair ``k`` (None: from the start to the measured pairs,
        as pair 0 in together mode): in a together pair its half, the unpatched tree on the first
        half in even together pairs, on the second in odd ones, so a difference between the halves
        cancels over pairs; before the pairs and in a sequential pair (``--mode both``) every CPU
        ab_bench may use, each tree running alone."""
        a = self.a
        if a.mode == "both" and (k is None or ab_stats.pair_mode(a.mode, k) == "sequential"):
            return {tree: a.cpu_all for tree in TREES}
        together = 0 if k is None else sum(ab_stats.pair_mode(a.mode, kk) == "together" for kk in range(k))
        return {tree: a.cpu_halves[(j + together) % 2] for j, tree in enumerate(TREES)}

    def pin(self, k: int | None) -> None:
        """--cpu-split: every thread of each tree's server and client onto the tree's CPUs for
        pair ``k`` (:meth:`cpus_for`); the record keeps what the kernel then reports (a note when
        it differs, or when a tree's server or client has no process left)."""
        self.cpus = self.cpus_for(k)
        entry: dict = {"pair": k if k is not None or self.a.mode == "both" else 0}
        for tree in TREES:
            cpus = format_cpu_list(self.cpus[tree])
            self.clients[tree].cpus = self.cpus[tree]
            entry[tree] = {
                "cpus": cpus,
                "server": pin_group(self.procs[tree].pid, self.cpus[tree]),
                "client": pin_group(self.clients[tree].proc.pid, self.cpus[tree]),
            }
            for what in ("server", "client"):
                if not entry[tree][what]["processes"]:  # it exited: nothing to pin, no CPUs to compare
                    self.record["notes"].append(f"pair {k}: {tree} {what}: no process left in its group to pin")
                elif entry[tree][what]["cpus"] != cpus:
                    self.record["notes"].append(
                        f"pair {k}: {tree} {what} on CPUs {entry[tree][what]['cpus']}, " f"not {cpus}"
                    )
        self.record["pinning"].append(entry)

    def another_pair(self, k: int, measured_since: float, expected: dict[int, float]) -> bool:
        """--config-seconds: whether to measure pair ``k`` beyond --pairs. Only the clock decides:
        the measured phase (since ``measured_since``) has run less than --config-seconds and the
        whole pair fits before the deadline, at the time each of its rounds is expected to take
        (as :meth:`bench` and the sequential first-round check estimate it). Never the ratios."""
        a = self.a
        if not a.config_seconds:
            return False
        ran = time.time() - measured_since
        if ran >= a.config_seconds:
            self.record["notes"].append(
                f"{k} pairs: the measured phase ran {ran:.0f} s of --config-seconds " f"{a.config_seconds:.0f}"
            )
            return False
        per_round = 1 if ab_stats.pair_mode(a.mode, k) == "together" else 2
        need = sum(per_round * (expected[c] + 5) for c in self.concurrencies)
        if self.left() < need:
            self.record["notes"].append(
                f"{k} pairs: pair {k} not started after {ran:.0f} s of --config-seconds "
                f"{a.config_seconds:.0f}, {self.left():.0f} s left, ~{need:.0f} s needed"
            )
            return False
        return True

    def bench(
        self, trees: tuple[str, ...], tag: str, prompts: int, concurrency: int, expected_s: float
    ) -> dict[str, dict]:
        """One bench_serving run on every tree of ``trees``, all started at once (each through its
        own client) and all waited for: {tree: run} of the runs that completed every prompt, a
        note for each other one; none starts when a server has exited or ``expected_s`` does not
        fit before the deadline."""
        for tree in trees:
            proc = self.procs[tree]
            if proc.poll() is not None:
                self.record["notes"].append(f"{tree} {tag}: server exited rc={proc.returncode}")
                return {}
        if self.left() < expected_s + 5:
            self.record["notes"].append(
                f"{'+'.join(trees)} {tag}: not started, {self.left():.0f} s left, " f"~{expected_s:.0f} s needed"
            )
            return {}
        paths, t_start, logs, offsets = {}, {}, {}, {}
        for tree in trees:
            paths[tree] = os.path.join(self.a.work, "rounds", f"{self.names[tree]}_c{concurrency}_{tag}.jsonl")
            logs[tree] = os.path.join(self.a.logdir, f"server_{self.names[tree]}.log")
            offsets[tree] = log_size(logs[tree])
            t_start[tree] = time.time()
            self.clients[tree].submit(bench_argv(self.a, self.ports[tree], prompts, concurrency, paths[tree]))
        until = time.time() + min(self.left(), 3 * expected_s + 60)
        runs = {}
        for tree in trees:
            status, t_end = self.clients[tree].wait(until - time.time())
            result = read_round(paths[tree]) if status == 0 else None
            run = {
                "tree": tree,
                "tag": tag,
                "concurrency": concurrency,
                "prompts": prompts,
                "status": status,
                "t_start": round(t_start[tree], 3),
                "wall_s": round(t_end - t_start[tree], 1),
                **(result or {}),
                **server_accept_length(logs[tree], offsets[tree]),
            }
            if self.cpus:
                run["cpus"] = format_cpu_list(self.cpus[tree])
            self.record["runs"].append(run)
            if result is None or result.get("completed") != prompts:
                self.record["notes"].append(
                    f"{tree} {tag} c{concurrency}: bench_serving status {status}, "
                    f"completed {None if result is None else result.get('completed')}"
                )
            else:
                runs[tree] = run
        return runs

    def run(self, prompts_json: dict) -> dict:
        a = self.a
        extra = self.record["server_extra_args"]
        start_cpus = self.cpus_for(None) if a.cpu_halves else {tree: None for tree in TREES}
        for tree in TREES:
            self.procs[tree] = start_server(self.names[tree], self.ports[tree], a, extra, start_cpus[tree])
        try:
            t0 = time.time()
            errors = wait_healthy(
                {self.names[t]: (self.procs[t], self.ports[t]) for t in TREES}, t0 + min(self.left(), a.startup_timeout)
            )
            self.record["startup_s"] = round(time.time() - t0, 1)
            self.record["memory"] = {
                t: read_memprobe(os.path.join(a.logdir, f"memprobe_{self.names[t]}.jsonl")) for t in TREES
            }
            if errors:
                self.record["notes"] += [f"{n}: {e}" for n, e in errors.items()]
                for name in errors:
                    self.record["notes"] += serve_checks.error_lines(os.path.join(a.logdir, f"server_{name}.log"))
                return self.record
            if a.cpu_halves:  # the clients too (the last configuration may have left them swapped); checked
                self.pin(None)
            if a.stress >= 0:
                self.record["exactness"] = {
                    t: exactness(
                        self.names[t], self.ports[t], self.procs[t], a, prompts_json, time.time() + self.left()
                    )
                    for t in TREES
                }
            round_prompts = {}
            for c in self.concurrencies:
                rates = []
                for tag, n in (("warmup", a.warmup_waves * c), ("calibration", 4 * c)):
                    for trees in self.groups():
                        runs = self.bench(trees, tag, n, c, 30)
                        if tag == "calibration":
                            rates += [run["completed"] / run["duration"] for run in runs.values()]
                if len(rates) < 2:
                    return self.record
                round_prompts[c] = prompts_for_round(rates, a.round_seconds, c, a.round_margin)
            self.record["round_prompts"] = round_prompts
            self.measure(round_prompts)
            return self.record
        finally:
            for proc in self.procs.values():
                serve_checks.kill_group(proc)

    def measure(self, round_prompts: dict[int, int]) -> None:
        """The measured pairs: --pairs of them (with --plan: its count), then (--config-seconds) more while
        :meth:`another_pair` says so; stops early when a round cannot run or fails."""
        a = self.a
        expected = {c: a.round_seconds * a.round_margin * 1.3 + 5 for c in self.concurrencies}
        measured_since = time.time()
        try:
            k = 0
            while k < self.pairs or self.another_pair(k, measured_since, expected):
                if self.cpus and (k or a.mode == "both"):  # together: pair 0's CPUs are the start's
                    self.pin(k)
                for c, trees in self.pair_steps(k):
                    # a pair's second round needs its first: start a pair's first round only if both fit
                    first = not any(r["pair"] == k and r["concurrency"] == c for r in self.record["rounds"])
                    if len(trees) == 1 and first and self.left() < 2 * expected[c] + 10:
                        self.record["notes"].append(f"pair {k} c{c}: not started, {self.left():.0f} s left")
                        return
                    runs = self.bench(trees, f"pair{k}", round_prompts[c], c, expected[c])
                    if len(runs) < len(trees):
                        return
                    mode = {"pair_mode": ab_stats.pair_mode(a.mode, k)} if a.mode == "both" else {}
                    self.record["rounds"] += [{"pair": k, **mode, **run} for run in runs.values()]
                    self.on_round(self.record)
                    expected[c] = max(expected[c], 1.1 * max(run["wall_s"] for run in runs.values()))
                    pair_rounds = [r for r in self.record["rounds"] if r["pair"] == k and r["concurrency"] == c]
                    if len(pair_rounds) == len(TREES):  # both trees had the same prompts; the next pairs may grow
                        grown = grown_prompts(round_prompts[c], pair_rounds, a.round_seconds, c, a.round_margin)
                        if grown > round_prompts[c]:
                            shortest = min(r["duration"] for r in pair_rounds)
                            self.record["notes"].append(
                                f"c{c}: pair {k}'s shortest round took {shortest:.1f} s: "
                                f"{round_prompts[c]} -> {grown} prompts from pair {k + 1} on"
                            )
                            expected[c] *= grown / round_prompts[c]
                            round_prompts[c] = grown
                k += 1
        finally:
            self.record["measured_s"] = round(time.time() - measured_since, 1)


def mode_label(record: dict, pair_mode: str | None = None) -> str:
    """A record's mode as tables show it: ``sequential`` (also a record written before --mode
    existed), ``together`` or ``together+cpu-split``; with ``--mode both`` the mode of its pairs
    ``pair_mode`` (``together+cpu-split (both)``, ``sequential (both)``), or ``both``."""
    mode = record.get("mode", "sequential")
    if mode == "both":
        if pair_mode is None:
            return "both" + ("+cpu-split" if record.get("cpu_split") else "")
        split = "+cpu-split" if record.get("cpu_split") and pair_mode == "together" else ""
        return f"{pair_mode}{split} (both)"
    return mode + ("+cpu-split" if record.get("cpu_split") else "")


def pair_ratios(rounds: list[dict]) -> dict[int, float]:
    """Pair index -> patched / unpatched output tokens/s, of the pairs with both rounds."""
    by_pair: dict[int, dict] = {}
    for r in rounds:
        by_pair.setdefault(r["pair"], {})[r["tree"]] = r
    return {
        k: p["patched"]["output_throughput"] / p["unpatched"]["output_throughput"]
        for k, p in sorted(by_pair.items())
        if len(p) == 2
    }


def summarize(record: dict, concurrencies: list[int], plan: dict | None = None) -> list[dict]:
    """One summary per (configuration, concurrency) from a Pair record: at the record's own
    concurrencies, or at ``concurrencies`` (the run's) for a record written before configurations
    had their own. A cell of the plan the record ran under (``record["plan"]``) gives its TOST
    verdict, registered before the run; ``plan`` judges a record that ran under none by its cells
    after the run (post hoc, and said so)."""
    out = []
    backend = serve_checks.parse(f"{record['config']}_patched")["backend"]
    modes = ab_stats.MODES if record.get("mode") == "both" else (None,)
    for c, pair_mode in [(c, m) for c in record.get("concurrencies", concurrencies) for m in modes]:
        rounds = [
            r
            for r in record.get("rounds", [])
            if r["concurrency"] == c and (pair_mode is None or r.get("pair_mode") == pair_mode)
        ]
        by_pair: dict[int, dict] = {}
        for r in rounds:
            by_pair.setdefault(r["pair"], {})[r["tree"]] = r
        pairs = [(p["unpatched"], p["patched"]) for _, p in sorted(by_pair.items()) if len(p) == 2]
        durations = [r["duration"] for pair in pairs for r in pair]
        cell, registered = None, None
        if record.get("plan"):
            cell, registered = record["plan"]["cells"].get(str(c)), "before the run"
        elif plan:
            cell, registered = ab_stats.plan_cell(plan, record["config"], c), "after the run (post hoc)"
        s = {
            "config": record["config"],
            "mode": mode_label(record, pair_mode),
            "concurrency": c,
            **ab_stats.ratio_summary(pairs, min(durations) if durations else None, cell),
            **{tree: ab_stats.tree_summary([p[i] for p in pairs]) for i, tree in enumerate(TREES)},
        }
        if cell:
            s["tost"].update(registered=registered, plan=(record.get("plan") or plan)["file"])
        if pair_mode:  # --mode both: the blocks' together - sequential difference (no t interval: no scipy here)
            s["mode_bias"] = ab_stats.mode_bias(pair_ratios([r for r in record["rounds"] if r["concurrency"] == c]))
        if record.get("cpu_split") and pair_mode != "sequential":  # the halves swap trees: does one favour its tree?
            by_half: dict[str, list[float]] = {}
            for k, p in sorted(by_pair.items()):
                if len(p) == 2:
                    half = p["unpatched"].get("cpus") or record["cpu_split"][k % 2]
                    by_half.setdefault(f"unpatched on {half}", []).append(
                        p["patched"]["output_throughput"] / p["unpatched"]["output_throughput"]
                    )
            s["ratio_median_by_half"] = {half: statistics.median(ratios) for half, ratios in by_half.items()}
        out.append(s)
    mem = []
    for tree in TREES:
        for rec in record.get("memory", {}).get(tree, []):
            if backend in ab_stats.BACKENDS and rec.get("args"):
                mem.append(ab_stats.memory_check(rec, backend, tree))
    for s in out:
        s["memory"] = mem
        s["exactness"] = {
            t: {k: v for k, v in e.items() if k != "checks"} for t, e in record.get("exactness", {}).items()
        }
        s["startup_s"] = record.get("startup_s")
        s["notes"] = record["notes"]
    return out


def fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def verdict_cell(s: dict) -> str:
    """The verdict, or why a configuration has no measured pair (its first note)."""
    if "verdict" in s:
        return s["verdict"]
    if not s.get("pairs"):
        return "not run" + (f" ({s['notes'][0]})" if s.get("notes") else "")
    return "-"


def accept_cell(tree: dict) -> str:
    """A tree's accept length in the measured rounds (the server's windows); for a record written
    before those were read, bench_serving's, marked as the server's average since start."""
    if tree.get("accept_length") is not None:
        return f"{tree['accept_length']:.2f}"
    if tree.get("accept_length_since_start") is not None:
        return f"{tree['accept_length_since_start']:.2f} (since start)"
    return "-"


def tost_cell(s: dict) -> str:
    """The plan's TOST verdict and its 90% interval of the mean ratio; '-' outside a plan."""
    t = s.get("tost")
    if not t:
        return "-"
    text = t["verdict"] + (f", {t['ratio_mean']:.3f} [{t['ci_low']:.3f}, {t['ci_high']:.3f}]" if "passed" in t else "")
    return text + (" (post hoc)" if t.get("registered", "").startswith("after") else "")


def markdown_table(summaries: list[dict]) -> str:
    rows = [
        "| config | mode | conc | pairs | round s | unpatched tok/s | patched tok/s | patched / unpatched median "
        "[95% bootstrap CI] | verdict | plan: TOST at ±2%, mean [90% CI] | sd of log ratio | TTFT med / p99 ms A, B | ITL med / p99 ms A, B "
        "| accept length A / B (measured rounds) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in summaries:
        A, B = s.get("unpatched", {}), s.get("patched", {})
        if "ratio_median" not in s:
            ratio = "-"
        elif "ci_low" in s:
            ratio = f"{s['ratio_median']:.3f} [{s['ci_low']:.3f}, {s['ci_high']:.3f}]"
        else:
            ratio = f"{s['ratio_median']:.3f} (min-max {s['ratio_min']:.3f}-{s['ratio_max']:.3f})"
        rows.append(
            f"| {s['config']} | {s['mode']} | {s['concurrency']} | {s['pairs']} | "
            f"{fmt(s.get('round_seconds'), '.1f')} | "
            f"{fmt(A.get('tokens_per_s'), '.0f')} | {fmt(B.get('tokens_per_s'), '.0f')} | {ratio} | "
            f"{verdict_cell(s)} | {tost_cell(s)} | {fmt(s.get('sd_log_ratio'), '.4f')} | "
            f"{fmt(A.get('ttft_median_ms'), '.0f')} / {fmt(A.get('ttft_p99_ms'), '.0f')}, "
            f"{fmt(B.get('ttft_median_ms'), '.0f')} / {fmt(B.get('ttft_p99_ms'), '.0f')} | "
            f"{fmt(A.get('itl_median_ms'), '.1f')} / {fmt(A.get('itl_p99_ms'), '.1f')}, "
            f"{fmt(B.get('itl_median_ms'), '.1f')} / {fmt(B.get('itl_p99_ms'), '.1f')} | "
            f"{accept_cell(A)} / {accept_cell(B)} |"
        )
    return "\n".join(rows) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--models")
    ap.add_argument("--site", help="folder holding the unpatched sglang/ (and its deps)")
    ap.add_argument("--patched", help="folder holding the patched copy sglang/")
    ap.add_argument("--out")
    ap.add_argument("--work", help="rounds' JSONL and server logs (default: OUT)")
    ap.add_argument(
        "--configs",
        nargs="+",
        default=CONFIGS,
        help="BACKEND_CG_MODE stems (serve_checks names), each optionally with its own concurrencies "
        "(STEM@1,8,32; without: --concurrencies)",
    )
    ap.add_argument("--concurrencies", nargs="+", type=int, default=[1, 8, 32])
    ap.add_argument("--pairs", type=int, default=6, help="measured pairs per concurrency (>= 6)")
    ap.add_argument("--round-seconds", type=float, default=20, help="measured round length (>= 20)")
    ap.add_argument(
        "--round-margin",
        type=float,
        default=1.5,
        help="a measured round's prompts: round-seconds times this at the faster calibration rate "
        "(>= 1); later pairs grow by as much after a round shorter than round-seconds",
    )
    ap.add_argument(
        "--mode",
        choices=("sequential", "together", "both"),
        default="sequential",
        help="a pair's two rounds one after the other, both at the same time, or pairs of the two "
        "modes alternating on the same servers, to measure the mode's bias (module docstring)",
    )
    ap.add_argument(
        "--cpu-split",
        action="store_true",
        help="together (and both) mode: each tree's server (with all it spawns) and client on its own "
        "half of this process's CPUs in a together pair, the halves swapping trees pair by pair "
        "(module docstring)",
    )
    ap.add_argument(
        "--config-seconds",
        type=float,
        default=0,
        help="after --pairs, more pairs while a configuration's measured phase has run less than this "
        "and the deadline allows a whole pair (0: exactly --pairs)",
    )
    ap.add_argument(
        "--plan",
        help="a pre-registered plan (benchmark/gpu/plans/*.json): every configuration and "
        "concurrency must be one of its cells and the run its design; each configuration measures "
        "the pairs its cells fix (no --config-seconds), and the summary gives the cell's TOST verdict "
        "at exactly that many pairs",
    )
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=512)
    ap.add_argument("--range-ratio", type=float, default=0.5, help="lengths drawn from [len * ratio, len]")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--warmup-waves",
        type=int,
        default=6,
        help="warm-up prompts per tree and concurrency, in waves of the concurrency (2 on 2026-12-01)",
    )
    ap.add_argument(
        "--stress",
        type=int,
        default=1,
        help="exactness: serve_checks.py's 8 x 1900-token batches (-1: no exactness check)",
    )
    ap.add_argument("--max-seconds", type=float, default=540, help="stop cleanly this long after start")
    ap.add_argument("--deadline-epoch", type=float, help="stop cleanly at this time.time() (overrides --max-seconds)")
    ap.add_argument(
        "--deadline-file",
        help="a file holding a time.time() to stop at, read at every check " "(overrides both while it holds one)",
    )
    ap.add_argument(
        "--min-config-seconds", type=float, default=150, help="start a configuration only with this much time left"
    )
    ap.add_argument("--startup-timeout", type=float, default=420)
    ap.add_argument("--base-port", type=int, default=20000)
    ap.add_argument("--port-step", type=int, default=1200, help="as serve_checks.py: SGLang takes ports above its own")
    ap.add_argument("--mem-fraction", type=float, default=0.4)
    ap.add_argument("--max-total-tokens", type=int, default=120000)
    ap.add_argument("--extra-args", default=os.environ.get("EXTRA_ARGS", ""))
    a = ap.parse_args(argv)
    if not a.client:
        missing = [f"--{k}" for k in ("models", "site", "patched", "out") if not getattr(a, k)]
        if missing:
            ap.error(f"required: {' '.join(missing)}")
        if a.pairs < 6:
            ap.error("--pairs must be at least 6")
        if a.round_seconds < 20:
            ap.error("--round-seconds must be at least 20")
        if a.round_margin < 1:
            ap.error("--round-margin must be at least 1")
        a.config_concurrencies = {}
        for spec in a.configs:
            stem, at, own = spec.partition("@")
            try:
                concurrencies = [int(c) for c in own.split(",")] if at else a.concurrencies
            except ValueError:
                ap.error(f"not a list of concurrencies: {spec} (STEM@1,8,32)")
            if stem in a.config_concurrencies:
                ap.error(f"configuration given twice: {stem} (give one its concurrencies: STEM@1,8,32)")
            if min(concurrencies) < 1:
                ap.error(f"concurrencies must be positive: {spec}")
            a.config_concurrencies[stem] = concurrencies
        a.configs = list(a.config_concurrencies)
        if a.config_seconds < 0:
            ap.error("--config-seconds must not be negative")
        a.plan_cells, a.config_pairs = {}, {}
        if a.plan:
            plan_cells(ap, a)
        a.cpu_halves = None
        if a.cpu_split:
            if a.mode == "sequential":
                ap.error(
                    "--cpu-split needs --mode together or both (in sequential mode each tree has the host to itself)"
                )
            try:
                a.cpu_all = sorted(os.sched_getaffinity(0))
                a.cpu_halves = cpu_halves(physical_cores(os.sched_getaffinity(0)))
            except ValueError as exc:
                ap.error(str(exc))
        for stem in a.configs:
            try:
                serve_checks.parse(f"{stem}_patched")
            except (AssertionError, ValueError, IndexError):
                ap.error(f"not a serve_checks.py configuration: {stem} (BACKEND_CG_kTOPKsSTEPS)")
    return a


def plan_cells(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """--plan: the run must be the plan's design and each (configuration, concurrency) one of its
    cells; each configuration then measures max(--pairs, its cells' n_pairs) pairs
    (``a.config_pairs``), and ``a.plan_cells`` maps (stem, concurrency) to its cell."""
    try:
        a.plan_data = ab_stats.load_plan(a.plan)
    except (OSError, ValueError) as exc:
        ap.error(f"--plan {a.plan}: {exc}")
    differ = [
        f"--{key.replace('_', '-')} {want!r} (given {getattr(a, key)!r})"
        for key, want in a.plan_data["design"].items()
        if getattr(a, key) != want
    ]
    if differ:
        ap.error(f"the plan's design is not this run's: {', '.join(differ)}")
    if a.config_seconds:
        ap.error("--plan fixes each configuration's pairs: no --config-seconds")
    for stem, concurrencies in a.config_concurrencies.items():
        for c in concurrencies:
            cell = ab_stats.plan_cell(a.plan_data, stem, c)
            if cell is None:
                ap.error(f"{stem} at concurrency {c} is not a cell of {a.plan}")
            a.plan_cells[(stem, c)] = cell
        a.config_pairs[stem] = max([a.pairs] + [a.plan_cells[(stem, c)]["n_pairs"] for c in concurrencies])


def write_outputs(a: argparse.Namespace, records: list[dict], summaries: list[dict], t_start: float) -> None:
    settings = {
        k: getattr(a, k)
        for k in (
            "mode",
            "configs",
            "concurrencies",
            "config_concurrencies",
            "pairs",
            "config_pairs",
            "config_seconds",
            "plan",
            "round_seconds",
            "round_margin",
            "warmup_waves",
            "input_len",
            "output_len",
            "range_ratio",
            "seed",
            "stress",
            "mem_fraction",
            "max_total_tokens",
            "extra_args",
            "models",
        )
    }
    if a.cpu_halves:
        settings["cpu_split"] = [format_cpu_list(half) for half in a.cpu_halves]
        settings["cpu_cores"] = [format_cpu_list(core) for core in physical_cores(os.sched_getaffinity(0))]
    settings["elapsed_s"] = round(time.time() - t_start, 1)
    with open(os.path.join(a.out, "ab_results.json"), "w") as f:
        json.dump({"settings": settings, "summaries": summaries, "records": records}, f, indent=1)
    with open(os.path.join(a.out, "ab_summary.md"), "w") as f:
        f.write(markdown_table(summaries))


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.client:
        return client_loop()
    t_start = time.time()
    deadline = Deadline(a.deadline_epoch or t_start + a.max_seconds, a.deadline_file)
    a.work = a.work or a.out
    a.logdir = os.path.join(a.work, "logs")
    for d in (a.out, os.path.join(a.work, "rounds"), a.logdir):
        os.makedirs(d, exist_ok=True)
    with open(os.path.join(a.models, "prompts.json")) as f:
        prompts_json = json.load(f)
    if a.mode != "sequential":  # one client per tree, both started now (--cpu-split: each on its pair-0 CPUs)
        halves = (a.cpu_all, a.cpu_all) if a.cpu_halves and a.mode == "both" else a.cpu_halves or (None, None)
        clients = {
            tree: Client(a, os.path.join(a.logdir, f"bench_serving_{tree}.log"), halves[j])
            for j, tree in enumerate(TREES)
        }
    else:
        client = Client(a, os.path.join(a.logdir, "bench_serving.log"))
        clients = {tree: client for tree in TREES}
    records, summaries = [], []
    try:
        for index, config in enumerate(a.configs):
            if deadline.left() < a.min_config_seconds:
                records.append(
                    {
                        "config": config,
                        "mode": a.mode,
                        "concurrencies": a.config_concurrencies[config],
                        "notes": ["not started: deadline"],
                        "rounds": [],
                    }
                )
            else:

                def on_round(record: dict) -> None:
                    write_outputs(
                        a,
                        records + [record],
                        [s for r in records + [record] for s in summarize(r, a.concurrencies)],
                        t_start,
                    )

                records.append(Pair(config, index, a, clients, deadline, on_round).run(prompts_json))
            summaries = [s for r in records for s in summarize(r, a.concurrencies)]
            write_outputs(a, records, summaries, t_start)
            print(f"[{time.time() - t_start:.0f}s] {config}: {records[-1]['notes']}", flush=True)
    finally:
        for client in dict.fromkeys(clients.values()):
            client.close()
        serve_checks.kill_all()
    print(markdown_table(summaries))
    return 0


if __name__ == "__main__":
    if "--client" not in sys.argv:  # the client dies on SIGTERM (a handler's SystemExit would be caught per run)
        signal.signal(signal.SIGTERM, lambda *_: (serve_checks.kill_all(), sys.exit(143)))
    sys.exit(main())
