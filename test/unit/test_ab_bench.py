"""benchmark/gpu/ab_bench.py, ab_stats.py and report_ab.py on CPU: arguments, the flags given to
sglang.bench_serving and sglang.launch_server (each must exist in 0.5.12's parsers), the round
schedules, the round sizes, the bootstrap interval, the memory
formula check, one configuration end to end with stand-in servers in each mode, and the report
over old and new results files."""

from __future__ import annotations

import ast
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from support.sglang_release import require_release
from support.wheel_source import wheel_source

GPU_BENCH = Path(__file__).resolve().parents[2] / "benchmark" / "gpu"
sys.path.insert(0, str(GPU_BENCH))
import ab_bench  # noqa: E402
import ab_stats  # noqa: E402
import report_ab  # noqa: E402

#: ab_bench's results of the H200 run of 2026-12-01, written before --mode existed
OLD_RESULTS = GPU_BENCH / "results" / "h200-2026-12-01-ab2" / "ab_results.json"

REQUIRED = ["--models", "m", "--site", "s", "--patched", "p", "--out", "o"]


def parser_options(text: str) -> dict[str, ast.Call]:
    """Every option string that an argparse parser in ``text`` adds."""
    options = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and str(arg.value).startswith("--"):
                    options[arg.value] = node
    return options


def test_defaults_are_the_issue_configs_and_sizes():
    a = ab_bench.parse_args(REQUIRED)
    assert a.configs == [
        "triton_nocg_k1s3",
        "triton_nocg_k4s3",
        "flashinfer_nocg_k4s3",
        "triton_cg_k4s3",
        "flashinfer_cg_k1s3",
        "flashinfer_cg_k4s3",
        "flashinfer_cg_k8s5",
    ]
    assert (a.pairs, a.round_seconds, a.concurrencies) == (6, 20, [1, 8, 32])
    assert (a.mode, a.round_margin, a.cpu_split, a.cpu_halves, a.config_seconds) == ("sequential", 1.5, False, None, 0)
    assert (a.input_len * a.range_ratio, a.input_len, a.output_len) == (256, 512, 512)


@pytest.mark.parametrize(
    "argv",
    [
        REQUIRED[2:],  # no --models
        REQUIRED + ["--pairs", "5"],  # fewer than 6 pairs
        REQUIRED + ["--round-seconds", "10"],  # rounds shorter than 20 s
        REQUIRED + ["--round-margin", "0.9"],  # rounds planned shorter than --round-seconds
        REQUIRED + ["--mode", "alternate"],  # neither sequential nor together
        REQUIRED + ["--concurrencies", "0"],
        REQUIRED + ["--configs", "vllm_cg_k4s3"],  # not a serve_checks backend
        REQUIRED + ["--cpu-split"],  # sequential: each tree has the host to itself anyway
        REQUIRED + ["--config-seconds", "-1"],
        REQUIRED + ["--configs", "triton_nocg_k4s3@8,0"],  # a concurrency of its own below 1
        REQUIRED + ["--configs", "triton_nocg_k4s3@eight"],
        REQUIRED + ["--configs", "triton_nocg_k4s3@"],
        REQUIRED + ["--configs", "triton_nocg_k4s3", "triton_nocg_k4s3@1"],  # one configuration twice
    ],
)
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit) as exc:
        ab_bench.parse_args(argv)
    assert exc.value.code == 2


def test_a_configuration_may_have_its_own_concurrencies():
    a = ab_bench.parse_args(
        REQUIRED + ["--configs", "flashinfer_cg_k1s3@1,8,32", "triton_nocg_k4s3", "--concurrencies", "32"]
    )
    assert a.configs == ["flashinfer_cg_k1s3", "triton_nocg_k4s3"]
    assert a.config_concurrencies == {"flashinfer_cg_k1s3": [1, 8, 32], "triton_nocg_k4s3": [32]}


@pytest.mark.releases
def test_every_flag_exists_in_bench_serving_0_5_12():
    require_release("0.5.12")
    options = parser_options(wheel_source("0.5.12", "sglang/bench_serving.py"))
    argv = ab_bench.bench_argv(
        ab_bench.parse_args(REQUIRED), port=20000, num_prompts=32, concurrency=8, output_file="x.jsonl"
    )
    flags = [x for x in argv if x.startswith("--")]
    assert flags and not [f for f in flags if f not in options]
    choices = next(kw.value for kw in options["--dataset-name"].keywords if kw.arg == "choices")
    assert "random-ids" in ast.literal_eval(choices)
    assert argv[argv.index("--dataset-name") + 1] == "random-ids"
    assert argv[argv.index("--max-concurrency") + 1] == "8"
    # the dataset the name maps to draws integers: no ShareGPT download
    datasets = wheel_source("0.5.12", "sglang/benchmark/datasets/random.py")
    assert 'random_sample=(args.dataset_name == "random")' in datasets


@pytest.mark.releases
def test_server_flags_exist_in_launch_server_0_5_12():
    """The flags ab_bench appends to serve_checks.py's server command (argparse keeps the last)."""
    require_release("0.5.12")
    options = parser_options(wheel_source("0.5.12", "sglang/srt/server_args.py"))
    for cg in ("cg", "nocg"):
        flags = [x for x in ab_bench.server_extra_args({"cg": cg}, 32).split() if x.startswith("--")]
        assert flags and not [f for f in flags if f not in options]
    assert (
        ab_bench.server_extra_args({"cg": "cg"}, 32)
        == "--max-running-requests 32 --disable-piecewise-cuda-graph --disable-radix-cache --sleep-on-idle "
        "--cuda-graph-max-bs 32"
    )
    assert (
        ab_bench.server_extra_args({"cg": "nocg"}, 8, "--foo 1")
        == "--max-running-requests 8 --disable-piecewise-cuda-graph --disable-radix-cache --sleep-on-idle --foo 1"
    )


def test_cpu_split_is_refused_with_a_single_cpu(monkeypatch, capsys):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    with pytest.raises(SystemExit) as exc:
        ab_bench.parse_args(REQUIRED + ["--mode", "together", "--cpu-split"])
    assert exc.value.code == 2
    assert "--cpu-split needs at least 2 CPUs, this process may use 3" in capsys.readouterr().err


def test_cpu_lists_read_and_written_as_the_kernel_writes_them():
    assert ab_bench.parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert ab_bench.format_cpu_list({11, 0, 1, 2, 3, 8, 10}) == "0-3,8,10-11"
    assert ab_bench.format_cpu_list({5}) == "5"


