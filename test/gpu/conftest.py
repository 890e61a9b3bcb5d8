"""What the GPU tests share: benchmark/gpu/ on sys.path (serve_checks), the skip without CUDA,
and the harness results they check (from $GPU_RESULTS, or from running the harness)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.strict_skips import skip_without_cuda

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmark" / "gpu"))


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    """Tests marked gpu are skipped without torch or a CUDA GPU (CI has neither); strict skips
    (support/strict_skips.py) allow this skip only."""
    if _cuda_available():
        return
    for item in items:
        if item.get_closest_marker("gpu"):
            skip_without_cuda(item)


class HarnessResults(dict):
    """{config name: that server's result}, merged over every results.json read."""

    def ran(self, name: str) -> dict:
        """The result of config ``name``; the test is skipped if this run did not include it."""
        if name not in self:
            pytest.skip(f"{name} was not part of this harness run")
        return self[name]


@pytest.fixture(scope="session")
def harness_results(tmp_path_factory):
    """harness_results(script, *sets) -> (HarnessResults, paths read).

    Reads the files named in GPU_RESULTS (colon-separated); without it, runs
    ``benchmark/gpu/<script> <sets>`` (minutes) and reads every results.json it wrote.
    ``harness_results.each(script, *sets)`` gives [(path, HarnessResults)], one per file, for
    runs whose files repeat config names (one file per model, as the dsv4 sets write).
    """

    def each(script: str, *sets: str) -> list[tuple[str, HarnessResults]]:
        paths = [p for p in os.environ.get("GPU_RESULTS", "").split(":") if p]
        if not paths:
            out = tmp_path_factory.mktemp("gpu_out")
            subprocess.run(
                ["bash", str(REPO / "benchmark/gpu" / script), *sets],
                cwd=REPO,
                env=dict(os.environ, OUT=str(out)),
                check=False,
                timeout=3600,
            )
            paths = sorted(str(p) for p in out.rglob("results.json"))
        runs = []
        for path in paths:
            if os.path.exists(path):
                runs.append((path, HarnessResults((r["config"], r) for r in json.loads(Path(path).read_text()))))
        return runs

    def load(script: str, *sets: str) -> tuple[HarnessResults, list[str]]:
        runs = each(script, *sets)
        merged = HarnessResults()
        for _, results in runs:
            merged.update(results)
        return merged, [path for path, _ in runs]

    load.each = each
    return load
