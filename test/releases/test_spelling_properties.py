"""Fork spellings of the real 0.5.12 call sites, drawn by hypothesis: `apply` never leaves a wrong draft path.

Each example rewrites one site of a scratch copy of the real 0.5.12 tree the way a fork might (issue 39,
item 6): the same values in another spelling (renamed locals, operands commuted, ``1 + i``, parentheses,
another line breaking, ``movedim`` for ``permute``, a guard, a method or a local of its own standing in for
a helper, a local named like a helper) or other values (a slice end off by one, the topk factor dropped, a
wider row, a weaker capacity check, a split missing, twice, or of the wrong axes). Then ``apply`` runs, and:

- exit 2 writes nothing;
- exit 0 leaves a tree whose every draft path, run by the harness with real torch
  (``harness.torch_backend``) on probes of this test's own (``PROBES``: other batch sizes, topk and steps
  than the ones ``check`` judges on), gives upstream's values: each step's write target is upstream's
  row, split once; each kv_indices row is ``bs * topk * ctx`` wide; step i's slice ends at
  ``draft_kv_indices_used_len(..., i + 1)``; the capacity check stops a row narrower than the kernel
  fills;
- a spelling of the release's own values in a form docs/sites.md ("How a site is recognised") says the
  rules recognise is patched (exit 0).

What ``apply`` did with each drawn spelling is an ``event`` (``--hypothesis-show-statistics``). Few examples
run in CI (``EXAMPLES``, derandomized); ``SGLANG_DRAFT_LAYOUT_SPELLINGS=<n>`` draws n per test instead, and with
``SGLANG_DRAFT_LAYOUT_SPELLINGS_SEEDED=1`` other draws, hypothesis's seed (``--hypothesis-seed``) choosing them.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
from hypothesis import Phase, event, example, given, note, settings, strategies as st
from sglang_draft_layout import cli
from sglang_draft_layout.harness import invariant, judged
from sglang_draft_layout.harness.invariant import GUARDED, guarded_modules
from sglang_draft_layout.harness.judged import judge_tree
from sglang_draft_layout.harness.paths import Probe
from sglang_draft_layout.harness.torch_backend import FACADE
from sglang_draft_layout.rules.draft_backends import DRAFT_BACKENDS, DraftBackend
from support import fork_edits
from test_releases import tree_digest

pytestmark = pytest.mark.releases

EXAMPLES = int(os.environ.get("SGLANG_DRAFT_LAYOUT_SPELLINGS", "4"))
#: no shrinking: each example patches a tree (seconds), and its label already says what it is
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None,
                    derandomize=os.environ.get("SGLANG_DRAFT_LAYOUT_SPELLINGS_SEEDED") != "1",
                    phases=(Phase.explicit, Phase.generate))  # fmt: skip

#: the yardstick's probes (``check`` judges on ``harness.paths.PROBES``): more sequences, other topk and steps
PROBES = (Probe(5, 1, 3), Probe(5, 3, 2), Probe(2, 5, 4), Probe(3, 2, 6), Probe(1, 1, 1))


#: the draft paths of 0.5.12 (every multi-step backend launching the kernel, DeepSeek-V4's, both workers): each
#: must still be found in a fork's tree, or its values would go unjudged
PATHS = {
    "srt/layers/attention/aiter_backend.py: AiterMultiStepDraftBackend",
    "srt/layers/attention/deepseek_v4_backend.py: DeepseekV4MultiStepBackend",
    "srt/layers/attention/flashinfer_backend.py: FlashInferMultiStepDraftBackend",
    "srt/layers/attention/flashinfer_mla_backend.py: FlashInferMLAMultiStepDraftBackend",
    "srt/layers/attention/triton_backend.py: TritonMultiStepDraftBackend",
    "srt/speculative/eagle_worker.py: EAGLEWorker",
    "srt/speculative/eagle_worker_v2.py: EagleDraftWorker",
}


# -- the yardstick -------------------------------------------------------------------------------------------
def not_upstream(package: Path) -> dict[str, str]:
    """``module: Class`` -> why, of each draft path of the tree that does not give upstream's values on
    ``PROBES`` with real torch (or shows no layout, or cannot be run there), and of each of 0.5.12's ``PATHS``
    no longer found."""
    modules = guarded_modules(package)
    texts = {m: (package / m).read_text(encoding="utf-8") for m in modules}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(invariant, "PROBES", PROBES)
        patch.setattr(judged, "_JUDGED", {})  # judged afresh: not check's verdicts on its own probes
        found = judge_tree(package, FACADE, texts, [m for m, t in texts.items() if "speculative_num_steps" in t])
    lost = {path: "no longer found as a draft path" for path in PATHS - {str(path) for path in found}}
    return lost | {str(path): verdict.cannot or "; ".join(verdict.problems[:3]) or "no layout on the probes"
                   for path, verdict in found.items() if not verdict.upstream}  # fmt: skip


@pytest.fixture(scope="module")
def fresh(pristine, tmp_path_factory):
    """fresh() -> the same folder each time, holding a new copy of the 0.5.12 tree."""
    root = tmp_path_factory.mktemp("spelling") / "fork"

    def copy(source: str, dest: str) -> str:  # the files apply may write copied, the others linked (fast)
        if any(f"/{folder}/" in source for folder in GUARDED):
            return shutil.copy2(source, dest)
        os.link(source, dest)
        return dest

    def get() -> Path:
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(pristine("0.5.12"), root, copy_function=copy)
        return root

    return get


def test_the_patched_release_gives_upstreams_values_on_the_yardsticks_probes(fresh):
    """The yardstick itself: every draft path of 0.5.12 after `apply` is upstream's on PROBES; before, the
    bugs show (the narrow FlashInfer rows, DeepSeek-V4's whole buffer) and nothing else."""
    root = fresh()
    before = not_upstream(root / "sglang")
    assert sorted(before) == [
        "srt/layers/attention/deepseek_v4_backend.py: DeepseekV4MultiStepBackend",
        "srt/layers/attention/flashinfer_backend.py: FlashInferMultiStepDraftBackend",
        "srt/layers/attention/flashinfer_mla_backend.py: FlashInferMLAMultiStepDraftBackend",
    ]
    dsv4, flashinfer, mla = (before[path] for path in sorted(before))
    assert "eager: raises AssertionError" in dsv4 and "out_cache_loc.shape=torch.Size([15])" in dsv4  # 5 x 1 x 3
    assert (
        "bs 5, topk 3, 2 steps: capture (max bs 6): kv_indices rows (2, 384) (row stride 384); upstream's (2, 1152)"
        in flashinfer
    )
    assert "without a capacity check" in flashinfer and "without a capacity check" in mla
    assert apply(root)[0] == 0
    assert not_upstream(root / "sglang") == {}


# -- a spelling and what apply does with it --------------------------------------------------------------------
@dataclass(frozen=True)
class Spelling:
    """One fork's edit of the 0.5.12 tree: ``label`` says what it is; ``same`` when it computes the release's
    own values at every shape (where the release has no such code, a capacity check or DeepSeek-V4's split of
    its own: when it computes upstream's); ``recognised`` when docs/sites.md says the rules recognise that form."""

    label: str
    edit: Callable[[Path], None]
    same: bool
    recognised: bool = False


def apply(root: Path) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["apply", "--no-tests", "-q", str(root)])
    return code, err.getvalue()


