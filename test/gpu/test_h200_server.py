"""GPU proof: the real SGLang 0.5.12 server, unpatched against patched (benchmark/gpu/).

Skipped without torch or CUDA (CI has neither GPU nor SGLang). On a GPU machine either
  GPU_RESULTS=path/results.json[:more.json] pytest test/gpu      (check results of a harness run)
or
  pytest test/gpu                  (runs benchmark/gpu/run_on_h200.sh key triton_nocg flashinfer_nocg first;
                                    needs sglang 0.5.12, see benchmark/gpu/README.md; several minutes)
"""

import pytest
import serve_checks  # benchmark/gpu/, put on sys.path by conftest.py

pytestmark = pytest.mark.gpu

DEFAULT_SETS = ["key", "triton_nocg", "flashinfer_nocg"]


@pytest.fixture(scope="session")
def results(harness_results):
    merged, paths = harness_results("run_on_h200.sh", *DEFAULT_SETS)
    if not merged:
        pytest.skip(f"no harness results in {paths}")
    return merged


ALL = serve_checks.SETS["all"]
PATCHED = [n for n in ALL if n.endswith("_patched")]
SPEC_UNPATCHED = [n for n in ALL if n.endswith("_unpatched")]
NONSPEC = [n for n in ALL if "_nonspec" in n]


@pytest.mark.parametrize("name", PATCHED)
def test_patched_server_starts_and_is_exact(results, name):
    """Import order (helpers imported at module level) holds: the server starts; every
    request equals the rule and accepts exactly num_steps + 1 tokens per verify."""
    r = results.ran(name)
    assert r.get("startup_s") is not None and r.get("checks"), r.get("error") or r.get("status")
    assert r["all_match_rule"], [c["tag"] for c in r["checks"] if not c.get("match_rule")]
    steps = r["steps"]
    bad = [(c["tag"], c["accept_len"]) for c in r["checks"] if c.get("accept_len") != steps + 1]
    assert not bad, bad
    if r.get("equal_nonspec") is not None:
        assert r["equal_nonspec"]


@pytest.mark.parametrize("name", PATCHED)
def test_patched_server_loaded_the_patched_tree(results, name):
    r = results.ran(name)
    origins = [t.split(" ", 1)[1] for t in r.get("trace", []) if t.startswith("sglang.srt.speculative.spec_utils ")]
    assert origins and all("/patched/" in o for o in origins), origins


@pytest.mark.parametrize("name", SPEC_UNPATCHED + NONSPEC)
def test_unpatched_outputs_follow_the_rule(results, name):
    """The target verifies every draft, so even the unpatched tree's outputs are right."""
    r = results.ran(name)
    assert r.get("checks"), r.get("error") or r.get("status")
    assert r["all_match_rule"]
    origins = [t.split(" ", 1)[1] for t in r.get("trace", []) if t.startswith("sglang.srt.speculative.spec_utils ")]
    assert origins and not any("/patched/" in o for o in origins), origins


@pytest.mark.parametrize("name", [n for n in SPEC_UNPATCHED if n.startswith("flashinfer_cg_k4")])
def test_unpatched_flashinfer_graph_topk4_drops_accept_length(results, name):
    """0.5.12's FlashInfer CUDA-graph kv_indices row lacks topk: a long batched request
    overflows it and accepts fewer than num_steps + 1 tokens per verify."""
    r = results.ran(name)
    accs = [c["accept_len"] for c in r.get("checks", []) if c.get("accept_len") is not None]
    assert accs and min(accs) < r["steps"] + 1, accs