def test_cpu_halves_keep_each_physical_core_whole_and_as_many_cores_on_each_side(tmp_path):
    # a 16-vCPU host whose SMT siblings are n and n + 8 (as /sys reports them)
    for cpu in range(16):
        (tmp_path / f"cpu{cpu}").write_text(f"{cpu % 8},{cpu % 8 + 8}\n")
    cores = ab_bench.physical_cores(set(range(16)), str(tmp_path / "cpu{}"))
    assert cores == [[n, n + 8] for n in range(8)]
    assert ab_bench.cpu_halves(cores) == ([0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15])
    # only the allowed CPUs count; a CPU without the file is a core of its own
    assert ab_bench.physical_cores({0, 8, 1, 99}, str(tmp_path / "cpu{}")) == [[0, 8], [1], [99]]
    # no SMT: contiguous halves; an odd core stays out, so both trees get as many
    assert ab_bench.cpu_halves([[n] for n in range(16)]) == (list(range(8)), list(range(8, 16)))
    assert ab_bench.cpu_halves([[0], [1], [2]]) == ([0], [1])
    assert ab_bench.cpu_halves([[0, 1]]) == ([0], [1])  # one core: its siblings are split
    with pytest.raises(ValueError):
        ab_bench.cpu_halves([[0]])


def test_schedule_interleaves_and_alternates_the_first_tree():
    order = ab_stats.schedule(2, [8, 32])
    assert order == [
        (0, 8, "unpatched"),
        (0, 8, "patched"),
        (0, 32, "patched"),
        (0, 32, "unpatched"),
        (1, 8, "unpatched"),
        (1, 8, "patched"),
        (1, 32, "patched"),
        (1, 32, "unpatched"),
    ]
    one = ab_stats.schedule(6, [32])
    assert [one[i][2] for i in range(0, 12, 2)] == ["unpatched", "patched"] * 3
    assert all({one[i][2], one[i + 1][2]} == {"unpatched", "patched"} for i in range(0, 12, 2))


def test_together_schedule_runs_each_pair_once_per_concurrency():
    assert ab_stats.together_schedule(2, [8, 32]) == [(0, 8), (0, 32), (1, 8), (1, 32)]
    assert [(k, c) for k, c, _ in ab_stats.schedule(2, [8, 32])][::2] == ab_stats.together_schedule(2, [8, 32])


def test_bootstrap_interval_holds_the_median_and_narrows_with_more_pairs():
    few = [0.97, 1.01, 1.03, 0.99, 1.05, 0.98]
    lo, hi = ab_stats.bootstrap_median_ci(few)
    assert min(few) <= lo <= statistics.median(few) <= hi <= max(few) and lo < hi
    assert ab_stats.bootstrap_median_ci(few) == (lo, hi)  # seeded
    lo2, hi2 = ab_stats.bootstrap_median_ci(few * 8)
    assert hi2 - lo2 < hi - lo
    assert ab_stats.bootstrap_median_ci([1.1] * 6) == (1.1, 1.1)


@pytest.mark.parametrize(
    "ratios, verdict",
    [
        ([1.00, 1.005, 0.995, 1.002, 0.998, 1.001], "within ±2%"),
        ([1.20, 1.25, 1.22, 1.30, 1.21, 1.24], "patched faster"),
        ([0.90, 0.92, 0.91, 0.89, 0.93, 0.90], "patched slower"),
        ([0.90, 1.10, 0.95, 1.05, 1.00, 0.85], "not resolved to ±2%"),
    ],
)
def test_ratio_summary_verdicts(ratios, verdict):
    pairs = [({"output_throughput": 100.0}, {"output_throughput": 100.0 * r}) for r in ratios]
    s = ab_stats.ratio_summary(pairs, round_seconds=20)
    assert s["pairs"] == 6 and s["verdict"] == verdict
    assert s["ratio_median"] == pytest.approx(statistics.median(ratios))
    assert s["ci_low"] <= s["ratio_median"] <= s["ci_high"]
    assert s["sd_log_ratio"] == pytest.approx(statistics.stdev([math.log(r) for r in ratios]))
    assert s["round_seconds"] == 20 and "tost" not in s  # no plan cell: no TOST


def test_prompts_for_round_fill_the_round_and_its_margin_at_the_faster_rate_in_whole_waves():
    assert ab_bench.prompts_for_round([10.0, 12.5], 20, 32, 1.0) == 256  # 250 -> 8 waves of 32
    assert ab_bench.prompts_for_round([10.0, 12.5], 20, 32, 1.5) == 384  # 375 -> 12 waves
    assert ab_bench.prompts_for_round([0.01, 0.02], 20, 8, 1.5) == 8  # at least one wave


def test_rounds_grow_after_a_pair_with_a_short_round():
    pair = [{"completed": 256, "duration": 25.6}, {"completed": 256, "duration": 16.0}]
    # the patched round took 16 s < 20 s at 16 requests/s: 20 s * 1.5 * 16/s = 480 -> 15 waves of 32
    assert ab_bench.grown_prompts(256, pair, 20, 32, 1.5) == 480
    assert ab_bench.grown_prompts(256, pair, 20, 32, 1.0) == 320
    assert ab_bench.grown_prompts(256, pair[:1], 20, 32, 1.5) == 256  # every round long enough
    assert ab_bench.grown_prompts(640, pair, 20, 32, 1.5) == 640  # never fewer


def probe(steps: int, max_bs: int, topk: int, ctx: int, rows_bytes: int, diff: int) -> dict:
    return {
        "args": [max_bs, max_bs * topk],
        "steps": steps,
        "topk": topk,
        "max_context_len": ctx,
        "rows_bytes": rows_bytes,
        "allocated_diff": diff,
    }


def test_memory_check_against_the_formula():
    # FlashInfer, 5 steps, max_bs 32, topk 8, ctx 2048, int32: 0.5.12's rows lack topk
    unpatched = ab_stats.memory_check(probe(5, 32, 8, 2048, 1_310_720, 1_310_720 + 1024), "flashinfer", "unpatched")
    patched = ab_stats.memory_check(probe(5, 32, 8, 2048, 10_485_760, 10_485_760), "flashinfer", "patched")
    assert unpatched["formula_bytes"] == 5 * 32 * 2048 * 4 and patched["formula_bytes"] == 5 * 32 * 8 * 2048 * 4
    assert unpatched["rows_equal_formula"] and patched["rows_equal_formula"]
    assert unpatched["allocation_covers_rows"] and patched["allocation_covers_rows"]
    wrong = ab_stats.memory_check(probe(5, 32, 8, 2048, 1_310_720, 100), "flashinfer", "patched")
    assert not wrong["rows_equal_formula"] and not wrong["allocation_covers_rows"]
    # Triton (int64) sizes its rows with topk on both trees
    assert ab_stats.memory_check(probe(3, 8, 4, 2048, 3 * 32 * 2048 * 8, 0), "triton", "unpatched")[
        "rows_equal_formula"
    ]


