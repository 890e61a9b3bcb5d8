"""benchmark/gpu/ab_bench.py on CPU: its arguments, the flags it gives sglang.bench_serving
(each must exist in 0.5.12's parser), and the per-config summary over fake rounds."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

from support.sglang_release import require_release
from support.wheel_source import wheel_source

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmark" / "gpu"))
import ab_bench  # noqa: E402

REQUIRED = ["--models", "m", "--site", "s", "--patched", "p", "--out", "o"]


def bench_serving_options(text: str) -> dict[str, ast.Call]:
    """Every option string that bench_serving's parser (built under ``__main__``) adds."""
    options = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and str(arg.value).startswith("--"):
                    options[arg.value] = node
    return options


def test_defaults_are_the_issue_configs_and_sizes():
    a = ab_bench.parse_args(REQUIRED)
    assert a.configs == ["triton_nocg_k4s3", "triton_nocg_k1s3", "flashinfer_cg_k4s3", "flashinfer_cg_k8s5"]
    assert (a.rounds, a.num_prompts, a.concurrency, a.max_seconds) == (5, 32, 8, 450)
    assert (a.input_len * a.range_ratio, a.input_len, a.output_len) == (512, 1024, 128)


@pytest.mark.parametrize("argv", [
    REQUIRED[2:],                              # no --models
    REQUIRED + ["--rounds", "4"],              # fewer than 5 rounds
    REQUIRED + ["--configs", "vllm_cg_k4s3"],  # not a serve_checks backend
])
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit) as exc:
        ab_bench.parse_args(argv)
    assert exc.value.code == 2


@pytest.mark.releases
def test_every_flag_exists_in_bench_serving_0_5_12():
    require_release("0.5.12")
    options = bench_serving_options(wheel_source("0.5.12", "sglang/bench_serving.py"))
    argv = ab_bench.bench_argv(ab_bench.parse_args(REQUIRED), port=20000, num_prompts=32, output_file="x.jsonl")
    flags = [x for x in argv if x.startswith("--")]
    assert flags and not [f for f in flags if f not in options]
    choices = next(kw.value for kw in options["--dataset-name"].keywords if kw.arg == "choices")
    assert "random-ids" in ast.literal_eval(choices)
    assert argv[argv.index("--dataset-name") + 1] == "random-ids"
    # the dataset the name maps to draws integers: no ShareGPT download
    datasets = wheel_source("0.5.12", "sglang/benchmark/datasets/random.py")
    assert 'random_sample=(args.dataset_name == "random")' in datasets


def fake_round(tokens_per_s: float, accept: float, completed: int = 32) -> dict:
    return {"completed": completed, "output_throughput": tokens_per_s, "accept_length": accept}


def test_summary_pairs_round_k_of_each_tree():
    rounds = {
        "unpatched": [fake_round(100, 2.0), fake_round(110, 2.1), fake_round(90, 2.2),
                      fake_round(100, 2.0), fake_round(120, 2.0)],
        "patched": [fake_round(200, 4.0), fake_round(110, 4.0), fake_round(180, 3.9),
                    fake_round(300, 4.0), fake_round(240, 4.0)],
    }
    s = ab_bench.summarize("flashinfer_cg_k4s3", rounds, expected_completed=32)
    assert s["rounds"] == {"unpatched": 5, "patched": 5} and s["pairs"] == 5
    assert (s["unpatched_tokens_per_s"], s["patched_tokens_per_s"]) == (100, 200)
    assert (s["unpatched_accept_length"], s["patched_accept_length"]) == (2.0, 4.0)
    # ratios per pair: 2.0, 1.0, 2.0, 3.0, 2.0
    assert (s["ratio_median"], s["ratio_min"], s["ratio_max"]) == (2.0, 1.0, 3.0)
    table = ab_bench.markdown_table([s])
    assert "| flashinfer_cg_k4s3 | 5 / 5 | 100.0 | 200.0 | 2.000 (1.000-3.000) | 2.000 | 4.000 |" in table


def test_incomplete_rounds_and_their_pairs_are_left_out():
    rounds = {
        "unpatched": [fake_round(100, 2.0), fake_round(50, 2.0, completed=31), None, fake_round(100, 2.0)],
        "patched": [fake_round(150, 4.0), fake_round(100, 4.0), fake_round(100, 4.0)],
    }
    s = ab_bench.summarize("triton_nocg_k4s3", rounds, expected_completed=32)
    assert s["rounds"] == {"unpatched": 2, "patched": 3}
    # pairs: round 0 only (round 1 of A incomplete, round 2 of A failed, round 3 of B missing)
    assert s["pairs"] == 1 and s["ratio_median"] == s["ratio_min"] == s["ratio_max"] == 1.5