def never_a_wrong_patch(fresh, spelling: Spelling) -> int:
    root = fresh()
    spelling.edit(root)
    note(spelling.label)
    before = tree_digest(root)
    code, err = apply(root)
    why = err.partition("error: ")[2].partition("; keep the fork's code")[0].replace(f"{root}/sglang/", "")
    event(f"patched: {spelling.label}" if code == 0 else f"refused: {spelling.label} -> {why[:160]}")
    note(err)
    assert code in (0, 2), err
    if code == 2:
        assert tree_digest(root) == before, "refused, yet files were written"
        assert not spelling.recognised, f"a recognised spelling of the release's values refused: {err}"
        return code
    assert not_upstream(root / "sglang") == {}, "apply exited 0 on a tree that gives other values than upstream's"
    return code


# -- the spellings ---------------------------------------------------------------------------------------------
def R(text: str) -> tuple[str, bool, bool]:
    """A part of the release's values, in a form docs/sites.md says the rules recognise."""
    return text, True, True


def S(text: str) -> tuple[str, bool, bool]:
    """A part of the release's values, in a form the docs do not name."""
    return text, True, False


def O(text: str) -> tuple[str, bool, bool]:  # noqa: E743
    """A part giving other values than the release's."""
    return text, False, False


class Drawn:
    """The parts drawn for one spelling: whether all are the release's values, and all recognised; its label.
    At most one part gives other values (``deviate_at``: which of the site's ``deviations`` picks offering
    some), so that about half the spellings keep the release's values and the others differ in one place."""

    def __init__(self, draw: Callable, site: str, deviations: int) -> None:
        self.draw, self.same, self.recognised, self.words = draw, True, True, [site]
        self.deviate_at, self.picks = draw(st.one_of(st.none(), st.integers(0, deviations - 1))), 0

    def pick(self, options: list[tuple], shown: bool = False):
        if any(not same for _value, same, _recognised in options):
            deviate, self.picks = self.picks == self.deviate_at, self.picks + 1
            options = [option for option in options if option[1] != deviate] or options
        value, same, recognised = self.draw(st.sampled_from(options))
        self.same, self.recognised = self.same and same, self.recognised and recognised
        if shown and value:
            self.words.append(str(value))
        return value

    def spelling(self, edit: Callable[[Path], None]) -> Spelling:
        return Spelling(" | ".join(word for word in self.words if word), edit, self.same, self.recognised)


def edits(*steps: Callable[[Path], None]) -> Callable[[Path], None]:
    def run(root: Path) -> None:
        for step in steps:
            step(root)

    return run


def edit(relative: str, scope: str, old: str, new: str) -> Callable[[Path], None]:
    return lambda root: fork_edits.edit(root, relative, old, new, scope)


def rename(relative: str, scope: str, pairs: tuple[str, ...]) -> Callable[[Path], None]:
    """Each ``"old -> new"`` of ``pairs``: a local or parameter of ``scope`` renamed."""
    return lambda root: [fork_edits.rename(root, relative, scope, *pair.split(" -> ")) for pair in pairs]


def method(relative: str, cls: str, before: str, text: str) -> Callable[[Path], None]:
    """Put the method ``text`` in ``cls`` above its method ``before``."""
    def_line = f"    def {before}("
    return edit(relative, f"{cls}.{before}", def_line, text + "\n" + def_line)


SLICE = (
    "            forward_batch.spec_info.kv_indices = kv_indices_buffer[i][\n                : {end}\n            ]\n"
)
SLICES = {
    "as released": SLICE,
    "on one line": "            forward_batch.spec_info.kv_indices = kv_indices_buffer[i][: {end}]\n",
    "a comment between its lines": SLICE.replace("[\n", "[\n                # what steps 0..i fill\n"),
    "its row bound to a local": (
        "            row = kv_indices_buffer[i]\n            forward_batch.spec_info.kv_indices = row[: {end}]\n"
    ),
    "a method of its own": SLICE.format(end="self._used_len(seq_lens_sum, bs, i)"),
    "a lambda named like the helper": SLICE.format(end="draft_kv_indices_used_len(i)"),
    "a local named like the helper": "            draft_kv_indices_used_len = {end}\n"
    + SLICE.format(end="draft_kv_indices_used_len"),
}
LOOP = "        for i in range(self.speculative_num_steps - 1):\n"
RELEASE_END = "seq_lens_sum * self.topk + bs * (i + 1)"


def used_len(d: Drawn) -> str:
    """A slice end: ``seq_lens_sum * self.topk + bs * (i + 1)`` in a drawn spelling, or a value of its own."""
    steps = d.pick([R("i + 1"), S("1 + i"), O("i + 2"), O("i")])
    prefix = d.pick([R("seq_lens_sum * self.topk"), R("self.topk * seq_lens_sum"), R("(seq_lens_sum * self.topk)"),
                     O("seq_lens_sum")])  # fmt: skip
    drafted = d.pick([R("bs * ({})"), R("({}) * bs"), R("(bs * ({}))"), O("num_seqs * ({})")]).format(steps)
    end = d.pick([R("{a} + {b}"), S("{b} + {a}"), O("{a} + {b} + 1"), O("{a} + {b} - 1")]).format(a=prefix, b=drafted)
    d.words.append(f"`{end}`")
    return end