def pair_record(ratios: list[float], concurrency: int = 32) -> dict:
    rounds = []
    for k, r in enumerate(ratios):
        for tree, tps in (("unpatched", 1000.0), ("patched", 1000.0 * r)):
            rounds.append(
                {
                    "pair": k,
                    "tree": tree,
                    "concurrency": concurrency,
                    "output_throughput": tps,
                    "duration": 21.0,
                    "median_ttft_ms": 50.0,
                    "p99_ttft_ms": 90.0,
                    "median_itl_ms": 4.0,
                    "p99_itl_ms": 9.0,
                    "accept_length": 5.9 if tree == "patched" else 4.4,
                    "accept_length_windows": 6.0 if tree == "patched" else 4.5,
                }
            )
    return {"config": "flashinfer_cg_k8s5", "notes": [], "rounds": rounds, "memory": {}}


def test_summarize_keeps_only_complete_pairs():
    record = pair_record([1.2, 1.3, 1.25, 1.22, 1.28, 1.24, 1.26])
    record["rounds"].pop()  # pair 6 lost its patched round: left out
    (s,) = ab_bench.summarize(record, [32])
    assert s["pairs"] == 6 and s["verdict"] == "patched faster"
    assert s["unpatched"]["accept_length"] == 4.5 and s["patched"]["accept_length"] == 6.0  # the windows'
    assert s["unpatched"]["accept_length_since_start"] == 4.4 and s["patched"]["accept_length_since_start"] == 5.9
    assert s["unpatched"]["tokens_per_s"] == 1000.0 and s["round_seconds"] == 21.0
    table = ab_bench.markdown_table([s])
    assert s["mode"] == "sequential"  # a record without a mode: before --mode existed
    assert "| flashinfer_cg_k8s5 | sequential | 32 | 6 | 21.0 | 1000 |" in table and "patched faster" in table
    assert table.rstrip().endswith("| 4.50 / 6.00 |")
    for r in record["rounds"]:  # a record written before the windows were read: bench_serving's, said so
        del r["accept_length_windows"]
    assert (
        ab_bench.markdown_table(ab_bench.summarize(record, [32]))
        .rstrip()
        .endswith("| 4.40 (since start) / 5.90 (since start) |")
    )


FAKE_BENCH_SERVING = '''\
"""Stands in for sglang.bench_serving: appends a result line to --output-file, exits with --exit."""
import json
import sys
import time

argv = sys.argv[1:]
time.sleep(float(argv[argv.index("--sleep") + 1]) if "--sleep" in argv else 0)
with open(argv[argv.index("--output-file") + 1], "a") as f:
    f.write(json.dumps({"completed": 32, "output_throughput": 123.0, "accept_length": 4.0,
                        "run_as": __name__, "argv0": sys.argv[0]}) + "\\n")
sys.exit(int(argv[argv.index("--exit") + 1]) if "--exit" in argv else 0)
'''


def test_client_runs_the_module_as_python_dash_m_once_per_round(tmp_path):
    """The long-lived client: one run per request, exit status and result file per run, a
    timeout when a run hangs (the fake module stands in for sglang.bench_serving)."""
    site = tmp_path / "site"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    (site / "sglang" / "bench_serving.py").write_text(FAKE_BENCH_SERVING)
    a = ab_bench.parse_args(["--models", "m", "--site", str(site), "--patched", "p", "--out", str(tmp_path)])
    client = ab_bench.Client(a, str(tmp_path / "client.log"))

    def run(argv: list[str], timeout: float) -> int | None:
        t0 = time.time()
        client.submit(argv)
        status, t_end = client.wait(timeout)
        assert t0 <= t_end <= time.time()
        return status

    try:
        first, second = tmp_path / "r0.jsonl", tmp_path / "r1.jsonl"
        assert run(["--output-file", str(first)], timeout=60) == 0
        assert run(["--output-file", str(second), "--exit", "3"], timeout=60) == 3
        assert ab_bench.read_round(str(first)) == dict(
            {k: None for k in ab_bench.ROUND_KEYS}, completed=32, output_throughput=123.0, accept_length=4.0
        )
        ran = json.loads(second.read_text())  # run as `python -m sglang.bench_serving` runs it
        assert ran["run_as"] == "__main__" and ran["argv0"] == str(site / "sglang" / "bench_serving.py")
        hung = client.proc
        assert run(["--output-file", str(first), "--sleep", "30"], timeout=1) is None
        assert hung.poll() is not None and client.proc is not hung  # replaced
        assert run(["--output-file", str(second)], timeout=60) == 0
    finally:
        client.close()
    assert client.proc.poll() is not None


FAKE_LAUNCH_SERVER = '''\
"""Stands in for sglang.launch_server: answers /health on --port until killed; as SGLang's server
does, it has a second thread and a child process (`sleep`), and /cpus answers the CPUs each of
the three may run on; started.log beside it gets its port, the CPUs it started on and its
OMP_NUM_THREADS."""
import http.server
import json
import os
import subprocess
import sys
import threading

port = int(sys.argv[sys.argv.index("--port") + 1])
child = subprocess.Popen(["sleep", "600"])
thread = threading.Thread(target=threading.Event().wait, daemon=True)
thread.start()


def cpus(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(line.split()[1] for line in f if line.startswith("Cpus_allowed_list:"))


with open(os.path.join(os.path.dirname(__file__), "started.log"), "a") as log:
    log.write(f"{port} {cpus(os.getpid())} {os.environ.get('OMP_NUM_THREADS')}\\n")


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        body = None
        if self.path.startswith("/decode/"):  # /decode/RUNNING/ACCEPT: one decode window, as 0.5.12 logs it
            running, accept = self.path.split("/")[2:]
            print(f"[2026-12-01 22:03:32] Decode batch, #running-req: {running}, #token: 34, token usage: 0.00, "
                  f"accept len: {accept}, accept rate: 0.97, cuda graph: False, gen throughput (token/s): 2.84, "
                  f"#queue-req: 0", flush=True)
        if self.path == "/cpus":
            body = {"server": cpus(os.getpid()), "thread": cpus(f"{os.getpid()}/task/{thread.native_id}"),
                    "child": cpus(child.pid)}
        self.wfile.write(json.dumps(body).encode())

    def log_message(self, *args):
        pass


http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
'''

