"""benchmark/gpu/report_ab.py on CPU, without plots (matplotlib is a benchmark extra): the run
times the drift plot places runs at, and the report's tables from an ab_results.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmark" / "gpu"))
import report_ab  # noqa: E402


def run(tree: str, tag: str, tps: float, wall: float, **extra) -> dict:
    return {
        "tree": tree,
        "tag": tag,
        "concurrency": 32,
        "prompts": 64,
        "status": 0,
        "wall_s": wall,
        "completed": 64,
        "duration": wall - 2,
        "output_throughput": tps,
        **extra,
    }


def test_run_times_use_t_start_and_else_add_up_the_walls():
    timed = {
        "runs": [
            run("unpatched", "warmup", 1.0, 10.0, t_start=100.0),
            run("patched", "warmup", 1.0, 12.0, t_start=100.5),
        ]
    }
    assert report_ab.run_times(timed) == [0.0, 0.5]  # measured together: the recorded starts
    untimed = {
        "runs": [
            run("unpatched", "warmup", 1.0, 10.0),
            run("patched", "warmup", 1.0, 12.0),
            run("unpatched", "pair0", 1.0, 21.5),
        ]
    }
    assert report_ab.run_times(untimed) == [0.0, 10.0, 22.0]


def test_report_tables_from_a_results_file(tmp_path):
    rounds = []
    for k, ratio in enumerate([1.01, 0.99, 1.0, 1.02, 0.98, 1.0]):
        for tree, tps in (("unpatched", 3000.0), ("patched", 3000.0 * ratio)):
            rounds.append(dict(run(tree, f"pair{k}", tps, 22.0), pair=k, accept_length=4.0))
    record = {
        "config": "triton_nocg_k4s3",
        "notes": [],
        "runs": rounds,
        "rounds": rounds,
        "memory": {},
        "exactness": {
            "patched": {
                "all_match_rule": True,
                "accept_min": 4.0,
                "accept_mean": 4.0,
                "accept_max": 4.0,
                "accept_all_exact": True,
            }
        },
    }
    path = tmp_path / "ab_results.json"
    not_started = {"config": "flashinfer_cg_k1s3", "notes": ["not started: deadline"], "rounds": []}
    path.write_text(json.dumps({"settings": {"concurrencies": [32]}, "records": [record, not_started]}))
    assert report_ab.main([str(path), "--out", str(tmp_path / "report"), "--no-plots"]) == 0
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert "| triton_nocg_k4s3 | sequential | 32 | 6 | 20.0 | 3000 | 3000 | 1.000 [" in summary
    assert "| triton_nocg_k4s3 | patched | True | 4.0 / 4.0 / 4.0 | True |" in summary
    (s, skipped) = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert s["pairs"] == 6 and s["verdict"] == "within ±2%"
    assert "| flashinfer_cg_k1s3 | sequential | 32 | 0 | - | - | - | - | not run (not started: deadline) |" in summary