#: a fork's branch for batches larger than any of check's base probes (harness.paths.PROBES: 3 sequences at most;
#: harness.paths.past gives the probes run where such an ``if`` went one way on them)
MANY = "{} > 4"


def branch(condition: str, taken: str, otherwise: str = "") -> str:
    """``if condition: taken else: otherwise`` (no ``else`` without it), the blocks (lines at the statement's
    indent) indented."""
    indent = taken[: len(taken) - len(taken.lstrip())]
    deeper = lambda block: "".join("    " + line for line in block.splitlines(True))  # noqa: E731
    return f"{indent}if {condition}:\n{deeper(taken)}" + (f"{indent}else:\n{deeper(otherwise)}" if otherwise else "")


@st.composite
def step_slices(draw: Callable) -> Spelling:
    """``common_template``'s per-step slice, as a fork spells it."""
    backend = draw(st.sampled_from(DRAFT_BACKENDS))
    d, scope = Drawn(draw, f"step slice, {backend.name}", 8), f"{backend.cls}.common_template"
    end = used_len(d)
    form = d.pick([R("as released"), R("on one line"), R("a comment between its lines"), S("its row bound to a local"),
                   S("a method of its own"), S("a lambda named like the helper"), S("a local named like the helper"),
                   S("another slice for more than 4 sequences")], shown=True)  # fmt: skip
    if form == "another slice for more than 4 sequences":
        new = branch(MANY.format("num_seqs"), SLICE.format(end=used_len(d)), SLICE.format(end=end))
    else:
        new = SLICES[form].format(end=end)
    steps_edit = edit(backend.file, scope, SLICE.format(end=RELEASE_END), new)
    if form == "a method of its own":
        own = f"    def _used_len(self, seq_lens_sum, bs, i):\n        return {end}\n"
        steps_edit = edits(steps_edit, method(backend.file, backend.cls, "common_template", own))
    elif form == "a lambda named like the helper":
        lambda_ = f"        draft_kv_indices_used_len = lambda i: {end}\n"
        steps_edit = edits(steps_edit, edit(backend.file, scope, LOOP, lambda_ + LOOP))
    names = d.pick([R(()), R(("seq_lens_sum -> total_len",)), R(("bs -> num_draft_tokens",)),
                    R(("kv_indices_buffer -> rows",))])  # fmt: skip
    d.words += names
    return d.spelling(edits(steps_edit, rename(backend.file, scope, names)))


def draft_backend(name: str) -> DraftBackend:
    return next(b for b in DRAFT_BACKENDS if b.name == name)


#: found by ``step_slices`` (50 draws, hypothesis seed 7, before the rule's fix): apply exited 0, and the Triton
#: backend's slice for more than 4 sequences, left as the fork wrote it, read one entry past upstream's used
#: length at bs 5 (the step slice rule patched the slice the probes run and never looked at the other)
SLICE_FOR_LARGER_BATCHES = Spelling(
    "step slice, triton | `seq_lens_sum * self.topk + bs * (i + 1)` | another slice for more than 4 sequences"
    " | `seq_lens_sum * self.topk + (bs * (1 + i)) + 1` | kv_indices_buffer -> rows",
    edits(
        edit(draft_backend("triton").file, "TritonMultiStepDraftBackend.common_template", SLICE.format(end=RELEASE_END),
             branch(MANY.format("num_seqs"), SLICE.format(end="seq_lens_sum * self.topk + (bs * (1 + i)) + 1"),
                    SLICE.format(end=RELEASE_END))),
        rename(draft_backend("triton").file, "TritonMultiStepDraftBackend.common_template",
               ("kv_indices_buffer -> rows",)),
    ),
    same=False,
)  # fmt: skip


@given(step_slices())
@example(SLICE_FOR_LARGER_BATCHES)
@SETTINGS
def test_a_forks_step_slice_is_patched_right_or_refused(fresh, spelling):
    never_a_wrong_patch(fresh, spelling)


EAGER_WIDTH = "forward_batch.batch_size * self.topk * self.max_context_len"
ALLOCATION = "        kv_indices = torch."


def product(d: Drawn, factors: list[str]) -> str:
    """The factors in a drawn order and grouping (a product's factors in any order, any parentheses: recognised)."""
    order = d.draw(st.permutations(factors))
    if len(order) < 3:
        return " * ".join(order)
    return d.pick([R("{} * {} * {}"), R("({} * {}) * {}"), R("{} * ({} * {})")]).format(*order)


def eager_width(d: Drawn, batch: str) -> str:
    """``batch * self.topk * self.max_context_len`` in a drawn spelling, the topk factor dropped (the bug), or a
    width of its own."""
    factors = [batch, "self.topk", "self.max_context_len"]
    changed = d.pick([R(""), O("the topk factor dropped"), O("a row one token longer"), O("twice as wide")])
    if changed == "the topk factor dropped":
        factors.remove("self.topk")
    elif changed == "a row one token longer":
        factors[2] = "(self.max_context_len + 1)"
    width = product(d, factors) + (" * 2" if changed == "twice as wide" else "")
    d.words += [f"`{width}`", changed]
    return width


#: what a fork puts where a row width was: the width itself, or a local bound above the allocation
WIDTH_FORMS = [R("inline"), S("bound to `width`"), S("bound to `draft_kv_indices_buffer_width`"),
               S("bound to `width` in a branch for more than 4 sequences"),
               S("another allocation for more than 4 sequences")]  # fmt: skip


def width_edits(d: Drawn, relative: str, scope: str, release: str, allocation: str, after: str, many: str,
                width: str, other: Callable[[], str], rows: str) -> Callable[[Path], None]:  # fmt: skip
    """The drawn width form's edits of the allocation of ``rows`` (``release``: its width as released;
    ``allocation``: the line it starts with; ``after``: the line after it; ``many``: the batch, in a branch)."""
    form = d.pick(WIDTH_FORMS, shown=True)
    if form == "inline":
        return edit(relative, scope, release, width)
    if form == "another allocation for more than 4 sequences":
        again = f"        {rows} = torch.zeros((self.speculative_num_steps, {other()}), dtype=torch.int32)\n"
        return edits(edit(relative, scope, release, width),
                     edit(relative, scope, after, branch(MANY.format(many), again) + after))  # fmt: skip
    local = form.split("`")[1]
    bound = f"        {local} = {width}\n"
    if "branch" in form:
        bound = branch(MANY.format(many), f"        {local} = {other()}\n", bound)
    return edits(edit(relative, scope, release, local), edit(relative, scope, allocation, bound + allocation))