FAKE_BENCH_BY_PORT = '''\\
"""Stands in for sglang.bench_serving: tokens/s and accept length by server port, the runs logged
with their start and end times (runs.log), the CPUs its client, the server, the server's second
thread and its child may run on and the client's OMP_NUM_THREADS (cpus.log); the requests of the
first measured pair run at 16/s, all others at 10/s; with a file `sleep` beside it, every run
takes that many seconds; with a file `move_deadline` ("TAG SECONDS") beside it, a run of TAG
writes now + SECONDS into `deadline`; with a file `together_slows` beside it, the patched server
runs a measured round at 110 tokens/s (not 125) when the other server's run is in flight halfway
through its own: together mode pulling the ratio toward 1."""
import json
import os
import sys
import time
import urllib.request

t0 = time.time()
here = os.path.dirname(__file__)
argv = sys.argv[1:]
port = int(argv[argv.index("--port") + 1])
base = int(open(os.path.join(here, "base_port")).read())
fast = port != base  # the second server of the pair (patched) is 1.25 times as fast
n = int(argv[argv.index("--num-prompts") + 1])
output_file = argv[argv.index("--output-file") + 1]
tag = output_file.rsplit("_", 1)[1].split(".")[0]
results = os.path.join(os.path.dirname(os.path.dirname(output_file)), "ab_results.json")
rounds = len(json.load(open(results))["records"][-1]["rounds"]) if os.path.exists(results) else "-"
inflight = os.path.join(here, f"inflight_{port}")
open(inflight, "w").close()
sleep = float(open(os.path.join(here, "sleep")).read()) if os.path.exists(os.path.join(here, "sleep")) else 0
time.sleep(sleep / 2)
beside = os.path.exists(os.path.join(here, f"inflight_{base + 1 - (port - base)}"))
time.sleep(sleep / 2)
if os.path.exists(os.path.join(here, "move_deadline")):
    at, seconds = open(os.path.join(here, "move_deadline")).read().split()
    if tag == at:
        open(os.path.join(here, "deadline"), "w").write(str(time.time() + float(seconds)))
with urllib.request.urlopen(f"http://127.0.0.1:{port}/cpus") as r:
    server = json.loads(r.read())
# the server's decode windows while this run is in flight: warm-up and calibration 1.00; a measured
# round two windows, (8 running, 4.00) and (2, 3.00) on the patched server, (8, 2.50) and (2, 1.50) on the other
for running, accept in ([(8, 4.0), (2, 3.0)] if fast else [(8, 2.5), (2, 1.5)]) if tag.startswith("pair") else [(8, 1.0)]:
    urllib.request.urlopen(f"http://127.0.0.1:{port}/decode/{running}/{accept:.2f}").read()
client = open("/proc/self/status").read().split("Cpus_allowed_list:")[1].split()[0]
with open(os.path.join(here, "cpus.log"), "a") as log:
    log.write(f"{port} {tag} {client} {server['server']} {server['thread']} {server['child']} "
              f"{os.environ.get('OMP_NUM_THREADS')}\\n")
slowed = beside and tag.startswith("pair") and os.path.exists(os.path.join(here, "together_slows"))
with open(output_file, "a") as f:
    f.write(json.dumps({"completed": n, "duration": n / (16.0 if tag == "pair0" else 10.0),
                        "output_throughput": (110.0 if slowed else 125.0) if fast else 100.0,
                        "accept_length": 4.0 if fast else 2.5, "median_ttft_ms": 10.0}) + "\\n")
os.remove(inflight)
with open(os.path.join(here, "runs.log"), "a") as log:
    log.write(f"{port} {n} {argv[argv.index('--max-concurrency') + 1]} {rounds} {tag} {t0} {time.time()}\\n")
'''


def stand_in_site(tmp_path: Path) -> tuple[Path, int]:
    """A site whose sglang.launch_server and sglang.bench_serving are the stand-ins; its base port."""
    site = tmp_path / "site"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    (site / "sglang" / "launch_server.py").write_text(FAKE_LAUNCH_SERVER)
    (site / "sglang" / "bench_serving.py").write_text(FAKE_BENCH_BY_PORT)
    base = 29000 + (hash(str(tmp_path)) % 500) * 2
    (site / "sglang" / "base_port").write_text(str(base))
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "prompts.json").write_text("{}")
    return site, base


def run_stand_in_ab(tmp_path: Path, site: Path, base: int, *args: str) -> list[list[str]]:
    """ab_bench.main on triton_nocg_k4s3 at concurrency 8; bench_serving's runs, as logged."""
    code = ab_bench.main(
        [
            "--models",
            str(tmp_path / "models"),
            "--site",
            str(site),
            "--patched",
            str(site),
            "--out",
            str(tmp_path / "out"),
            "--configs",
            "triton_nocg_k4s3",
            "--concurrencies",
            "8",
            "--stress",
            "-1",
            "--base-port",
            str(base),
            "--port-step",
            "1",
            "--startup-timeout",
            "60",
            "--max-seconds",
            "300",
            "--min-config-seconds",
            "1",
            *args,
        ]
    )
    assert code == 0
    return [line.split() for line in (site / "sglang" / "runs.log").read_text().splitlines()]


def test_one_config_end_to_end_with_stand_in_servers(tmp_path):
    """Start the pair, warm up and calibrate each, alternate the trees pair by pair, grow the
    rounds after a short pair, summarize: with stand-ins for sglang.launch_server and
    sglang.bench_serving (a real run needs a GPU)."""
    site, base = stand_in_site(tmp_path)
    runs = run_stand_in_ab(tmp_path, site, base)
    a, b = str(base), str(base + 1)
    # warm-up (6 waves: 48) and calibration (32) per tree, one after the other
    assert [r[:3] + r[4:5] for r in runs[:4]] == [
        [a, "48", "8", "warmup"],
        [b, "48", "8", "warmup"],
        [a, "32", "8", "calibration"],
        [b, "32", "8", "calibration"],
    ]
    # 6 pairs A B, B A, ...: 20 s * 1.5 at 10/s = 300 -> 304 prompts; pair 0 ran at 16/s (19 s < 20 s),
    # so pairs 1-5 get 20 s * 1.5 at 16/s = 480; both rounds of pair 0 had the same prompts
    assert [r[0] for r in runs[4:]] == [a, b, b, a] * 3
    assert [r[1] for r in runs[4:]] == ["304", "304"] + ["480"] * 10
    # the outputs are rewritten after every measured round: each round sees all earlier ones
    assert [r[3] for r in runs[4:]] == ["-"] + [str(k) for k in range(1, 12)]
    result = json.loads((tmp_path / "out" / "ab_results.json").read_text())
    assert (result["settings"]["mode"], result["settings"]["round_margin"]) == ("sequential", 1.5)
    (record,) = result["records"]
    assert record["mode"] == "sequential" and record["round_prompts"] == {"8": 480}
    assert record["notes"] == ["c8: pair 0's shortest round took 19.0 s: 304 -> 480 prompts from pair 1 on"]
    starts = [run["t_start"] for run in record["runs"]]
    assert len(starts) == 16 and starts == sorted(starts) and starts[0] >= time.time() - 120
    (s,) = result["summaries"]
    assert s["pairs"] == 6 and s["ratio_median"] == pytest.approx(1.25) and s["verdict"] == "patched faster"
    assert s["unpatched"]["tokens_per_s"] == 100.0
    # the server's windows while the measured rounds ran, weighted by running requests: (8 x 4 + 2 x 3) / 10;
    # not the warm-up's and calibration's (1.00), nor bench_serving's average since start (4.0)
    assert s["patched"]["accept_length"] == pytest.approx(3.8) and s["unpatched"]["accept_length"] == pytest.approx(2.3)
    assert s["patched"]["accept_length_since_start"] == 4.0
    assert all(r["accept_windows"] == 2 for r in record["rounds"])
    assert [r["accept_windows"] for r in record["runs"][:4]] == [1, 1, 1, 1]
    assert "| triton_nocg_k4s3 | sequential | 8 | 6 | 19.0 |" in (tmp_path / "out" / "ab_summary.md").read_text()


