"""The CPU test ``apply`` writes, run as each real fork's CI would run it, patched and with a fix put back.

For each commit of the manifest (as ``real_forks.py`` reads it) whose package registers tests
(``sglang/test/ci/ci_register.py``: what ``apply`` writes the test for), the commit is exported into a
scratch fork checkout (``python/sglang``, ``test/registered/``, its ``test/run_suite.py``), patched with
``apply --tests``, and the written test is run with ``python3 FILE`` in a venv holding SGLang's dependencies
(the proof venv the suite builds, ``test/support/sglang_venv.py``), through ``test/fork_ci/run_on_cpu.py``.
Then each fix the patch wrote is put back one at a time where its text is in the patched tree
(``REGRESSIONS``), and the test run again: it must fail.

    python benchmark/real_forks_written_test.py MANIFEST.json MIRRORS PYTHON [--only 0,5,18]

Printed per commit: apply's exit, the test's exit on the patched tree (``import`` where it stopped importing SGLang:
the venv lacks a package the fork imports), and, where it passed, per regression the test's exit (``-`` where the
patched tree has no such text). Nothing of a fork is kept in this repository.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

from real_forks import chosen, corpus_parser, export
from sglang_draft_layout.fork_tests import FORK_TESTS

HERE = Path(__file__).resolve().parent
RUNNER = HERE.parent / "test" / "fork_ci" / "run_on_cpu.py"
CPU_TEST = FORK_TESTS[0][0]  # the registered CPU test
#: name -> (file under sglang/srt, the patched text, the regression put in its place)
REGRESSIONS = {
    "narrow graph row": (
        "layers/attention/flashinfer_backend.py",
        r"draft_kv_indices_buffer_width\(\s*max_bs, self\.topk, self\.max_context_len\s*\)",
        "draft_kv_indices_buffer_width(max_bs, 1, self.max_context_len)",
    ),
    "slice end i + 2": (
        "layers/attention/flashinfer_backend.py",
        r"draft_kv_indices_used_len\(seq_lens_sum, self\.topk, bs, i \+ 1\)",
        "draft_kv_indices_used_len(seq_lens_sum, self.topk, bs, i + 2)",
    ),
    "DSv4 row 0 each step": (
        "layers/attention/deepseek_v4_backend.py",
        r"\)\[self\.speculative_step_id\]",
        ")[0]",
    ),
    "V2 worker row 0 each step": (
        "speculative/eagle_worker_v2.py",
        r"forward_batch\.out_cache_loc = out_cache_loc\[i\]",
        "forward_batch.out_cache_loc = out_cache_loc[0]",
    ),
    "V2 worker step 0's backend": (
        "speculative/eagle_worker_v2.py",
        r"attn_backend( ?= ?)self\.draft_attn_backend\.attn_backends\[i\]",
        r"attn_backend\1self.draft_attn_backend.attn_backends[0]",
    ),
    "capacity check skipped for graph rows": (
        "layers/attention/flashinfer_backend.py",
        r"\n( *)assert required_kv_indices_len <= kv_indices_buffer\.shape\[1\], \(",
        r'\n\1if kv_indices_buffer is not getattr(self, "cuda_graph_kv_indices", None):\n'
        r"\1    assert required_kv_indices_len <= kv_indices_buffer.shape[1], (",
    ),
    "runner sizes for its smallest batch": (
        "speculative/eagle_draft_cuda_graph_runner.py",
        r"self\.max_bs = max\(self\.capture_bs\)",
        "self.max_bs = self.capture_bs[0]",
    ),
    "host kv_indptr row 0": (
        "layers/attention/flashinfer_backend.py",
        r"global_override_indptr_cpu = indptr_cpu_whole\[i\]",
        "global_override_indptr_cpu = indptr_cpu_whole[0]",
    ),
    "per-step backends on kv_indptr row 0": (
        "layers/attention/flashinfer_backend.py",
        r"(?<!paged_)kv_indptr_buf=self\.kv_indptr\[i\],",
        "kv_indptr_buf=self.kv_indptr[0],",
    ),
    "kv_indptr row 0 each step": (
        "layers/attention/flashinfer_backend.py",
        r"forward_batch\.spec_info\.kv_indptr = self\.kv_indptr\[i, : bs \+ 1\]",
        "forward_batch.spec_info.kv_indptr = self.kv_indptr[0, : bs + 1]",
    ),
}


def tool(*args: str) -> subprocess.CompletedProcess:
    env = {"COLUMNS": "100000", "PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root")}
    return subprocess.run([sys.executable, "-m", "sglang_draft_layout", *args], capture_output=True, text=True, env=env)


def written_test(python: str, root: Path) -> tuple[int | str, str]:
    """The test's exit (``import`` where it stopped importing SGLang: the venv lacks what the fork imports) and the
    line that says why: the harness's first problem (path, probe, what differs), else the last line it printed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = str(root / "python")
    done = subprocess.run([python, str(RUNNER), str(root / CPU_TEST)], cwd=root, env=env, capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    problems = [line for line in lines if line.startswith("sglang/")]
    said = problems[0] if problems else lines[-1] if lines else ""
    return (done.returncode if any(line.startswith("Ran ") for line in lines) else "import"), said


def fork_checkout(entry: dict, mirrors: Path, scratch: Path) -> Optional[Path]:
    """The commit as a fork checkout (``python/sglang``, ``test/registered/``, its own ``test/run_suite.py``, a git
    repository); None where its package registers no tests (``apply`` writes none)."""
    root = scratch / "fork"
    (root / "python").mkdir(parents=True)
    (scratch / "export").mkdir()
    (export(entry, mirrors, scratch / "export") / "sglang").rename(root / "python" / "sglang")
    if not (root / "python/sglang/test/ci/ci_register.py").is_file():
        return None
    (root / "test" / "registered").mkdir(parents=True)
    gitdir = mirrors / entry["repo"].replace("/", "+") / "repo"
    suites = subprocess.run(["git", f"--git-dir={gitdir}", "show", f"{entry['commit']}:test/run_suite.py"],
                            capture_output=True, text=True)  # fmt: skip
    if suites.returncode == 0:  # the test registers to one of the fork's own suites
        (root / "test" / "run_suite.py").write_text(suites.stdout)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return root


def patched_and_regressed(root: Path, python: str) -> dict:
    """``apply --tests``'s exit; the written test on the patched tree; where it passed, on each regression."""
    result = {"apply": tool("apply", "--tests", str(root)).returncode}
    if result["apply"] != 0 or not (root / CPU_TEST).is_file():
        return result
    result["patched"] = written_test(python, root)
    if result["patched"][0] != 0:
        return result
    for name, (relative, patched, regressed) in REGRESSIONS.items():
        path = root / "python" / "sglang" / "srt" / relative
        text = path.read_text() if path.is_file() else ""
        if re.search(patched, text):
            path.write_text(re.sub(patched, regressed, text))
            result[name] = written_test(python, root)
            path.write_text(text)
    return result


def main() -> int:
    parser = corpus_parser(__doc__.split("\n\n")[0])
    parser.add_argument("python", help="a Python with SGLang's dependencies (not SGLang itself)")
    args = parser.parse_args()
    results = []
    for index, entry in chosen(args):
        with tempfile.TemporaryDirectory() as scratch:
            root = fork_checkout(entry, args.mirrors, Path(scratch))
            if root is None:
                continue
            result = {"index": index, "repo": entry["repo"], "commit": entry["commit"][:10]}
            result |= patched_and_regressed(root, args.python)
        results.append(result)
        cells = [f"{name} {result[name][0]}" if name in result else f"{name} -" for name in ("patched", *REGRESSIONS)]
        head = f"{index:3d} {entry['repo'][:28]:28s} {entry['commit'][:10]} apply {result['apply']}"
        print(f"{head}  {', '.join(cells)}", flush=True)
        for name in ("patched", *REGRESSIONS):  # a patched tree failing, a regression passing: the line it printed
            if name in result and (result[name][0] == 0) == (name != "patched"):
                print(f"      {name}: {result[name][1][:300]}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
