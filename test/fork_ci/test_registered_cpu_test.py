"""The registered CPU test `apply` writes into a fork checkout (fork_tests, registered_cpu).

Written, reported by `check`, idempotent, skipped with --no-tests (then, nothing left to patch, written
only with --tests); collected by 0.5.12's own
ci_register into stage-a-test-cpu (the suite its run_suite.py gives); and, run as the fork's CI runs it (`python3 FILE`, in the
proof venv), it passes on the patched fork and fails on the unpatched one (no helpers), on a
patched fork with one site reverted and on one splitting the per-step out_cache_loc twice, its
split-once failure `check`'s own verdict (proof.split_once) word for word. Black/isort:
test_registered_gpu_test.py (every template).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from sglang_draft_layout import cli
from sglang_draft_layout.fork_tests import render
from sglang_draft_layout.proof.split_once import split_verdict
from sglang_draft_layout.proof.world import world_of

from scratch_fork import CPU_TEST, ci_register, make_fork
from support import fork_edits

pytestmark = pytest.mark.releases
#: the written test's test methods (the helpers' three, the call sites' two)
TESTS = 5
RUNNER = Path(__file__).with_name("run_on_cpu.py")
GRAPH_WIDTH = "draft_kv_indices_buffer_width(\n            max_bs, self.topk, self.max_context_len\n        )"
GRAPH_WIDTH_BLOCK = (
    f"kv_indices_width = {GRAPH_WIDTH}\n"
    "        self.cuda_graph_kv_indices = torch.zeros(\n"
    "            (self.speculative_num_steps, kv_indices_width),"
)


def run_generated(python: Path, *forks: Path) -> list[subprocess.CompletedProcess]:
    """The generated file of each fork under ``python3 FILE``, side by side (each imports SGLang)."""
    runs = []
    for fork in forks:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env["PYTHONPATH"] = str(fork / "python")
        runs.append(
            subprocess.Popen(
                [str(python), str(RUNNER), str(fork / CPU_TEST)],
                cwd=fork,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = []
    for run in runs:
        stdout, stderr = run.communicate(timeout=600)
        results.append(subprocess.CompletedProcess(run.args, run.returncode, stdout, stderr))
    return results


def cpu_test_state(capsys) -> str:
    """The CPU test's state in the JSON report just printed."""
    [state] = [s["state"] for s in json.loads(capsys.readouterr().out)["sites"] if s["file"] == CPU_TEST]
    return state