def test_each_configuration_runs_at_its_own_concurrencies(tmp_path):
    """STEM@2,8: the first configuration warms up, calibrates and measures every pair at 2 and at
    8, the second (no @) only at --concurrencies; each pair's servers admit as many requests as
    its largest concurrency; one summary per configuration and concurrency."""
    site, base = stand_in_site(tmp_path)
    run_stand_in_ab(tmp_path, site, base, "--mode", "together", "--configs", "triton_nocg_k4s3@2,8", "triton_cg_k4s3")
    runs = [line.split() for line in (site / "sglang" / "runs.log").read_text().splitlines()]
    first = {str(base), str(base + 1)}
    assert {(r[2], r[4]) for r in runs if r[0] in first} == {
        (c, tag) for c in ("2", "8") for tag in ["warmup", "calibration"] + [f"pair{k}" for k in range(6)]
    }
    assert {(r[2], r[4]) for r in runs if r[0] not in first} == {
        ("8", tag) for tag in ["warmup", "calibration"] + [f"pair{k}" for k in range(6)]
    }
    result = json.loads((tmp_path / "out" / "ab_results.json").read_text())
    assert result["settings"]["config_concurrencies"] == {"triton_nocg_k4s3": [2, 8], "triton_cg_k4s3": [8]}
    assert [r["concurrencies"] for r in result["records"]] == [[2, 8], [8]]
    assert all("--max-running-requests 8 " in r["server_extra_args"] for r in result["records"])
    assert [(s["config"], s["concurrency"], s["pairs"]) for s in result["summaries"]] == [
        ("triton_nocg_k4s3", 2, 6),
        ("triton_nocg_k4s3", 8, 6),
        ("triton_cg_k4s3", 8, 6),
    ]


