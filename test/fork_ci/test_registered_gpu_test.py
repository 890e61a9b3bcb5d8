"""The registered GPU test `apply` writes into a fork checkout (fork_tests, registered_gpu).

Written beside the CPU one with --gpu-test (only then: it costs per-commit GPU time) and
reported by `check`, left out with --no-tests; collected by 0.5.12's own ci_register into the
CUDA suite the fork's run_suite.py gives (stage-b-test-1-gpu-small); every template
black/isort clean. Without a GPU, what it would run is read in the proof venv
(gpu_test_probe.py): each server command parsed by 0.5.12's own ServerArgs parser, the
configurations and requests it covers, and the models its embedded builder writes, byte for
byte those of sglang_draft_layout.tiny_models. On the H200: benchmark/gpu/run_fork_gpu_test.sh.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_draft_layout import cli
from sglang_draft_layout.fork_tests import FORK_TESTS, HARNESS, render

from scratch_fork import GPU_TEST, VERSION, ci_register
from support.sglang_release import pristine_tree

pytestmark = pytest.mark.releases
HERE = Path(__file__).resolve().parent
PACKAGE_SOURCE = HERE.parents[1] / "python"
#: (attention backend, CUDA graphs, topk, num_steps) of the case 0.5.12 fails on the H200
KNOWN_FAILING = ("flashinfer", True, 8, 5)


def run_in_venv(python: Path, pythonpath: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = str(pythonpath)
    result = subprocess.run([str(python), *args], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def probe(proof_python, tmp_path_factory):
    """gpu_test_probe.py's report on the rendered file, and its models' folder."""
    folder = tmp_path_factory.mktemp("gpu_test")
    generated = folder / "test_draft_layout_exact.py"
    generated.write_text(render("registered_gpu"))
    result = run_in_venv(
        proof_python,
        pristine_tree(VERSION),
        str(HERE / "run_on_cpu.py"),
        str(HERE / "gpu_test_probe.py"),
        str(generated),
        str(folder / "models"),
    )
    [line] = [line for line in result.stdout.splitlines() if line.startswith("GPU-TEST-PROBE ")]
    return json.loads(line.split(" ", 1)[1]), folder / "models"


def test_apply_writes_it_and_check_reports_it(fork, capsys):
    assert cli.main(["check", "--gpu-test", "--format", "json", str(fork)]) == 1
    assert [s["state"] for s in json.loads(capsys.readouterr().out)["sites"] if s["file"] == GPU_TEST] == ["to write"]
    assert cli.main(["apply", "--gpu-test", str(fork)]) == 0
    assert (fork / GPU_TEST).read_text() == render("registered_gpu")
    assert cli.main(["check", str(fork)]) == 0  # once written, it is checked without --gpu-test too


def test_no_tests_leaves_it_out(fork):
    assert cli.main(["apply", "--no-tests", "--gpu-test", str(fork)]) == 0
    assert not (fork / "test/registered/spec").exists()


def test_collected_into_the_cuda_suite(fork):
    assert cli.main(["apply", "--gpu-test", str(fork)]) == 0
    registry = ci_register(fork)
    registries, has_main = registry.ut_parse_one_file(str(fork / GPU_TEST))
    assert has_main
    [collected] = registry.collect_tests([str(fork / GPU_TEST)])
    assert (collected.backend.name, collected.effective_suite, collected.disabled) == (
        "CUDA",
        "stage-b-test-1-gpu-small",
        None,
    )
    assert collected.est_time > 0


@pytest.mark.parametrize("template", [template for _path, template, _what in (*FORK_TESTS, HARNESS)])
def test_black_and_isort_clean(tmp_path, template):
    path = tmp_path / f"test_{template}.py"
    path.write_text(render(template))
    for tool in (["black", "--check", "-l", "88"], ["isort", "--check-only", "--profile", "black", "-p", "sglang"]):
        result = subprocess.run([sys.executable, "-m", *tool, str(path)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def test_configurations_cover_backends_topk_steps_and_graphs(probe):
    configs = [tuple(config) for config in probe[0]["configs"].values()]
    assert KNOWN_FAILING in configs
    assert {backend for backend, *_ in configs} == {"triton", "flashinfer"}
    assert {topk for *_, topk, _steps in configs} == {1, 4, 8}
    assert {steps for *_, steps in configs} == {3, 5}
    for backend in ("triton", "flashinfer"):
        assert {graphs for name, graphs, *_ in configs if name == backend} == {True, False}


def test_server_commands_parse_with_the_forks_own_server_args(probe):
    report, models = probe
    for name, (backend, graphs, topk, steps) in report["configs"].items():
        args = dict(report["commands"][name])
        assert args.pop("argv0")[1:] == ["-m", "sglang.launch_server"]
        draft_tokens = args.pop("speculative_num_draft_tokens")
        assert draft_tokens == steps + 1 if topk == 1 else steps < draft_tokens <= topk * steps
        assert args == {
            "model_path": str(models / "target"),
            "port": 30000,
            "host": "127.0.0.1",
            "tensor_parallel_size": 1,
            "mem_fraction_static": 0.08,
            "max_total_tokens": 200000,
            "skip_server_warmup": True,
            "grammar_backend": "none",
            "max_running_requests": 8,
            "attention_backend": backend,
            "speculative_algorithm": "EAGLE",
            "speculative_draft_model_path": str(models / "draft"),
            "speculative_num_steps": steps,
            "speculative_eagle_topk": topk,
            "disable_cuda_graph": not graphs,
            "cuda_graph_max_bs": 8 if graphs else None,
        }, name


def test_requests_exact_lengths_and_near_context_batches(probe):
    report, _models = probe
    plan = report["plan"]
    near_context = [request for request in plan if request["tag"].startswith("near_context")]
    assert len(near_context) == 2 and all(len(request["texts"]) == 8 for request in near_context)
    assert len(plan) > len(near_context)
    for request in plan:
        assert len(request["texts"]) == len(request["rules"])
    shortest_rule = min(len(rule) for request in plan for rule in request["rules"])
    for name, (_backend, _graphs, topk, steps) in report["configs"].items():
        new = report["new_tokens"][name]
        assert new % (steps + 1) == 0 and 64 <= new <= shortest_rule, name
        draft_tokens = report["commands"][name]["speculative_num_draft_tokens"]
        assert report["near_context_tokens"] + new + draft_tokens < report["context"], name
    assert report["near_context_tokens"] > report["context"] - 200


def test_embedded_builder_writes_tiny_models_files(probe, proof_python, tmp_path):
    _report, embedded = probe
    run_in_venv(
        proof_python,
        PACKAGE_SOURCE,
        "-c",
        "import sys; from sglang_draft_layout.tiny_models import build_models; " "build_models(sys.argv[1])",
        str(tmp_path),
    )
    files = sorted(path.relative_to(tmp_path) for path in tmp_path.rglob("*") if path.is_file())
    assert len(files) == 9  # prompts.json, and config, weights, tokenizer (2) per model
    assert sorted(path.relative_to(embedded) for path in embedded.rglob("*") if path.is_file()) == files
    for path in files:
        assert (embedded / path).read_bytes() == (tmp_path / path).read_bytes(), path
