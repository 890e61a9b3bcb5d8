"""benchmark/gpu/memory_cost.py on CPU: its reading of SGLang 0.5.12's server log (real lines from
the H200 and the wheel's format strings), the formula beside each figure, and a whole run with
stand-in servers: one server at a time, unpatched then patched, with SGLang's own pool sizing
(no --max-total-tokens, no --max-running-requests but where 256 is asked), context 32768."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from support.sglang_release import require_release
from support.wheel_source import wheel_source

GPU_BENCH = Path(__file__).resolve().parents[2] / "benchmark" / "gpu"
sys.path.insert(0, str(GPU_BENCH))
import memory_cost  # noqa: E402

#: SGLang 0.5.12's lines as the H200 logged them (results/h200-2026-12-01-ab4/logs.tgz,
#: server_flashinfer_cg_k1s3_patched.log; two servers were starting at once there, so its "mem
#: usage" figures are not the patch's), with lines between that name none of the figures
REAL_LOG = """\
[2026-12-01 22:02:44] Load weight end. elapsed=2.51 s, type=LlamaForCausalLM, avail mem=96.70 GB, mem usage=28.26 GB.
[2026-12-01 22:02:44] max_total_tokens=120000 is larger than the profiled value 111171. Use the profiled value instead.
[2026-12-01 22:02:45] KV Cache is allocated. #tokens: 111171, K size: 6.79 GB, V size: 6.79 GB
[2026-12-01 22:02:45] Memory pool end. avail mem=83.06 GB
[2026-12-01 22:02:45] Capture cuda graph begin. This can take up to several minutes. avail mem=82.06 GB
[2026-12-01 22:02:45] Capture cuda graph bs [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32]
[2026-12-01 22:03:14] Capture cuda graph end. Time elapsed: 28.82 s. mem usage=1.72 GB. avail mem=80.34 GB.
[2026-12-01 22:03:14] Disable piecewise CUDA graph because --disable-piecewise-cuda-graph is set
[2026-12-01 22:03:15] KV Cache is allocated. #tokens: 111171, K size: 0.21 GB, V size: 0.21 GB
[2026-12-01 22:03:16] Capture draft cuda graph begin. This can take up to several minutes. avail mem=79.28 GB
[2026-12-01 22:03:20] Capture draft cuda graph end. Time elapsed: 4.03 s. mem usage=0.79 GB. avail mem=78.49 GB.
[2026-12-01 22:03:20] max_total_num_tokens=111171, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=32, context_len=2048, available_gpu_mem=78.49 GB
"""

#: the MLA pool's line and a draft capture that never ended, written from 0.5.12's f-strings
#: (srt/mem_cache/memory_pool.py: `KV Cache is allocated. #tokens: {num_tokens}, KV size: {kv_size_GB:.2f} GB`;
#: srt/speculative/eagle_worker_v2.py: `Capture draft cuda graph begin. ... avail mem={before_mem:.2f} GB`)
MLA_FAILED_LOG = """\
[2026-12-02 10:00:00] KV Cache is allocated. #tokens: 2412345, KV size: 2.45 GB
[2026-12-02 10:00:05] Capture cuda graph end. Time elapsed: 9.10 s. mem usage=0.51 GB. avail mem=20.10 GB.
[2026-12-02 10:00:05] KV Cache is allocated. #tokens: 2412345, KV size: 0.20 GB
[2026-12-02 10:00:06] Capture draft cuda graph begin. This can take up to several minutes. avail mem=19.80 GB
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.25 GiB.
"""


def test_the_log_figures_of_a_0_5_12_server():
    log = memory_cost.parse_server_log(REAL_LOG)
    assert log["kv_cache"] == [
        {"tokens": 111171, "gb": pytest.approx(13.58), "k_gb": 6.79, "v_gb": 6.79},
        {"tokens": 111171, "gb": pytest.approx(0.42), "k_gb": 0.21, "v_gb": 0.21},
    ]
    assert (
        log["max_total_num_tokens"],
        log["max_running_requests"],
        log["context_len"],
        log["available_gpu_mem_gb"],
    ) == (111171, 32, 2048, 78.49)
    assert log["target_graph_bs"][-1] == 32 and len(log["target_graph_bs"]) == 20
    assert log["target_graph"] == {"seconds": 28.82, "mem_usage_gb": 1.72, "avail_after_gb": 80.34}
    assert log["draft_graph"] == {"seconds": 4.03, "mem_usage_gb": 0.79, "avail_after_gb": 78.49}
    assert "draft_extend_graph" not in log and log["captures_not_ended"] == []


def test_a_capture_that_never_ended_and_the_single_kv_pool_line():
    log = memory_cost.parse_server_log(MLA_FAILED_LOG)
    assert log["kv_cache"] == [{"tokens": 2412345, "gb": 2.45}, {"tokens": 2412345, "gb": 0.20}]
    assert log["captures_not_ended"] == ["draft_graph"] and "draft_graph" not in log
    assert "max_total_num_tokens" not in log  # the scheduler never got there


@pytest.mark.releases
def test_the_lines_read_are_0_5_12s():
    """Each figure's f-string is in the 0.5.12 wheel, and so are the two rules the 256 case works
    around: EAGLE resets --max-running-requests to 48, and no graph is captured above the request pool."""
    require_release("0.5.12")
    src = {
        name: wheel_source("0.5.12", f"sglang/srt/{name}")
        for name in (
            "mem_cache/memory_pool.py",
            "managers/scheduler.py",
            "speculative/eagle_worker_v2.py",
            "model_executor/model_runner.py",
            "model_executor/cuda_graph_runner.py",
            "server_args.py",
        )
    }
    expected = {
        "mem_cache/memory_pool.py": [
            'f"KV Cache is allocated. #tokens: {num_tokens}, K size: {k_size_GB:.2f} GB, V size: {v_size_GB:.2f} GB"',
            'f"KV Cache is allocated. #tokens: {num_tokens}, KV size: {kv_size_GB:.2f} GB"',
        ],
        "managers/scheduler.py": [
            'f"max_total_num_tokens={self.max_total_num_tokens}, "',
            'f"max_running_requests={self.max_running_requests}, "',
            'f"context_len={self.model_config.context_len}, "',
        ],
        "speculative/eagle_worker_v2.py": [
            'f"Capture draft cuda graph end. Time elapsed: {time.perf_counter() - tic:.2f} s. mem usage='
            '{(before_mem - after_mem):.2f} GB. avail mem={after_mem:.2f} GB."'
        ],
        "model_executor/model_runner.py": [
            'f"Capture {graph_backend[self.device]} end. Time elapsed: {time.perf_counter() - tic:.2f} s. "',
            'f"mem usage={self.graph_mem_usage:.2f} GB. avail mem={after_mem:.2f} GB."',
        ],
        "model_executor/cuda_graph_runner.py": [
            'f"Capture cuda graph bs {self.capture_bs}"',
            "capture_bs = [bs for bs in capture_bs if bs <= num_max_requests]",
        ],
        "server_args.py": ["Max running requests is reset to 48 for speculative decoding."],
    }
    for name, pieces in expected.items():
        assert [p for p in pieces if p not in src[name]] == [], name
    assert "available_gpu_mem" in src["managers/scheduler.py"]


def test_the_formula_beside_each_figure():
    # the measurement of issue 29: FlashInfer topk 8 / 5 steps, 48 running requests, context 32768
    f = memory_cost.formulas("flashinfer", {"args": [48, 384]}, topk=8, steps=5)
    assert f["unpatched_bytes"] == 48 * 32768 * 5 * 4 and f["patched_bytes"] == 48 * 8 * 32768 * 5 * 4
    assert (f["patched_bytes"] - f["unpatched_bytes"]) / 2**30 == pytest.approx(0.205, abs=1e-3)  # 1.20 -> 1.40 GB
    mla = memory_cost.formulas("fimla", {"args": [256, 256]}, topk=1, steps=3)
    assert mla["unpatched_bytes"] == mla["patched_bytes"] == 256 * 32768 * 3 * 4
    assert memory_cost.formulas("flashinfer", None, topk=8, steps=5) is None


FAKE_SERVER = '''\
"""Stands in for sglang.launch_server: logs memory lines in 0.5.12's format, the draft capture's
mem usage the rows' formula (this tree's: the patched tree's file lives under a folder named
patched), answers /health; appends "start PORT ARGV" and "stop PORT" to events.log beside it."""
import http.server
import json
import os
import signal
import sys

here = os.path.dirname(os.path.abspath(__file__))
argv = sys.argv[1:]
opt = lambda flag, default=None: argv[argv.index(flag) + 1] if flag in argv else default
port = int(opt("--port"))
events = os.path.join(os.environ["FAKE_EVENTS"], "events.log")
with open(events, "a") as f:
    f.write(json.dumps({"start": port, "argv": argv,
                        "ctx_env": os.environ.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN")}) + "\\n")
topk, steps, ctx = int(opt("--speculative-eagle-topk")), int(opt("--speculative-num-steps")), int(opt("--context-length"))
running = int(opt("--max-running-requests", 48))
max_bs = min(int(opt("--cuda-graph-max-bs", 256)), running)
patched = "patched" in here
rows = steps * max_bs * (topk if patched else 1) * ctx * 4
print(f"[2026-12-02 10:00:00] KV Cache is allocated. #tokens: 858017, K size: 52.37 GB, V size: 52.37 GB")
print(f"[2026-12-02 10:00:09] Capture draft cuda graph end. Time elapsed: 3.00 s. mem usage={rows / 2**30 + 1:.2f} GB. "
      f"avail mem={20 - rows / 2**30:.2f} GB.")
print(f"[2026-12-02 10:00:10] max_total_num_tokens=858017, chunked_prefill_size=8192, max_prefill_tokens=16384, "
      f"max_running_requests={running}, context_len={ctx}, available_gpu_mem={20 - rows / 2**30:.2f} GB", flush=True)
with open(os.environ["SGL_DL_MEMPROBE"], "a") as f:
    f.write(json.dumps({"args": [max_bs, max_bs * topk], "topk": topk, "steps": steps, "max_context_len": ctx,
                        "rows_bytes": rows, "allocated_diff": rows}) + "\\n")


def stop(*_):
    with open(events, "a") as f:
        f.write(json.dumps({"stop": port}) + "\\n")
    os._exit(0)


signal.signal(signal.SIGTERM, stop)


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
'''


def test_one_server_at_a_time_with_sglangs_own_sizing_and_the_formula_beside(tmp_path, monkeypatch):
    for tree in ("site", "patched"):
        (tmp_path / tree / "sglang").mkdir(parents=True)
        (tmp_path / tree / "sglang" / "__init__.py").write_text("")
        (tmp_path / tree / "sglang" / "launch_server.py").write_text(FAKE_SERVER)
    for models in ("models8b", "ds_models"):
        (tmp_path / models).mkdir()
        (tmp_path / models / "prompts.json").write_text("{}")
    monkeypatch.setenv("FAKE_EVENTS", str(tmp_path))
    monkeypatch.delenv("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", raising=False)
    base = 31000 + (hash(str(tmp_path)) % 400) * 20
    assert (
        memory_cost.main(
            [
                "--models",
                str(tmp_path / "models8b"),
                "--site",
                str(tmp_path / "site"),
                "--patched",
                str(tmp_path / "patched"),
                "--out",
                str(tmp_path / "out"),
                "--base-port",
                str(base),
                "--startup-timeout",
                "60",
                "--configs",
                "0",
                "1",
                "4",
            ]
        )
        == 0
    )
    events = [json.loads(line) for line in (tmp_path / "events.log").read_text().splitlines()]
    starts = [e for e in events if "start" in e]
    # one server at a time: every start is followed by its own stop before the next start
    assert [("stop" in e) for e in events] == [False, True] * 6
    assert [e["stop"] for e in events if "stop" in e] == [e["start"] for e in starts]
    for e in starts:
        argv = e["argv"]
        assert "--max-total-tokens" not in argv and argv[argv.index("--mem-fraction-static") + 1] == "0.85"
        assert argv[argv.index("--context-length") + 1] == "32768" and e["ctx_env"] == "1"
        assert "--disable-cuda-graph" not in argv and "--disable-piecewise-cuda-graph" in argv
    bs256 = [e["argv"] for e in starts if "--cuda-graph-max-bs" in e["argv"]]
    assert len(bs256) == 2 and all(a[a.index("--max-running-requests") + 1] == "256" for a in bs256)
    assert all("--max-running-requests" not in e["argv"] for e in starts if e["argv"] not in bs256)
    assert [e["argv"][e["argv"].index("--model-path") + 1].split("/")[-2] for e in starts] == ["models8b"] * 4 + [
        "ds_models"
    ] * 2

    result = json.loads((tmp_path / "out" / "memory_cost.json").read_text())
    assert [(s["config"], s["tree"]) for s in result["servers"]] == [
        (c, t) for c in ("flashinfer_cgdef_k8s5",) * 2 + ("fimla_cgdef_k1s3",) for t in ("unpatched", "patched")
    ]
    default, big, mla = result["comparison"]
    assert default["max_running_requests"] == [48, 48] and default["kv_pool_tokens"] == [858017, 858017]
    assert default["formula_bytes"] == [5 * 48 * 32768 * 4, 5 * 48 * 8 * 32768 * 4]
    assert default["rows_bytes"] == default["formula_bytes"]
    assert default["formula_diff_gb"] == pytest.approx(0.205, abs=1e-3)
    assert default["draft_graph_mem_diff_gb"] == pytest.approx(0.21, abs=0.011)
    assert big["max_running_requests"] == [256, 256] and big["formula_bytes"][1] == 5 * 256 * 8 * 32768 * 4
    assert big["rows_bytes"] == big["formula_bytes"]  # each server's own probe
    assert mla["formula_bytes"][0] == mla["formula_bytes"][1] and mla["draft_graph_mem_diff_gb"] == 0
    assert all(s["healthy"] for s in result["servers"])
    logs = sorted(os.listdir(tmp_path / "out" / "logs"))
    assert (
        "server_flashinfer_cgdef_k8s5_patched_bs256.log" in logs
        and "server_fimla_cgdef_k1s3_unpatched_bsdefault.log" in logs
    )
    assert "memprobe_flashinfer_cgdef_k8s5_patched_bs256.jsonl" in logs
    assert "| flashinfer_cgdef_k8s5 |" in (tmp_path / "out" / "memory_cost.md").read_text()
