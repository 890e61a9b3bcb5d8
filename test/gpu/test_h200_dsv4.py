"""GPU proof, DeepSeek-V4 (change A): the multi-step draft's out_cache_loc on the real server.

Unpatched SGLang 0.5.12 with EAGLE (MTP) num_steps > 1 and --disable-cuda-graph must stop at the
first draft decode with DeepSeek-V4's shape assertion (out_cache_loc holds every step's slots);
the patched tree must serve, exactly as the non-speculative server does, every draft accepted.
One step is the control: its out_cache_loc has one slot per request, so both trees serve.

Skipped without torch or CUDA. On a GPU machine either
  GPU_RESULTS=a/results.json:b/results.json pytest test/gpu/test_h200_dsv4.py   (one file per model)
or
  pytest test/gpu/test_h200_dsv4.py   (runs benchmark/gpu/run_deepseek_on_h200.sh dsv4 dsv4_steps)
"""

import re

import pytest
import serve_checks  # benchmark/gpu/, put on sys.path by conftest.py

pytestmark = pytest.mark.gpu

CONFIGS = list(dict.fromkeys(serve_checks.SETS["dsv4"] + serve_checks.SETS["dsv4_steps"]))
SHAPE_ASSERTION = re.compile(
    r"AssertionError: req_pool_indices\.shape=torch\.Size\(\[(\d+)\]\) "
    r"seq_lens\.shape=torch\.Size\(\[(\d+)\]\) out_cache_loc\.shape=torch\.Size\(\[(\d+)\]\)"
)


@pytest.fixture(scope="session")
def runs(harness_results):
    found = [
        (path, r)
        for path, r in harness_results.each("run_deepseek_on_h200.sh", "dsv4", "dsv4_steps")
        if any(n in r for n in CONFIGS)
    ]
    if not found:
        pytest.skip("no DeepSeek-V4 harness results")
    return found


def ran(runs, name):
    """(file, result) of config name in every results file that has it; skip if none has."""
    got = [(path, r[name]) for path, r in runs if name in r]
    if not got:
        pytest.skip(f"{name} was not part of these harness runs")
    return got


def serves_every_request_exactly(r, name, path):
    steps = serve_checks.parse(name)["steps"]
    assert r.get("checks") and "error" not in r, f"{path} {name}: {r.get('status')} {r.get('error', '')}"
    assert r["all_match_rule"], [c["tag"] for c in r["checks"] if not c.get("match_rule")]
    if steps is not None:
        assert r["accept_all_exact"], (r.get("accept_min"), r.get("accept_max"), steps + 1)
        assert r["equal_nonspec"] is not False


@pytest.mark.parametrize("steps", [3, 5])
def test_unpatched_eager_multi_step_draft_fails_the_shape_assertion(runs, steps):
    for path, r in ran(runs, f"dsv4_nocg_k1s{steps}_unpatched"):
        assert not r.get("checks"), f"{path}: the unpatched server answered"
        found = [SHAPE_ASSERTION.search(line) for line in r.get("log_errors", [])]
        found = [m for m in found if m]
        assert found, f"{path}: no shape assertion in {r.get('log_errors')}"
        reqs, seqs, locs = (int(x) for x in found[-1].groups())
        assert reqs == seqs and locs == steps * reqs, found[-1].group(0)


@pytest.mark.parametrize(
    "name", [n for n in CONFIGS if n not in ("dsv4_nocg_k1s3_unpatched", "dsv4_nocg_k1s5_unpatched")]
)
def test_serves_with_every_draft_accepted(runs, name):
    for path, r in ran(runs, name):
        serves_every_request_exactly(r, name, path)


@pytest.mark.parametrize("name", [n for n in CONFIGS if n.endswith("_patched")])
def test_patched_servers_ran_the_patched_backend(runs, name):
    for path, r in ran(runs, name):
        origins = [t for t in r.get("trace", []) if t.startswith("sglang.srt.layers.attention.deepseek_v4_backend ")]
        assert origins and all("/patched/" in t for t in origins), (path, origins)