@st.composite
def eager_widths(draw: Callable) -> Spelling:
    """``init_forward_metadata``'s row width, as a fork spells it."""
    backend = draw(st.sampled_from(DRAFT_BACKENDS))
    d, scope = Drawn(draw, f"eager width, {backend.name}", 2), f"{backend.cls}.init_forward_metadata"
    batch = d.pick([R("forward_batch.batch_size"), S("num_seqs")])
    width = eager_width(d, batch)
    rows = width_edits(d, backend.file, scope, EAGER_WIDTH, ALLOCATION, "        def call_fn(i, forward_batch):\n",
                       "forward_batch.batch_size", width, lambda: eager_width(d, batch), "kv_indices")  # fmt: skip
    if batch == "num_seqs":  # bound above the allocation, before anything else goes there
        rows = edits(
            edit(backend.file, scope, ALLOCATION, "        num_seqs = forward_batch.batch_size\n" + ALLOCATION), rows
        )
    return d.spelling(rows)


def width_for_larger_batches(name: str, widths: tuple[str, str]) -> Callable[[Path], None]:
    """The eager row width bound to ``width``: ``widths[0]`` for more than 4 sequences, else ``widths[1]``."""
    scope, bound = f"{draft_backend(name).cls}.init_forward_metadata", [f"        width = {w}\n" for w in widths]
    condition = MANY.format("forward_batch.batch_size")
    return edits(edit(draft_backend(name).file, scope, EAGER_WIDTH, "width"),
                 edit(draft_backend(name).file, scope, ALLOCATION, branch(condition, *bound) + ALLOCATION))  # fmt: skip


#: found by this test (``SGLANG_DRAFT_LAYOUT_SPELLINGS=3``, before the rule's fix): apply exited 0, the FlashInfer
#: eager rows of more than 4 sequences left without the topk factor (the rule rewrote the width's last binding only)
NARROW_FOR_LARGER_BATCHES = Spelling(
    "eager width, flashinfer | `forward_batch.batch_size * self.max_context_len` | the topk factor dropped | bound to"
    " `width` in a branch for more than 4 sequences | `forward_batch.batch_size * self.max_context_len` | the topk"
    " factor dropped",
    width_for_larger_batches("flashinfer", ("forward_batch.batch_size * self.max_context_len",) * 2),
    same=False,
)
#: found by ``eager_widths`` (50 draws, before the rule's fix): apply exited 0 leaving the FlashInfer eager rows of
#: more than 4 sequences twice upstream's width (the rule rewrote the first allocation only)
WIDE_FOR_LARGER_BATCHES = Spelling(
    "eager width, flashinfer | `(forward_batch.batch_size * self.topk) * self.max_context_len` | another allocation"
    " for more than 4 sequences | `(forward_batch.batch_size * self.topk) * self.max_context_len * 2` | twice as wide",
    edits(
        edit(draft_backend("flashinfer").file, "FlashInferMultiStepDraftBackend.init_forward_metadata", EAGER_WIDTH,
             "(forward_batch.batch_size * self.topk) * self.max_context_len"),
        edit(draft_backend("flashinfer").file, "FlashInferMultiStepDraftBackend.init_forward_metadata",
             "        def call_fn(i, forward_batch):\n",
             branch(MANY.format("forward_batch.batch_size"),
                    "        kv_indices = torch.zeros((self.speculative_num_steps,"
                    " (forward_batch.batch_size * self.topk) * self.max_context_len * 2), dtype=torch.int32)\n")
             + "        def call_fn(i, forward_batch):\n"),
    ),
    same=False,
)  # fmt: skip


@given(eager_widths())
@example(NARROW_FOR_LARGER_BATCHES)
@example(WIDE_FOR_LARGER_BATCHES)
@SETTINGS
def test_a_forks_eager_row_width_is_patched_right_or_refused(fresh, spelling):
    never_a_wrong_patch(fresh, spelling)


def graph_width(d: Drawn, backend: DraftBackend) -> str:
    """The CUDA-graph row width as released (FlashInfer's and FlashInfer-MLA's ``max_bs * self.max_context_len``
    lack the topk factor: the bug; Triton's and Aiter's count branches in ``max_num_tokens``) in a drawn spelling,
    with the topk factor (27338's fix), or a width of its own."""
    rows = "max_bs" if backend.capacity_check else "max_num_tokens"
    branches = d.pick([R([rows]), (["max_bs", "self.topk"], rows == "max_num_tokens", False),
                       (["max_num_tokens"], rows == "max_num_tokens", False)])  # fmt: skip
    changed = d.pick([R(""), O("one sequence fewer"), O("a token shorter"), O("twice as wide")])
    factors = [*branches, "self.max_context_len"]
    if changed == "one sequence fewer":
        factors[0] = f"({factors[0]} - 1)"
    elif changed == "a token shorter":
        factors[-1] = "(self.max_context_len - 1)"
    width = product(d, factors) + (" * 2" if changed == "twice as wide" else "")
    d.words += [f"`{width}`", changed]
    return width


@st.composite
def graph_widths(draw: Callable) -> Spelling:
    """``init_cuda_graph_state``'s row width, as a fork spells it."""
    backend = draw(st.sampled_from(DRAFT_BACKENDS))
    d, scope = Drawn(draw, f"graph width, {backend.name}", 4), f"{backend.cls}.init_cuda_graph_state"
    release = f"{'max_bs' if backend.capacity_check else 'max_num_tokens'} * self.max_context_len"
    rows = width_edits(d, backend.file, scope, release, "        self.cuda_graph_kv_indices = torch.zeros(\n", LOOP,
                       "max_bs", graph_width(d, backend), lambda: graph_width(d, backend),
                       "self.cuda_graph_kv_indices")  # fmt: skip
    names = d.pick([R(()), R(("max_bs -> max_batch_size",))])
    d.words += names
    return d.spelling(edits(rows, rename(backend.file, scope, names)))


@given(graph_widths())
@SETTINGS
def test_a_forks_cuda_graph_row_width_is_patched_right_or_refused(fresh, spelling):
    never_a_wrong_patch(fresh, spelling)


