"""Forks between releases: 0.5.12 with some of upstream's draft-layout PRs cherry-picked.

Each fixture is built here by editing the real 0.5.12 tree from PyPI as a fork would
(string edits of its own lines; the fork's assert message is the fork's own), then
patched. Each must end in upstream's form: check says every site patched, each
``common_template`` holds exactly one capacity check, the sites read as apply leaves
plain 0.5.12, and a second apply writes nothing.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Callable

import pytest

from sglang_draft_layout import cli, engine
from sglang_draft_layout.rules.base import State
from sglang_draft_layout.target import resolve
from test_releases import SITES_IN_BOTH, SITES_SINCE_0_5_13, helper_statements, method_of, tree_digest

pytestmark = pytest.mark.releases

FLASHINFER = "srt/layers/attention/flashinfer_backend.py"
FLASHINFER_MLA = "srt/layers/attention/flashinfer_mla_backend.py"
BACKENDS = {FLASHINFER: "FlashInferMultiStepDraftBackend", FLASHINFER_MLA: "FlashInferMLAMultiStepDraftBackend"}
LAUNCH = "        self.generate_draft_decode_kv_indices[\n"
#: the check a fork wrote when it took 27338 / 27460 (black-formatted, its own message)
FORK_CHECK = (
    "        required_kv_indices_len = (\n"
    "            seq_lens_sum * self.topk + bs * self.speculative_num_steps\n"
    "        )\n"
    "        assert required_kv_indices_len <= kv_indices_buffer.shape[1], (\n"
    '            f"draft kv_indices row overflow: {required_kv_indices_len} > "\n'
    '            f"{kv_indices_buffer.shape[1]}"\n'
    "        )\n\n"
)
PER_STEP_HELPER = """

def per_step_draft_out_cache_loc(out_cache_loc, batch_size, topk, num_steps):
    expected = batch_size * topk * num_steps
    assert out_cache_loc.shape[0] == expected, "draft out_cache_loc has the wrong length"
    return (
        out_cache_loc.view(batch_size, topk, num_steps)
        .permute(2, 0, 1)
        .reshape(num_steps, -1)
    )
"""
HELPERS = ("draft_kv_indices_buffer_width", "draft_kv_indices_used_len", "per_step_draft_out_cache_loc")
HELPER_IMPORT = "from sglang.srt.speculative.eagle_utils import per_step_draft_out_cache_loc\n"


def edit(root: Path, relative: str, old: str, new: str) -> None:
    """Replace the only occurrence of ``old`` in ``sglang/<relative>``."""
    path = root / "sglang" / relative
    text = path.read_text()
    assert text.count(old) == 1, f"{relative}: {old!r} occurs {text.count(old)} times"
    path.write_text(text.replace(old, new))


def import_after_future(root: Path, relative: str, line: str) -> None:
    edit(root, relative, "from __future__ import annotations\n", "from __future__ import annotations\n" + line)


def cherry_pick_27338(root: Path, relative: str = FLASHINFER) -> None:
    """Upstream's pre-helper fix: the topk factor in the graph width, an inline check before the launch."""
    edit(
        root,
        relative,
        "(self.speculative_num_steps, max_bs * self.max_context_len),",
        "(self.speculative_num_steps, max_bs * self.topk * self.max_context_len),",
    )
    edit(root, relative, LAUNCH, FORK_CHECK + LAUNCH)


def cherry_pick_27338_and_27460(root: Path) -> None:
    cherry_pick_27338(root, FLASHINFER)
    cherry_pick_27338(root, FLASHINFER_MLA)


def merge_26239(root: Path) -> None:
    """The per-step helper in eagle_utils, used by the V2 worker's draft_forward and by DeepSeek-V4."""
    path = root / "sglang/srt/speculative/eagle_utils.py"
    path.write_text(path.read_text() + PER_STEP_HELPER)
    worker = "srt/speculative/eagle_worker_v2.py"
    edit(
        root,
        worker,
        "        out_cache_loc = out_cache_loc.reshape(\n"
        "            forward_batch.batch_size, self.topk, self.speculative_num_steps\n"
        "        )\n"
        "        out_cache_loc = out_cache_loc.permute((2, 0, 1)).reshape(\n"
        "            self.speculative_num_steps, -1\n"
        "        )\n",
        "        out_cache_loc = per_step_draft_out_cache_loc(\n"
        "            out_cache_loc, forward_batch.batch_size, self.topk, self.speculative_num_steps\n"
        "        )\n",
    )
    (
        import_after_future(root, worker, HELPER_IMPORT)
        if "from __future__" in (root / "sglang" / worker).read_text()
        else edit(root, worker, "import torch\n", "import torch\n" + HELPER_IMPORT)
    )
    dsv4 = "srt/layers/attention/deepseek_v4_backend.py"
    edit(
        root,
        dsv4,
        "                out_cache_loc=forward_batch.out_cache_loc,\n"
        "            )\n"
        "        elif forward_batch.forward_mode.is_target_verify():\n",
        "                out_cache_loc=(\n"
        "                    per_step_draft_out_cache_loc(\n"
        "                        forward_batch.out_cache_loc, forward_batch.batch_size,\n"
        "                        self.topk, self.speculative_num_steps,\n"
        "                    )[self.speculative_step_id]\n"
        "                    if self.topk > 0 and self.speculative_num_steps > 1\n"
        "                    else forward_batch.out_cache_loc\n"
        "                ),\n"
        "            )\n"
        "        elif forward_batch.forward_mode.is_target_verify():\n",
    )
    import_after_future(root, dsv4, HELPER_IMPORT)