def test_together_mode_runs_both_trees_of_every_pair_at_once(tmp_path):
    """--mode together: warm-up, calibration and each pair on both servers at the same time (the
    stand-in's logged start and end times overlap), same prompts, the ratio of the simultaneous
    rounds; then report_ab over these results and the old ones (no mode: sequential)."""
    site, base = stand_in_site(tmp_path)
    (site / "sglang" / "sleep").write_text("0.3")
    runs = run_stand_in_ab(tmp_path, site, base, "--mode", "together")
    a, b = str(base), str(base + 1)
    tags = ["warmup", "calibration"] + [f"pair{k}" for k in range(6)]
    assert [r[4] for r in runs[::2]] == tags and [r[4] for r in runs[1::2]] == tags
    for first, second in zip(runs[::2], runs[1::2]):
        assert {first[0], second[0]} == {a, b} and first[1:5] == second[1:5]  # same prompts, same step
        (start1, end1), (start2, end2) = map(float, first[5:]), map(float, second[5:])
        assert start1 < end2 and start2 < end1  # both runs were in flight at once
    assert [r[1] for r in runs[4:]] == ["304"] * 2 + ["480"] * 10
    assert [r[3] for r in runs[4:]] == ["-", "-"] + [str(2 * (k // 2)) for k in range(2, 12)]
    result = json.loads((tmp_path / "out" / "ab_results.json").read_text())
    assert result["settings"]["mode"] == "together"
    (record,) = result["records"]
    assert record["mode"] == "together" and all("t_start" in run for run in record["runs"])
    for k in range(6):
        pair = [r for r in record["rounds"] if r["pair"] == k]
        assert sorted(r["tree"] for r in pair) == ["patched", "unpatched"]
        assert abs(pair[0]["t_start"] - pair[1]["t_start"]) < 0.3
    (s,) = result["summaries"]
    assert (s["mode"], s["pairs"], s["verdict"]) == ("together", 6, "patched faster")
    assert s["ratio_median"] == pytest.approx(1.25)
    assert "| triton_nocg_k4s3 | together | 8 | 6 |" in (tmp_path / "out" / "ab_summary.md").read_text()
    assert (tmp_path / "out" / "logs" / "bench_serving_patched.log").exists()

    old = json.loads(OLD_RESULTS.read_text())
    assert "mode" not in old["settings"] and not any("mode" in r for r in old["records"])
    assert (
        report_ab.main(
            [
                str(OLD_RESULTS),
                str(tmp_path / "out" / "ab_results.json"),
                "--out",
                str(tmp_path / "report"),
                "--no-plots",
            ]
        )
        == 0
    )
    text = (tmp_path / "report" / "summary.md").read_text()
    assert "| triton_nocg_k4s3 | together | 8 | 6 |" in text
    first_old = old["records"][0]
    ratios = [
        p["output_throughput"] / u["output_throughput"]
        for u, p in zip(*[[r for r in first_old["rounds"] if r["tree"] == tree] for tree in ("unpatched", "patched")])
    ]
    assert f"| {first_old['config']} | sequential | 32 | 6 |" in text
    assert f"{statistics.median(ratios):.3f} [" in text


def test_deadline_file_overrides_while_it_holds_an_epoch(tmp_path):
    path = tmp_path / "deadline"
    deadline = ab_bench.Deadline(time.time() + 100, str(path))
    assert 90 < deadline.left() <= 100  # no file yet: the given deadline
    path.write_text(str(int(time.time()) + 500))
    assert 490 < deadline.left() <= 500
    path.write_text("")
    assert deadline.left() <= 100


def test_cpu_split_summary_gives_the_median_ratio_with_the_unpatched_tree_on_each_half():
    record = pair_record([1.01, 0.99, 1.03, 0.98, 1.02, 0.97, 1.04])
    assert "ratio_median_by_half" not in ab_bench.summarize(record, [32])[0]
    record["cpu_split"] = ["0-7", "8-15"]
    (s,) = ab_bench.summarize(record, [32])
    assert s["mode"] == "sequential+cpu-split" and s["pairs"] == 7
    assert s["ratio_median_by_half"] == {
        "unpatched on 0-7": pytest.approx(1.025),  # pairs 0, 2, 4, 6
        "unpatched on 8-15": pytest.approx(0.98),
    }  # pairs 1, 3, 5


def test_too_few_pairs_give_the_range_and_no_interval():
    pairs = [({"output_throughput": 100.0}, {"output_throughput": 100.0 * r}) for r in (1.218, 1.258)]
    s = ab_stats.ratio_summary(pairs, round_seconds=20)
    assert "ci_low" not in s and s["verdict"].startswith("2 pairs: too few")
    assert s["sd_log_ratio"] > 0
    record = pair_record([1.218, 1.258])
    (summary,) = ab_bench.summarize(record, [32])
    assert "1.238 (min-max 1.218-1.258)" in ab_bench.markdown_table([summary])


def test_cpu_split_pins_each_tree_to_its_half_and_config_seconds_adds_pairs(tmp_path, monkeypatch):
    """--cpu-split: each tree's server (its second thread and its child too) and client run on the
    tree's half, the halves disjoint and swapping trees pair by pair, as the stand-ins themselves
    read it from /proc; --config-seconds: pairs beyond --pairs while the measured phase has run
    less than the budget, each started before it ran out."""
    site, base = stand_in_site(tmp_path)
    (site / "sglang" / "sleep").write_text("0.1")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # ab_bench keeps a value it is given
    budget = 4.0
    run_stand_in_ab(tmp_path, site, base, "--mode", "together", "--cpu-split", "--config-seconds", str(budget))
    first, second = ab_bench.cpu_halves(ab_bench.physical_cores(os.sched_getaffinity(0)))
    assert first and second and not set(first) & set(second)
    assert set(first) | set(second) <= os.sched_getaffinity(0)
    halves = [ab_bench.format_cpu_list(first), ab_bench.format_cpu_list(second)]
    result = json.loads((tmp_path / "out" / "ab_results.json").read_text())
    (record,) = result["records"]
    pairs = max(r["pair"] for r in record["rounds"]) + 1
    assert pairs > 6 and len(record["rounds"]) == 2 * pairs

    started = sorted(line.split() for line in (site / "sglang" / "started.log").read_text().splitlines())
    omp = [str(len(first)), str(len(second))]  # OpenMP teams the size of the half (both halves alike)
    assert started == [[str(base), halves[0], omp[0]], [str(base + 1), halves[1], omp[1]]]  # before any re-pinning
    seen = [line.split() for line in (site / "sglang" / "cpus.log").read_text().splitlines()]
    assert len(seen) == 2 * (2 + pairs)  # warm-up, calibration and every pair, both trees
    for port, tag, *cpus, client_omp in seen:
        pair = int(tag[4:]) if tag.startswith("pair") else 0
        tree = int(port) - base  # 0: unpatched, 1: patched
        assert cpus == [halves[(tree + pair) % 2]] * 4, (port, tag)  # client, server, its thread, its child
        assert client_omp == omp[tree]
    assert result["settings"]["cpu_split"] == halves and record["cpu_split"] == halves
    assert [p["pair"] for p in record["pinning"]] == list(range(pairs))
    for p in record["pinning"]:
        for j, tree in enumerate(ab_bench.TREES):
            half = halves[(j + p["pair"]) % 2]
            assert p[tree]["cpus"] == p[tree]["server"]["cpus"] == p[tree]["client"]["cpus"] == half
            assert p[tree]["server"]["processes"] == 2 and p[tree]["server"]["threads"] >= 3  # server + sleep
    assert all(r["cpus"] == halves[((r["tree"] == "patched") + r["pair"]) % 2] for r in record["rounds"])

    starts = {k: min(r["t_start"] for r in record["rounds"] if r["pair"] == k) for k in range(pairs)}
    assert all(starts[k] - starts[0] < budget + 1 for k in range(6, pairs))  # started within the budget
    assert record["measured_s"] >= budget
    assert record["notes"][-1].startswith(f"{pairs} pairs: the measured phase ran")
    (s,) = result["summaries"]
    assert (s["mode"], s["pairs"]) == ("together+cpu-split", pairs)
    assert sorted(s["ratio_median_by_half"]) == [f"unpatched on {half}" for half in halves]
    table = (tmp_path / "out" / "ab_summary.md").read_text()
    assert f"| triton_nocg_k4s3 | together+cpu-split | 8 | {pairs} |" in table


def test_pinning_a_tree_whose_process_has_exited_says_so():
    """pin_group on a group with no process left finds nothing; the pinning's note says that, not
    that the process ran on no CPUs."""
    a = ab_bench.parse_args(REQUIRED + ["--mode", "together"])
    cpu = min(os.sched_getaffinity(0))
    a.cpu_halves = ([cpu], [cpu])
    gone = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    gone.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        pair = ab_bench.Pair(
            a.configs[0], 0, a, {tree: SimpleNamespace(proc=live, cpus=None) for tree in ab_bench.TREES}, deadline=None
        )
        pair.procs = {"unpatched": live, "patched": gone}
        pair.pin(0)
    finally:
        live.kill()
        live.wait()
    [entry] = pair.record["pinning"]
    assert entry["patched"]["server"] == {"processes": 0, "threads": 0, "cpus": ""}
    assert entry["unpatched"]["server"] == {
        "processes": 1,
        "threads": entry["unpatched"]["server"]["threads"],
        "cpus": str(cpu),
    }
    assert pair.record["notes"] == ["pair 0: patched server: no process left in its group to pin"]


def test_config_seconds_stops_at_the_deadline_with_whole_pairs(tmp_path):
    """Sequential: past --pairs a pair starts only when both its rounds fit before the deadline.
    The rounds grew after pair 0 (304 -> 480 prompts), so a round is expected to take 44 s x 480 /
    304 = 69.5 s, a pair 2 x (69.5 + 5) s; the stand-in moves the deadline to 100 s away during
    pair 7's first round: its second round still fits, pair 8 does not."""
    site, base = stand_in_site(tmp_path)
    (site / "sglang" / "move_deadline").write_text("pair7 100")
    run_stand_in_ab(
        tmp_path, site, base, "--config-seconds", "600", "--deadline-file", str(site / "sglang" / "deadline")
    )
    (record,) = json.loads((tmp_path / "out" / "ab_results.json").read_text())["records"]
    assert sorted({r["pair"] for r in record["rounds"]}) == list(range(8))
    assert len(record["rounds"]) == 16 and "cpu_split" not in record and "cpus" not in record["rounds"][0]
    assert record["notes"][-1].startswith("8 pairs: pair 8 not started after ")
    assert "s left, ~149 s needed" in record["notes"][-1]


def small_plan(tmp_path: Path, n: int = 7, **design) -> Path:
    """A plan file with one cell, triton_nocg_k4s3 at concurrency 8, of ``n`` pairs."""
    cell = {
        "config": "triton_nocg_k4s3",
        "concurrency": 8,
        "n_pairs": n,
        "alpha": 0.05,
        "margin": ab_stats.TOST_MARGIN,
        "t_crit": {7: 1.943180, 8: 1.894579}[n],
    }
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"design": {"mode": "together", "round_margin": 1.5, **design}, "cells": [cell]}))
    return path