KERNEL_LAUNCH = "        self.generate_draft_decode_kv_indices[\n"
FEWER = "27338's, for 4 sequences or fewer only"
CHECK_27338 = (
    "        required_kv_indices_len = {need}\n"
    "        assert required_kv_indices_len <= {width}, (\n"
    '            f"kv_indices row too small: need {{required_kv_indices_len}} > {{{width}}}"\n'
    "        )\n"
)
CHECKS = {
    "27338's": CHECK_27338,
    "inline": '        assert {need} <= {width}, "kv_indices row too small"\n',
    "flipped": '        assert {width} >= {need}, "kv_indices row too small"\n',
    "raising RuntimeError": (
        '        if {need} > {width}:\n            raise RuntimeError("kv_indices row too small")\n'
    ),
}


@st.composite
def capacity_checks(draw: Callable) -> Spelling:
    """A capacity check of the fork's own in FlashInfer's or FlashInfer-MLA's ``common_template`` (27338 and
    27460 cherry-picked: docs/sites.md, "Forks in between releases"), as a fork spells it. ``same``: the values
    27338's check holds."""
    backend = draw(st.sampled_from([b for b in DRAFT_BACKENDS if b.capacity_check]))
    d, scope = Drawn(draw, f"capacity check, {backend.name}", 4), f"{backend.cls}.common_template"
    steps = d.pick([R("self.speculative_num_steps"), O("(self.speculative_num_steps - 1)")])
    prefix = d.pick([R("seq_lens_sum * self.topk"), R("self.topk * seq_lens_sum"), O("seq_lens_sum")])
    need = d.pick([R("{a} + bs * {s}"), R("{a} + {s} * bs"), S("bs * {s} + {a}")]).format(a=prefix, s=steps)
    width = d.pick([R("kv_indices_buffer.shape[1]"), S("kv_indices_buffer.shape[-1]"), O("kv_indices_buffer.numel()")])
    form = d.pick([R("27338's"), S("inline"), S("flipped"), S("raising RuntimeError"), O(FEWER)])
    d.words += [f"`{need} <= {width}`", form]
    check = CHECKS[form.replace(FEWER, "27338's")].format(need=need, width=width)
    if form == FEWER:
        check = branch(MANY.replace(">", "<=").format("num_seqs"), check)
    return d.spelling(edit(backend.file, scope, KERNEL_LAUNCH, check + "\n" + KERNEL_LAUNCH))


#: found by hand on the kind the other sites' examples show (not drawn before it was added): apply exited 0
#: taking the fork's check, which runs only for 4 sequences or fewer, as the capacity check: from 5 sequences
#: rows narrower than the kernel fills went unchecked ("common_template fills rows 46 wide (it writes 47)
#: without a capacity check" at bs 5, topk 1, 3 steps). Refused since the harness runs a probe one past the
#: number of an ``if`` ordering against one that went one way (harness.paths.past: docs/verification.md, "Fork
#: spellings drawn by hypothesis")
CHECK_FOR_FEWER_BATCHES = Spelling(
    "capacity check, flashinfer | `seq_lens_sum * self.topk + bs * self.speculative_num_steps <="
    f" kv_indices_buffer.shape[1]` | {FEWER}",
    edit(draft_backend("flashinfer").file, "FlashInferMultiStepDraftBackend.common_template", KERNEL_LAUNCH, branch(
        MANY.replace(">", "<=").format("num_seqs"),
        CHECK_27338.format(need="seq_lens_sum * self.topk + bs * self.speculative_num_steps",
                           width="kv_indices_buffer.shape[1]"),
    ) + "\n" + KERNEL_LAUNCH),
    same=False,
)  # fmt: skip


@given(capacity_checks())
@example(CHECK_FOR_FEWER_BATCHES)
@SETTINGS
def test_a_forks_own_capacity_check_is_patched_right_or_refused(fresh, spelling):
    never_a_wrong_patch(fresh, spelling)


@pytest.mark.parametrize("condition", ["num_seqs <= 12", "12 >= num_seqs"])
def test_a_capacity_check_for_up_to_12_sequences_is_run_past_12(fresh, condition):
    """The same check under ``if num_seqs <= 12:``: the yardstick above (5 sequences) cannot tell it from upstream's,
    and fixed extra probes (8 sequences, then 5 at topk 16) never left the branch; the probe one past the ``if``'s
    number (13 sequences, ``harness.paths.past``) finds the rows unchecked there, and apply writes nothing."""
    root = fresh()
    edit(draft_backend("flashinfer").file, "FlashInferMultiStepDraftBackend.common_template", KERNEL_LAUNCH, branch(
        condition,
        CHECK_27338.format(need="seq_lens_sum * self.topk + bs * self.speculative_num_steps",
                           width="kv_indices_buffer.shape[1]"),
    ) + "\n" + KERNEL_LAUNCH)(root)  # fmt: skip
    before = tree_digest(root)
    code, err = apply(root)
    assert code == 2 and tree_digest(root) == before, err
    assert f"bs 13, topk 1, 3 steps (for `if {condition}:` at srt/layers/attention/flashinfer_backend.py:" in err
    assert "without a capacity check" in err


#: 27338's check as the fork writes it in FlashInfer's common_template (``checked_only_if``)
FORK_CHECK = CHECK_27338.format(
    need="seq_lens_sum * self.topk + bs * self.speculative_num_steps", width="kv_indices_buffer.shape[1]"
)


def checked_only_if(condition: str, otherwise: str = "") -> Callable[[Path], None]:
    """The fork's capacity check in FlashInfer's common_template, run only ``if condition:`` (``otherwise`` else)."""
    scope = "FlashInferMultiStepDraftBackend.common_template"
    check = branch(condition, FORK_CHECK, otherwise)
    return edit(draft_backend("flashinfer").file, scope, KERNEL_LAUNCH, check + "\n" + KERNEL_LAUNCH)


@pytest.mark.parametrize(
    "condition, past",
    [
        ("num_seqs < 256", "bs 257, topk 1, 3 steps"),
        ("self.max_context_len <= 100", "bs 2, topk 2, 3 steps, context 101"),
    ],
)
def test_a_capacity_check_for_fewer_sequences_or_a_shorter_context_is_run_past_the_ifs_number(fresh, condition, past):
    """Under ``if num_seqs < 256:`` (past 128 sequences, the bound the probes had) or ``if self.max_context_len <=
    100:`` (every probe took context 64; apply exited 0, and at context 128 real torch ran the kernel on rows 39 wide
    for the 40 it writes, where upstream's check stops them) the probe past the number finds the rows unchecked."""
    root = fresh()
    checked_only_if(condition)(root)
    before = tree_digest(root)
    code, err = apply(root)
    assert code == 2 and tree_digest(root) == before, err
    assert f"{past} (for `if {condition}:` at srt/layers/attention/flashinfer_backend.py:" in err
    assert "without a capacity check" in err