def test_no_rounds_gives_dashes():
    s = ab_bench.summarize("flashinfer_cg_k8s5", {"unpatched": [], "patched": []}, expected_completed=32)
    assert s["ratio_median"] is None and s["unpatched_tokens_per_s"] is None
    assert "| flashinfer_cg_k8s5 | 0 / 0 | - | - | - | - | - |" in ab_bench.markdown_table([s])


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
    try:
        first, second = tmp_path / "r0.jsonl", tmp_path / "r1.jsonl"
        assert client.run(["--output-file", str(first)], timeout=60) == 0
        assert client.run(["--output-file", str(second), "--exit", "3"], timeout=60) == 3
        assert ab_bench.read_round(str(first)) == {
            "completed": 32, "duration": None, "total_output_tokens": None, "output_throughput": 123.0,
            "accept_length": 4.0, "median_tpot_ms": None, "median_ttft_ms": None}
        ran = json.loads(second.read_text())  # run as `python -m sglang.bench_serving` runs it
        assert ran["run_as"] == "__main__" and ran["argv0"] == str(site / "sglang" / "bench_serving.py")
        hung = client.proc
        assert client.run(["--output-file", str(first), "--sleep", "30"], timeout=1) is None
        assert hung.poll() is not None and client.proc is not hung  # replaced
        assert client.run(["--output-file", str(second)], timeout=60) == 0
    finally:
        client.close()
    assert client.proc.poll() is not None


FAKE_LAUNCH_SERVER = '''\
"""Stands in for sglang.launch_server: answers /health on --port until killed."""
import http.server
import sys

port = int(sys.argv[sys.argv.index("--port") + 1])


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"null")

    def log_message(self, *args):
        pass


http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
'''

FAKE_BENCH_BY_PORT = '''\
"""Stands in for sglang.bench_serving: tokens/s and accept length by server port, the order of runs logged."""
import json
import sys

argv = sys.argv[1:]
port = int(argv[argv.index("--port") + 1])
base = int(open(__file__.replace("bench_serving.py", "base_port")).read())
fast = port != base  # the second server of the pair (patched) is twice as fast
with open(__file__.replace("bench_serving.py", "runs.log"), "a") as log:
    log.write(f"{port} {argv[argv.index('--num-prompts') + 1]}\\n")
with open(argv[argv.index("--output-file") + 1], "a") as f:
    f.write(json.dumps({"completed": int(argv[argv.index("--num-prompts") + 1]),
                        "output_throughput": 200.0 if fast else 100.0,
                        "accept_length": 4.0 if fast else 2.5}) + "\\n")
'''


def test_one_config_end_to_end_with_stand_in_servers(tmp_path):
    """Start the pair, warm up each, alternate A B A B ..., summarize: with stand-ins for
    sglang.launch_server and sglang.bench_serving (a real run needs a GPU)."""
    site = tmp_path / "site"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    (site / "sglang" / "launch_server.py").write_text(FAKE_LAUNCH_SERVER)
    (site / "sglang" / "bench_serving.py").write_text(FAKE_BENCH_BY_PORT)
    base = 29000 + (hash(str(tmp_path)) % 500) * 2
    (site / "sglang" / "base_port").write_text(str(base))
    out = tmp_path / "out"
    code = ab_bench.main(["--models", str(tmp_path / "models"), "--site", str(site), "--patched", str(site),
                          "--out", str(out), "--configs", "triton_nocg_k4s3", "--rounds", "5",
                          "--base-port", str(base), "--port-step", "1", "--startup-timeout", "60",
                          "--max-seconds", "120", "--min-config-seconds", "1"])
    assert code == 0
    runs = (site / "sglang" / "runs.log").read_text().split("\n")[:-1]
    a, b = f"{base} ", f"{base + 1} "
    assert runs == [a + "16", b + "16"] + [a + "32", b + "32"] * 5  # warm-up, then A B A B ...
    result = json.loads((out / "ab_results.json").read_text())
    [s] = result["summaries"]
    assert s["notes"] == [] and s["pairs"] == 5
    assert (s["unpatched_tokens_per_s"], s["patched_tokens_per_s"], s["ratio_min"], s["ratio_max"]) == (100, 200, 2, 2)
    assert (s["unpatched_accept_length"], s["patched_accept_length"]) == (2.5, 4.0)
    assert "| triton_nocg_k4s3 | 5 / 5 | 100.0 | 200.0 | 2.000 (2.000-2.000) | 2.500 | 4.000 |" in (
        out / "ab_summary.md").read_text()
