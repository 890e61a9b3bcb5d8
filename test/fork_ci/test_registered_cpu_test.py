"""The registered CPU test `apply` writes into a fork checkout (fork_tests, registered_cpu).

Written, reported by `check`, idempotent, skipped with --no-tests (then, nothing left to patch, written
only with --tests); collected by 0.5.12's own ci_register into stage-a-test-cpu (the suite its
run_suite.py gives); and, run as the fork's CI runs it (`python3 FILE`, in the proof venv, on real
torch), it passes on the patched fork and fails on the unpatched one (no helpers), on a patched fork
with a row, a slice end, a worker's or DeepSeek-V4's step row put back otherwise than upstream's, and on one splitting
the per-step out_cache_loc twice, naming the path and probe as `check` does (the same harness). A path
the fork keeps is not run. Black/isort: test_registered_gpu_test.py (every template).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from scratch_fork import CPU_TEST, ci_register, make_fork
from sglang_draft_layout import cli
from sglang_draft_layout.fork_tests import HARNESS, render
from support import fork_edits

pytestmark = pytest.mark.releases
#: the written test's test methods (the helpers' three, the draft paths' one)
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


def cpu_test_state(capsys, file: str = CPU_TEST) -> str:
    """The CPU test's (or another written ``file``'s) state in the JSON report just printed."""
    [state] = [s["state"] for s in json.loads(capsys.readouterr().out)["sites"] if s["file"] == file]
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
    written.write_text(written.read_text().replace("est_time=25", "est_time=26"))
    assert cli.main(["check", "--format", "json", str(fork)]) == 1
    assert cpu_test_state(capsys) == "stale"
    assert cli.main(["apply", str(fork)]) == 0
    assert written.read_text() == render("registered_cpu")
    harness = fork / HARNESS[0]
    assert harness.read_text() == render(HARNESS[1])
    harness.write_text(harness.read_text() + "# edited by the fork\n")
    capsys.readouterr()
    assert cli.main(["check", "--format", "json", str(fork)]) == 1
    assert cpu_test_state(capsys, HARNESS[0]) == "stale"
    assert cli.main(["apply", str(fork)]) == 0
    assert harness.read_text() == render(HARNESS[1])


def test_no_tests_leaves_it_out(fork, capsys):
    """Patched without it, the fork has nothing left to do; --tests writes it still."""
    assert cli.main(["apply", "--no-tests", str(fork)]) == 0
    assert not (fork / "test/registered/unit/speculative").exists()
    assert not (fork / HARNESS[0]).exists()
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
    assert not (fork / HARNESS[0]).exists()
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
    (fork / HARNESS[0]).write_text(render(HARNESS[1]))
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


def test_passes_where_the_helper_modules_import_a_kernel_package_this_machine_lacks(proof_python, tmp_path):
    """fzyzcjy/sglang@60d36e7 and 11 more real forks: their ``spec_utils`` imports the model layers, one of which
    imports ``sgl_kernel`` at module level; on a CPU machine without it the test ran only where the harness compiles
    the helper modules from their text instead of importing them."""
    fork = make_fork(tmp_path / "fork")
    assert cli.main(["apply", str(fork)]) == 0
    spec_utils = fork / "python/sglang/srt/speculative/spec_utils.py"
    spec_utils.write_text("from sgl_kernel import silu_and_mul  # noqa: F401\n" + spec_utils.read_text())
    (run,) = run_generated(proof_python, fork)
    assert run.returncode == 0 and f"Ran {TESTS} tests" in run.stderr, run.stdout + run.stderr[-2000:]


#: file, its patched text, the same site put back otherwise (0.5.12's narrow CUDA-graph row, the width of
#: one branch, a slice end of its own, the V2 worker handing every step row 0 or step 0's backend, the draft
#: CUDA-graph runner handing branches as max_bs or sizing the rows for its smallest batch, FlashInfer-MLA's steps all
#: reading kv_indptr row 0, FlashInfer planning them all with its host copy, Triton's per-step backends all built on
#: it, the kernel's row stride of the batch, every per-step backend handed graph row 0, a
#: capacity check stopping a row as wide as it fills or skipped for the CUDA-graph rows, DeepSeek-V4 baking 0.5.12's
#: whole buffer, initing step 0 at every step or baking row 0 at every step), and what the test says (after the file
#: of the path it names, where that is another file)
REGRESSIONS = {
    "narrow row": (
        "srt/layers/attention/flashinfer_backend.py",
        GRAPH_WIDTH_BLOCK,
        "self.cuda_graph_kv_indices = torch.zeros(\n"
        "            (self.speculative_num_steps, max_bs * self.max_context_len),",
        "FlashInferMultiStepDraftBackend: bs 2, topk 4, 3 steps: capture (max bs 3): kv_indices rows (3, 192) (row stride "
        "192); upstream's (3, 768)",
    ),
    "one branch": (
        "srt/layers/attention/flashinfer_backend.py",
        GRAPH_WIDTH,
        "draft_kv_indices_buffer_width(max_bs, 1, self.max_context_len)",
        "FlashInferMultiStepDraftBackend: bs 2, topk 4, 3 steps: capture (max bs 3): kv_indices rows (3, 192)",
    ),
    "slice end": (
        "srt/layers/attention/triton_backend.py",
        "draft_kv_indices_used_len(seq_lens_sum, self.topk, bs, i + 1)",
        "draft_kv_indices_used_len(seq_lens_sum, self.topk, bs, i + 2)",
        "TritonMultiStepDraftBackend: bs 1, topk 1, 2 steps: eager: steps read kv_indices (row, start, length) "
        "[(0, 0, 7)]; upstream's [(0, 0, 6)]",
    ),
    "row 0": (
        "srt/speculative/eagle_worker_v2.py",
        "forward_batch.out_cache_loc = out_cache_loc[i]",
        "forward_batch.out_cache_loc = out_cache_loc[0]",
        "EagleDraftWorker: bs 3, topk 1, 4 steps: the draft steps write to ['row 0']; upstream's rows 0..2",
    ),
    "V2 worker reads with step 0's backend": (  # every step's forward with attn_backends[0]: row 0's kv_indices
        "srt/speculative/eagle_worker_v2.py",
        "forward_batch.attn_backend = self.draft_attn_backend.attn_backends[i]",
        "forward_batch.attn_backend = self.draft_attn_backend.attn_backends[0]",
        "EagleDraftWorker: bs 3, topk 1, 4 steps: the draft steps' forwards read with 1 attention backend for 3 steps",
    ),
    "DSv4 whole buffer": (
        fork_edits.DSV4,
        "                seq_lens=seq_lens,\n                out_cache_loc=out_cache_loc,\n"
        "            )\n        elif forward_batch.forward_mode.is_target_verify():",
        "                seq_lens=seq_lens,\n                out_cache_loc=forward_batch.out_cache_loc,\n"
        "            )\n        elif forward_batch.forward_mode.is_target_verify():",
        "DeepseekV4MultiStepBackend: bs 1, topk 1, 2 steps: eager: raises AssertionError at "
        "srt/layers/attention/deepseek_v4_backend.py:",
    ),
    "runner hands branches": (  # the fork's draft CUDA-graph runner hands max_num_token as max_bs (rows topk^2 wide)
        "srt/speculative/eagle_draft_cuda_graph_runner.py",
        "self.draft_attn_backend.init_cuda_graph_state(self.max_bs, self.max_num_token)",
        "self.draft_attn_backend.init_cuda_graph_state(self.max_num_token, self.max_num_token)",
        "srt/layers/attention/flashinfer_backend.py: FlashInferMultiStepDraftBackend: bs 2, topk 4, 3 steps: capture "
        "(max bs 3, sized by EAGLEDraftCudaGraphRunner): kv_indices rows (3, 3072) (row stride 3072); upstream's (3, 768)",
    ),
    "runner sizes rows for its smallest batch": (  # the rows of one batch; the graph replays up to max_bs in them
        "srt/speculative/eagle_draft_cuda_graph_runner.py",
        "self.max_bs = max(self.capture_bs)",
        "self.max_bs = self.capture_bs[0]",
        "srt/layers/attention/flashinfer_backend.py: FlashInferMultiStepDraftBackend: bs 1, topk 1, 2 steps: capture "
        "(max bs 2, sized by EAGLEDraftCudaGraphRunner): kv_indices rows (2, 64) (row stride 64); upstream's (2, 128)",
    ),
    "kv_indptr row 0": (  # every step reads its kv_indices row through step 0's kv_indptr
        "srt/layers/attention/flashinfer_mla_backend.py",
        "forward_batch.spec_info.kv_indptr = self.kv_indptr[i, : bs + 1]",
        "forward_batch.spec_info.kv_indptr = self.kv_indptr[0, : bs + 1]",
        "FlashInferMLAMultiStepDraftBackend: bs 3, topk 1, 4 steps: eager: steps read kv_indptr (row, start, length) "
        "[(0, 0, 4), (0, 0, 4), (0, 0, 4)]; upstream's [(0, 0, 4), (1, 0, 4), (2, 0, 4)]",
    ),
    "host kv_indptr row 0": (  # FlashInfer plans every step with step 0's lengths
        "srt/layers/attention/flashinfer_backend.py",
        "global_override_indptr_cpu = indptr_cpu_whole[i]",
        "global_override_indptr_cpu = indptr_cpu_whole[0]",
        "FlashInferMultiStepDraftBackend: bs 3, topk 1, 4 steps: eager: steps read kv_indptr on the host (row, start, "
        "length) [(0, 0, 4), (0, 0, 4), (0, 0, 4)]; upstream's [(0, 0, 4), (1, 0, 4), (2, 0, 4)]",
    ),
    "per-step backends built on kv_indptr row 0": (  # in the CUDA graph each plans into row 0: the last step's wins
        "srt/layers/attention/triton_backend.py",
        "kv_indptr_buf=self.kv_indptr[i],",
        "kv_indptr_buf=self.kv_indptr[0],",
        "TritonMultiStepDraftBackend: bs 3, topk 1, 4 steps: the per-step backends are built on kv_indptr rows "
        "[0, 0, 0]; upstream's [0, 1, 2]",
    ),
    "kernel row stride": (  # right only where the CUDA graph's largest batch is the one replayed
        "srt/layers/attention/flashinfer_backend.py",
        "            self.pool_len,\n            kv_indices_buffer.shape[1],\n",
        "            self.pool_len,\n            bs * self.max_context_len,\n",
        "FlashInferMultiStepDraftBackend: bs 1, topk 1, 2 steps: capture (max bs 2): kv_indices rows (2, 128) (row "
        "stride 64)",
    ),
    "graph row 0": (
        "srt/layers/attention/flashinfer_backend.py",
        "max_bs, max_num_tokens, kv_indices_buf=self.cuda_graph_kv_indices[i]",
        "max_bs, max_num_tokens, kv_indices_buf=self.cuda_graph_kv_indices[0]",
        "FlashInferMultiStepDraftBackend: bs 3, topk 1, 4 steps: capture (max bs 4): the per-step backends' CUDA-graph "
        "kv_indices are rows [0, 0, 0]; upstream's [0, 1, 2]",
    ),
    "strict capacity check": (  # stops a row exactly as wide as the kernel fills
        "srt/layers/attention/flashinfer_backend.py",
        "assert required_kv_indices_len <= kv_indices_buffer.shape[1], (",
        "assert required_kv_indices_len < kv_indices_buffer.shape[1], (",
        "FlashInferMultiStepDraftBackend: bs 1, topk 1, 2 steps: common_template stops rows 7 wide, as wide as it "
        "fills: AssertionError at srt/layers/attention/flashinfer_backend.py:",
    ),
    "capacity check skipped for the CUDA-graph rows": (  # the rows 0.5.12's narrow width overflowed
        "srt/layers/attention/flashinfer_backend.py",
        "        assert required_kv_indices_len <= kv_indices_buffer.shape[1], (",
        '        if kv_indices_buffer is not getattr(self, "cuda_graph_kv_indices", None):\n'
        "            assert required_kv_indices_len <= kv_indices_buffer.shape[1], (",
        "FlashInferMultiStepDraftBackend: bs 1, topk 1, 2 steps: common_template fills CUDA-graph rows 6 wide (it "
        "writes 7) without a capacity check",
    ),
    "DSv4 inits step 0 each time": (  # steps 1.. never bake their row
        fork_edits.DSV4,
        "            self.attn_backends[i].init_forward_metadata(forward_batch)\n",
        "            self.attn_backends[0].init_forward_metadata(forward_batch)\n",
        "DeepseekV4MultiStepBackend: bs 3, topk 1, 4 steps: eager: steps [1, 2] bake nothing; upstream's step i bakes row i",
    ),
    "DSv4 row 0": (
        fork_edits.DSV4,
        "                )[self.speculative_step_id]\n",
        "                )[0]\n",
        "DeepseekV4MultiStepBackend: bs 3, topk 1, 4 steps: eager: step 1 bakes slots [1000000, 1000004, 1000008]; "
        "upstream's row 1 is [1000001, 1000005, 1000009]",
    ),
}


def test_fails_with_a_site_put_back_otherwise(proof_python, tmp_path):
    forks = []
    for name, (relative, patched_text, reverted_text, _said) in REGRESSIONS.items():
        fork = make_fork(tmp_path / name.replace(" ", "-"))
        assert cli.main(["apply", str(fork)]) == 0
        path = fork / "python/sglang" / relative
        assert path.read_text().count(patched_text) == 1, name
        path.write_text(path.read_text().replace(patched_text, reverted_text))
        assert cli.main(["check", str(fork)]) != 0, name  # to patch again (1) or refused as it is (2)
        forks.append(fork)
    for (name, (relative, _p, _r, said)), run in zip(REGRESSIONS.items(), run_generated(proof_python, *forks)):
        assert run.returncode != 0, (name, run.stdout + run.stderr)
        # CustomTestCase reports a failed assert as an error; only the draft paths' test fails
        failure = re.split(r"(?:FAIL|ERROR): test_draft_paths_give_upstreams_values", run.stderr)[1]
        said = said if said.startswith("srt/") else f"{relative}: {said}"  # the file of the path it names
        assert f"sglang/{said}" in failure, (name, failure[-2000:])
        assert f"Ran {TESTS} tests" in run.stderr
        assert re.search(r"FAILED \((errors|failures)=1\)", run.stderr), (name, run.stderr[-2000:])


#: a helper's body changed where only some of its values change (file under srt/speculative, its text, the change):
#: a shortcut at topk 1, the int32 guard loosened
HELPER_REGRESSIONS = {
    "used length at topk 1": (
        "spec_utils.py",
        "    return seq_lens_sum * topk + bs * num_steps\n",
        "    if topk == 1:\n        return seq_lens_sum + num_steps\n    return seq_lens_sum * topk + bs * num_steps\n",
    ),
    "rows at topk 1": (
        "eagle_utils.py",
        "    return (\n        out_cache_loc.view(batch_size, topk, num_steps)\n",
        "    if topk == 1:\n        return out_cache_loc.view(num_steps, batch_size)\n"
        "    return (\n        out_cache_loc.view(batch_size, topk, num_steps)\n",
    ),
    "int32 guard": ("spec_utils.py", "    assert width < 2**31, (\n", "    assert width < 2**32, (\n"),
}


def test_fails_with_a_helper_changed_where_its_pinned_values_hold(proof_python, tmp_path):
    """The draft paths are held against the tree's own helpers: each must be upstream's wherever a path is judged."""
    forks = []
    for name, (relative, patched_text, changed_text) in HELPER_REGRESSIONS.items():
        fork = make_fork(tmp_path / name.replace(" ", "-"))
        assert cli.main(["apply", str(fork)]) == 0
        path = fork / "python/sglang/srt/speculative" / relative
        assert path.read_text().count(patched_text) == 1, name
        path.write_text(path.read_text().replace(patched_text, changed_text))
        forks.append(fork)
    for name, run in zip(HELPER_REGRESSIONS, run_generated(proof_python, *forks)):
        assert run.returncode != 0, (name, run.stdout + run.stderr)
        assert re.search(r"(?:FAIL|ERROR): test_upstreams_values_wherever_the_paths_are_judged", run.stderr), name
        assert f"Ran {TESTS} tests" in run.stderr


KEEP = "  # sglang-draft-layout: keep"


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
    naming the path. Sites kept by pragma: passes (their paths are not run), those sites untouched."""
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
    failure = re.split(r"(?:FAIL|ERROR): test_draft_paths_give_upstreams_values", split_twice.stderr)[1]
    said = (  # as check says it: the per-step helper's length assert on a row split already
        f"sglang/{fork_edits.DSV4}: DeepseekV4MultiStepBackend: bs 1, topk 1, 2 steps: eager: raises AssertionError at "
        "srt/speculative/eagle_utils.py:"
    )
    assert said in failure, failure[-2000:]
    assert kept_run.returncode == 0, kept_run.stdout + kept_run.stderr
    assert f"Ran {TESTS} tests" in kept_run.stderr