def test_apply_writes_it_once_and_check_reports_it(fork, capsys):
    assert cli.main(["check", "--format", "json", str(fork)]) == 1
    assert cpu_test_state(capsys) == "to write"
    assert cli.main(["apply", "--format", "json", str(fork)]) == 0
    assert cpu_test_state(capsys) == "written now"
    written = fork / CPU_TEST
    assert written.read_text() == render("registered_cpu")
    stamp = written.stat().st_mtime_ns
    assert cli.main(["apply", str(fork)]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert written.stat().st_mtime_ns == stamp
    assert cli.main(["check", "--format", "json", str(fork)]) == 0
    assert cpu_test_state(capsys) == "present"
    written.write_text(written.read_text().replace("est_time=15", "est_time=16"))
    assert cli.main(["check", "--format", "json", str(fork)]) == 1
    assert cpu_test_state(capsys) == "stale"
    assert cli.main(["apply", str(fork)]) == 0
    assert written.read_text() == render("registered_cpu")


def test_no_tests_leaves_it_out(fork, capsys):
    """Patched without it, the fork has nothing left to do; --tests writes it still."""
    assert cli.main(["apply", "--no-tests", str(fork)]) == 0
    assert not (fork / "test/registered/unit/speculative").exists()
    assert cli.main(["check", "--no-tests", str(fork)]) == 0
    assert cli.main(["check", str(fork)]) == 0
    assert cli.main(["diff", "--exit-code", str(fork)]) == 0
    capsys.readouterr()
    assert cli.main(["check", "--tests", "--format", "json", str(fork)]) == 1
    assert cpu_test_state(capsys) == "to write"
    assert cli.main(["diff", "--tests", str(fork)]) == 0
    assert f"+++ b/{CPU_TEST}" in capsys.readouterr().out


def test_a_failed_write_leaves_no_file_and_no_folder(fork, monkeypatch):
    from sglang_draft_layout import transaction

    def full_disk_at_the_test(point, path):
        if point == "renamed" and path.name == "test_draft_layout.py":  # the last file, written
            raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(transaction, "fault_hook", full_disk_at_the_test)
    before = {p: p.read_text() for p in (fork / "python/sglang/srt").rglob("*.py")}
    assert cli.main(["apply", str(fork)]) == 2
    assert not (fork / "test/registered/unit/speculative").exists()
    assert {p: p.read_text() for p in before} == before


def test_collected_by_the_forks_own_collector(fork):
    assert cli.main(["apply", str(fork)]) == 0
    registry = ci_register(fork)
    registries, has_main = registry.ut_parse_one_file(str(fork / CPU_TEST))
    assert has_main
    [collected] = registry.collect_tests([str(fork / CPU_TEST)])
    assert (collected.backend.name, collected.effective_suite, collected.disabled) == ("CPU", "stage-a-test-cpu", None)
    assert collected.est_time > 0


def test_passes_patched_fails_unpatched(fork, proof_python, tmp_path):
    (fork / CPU_TEST).parent.mkdir(parents=True)
    (fork / CPU_TEST).write_text(render("registered_cpu"))
    patched_fork = make_fork(tmp_path / "patched-fork")
    assert cli.main(["apply", str(patched_fork)]) == 0
    unpatched, patched = run_generated(proof_python, fork, patched_fork)
    assert unpatched.returncode != 0, unpatched.stdout + unpatched.stderr
    assert (
        "ImportError: sglang.srt.speculative has no draft_kv_indices_buffer_width, draft_kv_indices_used_len, "
        "per_step_draft_out_cache_loc: run apply"
    ) in unpatched.stderr
    assert patched.returncode == 0, patched.stdout + patched.stderr
    assert f"Ran {TESTS} tests" in patched.stderr and "\nOK" in patched.stderr


#: the patched init_cuda_graph_state width of FlashInferMultiStepDraftBackend, and two ways to
#: put 0.5.12's width back: in the allocation as 0.5.12 has it, or in the local the patch binds
REVERTS = {
    "inline": (
        GRAPH_WIDTH_BLOCK,
        "self.cuda_graph_kv_indices = torch.zeros(\n"
        "            (self.speculative_num_steps, max_bs * self.max_context_len),",
    ),
    "local": (GRAPH_WIDTH, "max_bs * self.max_context_len"),
}


def test_fails_with_one_site_reverted(proof_python, tmp_path):
    forks = []
    for form, (patched_text, reverted_text) in sorted(REVERTS.items()):
        fork = make_fork(tmp_path / f"reverted-{form}")
        assert cli.main(["apply", str(fork)]) == 0
        backend = fork / "python/sglang/srt/layers/attention/flashinfer_backend.py"
        assert backend.read_text().count(patched_text) == 1
        backend.write_text(backend.read_text().replace(patched_text, reverted_text))
        forks.append(fork)
    for form, reverted in zip(sorted(REVERTS), run_generated(proof_python, *forks)):
        assert reverted.returncode != 0, (form, reverted.stdout + reverted.stderr)
        # CustomTestCase reports a failed assert as an error; only the call-site test fails
        failures = re.split(r"(?:FAIL|ERROR): test_draft_layout_calls_the_helpers", reverted.stderr)[1]
        line = (
            backend.read_text()
            .splitlines()
            .index("    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):")
        )
        assert (
            f"sglang/srt/layers/attention/flashinfer_backend.py: FlashInferMultiStepDraftBackend.init_cuda_graph_state "
            f"(line {line + 1}): not draft_kv_indices_buffer_width"
        ) in failures, form
        assert f"Ran {TESTS} tests" in reverted.stderr
        assert re.search(r"FAILED \((errors|failures)=1\)", reverted.stderr), (form, reverted.stderr[-2000:])


KEEP = "  # sglang-draft-layout: keep"


def dsv4_verdict(fork: Path):
    """`check`'s split-once verdict on the fork's DeepseekV4AttnBackend (proof.split_once)."""
    package = fork / "python/sglang"
    tree = ast.parse((package / fork_edits.DSV4).read_text())
    return split_verdict(world_of(tree, package), "DeepseekV4AttnBackend")


def dsv4_init_line(fork: Path) -> int:
    """The def line of the fork's DeepseekV4AttnBackend.init_forward_metadata."""
    tree = ast.parse((fork / "python/sglang" / fork_edits.DSV4).read_text())
    [cls] = [c for c in tree.body if isinstance(c, ast.ClassDef) and c.name == "DeepseekV4AttnBackend"]
    return next(m.lineno for m in cls.body if getattr(m, "name", "") == "init_forward_metadata")


def kept_fork(fork: Path) -> None:
    """Two sites the fork keeps: DSv4 passes a strided slice (no rule proves it), the V2 worker its own split."""
    fork_edits.edit(
        fork / "python",
        fork_edits.DSV4,
        fork_edits.DSV4_DECODE,
        (
            "        if forward_batch.forward_mode.is_decode_or_idle():\n"
            "            step, steps = self.speculative_step_id, self.speculative_num_steps\n"
            f"            metadata = self.init_forward_metadata_decode({KEEP}\n"
            "                max_seq_len=max_seq_len,\n"
            "                req_pool_indices=req_pool_indices,\n"
            "                seq_lens=seq_lens,\n"
            "                out_cache_loc=forward_batch.out_cache_loc[step::steps],\n"
            "            )\n"
        ),
    )
    fork_edits.edit(
        fork / "python",
        fork_edits.WORKER_V2,
        "    def draft_forward(self, forward_batch: ForwardBatch):\n",
        f"    def draft_forward(self, forward_batch: ForwardBatch):{KEEP}\n",
    )


def test_split_once_and_the_keep_pragma(proof_python, tmp_path):
    """Caller-split DSv4 fork patched: passes. The same fork on a tree an older apply had patched
    (a per-step split too), its caller kept by pragma: `check` refuses it and the written test fails,
    naming the path. Sites kept by pragma: passes, those sites untouched."""
    caller = make_fork(tmp_path / "caller-split")
    fork_edits.dsv4_caller_split(caller / "python")
    assert cli.main(["apply", str(caller)]) == 0
    twice = make_fork(tmp_path / "split-twice")
    assert cli.main(["apply", str(twice)]) == 0
    fork_edits.dsv4_caller_split(twice / "python")  # the caller kept too: its own layout only, not the path
    caller_def = fork_edits.CALLER_SPLIT.splitlines(True)[0]
    fork_edits.edit(twice / "python", fork_edits.DSV4, caller_def, caller_def.replace(":\n", f":{KEEP}\n"))
    assert cli.main(["check", str(twice)]) == 2
    kept = make_fork(tmp_path / "kept")
    kept_fork(kept)
    forked = {f: (kept / "python/sglang" / f).read_text() for f in (fork_edits.DSV4, fork_edits.WORKER_V2)}
    assert cli.main(["apply", str(kept)]) == 0
    assert {f: (kept / "python/sglang" / f).read_text() for f in forked} == forked

    patched, split_twice, kept_run = run_generated(proof_python, caller, twice, kept)
    assert patched.returncode == 0, patched.stdout + patched.stderr
    assert f"Ran {TESTS} tests" in patched.stderr and "\nOK" in patched.stderr
    assert split_twice.returncode != 0
    failure = re.split(r"(?:FAIL|ERROR): test_per_step_out_cache_loc_split_once", split_twice.stderr)[1]
    verdict = dsv4_verdict(twice)  # check's own verdict, as the written test gives it
    assert (verdict.who, verdict.caller) == ("twice", "DeepseekV4MultiStepBackend.init_forward_metadata")
    assert (
        f"deepseek_v4_backend.py:{dsv4_init_line(twice)}: DeepseekV4AttnBackend.init_forward_metadata: "
        f"{verdict.why}" in failure
    )
    assert kept_run.returncode == 0, kept_run.stdout + kept_run.stderr
    assert f"Ran {TESTS} tests" in kept_run.stderr


#: 0.5.12's def line of DeepseekV4AttnBackend.init_forward_metadata (the DSv4 site's method)
DSV4_DEF = "    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:\n"
WORKER_DEF = "    def draft_forward(self, forward_batch: ForwardBatch):\n"


def test_split_once_across_modules_the_workers_rows(proof_python, tmp_path, capsys):
    """The V2 worker inits each DeepSeek-V4 step with the row it sets (another module than the path's):
    `check` counts that split, so does the written test. Patched: passes. The same worker on a tree an
    older apply gave DSv4's own split: `check` refuses it, the written test fails naming both places,
    also with the worker's draft_forward kept by the comment (it keeps the worker's own layout); kept on
    DSv4's init_forward_metadata (the comment, or --keep for `check`) both let it pass."""
    worker = make_fork(tmp_path / "worker-split")
    fork_edits.dsv4_worker_split(worker / "python")
    assert cli.main(["apply", str(worker)]) == 0
    assert cli.main(["check", str(worker)]) == 0
    assert "1 handled by the fork's caller" in capsys.readouterr().out
    twice = {keep: make_fork(tmp_path / f"worker-split-twice-{keep}") for keep in ("worker", "dsv4")}
    for fork in twice.values():
        assert cli.main(["apply", str(fork)]) == 0
        fork_edits.dsv4_worker_split(fork / "python")
    capsys.readouterr()
    assert cli.main(["check", str(twice["dsv4"])]) == 2
    assert "splits the per-step out_cache_loc twice" in capsys.readouterr().err
    assert (
        cli.main(
            ["check", "--keep", f"{fork_edits.DSV4}:DeepseekV4AttnBackend.init_forward_metadata", str(twice["dsv4"])]
        )
        == 0
    )
    fork_edits.edit(
        twice["worker"] / "python", fork_edits.WORKER_V2, WORKER_DEF, WORKER_DEF.replace(":\n", f":{KEEP}\n")
    )
    fork_edits.edit(twice["dsv4"] / "python", fork_edits.DSV4, DSV4_DEF, DSV4_DEF.replace(":\n", f":{KEEP}\n"))
    assert cli.main(["check", str(twice["worker"])]) == 2
    assert "splits the per-step out_cache_loc twice" in capsys.readouterr().err
    assert cli.main(["check", str(twice["dsv4"])]) == 0
    assert "kept by the fork" in capsys.readouterr().out

    patched, kept_on_worker, kept_on_dsv4 = run_generated(proof_python, worker, twice["worker"], twice["dsv4"])
    assert patched.returncode == 0, patched.stdout + patched.stderr
    assert f"Ran {TESTS} tests" in patched.stderr and "\nOK" in patched.stderr
    assert dsv4_verdict(worker).who == "never"  # the worker's rows split it: DSv4 takes them as they come
    assert kept_on_worker.returncode != 0
    failure = re.split(r"(?:FAIL|ERROR): test_per_step_out_cache_loc_split_once", kept_on_worker.stderr)[1]
    rows = (twice["worker"] / "python/sglang" / fork_edits.WORKER_V2).read_text().splitlines()
    row = rows.index("            forward_batch.out_cache_loc = out_cache_loc[i]") + 1
    assert dsv4_verdict(twice["worker"]).who == "per-step backend"
    assert (
        f"deepseek_v4_backend.py:{dsv4_init_line(twice['worker'])}: DeepseekV4AttnBackend.init_forward_metadata: "
        f"split by the per-step backend, and by EagleDraftWorker.draft_forward "
        f"({fork_edits.WORKER_V2}:{row}): twice"
    ) in failure
    assert re.search(r"FAILED \((errors|failures)=1\)", kept_on_worker.stderr), kept_on_worker.stderr[-2000:]
    assert kept_on_dsv4.returncode == 0, kept_on_dsv4.stdout + kept_on_dsv4.stderr
    assert f"Ran {TESTS} tests" in kept_on_dsv4.stderr
