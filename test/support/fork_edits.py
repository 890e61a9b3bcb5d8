"""Forks with their own fix of a draft layout site, built by editing a real SGLang 0.5.12 tree.

Each edit changes the release's own lines the way a fork did (see SPEC, "A real fork's own
fix of a site"): DeepSeek-V4's per-step out_cache_loc split by a method of the fork's own,
in the per-step backend, in the multi-step backend that calls it, or by the EAGLE worker
initing each step's backend with its row (also beside a split of DeepSeek-V4's own: twice), and
the EAGLE worker's split in other spellings; splits through a 3-d view bound to a local (also apart from
its move, or moved in a block below it), a split reaching DeepSeek-V4's ``out_cache_loc=`` through a chain of locals, and methods splitting in
two branches. Shapes no known fork has, which `check` follows: DeepSeek-V4's
init_forward_metadata body moved into a method it calls (or two calls down), its own method's split one
call further down. The edited files stay black/isort-clean.
Standard library only, so that the same fork can be built anywhere the release is installed:

    python test/support/fork_edits.py dsv4-caller-split DEST

edits ``DEST/sglang`` in place (for a fork checkout DEST is its ``python/``), first copied
there from the ``sglang`` this Python finds when DEST holds none (run with that sglang's Python).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
import shutil
import sys
from pathlib import Path
from typing import Callable, Dict

DSV4 = "srt/layers/attention/deepseek_v4_backend.py"
WORKER_V2 = "srt/speculative/eagle_worker_v2.py"

#: 0.5.12's decode branch of DeepseekV4AttnBackend.init_forward_metadata
DSV4_DECODE = (
    "        if forward_batch.forward_mode.is_decode_or_idle():\n"
    "            metadata = self.init_forward_metadata_decode(\n"
    "                max_seq_len=max_seq_len,\n"
    "                req_pool_indices=req_pool_indices,\n"
    "                seq_lens=seq_lens,\n"
    "                out_cache_loc=forward_batch.out_cache_loc,\n"
    "            )\n"
)
#: 0.5.12's DeepseekV4MultiStepBackend.init_forward_metadata
DSV4_MULTI_STEP = (
    "    def init_forward_metadata(self, forward_batch: ForwardBatch):\n"
    "        for i in range(self.speculative_num_steps - 1):\n"
    "            self.attn_backends[i].init_forward_metadata(forward_batch)\n"
)
#: 0.5.12's split in EagleDraftWorker.draft_forward
WORKER_SPLIT = (
    "        out_cache_loc = out_cache_loc.reshape(\n"
    "            forward_batch.batch_size, self.topk, self.speculative_num_steps\n"
    "        )\n"
    "        out_cache_loc = out_cache_loc.permute((2, 0, 1)).reshape(\n"
    "            self.speculative_num_steps, -1\n"
    "        )\n"
)

#: the fork's own method (SPEC's first fork): the step's row, the width spelt as a local
OWN_METHOD = """
    def _get_mtp_decode_out_cache_loc(
        self, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        out_cache_loc = forward_batch.out_cache_loc
        if self.topk <= 0 or self.speculative_num_steps <= 1:
            return out_cache_loc
        bs = forward_batch.batch_size
        topk = self.topk
        steps = self.speculative_num_steps
        step_width = bs * topk
        return (
            out_cache_loc.reshape(bs, topk, steps)
            .permute(2, 0, 1)
            .reshape(steps, step_width)[self.speculative_step_id]
        )
"""
#: the fork's own method (OWN_METHOD) with its split one ``self.`` call further down, in ``_mtp_step_rows``
OWN_METHOD_DEEP = """
    def _get_mtp_decode_out_cache_loc(
        self, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        if self.topk <= 0 or self.speculative_num_steps <= 1:
            return forward_batch.out_cache_loc
        return self._mtp_step_rows(forward_batch)[self.speculative_step_id]

    def _mtp_step_rows(self, forward_batch: ForwardBatch) -> torch.Tensor:
        bs = forward_batch.batch_size
        topk = self.topk
        steps = self.speculative_num_steps
        return (
            forward_batch.out_cache_loc.reshape(bs, topk, steps)
            .permute(2, 0, 1)
            .reshape(steps, -1)
        )
"""
#: the fork's own caller split (SPEC's second fork): the multi-step backend hands each step its row
CALLER_SPLIT = """    def init_forward_metadata(self, forward_batch: ForwardBatch):
        step_out_cache_loc = self._split_out_cache_loc_per_step(forward_batch)
        original_out_cache_loc = forward_batch.out_cache_loc
        try:
            for i in range(self.speculative_num_steps - 1):
                if step_out_cache_loc is not None:
                    forward_batch.out_cache_loc = step_out_cache_loc[i]
                self.attn_backends[i].init_forward_metadata(forward_batch)
        finally:
            forward_batch.out_cache_loc = original_out_cache_loc

    def _split_out_cache_loc_per_step(self, forward_batch: ForwardBatch):
        out_cache_loc = forward_batch.out_cache_loc
        if out_cache_loc is None or self.topk <= 0 or self.speculative_num_steps <= 1:
            return None
        num_reqs = forward_batch.batch_size
        topk = self.topk
        steps = self.speculative_num_steps
        return (
            out_cache_loc.reshape(num_reqs, topk, steps)
            .permute(2, 0, 1)
            .reshape(steps, -1)
        )
"""


def edit(tree: Path, relative: str, old: str, new: str, scope: str = "") -> None:
    """Replace the only occurrence of ``old`` in ``tree/sglang/<relative>`` (``scope``: in that ``Class.method``
    only, its decorators and def line included)."""
    path = Path(tree) / "sglang" / relative
    text = path.read_text(encoding="utf-8")
    start, end = _span(text, scope) if scope else (0, len(text))
    part = text[start:end]
    if part.count(old) != 1:
        raise ValueError(f"{path}:{scope}: expected one {old[:60]!r}, found {part.count(old)}")
    path.write_text(text[:start] + part.replace(old, new, 1) + text[end:], encoding="utf-8")


def rename(tree: Path, relative: str, scope: str, name: str, new_name: str) -> None:
    """Rename the local or parameter ``name`` of ``Class.method`` (``scope``) to ``new_name``: every use of it,
    not an attribute (``forward_batch.name``) or a keyword argument (``name=``) of that name."""
    path = Path(tree) / "sglang" / relative
    text = path.read_text(encoding="utf-8")
    start, end = _span(text, scope)
    part, count = re.subn(rf"(?<![.\w]){re.escape(name)}\b(?!=)", new_name, text[start:end])
    if not count:
        raise ValueError(f"{path}:{scope}: no {name!r}")
    path.write_text(text[:start] + part + text[end:], encoding="utf-8")


def _span(text: str, scope: str) -> tuple[int, int]:
    """(start, end) offsets in ``text`` of the method ``Class.method`` (the last class of that name, as Python
    binds it), from its first decorator's line to the end of its last line."""
    cls_name, _, method_name = scope.partition(".")
    cls = [n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == cls_name][-1]
    method = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == method_name)
    lines = text.splitlines(keepends=True)
    first = min([method.lineno] + [d.lineno for d in method.decorator_list])
    return len("".join(lines[: first - 1])), len("".join(lines[: method.end_lineno]))


def _decode_passing(value: str) -> str:
    return DSV4_DECODE.replace("out_cache_loc=forward_batch.out_cache_loc,", f"out_cache_loc={value},")


def dsv4_own_method(tree: Path, method: str = OWN_METHOD) -> None:
    """DeepseekV4AttnBackend passes the step's row from a method of its own (width ``step_width``)."""
    edit(tree, DSV4, DSV4_DECODE, _decode_passing("self._get_mtp_decode_out_cache_loc(forward_batch)"))
    edit(
        tree,
        DSV4,
        "    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:\n",
        method.lstrip("\n") + "\n    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:\n",
    )


def dsv4_own_method_deep(tree: Path) -> None:
    """DeepseekV4AttnBackend passes the step's row from a method of its own that calls another one splitting."""
    dsv4_own_method(tree, OWN_METHOD_DEEP)


#: 0.5.12's def line of DeepseekV4AttnBackend.init_forward_metadata
DSV4_INIT_DEF = "    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:\n"


def dsv4_init_moved(tree: Path) -> None:
    """DeepseekV4AttnBackend.init_forward_metadata calls a method of its own holding the release's body
    (its decode branch, the ``out_cache_loc=`` handoff), as a fork wrapping it would."""
    edit(
        tree,
        DSV4,
        DSV4_INIT_DEF,
        (
            DSV4_INIT_DEF + "        self._init_forward_metadata_impl(forward_batch)\n"
            "\n"
            "    def _init_forward_metadata_impl(self, forward_batch: ForwardBatch) -> None:\n"
        ),
    )


def dsv4_init_moved_deep(tree: Path) -> None:
    """DeepseekV4AttnBackend.init_forward_metadata calls a method of its own that calls another one holding the
    release's body: the ``out_cache_loc=`` handoff two ``self.`` calls deep."""
    edit(
        tree,
        DSV4,
        DSV4_INIT_DEF,
        (
            DSV4_INIT_DEF + "        self._build_forward_metadata(forward_batch)\n"
            "\n"
            "    def _build_forward_metadata(self, forward_batch: ForwardBatch) -> None:\n"
            "        self._init_forward_metadata_impl(forward_batch)\n"
            "\n"
            "    def _init_forward_metadata_impl(self, forward_batch: ForwardBatch) -> None:\n"
        ),
    )


def dsv4_inline_movedim(tree: Path) -> None:
    """DeepseekV4AttnBackend splits inline: ``movedim(-1, 0)`` and the width ``bs * topk``."""
    split = (
        "        if forward_batch.forward_mode.is_decode_or_idle():\n"
        "            out_cache_loc = forward_batch.out_cache_loc\n"
        "            if self.topk > 0 and self.speculative_num_steps > 1:\n"
        "                bs = forward_batch.batch_size\n"
        "                out_cache_loc = (\n"
        "                    out_cache_loc.view(bs, self.topk, self.speculative_num_steps)\n"
        "                    .movedim(-1, 0)\n"
        "                    .reshape(-1, bs * self.topk)[self.speculative_step_id]\n"
        "                )\n"
    )
    edit(tree, DSV4, DSV4_DECODE, _decode_passing("out_cache_loc").replace(DSV4_DECODE.splitlines(True)[0], split))


def dsv4_caller_split(tree: Path) -> None:
    """DeepseekV4MultiStepBackend splits per step itself and sets each step's row on the batch."""
    edit(tree, DSV4, DSV4_MULTI_STEP, CALLER_SPLIT)


#: 0.5.12's per-step batch of EagleDraftWorker.draft_forward (the step's row, the step's backend)
WORKER_STEP = (
    "            forward_batch.out_cache_loc = out_cache_loc[i]\n"
    "            forward_batch.attn_backend = self.draft_attn_backend.attn_backends[i]\n"
)
#: 0.5.12's EagleDraftWorker.__init__ lines after which a fork's own flag goes
WORKER_STEPS_ARG = (
    "        self.device = server_args.device\n"
    "        self.topk = server_args.speculative_eagle_topk\n"
    "        self.speculative_num_steps = server_args.speculative_num_steps\n"
)


def dsv4_worker_split(tree: Path) -> None:
    """EagleDraftWorker.draft_forward inits each DeepSeek-V4 step's backend with the step's row it sets
    (the release's split), DeepseekV4AttnBackend left as released."""
    edit(
        tree,
        WORKER_V2,
        WORKER_STEPS_ARG,
        WORKER_STEPS_ARG
        + (
            "        self.init_draft_metadata_per_step = (\n"
            '            server_args.decode_attention_backend == "dsv4"\n'
            "        )\n"
        ),
    )
    edit(
        tree,
        WORKER_V2,
        WORKER_STEP,
        WORKER_STEP
        + (
            "            if self.init_draft_metadata_per_step:\n"
            "                # DeepSeek-V4 bakes this step's KV write targets: init with its row\n"
            "                forward_batch.attn_backend.init_forward_metadata(forward_batch)\n"
        ),
    )


def dsv4_worker_split_twice(tree: Path) -> None:
    """The worker's per-step rows (``dsv4-worker-split``) and DeepseekV4AttnBackend's own split too."""
    dsv4_worker_split(tree)
    dsv4_inline_movedim(tree)


def worker_transposes(tree: Path) -> None:
    """EagleDraftWorker.draft_forward: two transposes, ``flatten(1)``, locals for topk and steps."""
    edit(
        tree,
        WORKER_V2,
        WORKER_SPLIT,
        (
            "        topk = self.topk\n"
            "        steps = self.speculative_num_steps\n"
            "        out_cache_loc = out_cache_loc.view(forward_batch.batch_size, topk, steps)\n"
            "        out_cache_loc = out_cache_loc.transpose(1, 2).transpose(0, 1).flatten(1)\n"
        ),
    )


def worker_bound_view(tree: Path) -> None:
    """EagleDraftWorker.draft_forward: the 3-d view bound to ``rows``, permuted through it."""
    edit(
        tree,
        WORKER_V2,
        WORKER_SPLIT,
        (
            "        rows = out_cache_loc.reshape(\n"
            "            forward_batch.batch_size, self.topk, self.speculative_num_steps\n"
            "        )\n"
            "        out_cache_loc = rows.permute(2, 0, 1).reshape(self.speculative_num_steps, -1)\n"
        ),
    )


def worker_bound_view_locals(tree: Path) -> None:
    """EagleDraftWorker.draft_forward: locals for topk and steps, the 3-d view and the steps-first rows
    each named apart from the buffer."""
    edit(
        tree,
        WORKER_V2,
        WORKER_SPLIT,
        (
            "        topk = self.topk\n"
            "        steps = self.speculative_num_steps\n"
            "        slots = out_cache_loc.view(forward_batch.batch_size, topk, steps)\n"
            "        step_out_cache_loc = slots.movedim(-1, 0).flatten(1)\n"
        ),
    )
    edit(
        tree,
        WORKER_V2,
        "forward_batch.out_cache_loc = out_cache_loc[i]\n",
        "forward_batch.out_cache_loc = step_out_cache_loc[i]\n",
    )


#: 0.5.12's hot-token map in EagleDraftWorker.draft_forward, right above its split
WORKER_HOT_TOKENS = (
    "        if self.hot_token_id is not None:\n" "            topk_index = self.hot_token_id[topk_index]\n" "\n"
)


def worker_bound_view_apart(tree: Path) -> None:
    """EagleDraftWorker.draft_forward: the 3-d view bound to ``rows`` (a comment above it) ahead of the
    hot-token map, permuted through it after."""
    edit(
        tree,
        WORKER_V2,
        WORKER_HOT_TOKENS + WORKER_SPLIT,
        (
            "        # [bs, topk, steps]: each request's draft slots\n"
            "        rows = out_cache_loc.reshape(\n"
            "            forward_batch.batch_size, self.topk, self.speculative_num_steps\n"
            "        )\n"
            "\n"
            + WORKER_HOT_TOKENS
            + "        out_cache_loc = rows.permute(2, 0, 1).reshape(self.speculative_num_steps, -1)\n"
        ),
    )


def worker_bound_view_read_again(tree: Path) -> None:
    """EagleDraftWorker.draft_forward: the bound 3-d view is read again after its split (each request's
    first branch)."""
    worker_bound_view(tree)
    moved = "        out_cache_loc = rows.permute(2, 0, 1).reshape(self.speculative_num_steps, -1)\n"
    edit(tree, WORKER_V2, moved, moved + "        first_branch_slots = rows[:, 0]\n")


def dsv4_bound_view(tree: Path) -> None:
    """DeepseekV4AttnBackend splits in the decode branch through a bound 3-d view ``rows`` (steps a local:
    black breaks the line inside the step's subscript)."""
    split = (
        "        if forward_batch.forward_mode.is_decode_or_idle():\n"
        "            out_cache_loc = forward_batch.out_cache_loc\n"
        "            if self.topk > 0 and self.speculative_num_steps > 1:\n"
        "                bs = forward_batch.batch_size\n"
        "                steps = self.speculative_num_steps\n"
        "                rows = out_cache_loc.reshape(bs, self.topk, steps)\n"
        "                out_cache_loc = rows.permute(2, 0, 1).reshape(steps, -1)[\n"
        "                    self.speculative_step_id\n"
        "                ]\n"
    )
    edit(tree, DSV4, DSV4_DECODE, _decode_passing("out_cache_loc").replace(DSV4_DECODE.splitlines(True)[0], split))


def dsv4_bound_view_nested(tree: Path) -> None:
    """DeepseekV4AttnBackend binds the 3-d view ``rows`` (a comment above it) ahead of its multi-step
    guard and moves it inside that ``if`` block."""
    split = (
        "        if forward_batch.forward_mode.is_decode_or_idle():\n"
        "            out_cache_loc = forward_batch.out_cache_loc\n"
        "            bs = forward_batch.batch_size\n"
        "            steps = self.speculative_num_steps\n"
        "            # [bs, topk, steps]: each request's draft slots\n"
        "            rows = out_cache_loc.reshape(bs, self.topk, steps)\n"
        "            if steps > 1:\n"
        "                out_cache_loc = rows.permute(2, 0, 1).reshape(steps, -1)[\n"
        "                    self.speculative_step_id\n"
        "                ]\n"
    )
    edit(tree, DSV4, DSV4_DECODE, _decode_passing("out_cache_loc").replace(DSV4_DECODE.splitlines(True)[0], split))


def dsv4_alias_chain(tree: Path) -> None:
    """DeepseekV4AttnBackend splits in the decode branch into ``step_rows``, whose step's row reaches
    ``out_cache_loc=`` through a second local (``step_out_cache_loc``)."""
    split = (
        "        if forward_batch.forward_mode.is_decode_or_idle():\n"
        "            step_out_cache_loc = forward_batch.out_cache_loc\n"
        "            if self.topk > 0 and self.speculative_num_steps > 1:\n"
        "                bs = forward_batch.batch_size\n"
        "                steps = self.speculative_num_steps\n"
        "                step_rows = (\n"
        "                    forward_batch.out_cache_loc.view(bs, self.topk, steps)\n"
        "                    .permute(2, 0, 1)\n"
        "                    .reshape(steps, -1)\n"
        "                )\n"
        "                step_out_cache_loc = step_rows[self.speculative_step_id]\n"
    )
    edit(tree, DSV4, DSV4_DECODE, _decode_passing("step_out_cache_loc").replace(DSV4_DECODE.splitlines(True)[0], split))


#: EagleDraftWorker.draft_forward splitting in two branches: one expression for topk 1, the release's
#: two statements otherwise
WORKER_TWO_SPLITS = (
    "        if self.topk == 1:\n"
    "            out_cache_loc = (\n"
    "                out_cache_loc.view(\n"
    "                    forward_batch.batch_size, self.topk, self.speculative_num_steps\n"
    "                )\n"
    "                .movedim(-1, 0)\n"
    "                .flatten(1)\n"
    "            )\n"
    "        else:\n" + "".join("    " + line for line in WORKER_SPLIT.splitlines(True))
)


def worker_two_splits(tree: Path) -> None:
    """EagleDraftWorker.draft_forward splits in two branches (WORKER_TWO_SPLITS)."""
    edit(tree, WORKER_V2, WORKER_SPLIT, WORKER_TWO_SPLITS)


def dsv4_two_splits(tree: Path) -> None:
    """DeepseekV4AttnBackend splits in two branches of the decode branch, each its own spelling."""
    split = (
        "        if forward_batch.forward_mode.is_decode_or_idle():\n"
        "            out_cache_loc = forward_batch.out_cache_loc\n"
        "            bs = forward_batch.batch_size\n"
        "            if self.topk > 1 and self.speculative_num_steps > 1:\n"
        "                out_cache_loc = (\n"
        "                    out_cache_loc.reshape(bs, self.topk, self.speculative_num_steps)\n"
        "                    .permute(2, 0, 1)\n"
        "                    .reshape(self.speculative_num_steps, -1)[self.speculative_step_id]\n"
        "                )\n"
        "            elif self.speculative_num_steps > 1:\n"
        "                out_cache_loc = (\n"
        "                    out_cache_loc.view(bs, self.topk, self.speculative_num_steps)\n"
        "                    .movedim(-1, 0)\n"
        "                    .flatten(1)[self.speculative_step_id]\n"
        "                )\n"
    )
    edit(tree, DSV4, DSV4_DECODE, _decode_passing("out_cache_loc").replace(DSV4_DECODE.splitlines(True)[0], split))


# -- plausible fork edits where a rewrite read off the syntax alone would change the rows (issue 26) --

#: 0.5.12's DeepseekV4AttnBackend.init_forward_metadata_decode, up to its shape assert
DSV4_DECODE_CALLEE = (
    "    ) -> Union[DSV4Metadata, DSV4RawDecodeMetadata]:\n"
    "        assert (\n"
    "            req_pool_indices.shape[0] == seq_lens.shape[0] == out_cache_loc.shape[0]\n"
)


def worker_minus_one(tree: Path) -> None:
    """EagleDraftWorker.draft_forward's split with ``-1`` for the batch (it infers the sequence count)."""
    edit(tree, WORKER_V2, WORKER_SPLIT, WORKER_SPLIT.replace("forward_batch.batch_size,", "-1,"))


def worker_2d_buffer(tree: Path) -> None:
    """EagleDraftWorker.draft_forward views the buffer as [bs * topk, steps] first, then splits it."""
    edit(
        tree,
        WORKER_V2,
        WORKER_SPLIT,
        ("        out_cache_loc = out_cache_loc.view(-1, self.speculative_num_steps)\n" + WORKER_SPLIT),
    )


def dsv4_inline_minus_one(tree: Path) -> None:
    """DeepseekV4AttnBackend's own split inline, with ``-1`` for the batch."""
    split = (
        "forward_batch.out_cache_loc.reshape(-1, self.topk, self.speculative_num_steps)"
        ".permute(2, 0, 1).reshape(self.speculative_num_steps, -1)[self.speculative_step_id]"
    )
    edit(tree, DSV4, DSV4_DECODE, _decode_passing(split))


def dsv4_caller_minus_one(tree: Path) -> None:
    """The caller split (``dsv4-caller-split``) with ``-1`` for the batch."""
    edit(
        tree, DSV4, DSV4_MULTI_STEP, CALLER_SPLIT.replace("reshape(num_reqs, topk, steps)", "reshape(-1, topk, steps)")
    )


def dsv4_callee_split(tree: Path) -> None:
    """DeepseekV4AttnBackend splits in ``init_forward_metadata_decode``, where 0.5.12's shape assert points."""
    edit(
        tree,
        DSV4,
        DSV4_DECODE_CALLEE,
        DSV4_DECODE_CALLEE.replace(
            "        assert (\n",
            (
                "        if self.topk > 0 and self.speculative_num_steps > 1:\n"
                "            out_cache_loc = out_cache_loc.reshape(\n"
                "                -1, self.topk, self.speculative_num_steps\n"
                "            ).permute(2, 0, 1)[self.speculative_step_id].reshape(-1)\n"
                "        assert (\n"
            ),
            1,
        ),
    )


#: the caller split's own method (``CALLER_SPLIT``), put in a mixin of the multi-step backend
MIXIN = "class _PerStepOutCacheLocMixin:\n" + CALLER_SPLIT + "\n\n"
MULTI_STEP_CLASS = "class DeepseekV4MultiStepBackend(DeepseekV4AttnBackend):\n"


def dsv4_caller_split_mixin(tree: Path) -> None:
    """The caller split moved into a mixin that DeepseekV4MultiStepBackend inherits."""
    edit(tree, DSV4, DSV4_MULTI_STEP, "")
    edit(
        tree,
        DSV4,
        MULTI_STEP_CLASS,
        MIXIN + "class DeepseekV4MultiStepBackend(_PerStepOutCacheLocMixin, DeepseekV4AttnBackend):\n",
    )


def dsv4_caller_split_super(tree: Path) -> None:
    """DeepseekV4MultiStepBackend's own init_forward_metadata calls ``super()``, the mixin's split."""
    edit(
        tree,
        DSV4,
        DSV4_MULTI_STEP,
        (
            "    def init_forward_metadata(self, forward_batch: ForwardBatch):\n"
            "        super().init_forward_metadata(forward_batch)\n"
        ),
    )
    edit(
        tree,
        DSV4,
        MULTI_STEP_CLASS,
        MIXIN + "class DeepseekV4MultiStepBackend(_PerStepOutCacheLocMixin, DeepseekV4AttnBackend):\n",
    )


def dsv4_caller_split_base_call(tree: Path) -> None:
    """DeepseekV4MultiStepBackend calls the mixin's split explicitly: ``Mixin.init_forward_metadata(self, ...)``."""
    edit(
        tree,
        DSV4,
        DSV4_MULTI_STEP,
        (
            "    def init_forward_metadata(self, forward_batch: ForwardBatch):\n"
            "        _PerStepOutCacheLocMixin.init_forward_metadata(self, forward_batch)\n"
        ),
    )
    edit(
        tree,
        DSV4,
        MULTI_STEP_CLASS,
        MIXIN + "class DeepseekV4MultiStepBackend(_PerStepOutCacheLocMixin, DeepseekV4AttnBackend):\n",
    )


#: 0.5.12's construction of each step's backend in DeepseekV4MultiStepBackend.__init__
DSV4_STEP_BUILT = "            self.attn_backends.append(\n                DeepseekV4AttnBackend(\n"


def dsv4_step_subclass_split(tree: Path) -> None:
    """Each step's backend is a subclass that sets its own row on the batch, then calls ``super()``."""
    edit(tree, DSV4, DSV4_STEP_BUILT, DSV4_STEP_BUILT.replace("DeepseekV4AttnBackend(", "DeepseekV4StepBackend("))
    edit(
        tree,
        DSV4,
        MULTI_STEP_CLASS,
        (
            "class DeepseekV4StepBackend(DeepseekV4AttnBackend):\n"
            "    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:\n"
            "        whole = forward_batch.out_cache_loc\n"
            "        forward_batch.out_cache_loc = whole.reshape(\n"
            "            forward_batch.batch_size, self.topk, self.speculative_num_steps\n"
            "        ).permute(2, 0, 1)[self.speculative_step_id].flatten()\n"
            "        try:\n"
            "            super().init_forward_metadata(forward_batch)\n"
            "        finally:\n"
            "            forward_batch.out_cache_loc = whole\n\n\n" + MULTI_STEP_CLASS
        ),
    )


FLASHINFER = "srt/layers/attention/flashinfer_backend.py"
#: 0.5.12's FlashInferMultiStepDraftBackend.init_cuda_graph_state def line and its narrow row
FLASHINFER_GRAPH_STATE = (
    "    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):\n"
    "        self.cuda_graph_kv_indices = torch.zeros(\n"
    "            (self.speculative_num_steps, max_bs * self.max_context_len),\n"
)


def graph_width_defined_twice(tree: Path) -> None:
    """FlashInferMultiStepDraftBackend defines init_cuda_graph_state a second time below (the one Python keeps)."""
    path = Path(tree) / "sglang" / FLASHINFER
    text = path.read_text(encoding="utf-8")
    start = text.index(FLASHINFER_GRAPH_STATE)
    end = text.index("\n    def ", start + 1)
    method = text[start:end]
    later = text.index("\n    def ", end + 1)
    path.write_text(
        text[:later]
        + "\n"
        + method.replace("dtype=torch.int32,", "dtype=torch.int32,  # the fork's second definition")
        + text[later:],
        encoding="utf-8",
    )


def _caller_rows(rows: str, step_row: str = "step_out_cache_loc[i]") -> str:
    return CALLER_SPLIT.replace(
        "        return (\n            out_cache_loc.reshape(num_reqs, topk, steps)\n"
        "            .permute(2, 0, 1)\n            .reshape(steps, -1)\n        )\n",
        rows,
    ).replace("forward_batch.out_cache_loc = step_out_cache_loc[i]", f"forward_batch.out_cache_loc = {step_row}")


def dsv4_caller_chunk(tree: Path) -> None:
    """The caller hands step i ``torch.chunk``'s i-th piece of the buffer (step-major pieces, not the layout)."""
    edit(tree, DSV4, DSV4_MULTI_STEP, _caller_rows("        return out_cache_loc.chunk(steps)\n"))


def dsv4_caller_first_row(tree: Path) -> None:
    """The caller hands every step row 0."""
    edit(
        tree,
        DSV4,
        DSV4_MULTI_STEP,
        CALLER_SPLIT.replace(
            "forward_batch.out_cache_loc = step_out_cache_loc[i]", "forward_batch.out_cache_loc = step_out_cache_loc[0]"
        ),
    )


def dsv4_caller_topk_only(tree: Path) -> None:
    """The caller splits only for topk > 1 (DeepSeek-V4's MTP runs topk 1): at topk 1 it hands the whole buffer."""
    edit(
        tree,
        DSV4,
        DSV4_MULTI_STEP,
        CALLER_SPLIT.replace(
            "if out_cache_loc is None or self.topk <= 0 or self.speculative_num_steps <= 1:",
            "if out_cache_loc is None or self.topk <= 1 or self.speculative_num_steps <= 1:",
        ),
    )


def dsv4_caller_next_row(tree: Path) -> None:
    """The caller hands step i the next step's row."""
    edit(
        tree,
        DSV4,
        DSV4_MULTI_STEP,
        CALLER_SPLIT.replace(
            "forward_batch.out_cache_loc = step_out_cache_loc[i]",
            "forward_batch.out_cache_loc = step_out_cache_loc[i + 1]",
        ),
    )


def worker_view_suppress(tree: Path) -> None:
    """EagleDraftWorker.draft_forward moves its bound 3-d view under ``contextlib.suppress``."""
    edit(
        tree,
        WORKER_V2,
        WORKER_SPLIT,
        (
            "        rows = out_cache_loc.reshape(\n"
            "            forward_batch.batch_size, self.topk, self.speculative_num_steps\n"
            "        )\n"
            "        with contextlib.suppress(RuntimeError):\n"
            "            out_cache_loc = rows.permute(2, 0, 1).reshape(self.speculative_num_steps, -1)\n"
        ),
    )


def worker_view_nonlocal(tree: Path) -> None:
    """Between the bound 3-d view and its move, a local function rebinds the buffer through ``nonlocal``."""
    edit(
        tree,
        WORKER_V2,
        WORKER_SPLIT,
        (
            "        rows = out_cache_loc.reshape(\n"
            "            forward_batch.batch_size, self.topk, self.speculative_num_steps\n"
            "        )\n"
            "\n"
            "        def keep_first_row():\n"
            "            nonlocal rows\n"
            "            rows = rows[:1]\n"
            "\n"
            "        keep_first_row()\n"
            "        out_cache_loc = rows.permute(2, 0, 1).reshape(self.speculative_num_steps, -1)\n"
        ),
    )


DSV4_OWN_MODULE = "srt/layers/attention/deepseek_v4_fork_backend.py"
#: a DeepSeek-V4 module of the fork's own: a per-step subclass (its ``init_forward_metadata`` appended) and the
#: multi-step subclass building one per step
DSV4_OWN_MODULE_HEAD = """from __future__ import annotations

import torch

from sglang.srt.layers.attention.deepseek_v4_backend import (
    SWA_WINDOW,
    DeepseekV4AttnBackend,
    DeepseekV4MultiStepBackend,
)
from sglang.srt.model_executor.forward_batch_info import ForwardBatch


class DeepseekV4MultiStepForkBackend(DeepseekV4MultiStepBackend):
    def __init__(self, model_runner, topk: int, speculative_num_steps: int):
        super().__init__(model_runner, topk, speculative_num_steps)
        self.attn_backends = [
            DeepseekV4StepForkBackend(
                model_runner,
                speculative_step_id=i,
                topk=self.topk,
                speculative_num_steps=self.speculative_num_steps,
            )
            for i in range(self.speculative_num_steps)
        ]


class DeepseekV4StepForkBackend(DeepseekV4AttnBackend):
"""


def dsv4_subclass_own_module(tree: Path) -> None:
    """A module of the fork's own: a DeepseekV4AttnBackend subclass whose init_forward_metadata is the release's
    (each step bakes the whole buffer: the bug), built per step by a DeepseekV4MultiStepBackend subclass."""
    text = (Path(tree) / "sglang" / DSV4).read_text(encoding="utf-8")
    start, end = _span(text, "DeepseekV4AttnBackend.init_forward_metadata")
    path = Path(tree) / "sglang" / DSV4_OWN_MODULE
    path.write_text(DSV4_OWN_MODULE_HEAD + text[start:end].rstrip("\n") + "\n", encoding="utf-8")


WORKER_OWN_MODULE = "srt/speculative/eagle_worker_v2_fork.py"


def worker_subclass_own_module(tree: Path) -> None:
    """A module of the fork's own: an EagleDraftWorker subclass whose draft_forward is the release's with the
    buffer split step-major (``reshape(steps, -1)``: other rows than upstream's)."""
    text = (Path(tree) / "sglang" / WORKER_V2).read_text(encoding="utf-8")
    start, end = _span(text, "EagleDraftWorker.draft_forward")
    method = text[start:end].replace(
        WORKER_SPLIT, "        out_cache_loc = out_cache_loc.reshape(self.speculative_num_steps, -1)\n"
    )
    head = text[: text.index("\nclass ")]  # the release module's imports and module-level names
    path = Path(tree) / "sglang" / WORKER_OWN_MODULE
    path.write_text(
        head + "\nfrom sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker\n\n\n"
        "class EagleDraftForkWorker(EagleDraftWorker):\n" + method.rstrip("\n") + "\n",
        encoding="utf-8",
    )


#: 0.5.12's FlashInferMultiStepDraftBackend.common_template kernel launch
FLASHINFER_LAUNCH = "        self.generate_draft_decode_kv_indices[\n"


def flashinfer_strict_capacity_check(tree: Path) -> None:
    """FlashInfer's rows cherry-picked wide, with a capacity check of the fork's own that stops a row exactly as wide
    as the kernel fills (``<``: stricter than upstream's)."""
    edit(tree, FLASHINFER, FLASHINFER_LAUNCH,
         "        required = seq_lens_sum * self.topk + bs * self.speculative_num_steps\n"
         "        assert required < kv_indices_buffer.shape[1], f\"kv_indices row too small: {required}\"\n\n"
         + FLASHINFER_LAUNCH, "FlashInferMultiStepDraftBackend.common_template")  # fmt: skip
    edit(tree, FLASHINFER, "max_bs * self.max_context_len),", "max_bs * self.topk * self.max_context_len),",
         "FlashInferMultiStepDraftBackend.init_cuda_graph_state")  # fmt: skip


#: issue 26's forks: the rewrite must be proven (patched, the rows upstream's) or refused
PROOF_FORKS: Dict[str, Callable[[Path], None]] = {
    "worker-minus-one": worker_minus_one,
    "worker-2d-buffer": worker_2d_buffer,
    "dsv4-inline-minus-one": dsv4_inline_minus_one,
    "dsv4-caller-minus-one": dsv4_caller_minus_one,
    "dsv4-callee-split": dsv4_callee_split,
    "dsv4-caller-split-mixin": dsv4_caller_split_mixin,
    "dsv4-caller-split-super": dsv4_caller_split_super,
    "dsv4-caller-split-base-call": dsv4_caller_split_base_call,
    "dsv4-step-subclass-split": dsv4_step_subclass_split,
    "graph-width-defined-twice": graph_width_defined_twice,
    "dsv4-caller-chunk": dsv4_caller_chunk,
    "dsv4-caller-first-row": dsv4_caller_first_row,
    "dsv4-caller-topk-only": dsv4_caller_topk_only,
    "dsv4-caller-next-row": dsv4_caller_next_row,
    "worker-view-suppress": worker_view_suppress,
    "worker-view-nonlocal": worker_view_nonlocal,
    "dsv4-subclass-own-module": dsv4_subclass_own_module,
    "worker-subclass-own-module": worker_subclass_own_module,
    "flashinfer-strict-capacity-check": flashinfer_strict_capacity_check,
}


FORKS: Dict[str, Callable[[Path], None]] = {
    "dsv4-own-method": dsv4_own_method,
    "dsv4-inline-movedim": dsv4_inline_movedim,
    "dsv4-init-moved": dsv4_init_moved,
    "dsv4-init-moved-deep": dsv4_init_moved_deep,
    "dsv4-own-method-deep": dsv4_own_method_deep,
    "dsv4-caller-split": dsv4_caller_split,
    "dsv4-worker-split": dsv4_worker_split,
    "dsv4-worker-split-twice": dsv4_worker_split_twice,
    "worker-transposes": worker_transposes,
    "worker-bound-view": worker_bound_view,
    "worker-bound-view-locals": worker_bound_view_locals,
    "worker-bound-view-apart": worker_bound_view_apart,
    "worker-bound-view-read-again": worker_bound_view_read_again,
    "dsv4-bound-view": dsv4_bound_view,
    "dsv4-bound-view-nested": dsv4_bound_view_nested,
    "dsv4-alias-chain": dsv4_alias_chain,
    "worker-two-splits": worker_two_splits,
    "dsv4-two-splits": dsv4_two_splits,
    **PROOF_FORKS,
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("fork", choices=sorted(FORKS))
    parser.add_argument(
        "dest",
        type=Path,
        help="a folder holding sglang/ (a fork checkout's python/), "
        "copied from this Python's sglang when it holds none",
    )
    args = parser.parse_args(argv)
    if not (args.dest / "sglang").is_dir():
        spec = importlib.util.find_spec("sglang")
        if spec is None or not spec.submodule_search_locations:
            parser.error("no sglang/ in DEST and none importable to copy")
        shutil.copytree(
            list(spec.submodule_search_locations)[0], args.dest / "sglang", ignore=shutil.ignore_patterns("__pycache__")
        )
    FORKS[args.fork](args.dest)
    print(f"{args.dest / 'sglang'}: {args.fork} ({FORKS[args.fork].__doc__.splitlines()[0]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
