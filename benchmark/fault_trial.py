"""Signal `apply` at random moments on the 0.5.12 tree; say what each trial left.

Each trial runs ``sglang_draft_layout.cli`` ``apply`` on a fresh copy of the 0.5.12 files the
patch reads, in a child whose test hook (``transaction.fault_hook``) prints the first point of
the write phase and sleeps 20 ms at each (9 files: about 0.4 s of writing). Half the trials send
the signal while planning (a random 0 to 0.4 s after the child, its imports done, calls
``cli.main``), half while writing (a random 0 to 0.4 s after the first point). Each records the exit code, the lines on stderr,
whether the tree is the original, the clean patched result or neither (mixed), and the tool's
temp files left. A SIGKILL trial then runs ``apply`` again and records the same for that run.

    PYTHONPATH=python python benchmark/fault_trial.py --trials 8 > benchmark/results/fault_trial.txt

Columns: signal | sent while | exit code | tree | temp files left | stderr lines | stderr | apply's report.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from sglang_draft_layout import engine
from sglang_draft_layout.releases import unpack_release
from sglang_draft_layout.target import resolve

PARTS = ("sglang/_version.py", "sglang/srt/speculative", "sglang/srt/layers/attention")
CHILD = (
    "import sys, time\n"
    "from sglang_draft_layout import cli, transaction\n"
    "def hook(point, path):\n"
    "    print(point, flush=True)\n"
    "    time.sleep(0.02)\n"
    "transaction.fault_hook = hook\n"
    "print('started', flush=True)\n"
    "sys.exit(cli.main(['apply', sys.argv[1]]))\n"
)


def digest(root: Path) -> str:
    sha = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        sha.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return sha.hexdigest()


def copy(source: Path, dest: Path) -> Path:
    for part in PARTS:
        (dest / part).parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if (source / part).is_dir() else shutil.copy2)(source / part, dest / part)
    return dest


def outcome(root: Path, original: str, patched: str) -> str:
    found = digest(root)
    return "original" if found == original else "patched" if found == patched else "MIXED"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8, help="trials per signal")
    parser.add_argument("--seed", type=int, default=17)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as scratch:
        full = Path(scratch) / "full"
        unpack_release("0.5.12", full)
        pristine = copy(full, Path(scratch) / "pristine")
        clean = copy(pristine, Path(scratch) / "clean")
        engine.apply(resolve(str(clean)))
        original, patched = digest(pristine), digest(clean)
        tally: Counter = Counter()
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL):
            for trial in range(args.trials):
                root = copy(pristine, Path(scratch) / f"{signum.name}-{trial}")
                child = subprocess.Popen(
                    [sys.executable, "-c", CHILD, str(root)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                )
                phase = "writing" if trial % 2 else "planning"
                child.stdout.readline()  # started: the tool is imported, cli.main begins
                if phase == "writing":
                    child.stdout.readline()
                time.sleep(rng.uniform(0, 0.4))
                child.send_signal(signum)
                out, err = child.communicate(timeout=120)
                row = (
                    signum.name,
                    phase,
                    child.returncode,
                    outcome(root, original, patched),
                    len(list(root.rglob("*.sglang-draft-layout-*.tmp"))),
                    len(err.splitlines()),
                    err.strip().split(": ", 1)[-1] if err.strip() else "",
                    "report printed" if "wrote 9 file(s)" in out else "",
                )
                if signum is signal.SIGKILL:
                    again = subprocess.run(
                        [sys.executable, "-m", "sglang_draft_layout", "apply", str(root)],
                        capture_output=True,
                        text=True,
                    )
                    row += (
                        f"re-run apply: exit {again.returncode}, {outcome(root, original, patched)}, "
                        f"{len(list(root.rglob('*.sglang-draft-layout-*.tmp')))} temp files",
                    )
                print(" | ".join(str(cell) for cell in row), flush=True)
                tally[row[0], row[1], row[3], row[4]] += 1
                shutil.rmtree(root)
        print("\nsignal, sent while, tree, temp files left: trials")
        for key, count in sorted(tally.items()):
            print(f"{', '.join(map(str, key))}: {count}")


if __name__ == "__main__":
    main()