@pytest.mark.parametrize("constant", ["MAX_SMALL", "self.MAX_SMALL"])
def test_a_capacity_check_for_up_to_a_constants_number_of_sequences_is_run_past_it(fresh, constant):
    """Under ``if num_seqs <= MAX_SMALL:`` or ``if num_seqs <= self.MAX_SMALL:`` (a constant of 12: apply exited 0, the
    number unread) the probe one past the constant's number finds the rows unchecked."""
    root = fresh()
    check = f"        {constant} = 12\n" + branch(f"num_seqs <= {constant}", FORK_CHECK)
    scope = "FlashInferMultiStepDraftBackend.common_template"
    edit(draft_backend("flashinfer").file, scope, KERNEL_LAUNCH, check + "\n" + KERNEL_LAUNCH)(root)
    before = tree_digest(root)
    code, err = apply(root)
    assert code == 2 and tree_digest(root) == before, err
    at = "srt/layers/attention/flashinfer_backend.py:"
    assert f"bs 13, topk 1, 3 steps (for `if num_seqs <= {constant}:` at {at}" in err
    assert "without a capacity check" in err


def test_a_capacity_check_under_an_if_no_probe_takes_the_other_way_is_refused_naming_it(fresh):
    """Past 1000 sequences no probe goes (``harness.paths.PAST_AT_MOST``): the ``if`` went one way on every probe,
    and its other side, unjudged, refuses the patch (apply exited 0 before)."""
    root = fresh()
    checked_only_if("num_seqs <= 1000")(root)
    before = tree_digest(root)
    code, err = apply(root)
    assert code == 2 and tree_digest(root) == before, err
    lines = (root / "sglang" / draft_backend("flashinfer").file).read_text().splitlines()
    line = lines.index("        if num_seqs <= 1000:") + 1  # the fork's line, not the rewrite's (imports added above)
    assert f"`if num_seqs <= 1000:` at srt/layers/attention/flashinfer_backend.py:{line} went the same way" in err
    assert "went the same way on every probe: its other side cannot be judged" in err


@pytest.mark.parametrize(
    "condition, taken, otherwise",
    [("num_seqs != 5", FORK_CHECK, ""), ("num_seqs == 5", "        pass\n", FORK_CHECK)],
    ids=["checked if != 5", "checked in the else of == 5"],
)
def test_a_capacity_check_skipped_for_5_sequences_is_run_at_5(fresh, condition, taken, otherwise):
    """Under ``if num_seqs != 5:`` (or in the ``else`` of ``if num_seqs == 5:``) the check runs on every base probe
    (apply exited 0: an equality was not recorded); the probe at the ``if``'s number (5 sequences, not one past it)
    finds the rows unchecked there, naming the ``if`` at the fork's line."""
    root = fresh()
    scope = "FlashInferMultiStepDraftBackend.common_template"
    edit(draft_backend("flashinfer").file, scope, KERNEL_LAUNCH, branch(condition, taken, otherwise) + KERNEL_LAUNCH)(
        root
    )
    before = tree_digest(root)
    code, err = apply(root)
    assert code == 2 and tree_digest(root) == before, err
    lines = (root / "sglang" / draft_backend("flashinfer").file).read_text().splitlines()
    line = lines.index(f"        if {condition}:") + 1
    assert f"bs 5, topk 1, 3 steps (for `if {condition}:` at srt/layers/attention/flashinfer_backend.py:{line})" in err
    assert "without a capacity check" in err


def test_a_capacity_check_on_both_sides_of_an_if_on_the_context_is_patched(fresh):
    """The same check on both sides of ``if self.max_context_len <= 100:``: patched, and upstream's values on the
    yardstick's probes and the probe past 100 (context 101)."""
    root = fresh()
    checked_only_if("self.max_context_len <= 100", FORK_CHECK)(root)
    assert apply(root)[0] == 0
    assert not_upstream(root / "sglang") == {}


def split_chain(d: Drawn, source: str, batch: list, moves: list) -> tuple[str, str]:
    """``source`` viewed [bs, topk, steps], steps moved first, flattened to [steps, bs * topk]; and the lines
    binding the locals it uses (``LOCALS``, indented for the method's body), or none."""
    view = d.pick([R("reshape"), R("view")])
    batch = d.pick(batch)
    topk, steps = d.pick([R(("self.topk", "self.speculative_num_steps")), S(("topk", "steps"))])
    move = d.pick(moves)
    flat = d.pick([R(f"reshape({steps}, -1)"), S("flatten(1)"), S(f"reshape(-1, forward_batch.batch_size * {topk})"),
                   S(f"contiguous().view({steps}, -1)")])  # fmt: skip
    chain = f"{source}.{view}({batch}, {topk}, {steps}).{move}.{flat}"
    return chain, LOCALS if batch == "bs" or topk == "topk" else ""


MOVES = [R("permute((2, 0, 1))"), R("permute(2, 0, 1)"), S("movedim(-1, 0)"), S("movedim(2, 0)"),
         S("transpose(1, 2).transpose(0, 1)"), O("permute(2, 1, 0)"), O("permute(1, 0, 2)")]  # fmt: skip
#: what a fork binds before its split: the batch, topk and steps as locals (``split_chain``'s names)
LOCALS = (
    "        bs = forward_batch.batch_size\n"
    "        topk = self.topk\n"
    "        steps = self.speculative_num_steps\n"
)
WORKER_V1 = "srt/speculative/eagle_worker.py"
WORKER_SPLITS = {
    "two statements": "        out_cache_loc = {view}\n        out_cache_loc = out_cache_loc.{rest}\n",
    "one statement": "        out_cache_loc = {chain}\n",
    "a bound 3-d view": "        rows = {view}\n        out_cache_loc = rows.{rest}\n",
    "a local named like the helper": (
        "        per_step_draft_out_cache_loc = {chain}\n        out_cache_loc = per_step_draft_out_cache_loc\n"
    ),
    "no split": "",
    "split twice": fork_edits.WORKER_SPLIT + "        out_cache_loc = {chain}\n",
    "step-major chunks": "        out_cache_loc = out_cache_loc.reshape(self.speculative_num_steps, -1)\n",
}