def merge_27484(root: Path) -> None:
    """spec_utils' type-only imports moved under ``if TYPE_CHECKING:``."""
    spec_utils = "srt/speculative/spec_utils.py"
    edit(root, spec_utils, "from sglang.srt.constrained.base_grammar_backend import BaseGrammarObject\n", "")
    edit(root, spec_utils, "from sglang.srt.managers.schedule_batch import Req\n", "")
    edit(
        root,
        spec_utils,
        "from sglang.srt.server_args import ServerArgs, get_global_server_args\n",
        "from sglang.srt.server_args import get_global_server_args\n",
    )
    edit(
        root,
        spec_utils,
        "if TYPE_CHECKING:\n",
        "if TYPE_CHECKING:\n"
        "    from sglang.srt.constrained.base_grammar_backend import BaseGrammarObject\n"
        "    from sglang.srt.managers.schedule_batch import Req\n"
        "    from sglang.srt.server_args import ServerArgs\n",
    )


def states(root: Path) -> dict[str, engine.Finding]:
    """Each site's finding, but the sites 0.5.13 added where the tree has none (its file or method)."""
    return {
        f.rule.id: f
        for f in engine.plan(resolve(str(root)), render_changes=False).findings
        if not (f.rule.id in SITES_SINCE_0_5_13 and f.state is State.ABSENT)
    }


def capacity_checks(root: Path, relative: str) -> list[str]:
    """Each assert of common_template comparing a length with the row's width."""
    method = method_of(root, relative, BACKENDS[relative], "common_template")
    return [
        ast.unparse(n.test)
        for n in ast.walk(method)
        if isinstance(n, ast.Assert) and ".shape[1]" in ast.unparse(n.test)
    ]


FORKS: dict[str, tuple[Callable[[Path], None], dict[str, State]]] = {
    # fixture, and what check must say of it before apply (every other site: to patch)
    "27338 (FlashInfer)": (cherry_pick_27338, {}),
    "27338 + 27460 (FlashInfer, FlashInfer-MLA)": (cherry_pick_27338_and_27460, {}),
    "26239 without 27475": (
        merge_26239,
        {
            "helper:per_step_draft_out_cache_loc": State.PATCHED,
            "draft-forward:EagleDraftWorker": State.PATCHED,
            "dsv4-out-cache-loc": State.PATCHED,
        },
    ),
    "27484 (type-only imports under TYPE_CHECKING)": (merge_27484, {}),
}


@pytest.mark.parametrize("make_fork, done", FORKS.values(), ids=FORKS.keys())
def test_fork_is_finished_in_upstreams_form(scratch, patched, make_fork, done, capsys):
    root = scratch("0.5.12")
    make_fork(root)

    before = states(root)
    assert {rule: f.state for rule, f in before.items() if f.state is not State.TO_PATCH} == done
    for relative in BACKENDS:  # a fork's own check is rewritten in place, nothing is added beside it
        if capacity_checks(root, relative):
            finding = before[f"capacity-check:{'flashinfer_mla' if 'mla' in relative else 'flashinfer'}"]
            assert finding.detail == "the fork's own check (27338/27460): its length via the helper"
    assert cli.main(["check", str(root)]) == 1
    forked = {site: helper_statements(method_of(root, *site)) for site in SITES_IN_BOTH}
    finished = {site for site, found in forked.items() if any(helper in dump for dump in found for helper in HELPERS)}

    assert cli.main(["apply", str(root)]) == 0

    assert all(f.state is State.PATCHED for f in states(root).values())
    assert cli.main(["check", str(root)]) == 0
    plain = patched("0.5.12")
    for relative in BACKENDS:
        assert len(capacity_checks(root, relative)) == 1
        assert capacity_checks(root, relative) == capacity_checks(plain, relative)
    for site in sorted(set(SITES_IN_BOTH)):  # as apply leaves plain 0.5.12, or as the fork had it already
        expected = forked[site] if site in finished else helper_statements(method_of(plain, *site))
        assert helper_statements(method_of(root, *site)) == expected, site
    digest = tree_digest(root)
    capsys.readouterr()
    assert cli.main(["apply", str(root)]) == 0
    assert tree_digest(root) == digest
    assert "nothing to do" in capsys.readouterr().out