def test_a_plan_fixes_the_pairs_and_refuses_runs_outside_its_design_or_cells(tmp_path, capsys):
    plan = str(small_plan(tmp_path))
    a = ab_bench.parse_args(REQUIRED + ["--plan", plan, "--mode", "together", "--configs", "triton_nocg_k4s3@8"])
    assert a.config_pairs == {"triton_nocg_k4s3": 7} and a.plan_cells[("triton_nocg_k4s3", 8)]["n_pairs"] == 7
    for argv, says in [
        (["--configs", "triton_nocg_k4s3@8"], "--mode 'together' (given 'sequential')"),
        (
            ["--mode", "together", "--round-margin", "1.25", "--configs", "triton_nocg_k4s3@8"],
            "--round-margin 1.5 (given 1.25)",
        ),
        (["--mode", "together", "--configs", "triton_nocg_k4s3@8,32"], "triton_nocg_k4s3 at concurrency 32 is not"),
        (["--mode", "together", "--config-seconds", "300", "--configs", "triton_nocg_k4s3@8"], "no --config-seconds"),
    ]:
        with pytest.raises(SystemExit):
            ab_bench.parse_args(REQUIRED + ["--plan", plan] + argv)
        assert says in capsys.readouterr().err
    # fewer planned pairs than --pairs: --pairs run, the verdict still at the plan's count
    assert ab_bench.parse_args(
        REQUIRED + ["--plan", plan, "--mode", "together", "--pairs", "9", "--configs", "triton_nocg_k4s3@8"]
    ).config_pairs == {"triton_nocg_k4s3": 9}


def test_a_plan_run_measures_its_pairs_and_gives_its_verdict_then_report_judges_old_runs_post_hoc(tmp_path):
    """ab_bench --plan end to end with the stand-ins (patched 1.25 times as fast in every pair: the
    TOST cannot pass), then report_ab --plan over the old results (no plan then: post hoc)."""
    site, base = stand_in_site(tmp_path)
    plan = small_plan(tmp_path)
    run_stand_in_ab(tmp_path, site, base, "--mode", "together", "--plan", str(plan))
    result = json.loads((tmp_path / "out" / "ab_results.json").read_text())
    (record,) = result["records"]
    assert sorted({r["pair"] for r in record["rounds"]}) == list(range(7))
    assert record["plan"]["file"] == str(plan) and record["plan"]["cells"]["8"]["n_pairs"] == 7
    assert record["plan"]["sha256"] == hashlib.sha256(plan.read_bytes()).hexdigest()
    (s,) = result["summaries"]
    t = s["tost"]
    assert (t["n"], t["passed"], t["registered"]) == (7, False, "before the run")
    assert t["ratio_mean"] == pytest.approx(1.25)
    assert (
        "| not shown within ±2% (TOST, 7 planned pairs), 1.250 [1.250, 1.250] |"
        in (tmp_path / "out" / "ab_summary.md").read_text()
    )

    old = tmp_path / "old.json"
    old.write_text(json.dumps({"settings": {"concurrencies": [8]}, "records": [pair_record([1.0, 1.01, 0.99] * 3, 8)]}))
    loose = tmp_path / "loose.json"
    loose.write_text(
        json.dumps(
            {
                "design": {},
                "cells": [
                    {
                        "config": "flashinfer_cg_k8s5",
                        "concurrency": 8,
                        "n_pairs": 8,
                        "alpha": 0.05,
                        "margin": ab_stats.TOST_MARGIN,
                        "t_crit": 1.894579,
                    }
                ],
            }
        )
    )
    assert report_ab.main([str(old), "--out", str(tmp_path / "report"), "--no-plots", "--plan", str(loose)]) == 0
    (s,) = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert s["tost"]["passed"] and s["tost"]["n"] == 8 and s["tost"]["registered"] == "after the run (post hoc)"
    assert "equivalent within ±2% (TOST, 8 planned pairs), " in (tmp_path / "report" / "summary.md").read_text()
    assert "(post hoc)" in (tmp_path / "report" / "summary.md").read_text()


#: decode windows as SGLang 0.5.12 logged them on the H200 (results/h200-2026-12-01-ab4/logs.tgz,
#: server_flashinfer_cg_k1s3_patched.log and server_triton_nocg_k4s3_patched.log), with a prefill line
#: and a capture line between; the format is srt/observability/scheduler_metrics_mixin.py's
REAL_DECODE_LOG = """\
[2026-12-01 22:03:32] Decode batch, #running-req: 1, #token: 34, token usage: 0.00, accept len: 3.92, accept rate: 0.97, cuda graph: True, gen throughput (token/s): 2.84, #queue-req: 0
[2026-12-01 22:03:33] Prefill batch, #new-seq: 1, #new-token: 512, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0, cuda graph: False, input throughput (token/s): 0.00
[2026-12-01 22:03:34] Capture draft cuda graph end. Time elapsed: 4.03 s. mem usage=0.79 GB. avail mem=78.49 GB.
[2026-12-01 22:03:35] Decode batch, #running-req: 32, #token: 14410, token usage: 0.13, accept len: 3.98, accept rate: 0.99, cuda graph: False, gen throughput (token/s): 2061.55, #queue-req: 0
"""


def test_accept_length_from_the_servers_decode_windows_in_0_5_12s_format(tmp_path):
    assert ab_bench.window_accept_length(REAL_DECODE_LOG) == {
        "accept_windows": 2,
        "accept_length_windows": pytest.approx((1 * 3.92 + 32 * 3.98) / 33),
    }
    assert ab_bench.window_accept_length("") == {"accept_windows": 0, "accept_length_windows": None}
    # from an offset on, whole lines only (a line still being written counts in the next run's read)
    log = tmp_path / "server.log"
    first, second = REAL_DECODE_LOG.splitlines(keepends=True)[0], REAL_DECODE_LOG.splitlines(keepends=True)[3]
    log.write_text(first + second[:60])
    offset = len(first.encode())
    assert ab_bench.server_accept_length(str(log), offset)["accept_windows"] == 0
    log.write_text(first + second)
    assert ab_bench.server_accept_length(str(log), offset) == {"accept_windows": 1, "accept_length_windows": 3.98}
    assert ab_bench.server_accept_length(str(tmp_path / "none.log"), 0)["accept_windows"] == 0


@pytest.mark.releases
def test_the_decode_window_line_is_0_5_12s():
    """The pieces DECODE_WINDOW reads are in 0.5.12's f-strings, in that order, and each line's
    accept len is its own window's (the counters reset before it is written)."""
    require_release("0.5.12")
    text = wheel_source("0.5.12", "sglang/srt/observability/scheduler_metrics_mixin.py")
    pieces = [
        'msg = f"Decode batch{iter_msg}, #running-req: {num_running_reqs}, {token_usage_msg}"',
        "spec_accept_length = self.spec_num_accept_tokens / self.spec_num_forward_ct",
        "self.spec_num_accept_tokens = self.spec_num_forward_ct = 0",  # each window its own
        'msg += f"accept len: {spec_accept_length:.2f}, accept rate: {spec_accept_rate:.2f}, "',
    ]
    at = [text.find(p) for p in pieces]
    assert -1 not in at and at == sorted(at)