@st.composite
def worker_splits(draw: Callable) -> Spelling:
    """An EAGLE worker's per-step split of out_cache_loc in ``draft_forward``, as a fork spells it."""
    cls, relative = draw(st.sampled_from([("EagleDraftWorker", fork_edits.WORKER_V2), ("EAGLEWorker", WORKER_V1)]))
    d, scope = Drawn(draw, f"draft_forward split, {cls}", 4), f"{cls}.draft_forward"
    form = d.pick([R("two statements"), S("one statement"), S("a bound 3-d view"), S("a local named like the helper"),
                   O("no split"), O("split twice"), O("step-major chunks")], shown=True)  # fmt: skip
    chain, bound = split_chain(d, "out_cache_loc", [R("forward_batch.batch_size"), S("-1"), S("bs")], MOVES)
    d.words.append(f"`{chain}`")
    view, _, rest = chain.partition(").")
    split = WORKER_SPLITS[form].format(view=view + ")", rest=rest, chain=chain)
    if split and d.pick([R(""), S("another split for more than 4 sequences")], shown=True):
        other, other_bound = split_chain(d, "out_cache_loc", [R("forward_batch.batch_size")], MOVES)
        other = d.pick([R(other), O("out_cache_loc.reshape(self.speculative_num_steps, -1)")])  # or step-major chunks
        d.words.append(f"`{other}`")
        bound = bound or other_bound
        split = branch(MANY.format("forward_batch.batch_size"), f"        out_cache_loc = {other}\n", split)
    names = d.pick([R(()), R(("out_cache_loc -> slots",))])
    d.words += names
    return d.spelling(
        edits(edit(relative, scope, fork_edits.WORKER_SPLIT, bound + split), rename(relative, scope, names))
    )


#: found by ``worker_splits`` (40 draws, hypothesis seed 21, before the rule's fix): apply exited 0, the V2 worker's
#: steps writing step-major chunks for more than 4 sequences (the rule rewrote the split and left the other layout)
CHUNKS_FOR_LARGER_BATCHES = Spelling(
    "draft_forward split, EagleDraftWorker | a bound 3-d view | `out_cache_loc.view(bs, self.topk,"
    " self.speculative_num_steps).movedim(-1, 0).reshape(self.speculative_num_steps, -1)` | another split for more"
    " than 4 sequences | `out_cache_loc.reshape(self.speculative_num_steps, -1)`",
    edit(fork_edits.WORKER_V2, "EagleDraftWorker.draft_forward", fork_edits.WORKER_SPLIT, LOCALS + branch(
        MANY.format("forward_batch.batch_size"),
        "        out_cache_loc = out_cache_loc.reshape(self.speculative_num_steps, -1)\n",
        WORKER_SPLITS["a bound 3-d view"].format(
            view="out_cache_loc.view(bs, self.topk, self.speculative_num_steps)",
            rest="movedim(-1, 0).reshape(self.speculative_num_steps, -1)",
            chain="",
        ),
    )),
    same=False,
)  # fmt: skip


@given(worker_splits())
@example(CHUNKS_FOR_LARGER_BATCHES)
@SETTINGS
def test_a_workers_own_split_is_patched_right_or_refused(fresh, spelling):
    never_a_wrong_patch(fresh, spelling)


STEPS = "self.speculative_num_steps"
#: a guard of the fork's own, standing in for ``self.topk > 0 and self.speculative_num_steps > 1``
GUARD_METHOD = "    def multi_step_draft(self):\n        return self.topk > 0 and self.speculative_num_steps > 1\n"
DSV4_GUARDS = ["self.topk > 0 and self.speculative_num_steps > 1", "self.speculative_num_steps > 1",
               "self.multi_step_draft, a property", "self.multi_step_draft, a method never called",
               "self.topk > 1 and self.speculative_num_steps > 1"]  # fmt: skip


@st.composite
def dsv4_decodes(draw: Callable) -> Spelling:
    """What DeepSeek-V4's eager decode hands ``init_forward_metadata_decode`` as ``out_cache_loc``, as a fork
    spells it: the whole buffer (the release's bug) another way, or a split of the fork's own."""
    d, scope = Drawn(draw, "DeepSeek-V4 decode", 5), "DeepseekV4AttnBackend.init_forward_metadata"
    first_line = fork_edits.DSV4_DECODE.splitlines(True)[0]
    form = d.pick([S("the whole buffer through a local"), S("the whole buffer, sliced [:]"), S("a split, inline"),
                   S("a split, in a guarded local"), O("a split, and the caller's too")], shown=True)  # fmt: skip
    if form == "the whole buffer through a local":
        passing = first_line + "            whole = forward_batch.out_cache_loc\n"
        return d.spelling(edit(fork_edits.DSV4, scope, fork_edits.DSV4_DECODE,
                               fork_edits._decode_passing("whole").replace(first_line, passing)))  # fmt: skip
    if form == "the whole buffer, sliced [:]":
        passing = fork_edits._decode_passing("forward_batch.out_cache_loc[:]")
        return d.spelling(edit(fork_edits.DSV4, scope, fork_edits.DSV4_DECODE, passing))
    chain, bound = split_chain(d, "forward_batch.out_cache_loc", [R("forward_batch.batch_size"), S("-1")], MOVES)
    row = chain + d.pick([R("[self.speculative_step_id]"), O("[0]"), O("[self.speculative_step_id - 1]")])
    d.words.append(f"`{row}`")
    steps_locals = "".join("    " + line for line in bound.splitlines(True))  # in the decode branch
    if form == "a split, in a guarded local":
        local = d.pick([R("out_cache_loc"), S("per_step_draft_out_cache_loc")])
        guard = d.pick([R(g) for g in DSV4_GUARDS[:-1]] + [O(DSV4_GUARDS[-1])])
        d.words += [f"`{local}`", f"if {guard}"]
        assigned = f"                {local} = {row}\n"
        if d.pick([R(""), S("another row for more than 4 sequences")], shown=True):
            other = d.pick([R(row), O(f"forward_batch.out_cache_loc.reshape({STEPS}, -1)[self.speculative_step_id]")])
            d.words.append(f"`{other}`")
            assigned = branch(MANY.format("forward_batch.batch_size"), f"                {local} = {other}\n", assigned)
        split = (
            first_line + f"            {local} = forward_batch.out_cache_loc\n"
            f"            if {guard.partition(',')[0]}:\n"
            + "".join("    " + line for line in steps_locals.splitlines(True))
            + assigned
        )  # fmt: skip
        steps = [edit(fork_edits.DSV4, scope, fork_edits.DSV4_DECODE,
                      fork_edits._decode_passing(local).replace(first_line, split))]  # fmt: skip
        if "multi_step_draft" in guard:
            decorated = ("    @property\n" if "property" in guard else "") + GUARD_METHOD
            steps.append(method(fork_edits.DSV4, "DeepseekV4AttnBackend", "init_forward_metadata", decorated))
        return d.spelling(edits(*steps))
    passing = fork_edits._decode_passing(row).replace(first_line, first_line + steps_locals)
    split = edit(fork_edits.DSV4, scope, fork_edits.DSV4_DECODE, passing)
    return d.spelling(edits(split, fork_edits.dsv4_caller_split) if "caller" in form else split)


