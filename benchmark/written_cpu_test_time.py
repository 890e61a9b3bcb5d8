"""How long the CPU test `apply` writes into a fork takes, as the fork's CI runs it: what its
``register_cpu_ci(est_time=...)`` states (fork_templates/registered_cpu.py).

A fork laid out from the 0.5.12 wheel (test/fork_ci/scratch_fork.py), patched by ``apply``; then
``python3 test/registered/unit/speculative/test_draft_layout.py`` (through test/fork_ci/run_on_cpu.py,
which stands in 0.5.12's CUDA-only torchvision) in the proof venv (0.5.12's dependencies, CPU torch; built
and cached by test/support/sglang_venv.py), a fresh interpreter each run, wall time. Two kinds of run,
interleaved: ``cold``, the fork's own ``__pycache__`` folders removed first (a fresh CI checkout), and
``warm``, the bytecode of the run before kept. The machine is shared: the load average is printed with
each run.

    python benchmark/written_cpu_test_time.py --reps 5
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TEST = Path(__file__).resolve().parents[1] / "test"
sys.path[:0] = [str(TEST), str(TEST / "fork_ci")]

from scratch_fork import CPU_TEST, make_fork  # noqa: E402
from support.sglang_venv import proof_venv  # noqa: E402

from sglang_draft_layout import api  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="written-cpu-test-")) / "fork"
    make_fork(root)
    assert api.apply(root).exit_code == 0
    python = proof_venv("0.5.12")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = str(root / "python")
    times: dict[str, list[float]] = {"cold": [], "warm": []}
    print(f"{os.cpu_count()} cores; {python}")
    for rep in range(args.reps):
        for kind in times:
            if kind == "cold":
                for cache in list((root / "python").rglob("__pycache__")):
                    shutil.rmtree(cache)
            start = time.perf_counter()
            run = subprocess.run(
                [str(python), str(TEST / "fork_ci" / "run_on_cpu.py"), str(root / CPU_TEST)],
                cwd=root,
                env=env,
                capture_output=True,
                text=True,
            )
            times[kind].append(time.perf_counter() - start)
            ran = [line for line in run.stderr.splitlines() if line.startswith("Ran ")]
            print(f"{kind} {rep}: exit {run.returncode}, {times[kind][-1]:.1f} s ({ran[-1] if ran else run.stderr[-300:]}), "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
            assert run.returncode == 0
    for kind, each in times.items():
        print(f"{kind}: min {min(each):.1f} s, median {statistics.median(each):.1f} s, max {max(each):.1f} s")
    shutil.rmtree(root.parent)


if __name__ == "__main__":
    main()
