"""The harness results the GPU tests check: from $GPU_RESULTS, or from running the harness."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


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
    ``benchmark/gpu/<script> <sets>`` (minutes) and reads what it wrote.
    """

    def load(script: str, *sets: str) -> tuple[HarnessResults, list[str]]:
        paths = [p for p in os.environ.get("GPU_RESULTS", "").split(":") if p]
        if not paths:
            out = tmp_path_factory.mktemp("gpu_out")
            subprocess.run(["bash", str(REPO / "benchmark/gpu" / script), *sets],
                           cwd=REPO, env=dict(os.environ, OUT=str(out)), check=False, timeout=3600)
            paths = [str(out / "results.json")]
        merged = HarnessResults()
        for path in paths:
            if os.path.exists(path):
                merged.update((r["config"], r) for r in json.loads(Path(path).read_text()))
        return merged, paths

    return load