DSV4_ROW = (
    "forward_batch.out_cache_loc.reshape(forward_batch.batch_size, self.topk, self.speculative_num_steps)"
    ".permute(2, 0, 1).reshape(self.speculative_num_steps, -1)[self.speculative_step_id]"
)
DSV4_CHUNK = f"forward_batch.out_cache_loc.reshape({STEPS}, -1)[self.speculative_step_id]"
#: found by hand, trying the class ``worker_splits`` found on DeepSeek-V4 (before the split rules' fix): apply
#: exited 0, DeepSeek-V4 baking step-major chunks for more than 4 sequences (the rule rewrote the other branch)
CHUNK_FOR_LARGER_BATCHES = Spelling(
    f"DeepSeek-V4 decode | a split, in a guarded local | `{DSV4_ROW}` | `out_cache_loc` | if {DSV4_GUARDS[0]}"
    f" | another row for more than 4 sequences | `{DSV4_CHUNK}`",
    edit(fork_edits.DSV4, "DeepseekV4AttnBackend.init_forward_metadata", fork_edits.DSV4_DECODE,
         fork_edits._decode_passing("out_cache_loc").replace(
             fork_edits.DSV4_DECODE.splitlines(True)[0],
             fork_edits.DSV4_DECODE.splitlines(True)[0]
             + "            out_cache_loc = forward_batch.out_cache_loc\n"
             + f"            if {DSV4_GUARDS[0]}:\n"
             + branch(MANY.format("forward_batch.batch_size"), f"                out_cache_loc = {DSV4_CHUNK}\n",
                      f"                out_cache_loc = {DSV4_ROW}\n"),
         )),
    same=False,
)  # fmt: skip


@given(dsv4_decodes())
@example(CHUNK_FOR_LARGER_BATCHES)
@SETTINGS
def test_deepseek_v4s_decode_spelt_by_a_fork_is_patched_right_or_refused(fresh, spelling):
    never_a_wrong_patch(fresh, spelling)


# -- edits after the patch -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fresh_patched(fresh, tmp_path_factory):
    """fresh_patched() -> the folder ``fresh`` gives, holding a new copy of the 0.5.12 tree as ``apply`` leaves it."""
    patched = tmp_path_factory.mktemp("patched") / "fork"
    shutil.copytree(fresh(), patched)
    assert apply(patched)[0] == 0

    def get() -> Path:
        root = fresh()
        for folder in GUARDED:
            shutil.rmtree(root / "sglang" / folder)
            shutil.copytree(patched / "sglang" / folder, root / "sglang" / folder)
        return root

    return get


#: what ``apply`` writes at each multi-step backend's rows (its CUDA-graph and eager widths, its per-step slice end):
#: the helpers' arguments, as a fork might edit them after the patch
PATCHED_ARGUMENTS = {
    "init_cuda_graph_state": (
        "max_bs, self.topk, self.max_context_len",
        [R("max_bs, self.topk, self.max_context_len"), S("self.topk, max_bs, self.max_context_len"),
         S("max_bs * self.topk, 1, self.max_context_len"), O("max_bs, 1, self.max_context_len"),
         O("max_bs, self.topk, self.max_context_len - 1")],
    ),
    "init_forward_metadata": (
        "forward_batch.batch_size, self.topk, self.max_context_len",
        [S("forward_batch.batch_size * self.topk, 1, self.max_context_len"),
         O("forward_batch.batch_size, 1, self.max_context_len")],
    ),
    "common_template": (
        "seq_lens_sum, self.topk, bs, i + 1",
        [S("seq_lens_sum, self.topk, bs, 1 + i"), O("seq_lens_sum, self.topk, bs, i + 2"), O("seq_lens_sum, self.topk, bs, i")],
    ),
}  # fmt: skip


def patched_edit(backend: DraftBackend, method: str, arguments: str) -> Spelling:
    old, options = PATCHED_ARGUMENTS[method]
    same = next(same for value, same, _recognised in options if value == arguments)
    label = f"after the patch, {backend.name}.{method}: `{arguments}`"
    return Spelling(label, edit(backend.file, f"{backend.cls}.{method}", old, arguments), same)


@st.composite
def patched_edits(draw: Callable) -> Spelling:
    """One argument list of a helper the patch wrote, edited: the same values or others."""
    backend = draw(st.sampled_from(DRAFT_BACKENDS))
    method = draw(st.sampled_from(sorted(PATCHED_ARGUMENTS)))
    arguments, _same, _recognised = draw(st.sampled_from(PATCHED_ARGUMENTS[method][1]))
    return patched_edit(backend, method, arguments)


@given(patched_edits())
@example(patched_edit(draft_backend("flashinfer"), "init_cuda_graph_state", "max_bs, 1, self.max_context_len"))
@example(patched_edit(draft_backend("triton"), "common_template", "seq_lens_sum, self.topk, bs, 1 + i"))
@SETTINGS
def test_an_edit_after_the_patch_is_patched_right_or_refused(fresh_patched, spelling):
    """A tree with no site left to patch is judged as it is: `apply` exits 0 only where every draft path still
    gives upstream's values (the same yardstick: FlashInfer-MLA takes topk 1 only, so a topk factor dropped
    there gives them too); the narrow CUDA-graph row put back is never left."""
    never_a_wrong_patch(fresh_patched, spelling)