def test_both_mode_alternates_the_modes_t_s_s_t_with_one_of_each_in_every_block():
    assert [ab_stats.pair_mode("both", k) for k in range(8)] == ["together", "sequential", "sequential", "together"] * 2
    assert ab_stats.pair_mode("together", 1) == "together" and ab_stats.pair_mode("sequential", 0) == "sequential"
    trees = ab_stats.TREES
    assert ab_stats.both_schedule(4, [8]) == [
        (0, 8, trees),
        (1, 8, ("unpatched",)),
        (1, 8, ("patched",)),
        (2, 8, ("patched",)),
        (2, 8, ("unpatched",)),
        (3, 8, trees),
    ]
    for b in range(4):
        assert {ab_stats.pair_mode("both", k) for k in (2 * b, 2 * b + 1)} == set(ab_stats.MODES)


def test_mode_bias_pairs_each_blocks_together_and_sequential_ratios():
    """The blocks' together - sequential log ratios, a drift shared by both pairs of a block cancelled;
    an incomplete block left out; the share of the sequential log ratio that together keeps."""
    drift = [1.0, 1.03, 0.97, 1.01]
    ratios = {}
    for b, f in enumerate(drift):  # the machine's drift moves both pairs of block b alike
        for k in (2 * b, 2 * b + 1):
            ratios[k] = (1.1 if ab_stats.pair_mode("both", k) == "together" else 1.25) * f
    ratios[8] = 1.3  # block 4: its together pair only
    bias = ab_stats.mode_bias(ratios, t_crit=3.182)  # t's 0.975 quantile at 3 degrees of freedom
    assert bias["blocks"] == 4
    assert bias["ratio_of_ratios"] == pytest.approx(1.1 / 1.25)
    assert bias["sd_log_diff"] == pytest.approx(0, abs=1e-12)
    lo, hi = bias["ratio_of_ratios_ci95"]
    assert lo == pytest.approx(1.1 / 1.25) and hi == pytest.approx(1.1 / 1.25)
    geo = math.exp(statistics.mean(math.log(f) for f in drift))
    assert bias["together_ratio"] == pytest.approx(1.1 * geo) and bias["sequential_ratio"] == pytest.approx(1.25 * geo)
    kept = math.log(1.1 * geo) / math.log(1.25 * geo)
    assert bias["kept"] == pytest.approx(kept)
    klo, khi = bias["kept_ci95"]
    assert klo <= bias["kept"] <= khi and 0 < klo < 1
    noisy = {**ratios, 1: ratios[1] * 1.05, 2: ratios[2] / 1.05}
    wide = ab_stats.mode_bias(noisy, t_crit=3.182)
    lo, hi = wide["ratio_of_ratios_ci95"]
    assert lo < wide["ratio_of_ratios"] < hi and hi / lo > 1.05
    assert ab_stats.mode_bias({0: 1.1, 1: 1.2}) == {"blocks": 1}


def test_both_mode_alternates_the_modes_on_the_same_servers_and_reports_the_bias(tmp_path, monkeypatch):
    """--mode both --cpu-split: warm-up and calibration each tree alone on every CPU; pairs 0, 3, 4
    both trees at once, each on its half (the halves swapping from one together pair to the next), pairs
    1, 2, 5 one tree after the other on every CPU, the first tree alternating; a summary per mode, the
    mode bias in both, report_ab's bias table. The stand-in's patched server runs 110 tokens/s
    instead of 125 beside the other one."""
    site, base = stand_in_site(tmp_path)
    (site / "sglang" / "sleep").write_text("0.4")
    (site / "sglang" / "together_slows").write_text("")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    runs = run_stand_in_ab(tmp_path, site, base, "--mode", "both", "--cpu-split")
    a, b = str(base), str(base + 1)
    assert [(r[0], r[4]) for r in runs[:4]] == [(a, "warmup"), (b, "warmup"), (a, "calibration"), (b, "calibration")]
    measured = runs[4:]
    assert [r[4] for r in measured] == [f"pair{k}" for k in (0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5)]
    for k, (first, second) in enumerate(zip(measured[::2], measured[1::2])):
        (start1, end1), (start2, end2) = map(float, first[5:]), map(float, second[5:])
        overlap = start1 < end2 and start2 < end1
        assert overlap == (k in (0, 3, 4)), k  # together pairs at once, sequential ones one after the other
    assert [r[0] for r in measured[2:6]] == [a, b, b, a] and [r[0] for r in measured[10:]] == [a, b]

    first, second = ab_bench.cpu_halves(ab_bench.physical_cores(os.sched_getaffinity(0)))
    halves = [ab_bench.format_cpu_list(first), ab_bench.format_cpu_list(second)]
    every = ab_bench.format_cpu_list(os.sched_getaffinity(0))
    started = sorted(line.split() for line in (site / "sglang" / "started.log").read_text().splitlines())
    assert started == [[a, every, str(len(first))], [b, every, str(len(first))]]
    together_index = {0: 0, 3: 1, 4: 2}
    for port, tag, *cpus, _ in (line.split() for line in (site / "sglang" / "cpus.log").read_text().splitlines()):
        k = int(tag[4:]) if tag.startswith("pair") else None
        if k in together_index:
            want = halves[(int(port) - base + together_index[k]) % 2]
        else:
            want = every
        assert cpus == [want] * 4, (port, tag)  # client, server, its thread, its child

    result = json.loads((tmp_path / "out" / "ab_results.json").read_text())
    (record,) = result["records"]
    assert record["mode"] == "both" and result["settings"]["mode"] == "both"
    assert {r["pair"]: r["pair_mode"] for r in record["rounds"]} == {k: ab_stats.pair_mode("both", k) for k in range(6)}
    together, sequential = result["summaries"]
    assert (together["mode"], together["pairs"]) == ("together+cpu-split (both)", 3)
    assert (sequential["mode"], sequential["pairs"]) == ("sequential (both)", 3)
    assert together["ratio_median"] == pytest.approx(1.1) and sequential["ratio_median"] == pytest.approx(1.25)
    assert "ratio_median_by_half" in together and "ratio_median_by_half" not in sequential
    assert together["mode_bias"] == sequential["mode_bias"]
    assert together["mode_bias"]["blocks"] == 3
    assert together["mode_bias"]["ratio_of_ratios"] == pytest.approx(1.1 / 1.25)
    assert together["mode_bias"]["kept"] == pytest.approx(math.log(1.1) / math.log(1.25))

    assert report_ab.main([str(tmp_path / "out" / "ab_results.json"), "--out", str(tmp_path / "r"), "--no-plots"]) == 0
    text = (tmp_path / "r" / "summary.md").read_text()
    assert "| triton_nocg_k4s3 | 8 | 3 | 1.250 | 1.100 | 0.880 [0.880, 0.880] | 0.43 [0.43, 0.43] |" in text
    assert "| triton_nocg_k4s3 | sequential (both) | 8 | 3 |" in text
