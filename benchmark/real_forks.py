"""check, apply and check again on real public fork commits: the yardstick of issue 39.

No fork's code is kept in this repository. The corpus is a manifest of public commits (``repo``,
``commit``, ``prefix``: the folder holding ``sglang/``) and git mirrors of those repositories
(``MIRRORS/owner+name/repo``, bare); each commit's ``PREFIX/sglang`` is exported with ``git archive``
into a scratch folder and the tool is run on it as a fresh process, as a user runs it:

    python benchmark/real_forks.py MANIFEST.json MIRRORS [--only 0,5,18] [--json out.json]

Printed per commit: check's exit code, apply's, the check after apply, and the first error line.
The tool is never expected to exit 2 on a real fork (issue 39: a refusal of a real fork whose code is
right or has the bug is a bug); an exit 2 is shown with its line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOOL = [sys.executable, "-m", "sglang_draft_layout"]


def export(entry: dict, mirrors: Path, dest: Path) -> Path:
    gitdir = mirrors / entry["repo"].replace("/", "+") / "repo"
    archive = subprocess.run(
        ["git", f"--git-dir={gitdir}", "archive", entry["commit"], f"{entry['prefix']}/sglang"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest / entry["prefix"]


def run(command: str, tree: Path) -> tuple[int, str, float]:
    start = time.perf_counter()
    done = subprocess.run([*TOOL, command, "--no-tests", str(tree)] if command == "apply" else [*TOOL, command, str(tree)],
                          capture_output=True, text=True, env={"COLUMNS": "100000", "PATH": "/usr/bin:/bin"})  # fmt: skip
    errors = [line for line in (done.stderr + done.stdout).splitlines() if line.startswith("error:")]
    summary = [line for line in done.stdout.splitlines() if " call sites" in line]
    return done.returncode, (errors[0] if errors else summary[-1] if summary else ""), time.perf_counter() - start


def corpus_parser(description: str) -> argparse.ArgumentParser:
    """The arguments naming the corpus: the manifest, the mirrors, the commits chosen (``chosen``), a JSON file."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("manifest", type=Path)
    parser.add_argument("mirrors", type=Path)
    parser.add_argument("--only", default="", help="the manifest's indices, comma-separated (default: all)")
    parser.add_argument("--json", type=Path)
    return parser


def chosen(args: argparse.Namespace) -> list[tuple[int, dict]]:
    entries = json.loads(args.manifest.read_text())
    return [(i, entries[i]) for i in ([int(i) for i in args.only.split(",")] if args.only else range(len(entries)))]


def main() -> int:
    args = corpus_parser(__doc__.split("\n\n")[0]).parse_args()
    results = []
    for index, entry in chosen(args):
        with tempfile.TemporaryDirectory() as scratch:
            tree = export(entry, args.mirrors, Path(scratch))
            check = run("check", tree)
            apply = run("apply", tree)
            after = run("check", tree)
        results.append({"index": index, "repo": entry["repo"], "commit": entry["commit"][:10], "era": entry["era"],
                        "check": check[0], "apply": apply[0], "after": after[0], "line": (apply[1] if apply[0] == 2 else after[1])})  # fmt: skip
        print(f"{index:3d} {entry['repo'][:28]:28s} {entry['commit'][:10]} check {check[0]} apply {apply[0]} "
              f"after {after[0]} ({check[2]:.1f}s)  {results[-1]['line'][:300]}", flush=True)  # fmt: skip
    refused = [r for r in results if 2 in (r["check"], r["apply"], r["after"])]
    print(f"{len(results)} commits: {len(refused)} refused (exit 2)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
