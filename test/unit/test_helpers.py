"""Unit tests for the three draft layout helpers (project issue 2).

per_step_draft_out_cache_loc (speculative/eagle_utils.py) and
draft_kv_indices_buffer_width / draft_kv_indices_used_len (speculative/spec_utils.py).
CPU torch only; see docs/layout.md for the layouts these tests pin.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import textwrap

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_draft_layout.speculative import eagle_utils, spec_utils
from sglang_draft_layout.speculative.eagle_utils import per_step_draft_out_cache_loc
from sglang_draft_layout.speculative.spec_utils import (
    draft_kv_indices_buffer_width,
    draft_kv_indices_used_len,
)

BS_RANGE = range(1, 5)
TOPK_RANGE = range(1, 5)
STEPS_RANGE = range(1, 6)
ALL_SHAPES = list(itertools.product(BS_RANGE, TOPK_RANGE, STEPS_RANGE))
# Offsets make every value differ from its own index, and for int64 lie outside the
# int32 range, so a helper that returned indices or narrowed the dtype would fail.
DTYPE_OFFSETS = [(torch.int32, 1000), (torch.int64, 2**40)]


def _distinct_buffer(n: int, dtype: torch.dtype, offset: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randperm(n, generator=gen) + offset).to(dtype)


def _reference(values: list[int], bs: int, topk: int, steps: int) -> list[list[int]]:
    """Per-step table straight from the definition, with plain Python loops."""
    table = [[None] * (bs * topk) for _ in range(steps)]
    for b in range(bs):
        for k in range(topk):
            for s in range(steps):
                table[s][b * topk + k] = values[(b * topk + k) * steps + s]
    return table


# ---------------------------------------------------------------------------
# per_step_draft_out_cache_loc: values
# ---------------------------------------------------------------------------


def test_shape_ranges_cover_the_degenerate_cases():
    assert (1, 1, 1) in ALL_SHAPES
    assert any(t == 1 and s > 1 for _, t, s in ALL_SHAPES)  # DSv4's failing case
    assert any(t > 1 and s == 1 for _, t, s in ALL_SHAPES)


@pytest.mark.parametrize("dtype,offset", DTYPE_OFFSETS, ids=["int32", "int64"])
def test_per_step_matches_loop_reference(dtype, offset):
    for seed, (bs, topk, steps) in enumerate(ALL_SHAPES):
        n = bs * topk * steps
        buf = _distinct_buffer(n, dtype, offset, seed)
        assert len(set(buf.tolist())) == n
        out = per_step_draft_out_cache_loc(buf, bs, topk, steps)
        case = f"bs={bs} topk={topk} steps={steps} {dtype}"
        assert out.dtype == dtype, case
        assert tuple(out.shape) == (steps, bs * topk), case
        assert out.tolist() == _reference(buf.tolist(), bs, topk, steps), case


def test_per_step_worked_example():
    # bs=2, topk=2, steps=3: slot (b, k, s) = (2b + k) * 3 + s; docs/layout.md shows this.
    out = per_step_draft_out_cache_loc(torch.arange(100, 112), 2, 2, 3)
    assert out.tolist() == [
        [100, 103, 106, 109],
        [101, 104, 107, 110],
        [102, 105, 108, 111],
    ]


def test_per_step_rows_partition_the_buffer():
    # Every slot is written by exactly one (step, branch).
    for bs, topk, steps in ALL_SHAPES:
        n = bs * topk * steps
        out = per_step_draft_out_cache_loc(torch.arange(n), bs, topk, steps)
        assert sorted(out.flatten().tolist()) == list(range(n))


@pytest.mark.parametrize("length", [0, 29, 31, 60])
def test_per_step_wrong_length_message(length):
    bs, topk, steps = 2, 3, 5  # product 30; all numbers distinct
    buf = torch.arange(length, dtype=torch.int64)
    numbers = [length, bs, topk, steps, bs * topk * steps]
    pattern = "(?s)" + "".join(rf"(?=.*(?<!\d){n}(?!\d))" for n in numbers)
    with pytest.raises(AssertionError, match=pattern):
        per_step_draft_out_cache_loc(buf, bs, topk, steps)


def test_per_step_wrong_length_message_exact_text():
    with pytest.raises(AssertionError) as excinfo:
        per_step_draft_out_cache_loc(torch.arange(13), 2, 2, 3)
    msg = str(excinfo.value)
    assert "13" in msg and "2*2*3=12" in msg, msg


# ---------------------------------------------------------------------------
# per_step_draft_out_cache_loc: memory layout (a strided view, never a copy)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,offset", DTYPE_OFFSETS, ids=["int32", "int64"])
def test_per_step_is_a_view_of_the_input(dtype, offset):
    for seed, (bs, topk, steps) in enumerate(ALL_SHAPES):
        n = bs * topk * steps
        buf = _distinct_buffer(n, dtype, offset, seed)
        out = per_step_draft_out_cache_loc(buf, bs, topk, steps)
        case = f"bs={bs} topk={topk} steps={steps}"
        assert out.data_ptr() == buf.data_ptr(), case
        assert out.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr(), case
        for i in range(steps):
            assert out[i].data_ptr() == buf.data_ptr() + i * buf.element_size(), case
            assert torch.equal(out[i], buf[i::steps]), case
        # Writes through the input show up in the result and vice versa.
        buf[n - 1] = -7
        assert out[steps - 1, bs * topk - 1].item() == -7, case
        out[0, 0] = -9
        assert buf[0].item() == -9, case


def test_per_step_strides_and_non_contiguous_rows():
    checked = 0
    for bs, topk, steps in ALL_SHAPES:
        if bs * topk == 1 or steps == 1:
            continue
        buf = torch.arange(bs * topk * steps, dtype=torch.int32)
        out = per_step_draft_out_cache_loc(buf, bs, topk, steps)
        case = f"bs={bs} topk={topk} steps={steps}"
        assert out.stride() == (1, steps), case
        assert not out.is_contiguous(), case
        for i in range(steps):
            assert out[i].stride() == (steps,), case
            assert not out[i].is_contiguous(), case
            # A kernel given row i's data pointer and assuming contiguity reads
            # out_cache_loc[i : i + bs * topk], which is not the row.
            raw = torch.as_strided(buf, (bs * topk,), (1,), out[i].storage_offset())
            assert torch.equal(raw, buf[i : i + bs * topk]), case
            assert not torch.equal(out[i], raw), case
            # Nor is the row the i-th chunk of the flat buffer.
            assert not torch.equal(out[i], buf[i * bs * topk : (i + 1) * bs * topk]), case
        checked += 1
    assert checked == 4 * 4 * 4 - 4  # all shapes with bs*topk > 1 and steps > 1


def test_per_step_single_step_row_is_the_whole_buffer():
    for bs, topk in itertools.product(BS_RANGE, TOPK_RANGE):
        buf = torch.arange(bs * topk, dtype=torch.int64)
        out = per_step_draft_out_cache_loc(buf, bs, topk, 1)
        assert out[0].is_contiguous()
        assert out[0].data_ptr() == buf.data_ptr()
        assert torch.equal(out[0], buf)


# ---------------------------------------------------------------------------
# kv_indices sizing
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "num_seqs,topk,max_context_len,width",
    [
        (2, 2, 8, 32),  # docs/layout.md example; without topk it would be 16
        (3, 2, 20, 120),
        (1, 1, 1, 1),
        (4, 8, 4096, 131072),
        (0, 8, 4096, 0),
    ],
)
def test_buffer_width_examples(num_seqs, topk, max_context_len, width):
    assert draft_kv_indices_buffer_width(num_seqs, topk, max_context_len) == width


@pytest.mark.parametrize(
    "seq_lens_sum,topk,bs,num_steps,used",
    [
        # SPEC: lengths 5, 9, 4 (sum 18), topk 2 -> bs 6; rows used 42, 48, 54.
        (18, 2, 6, 1, 42),
        (18, 2, 6, 2, 48),
        (18, 2, 6, 3, 54),
        # docs/layout.md: seq_lens [5, 3], topk 2 -> bs 4.
        (8, 2, 4, 1, 20),
        (8, 2, 4, 2, 24),
        (8, 2, 4, 3, 28),
        (10, 1, 3, 0, 10),
    ],
)
def test_used_len_examples(seq_lens_sum, topk, bs, num_steps, used):
    assert draft_kv_indices_used_len(seq_lens_sum, topk, bs, num_steps) == used


@settings(max_examples=300, deadline=None)
@given(
    data=st.data(),
    num_seqs=st.integers(1, 16),
    topk=st.integers(1, 16),
    num_steps=st.integers(1, 8),
)
def test_used_len_fits_buffer_width(data, num_seqs, topk, num_steps):
    max_context_len = data.draw(st.integers(num_steps, 4096), label="max_context_len")
    max_seq_len = max_context_len - num_steps
    seq_lens = data.draw(st.lists(st.integers(0, max_seq_len), min_size=num_seqs, max_size=num_seqs))
    bs = topk * num_seqs
    width = draft_kv_indices_buffer_width(num_seqs, topk, max_context_len)
    for steps in range(1, num_steps + 1):
        assert draft_kv_indices_used_len(sum(seq_lens), topk, bs, steps) <= width
    # Tight when every sequence is as long as it may be.
    if all(s == max_seq_len for s in seq_lens):
        assert draft_kv_indices_used_len(sum(seq_lens), topk, bs, num_steps) == width


@settings(max_examples=300, deadline=None)
@given(
    num_seqs=st.integers(1, 16),
    topk=st.integers(2, 16),
    num_steps=st.integers(1, 8),
    max_context_len=st.integers(16, 4096),
)
def test_width_without_topk_overflows(num_seqs, topk, num_steps, max_context_len):
    # The upstream bug (27338/27460): rows sized num_seqs * max_context_len are too
    # short for full-length sequences once topk > 1; the helper's width is not.
    seq_lens_sum = num_seqs * (max_context_len - num_steps)
    used = draft_kv_indices_used_len(seq_lens_sum, topk, topk * num_seqs, num_steps)
    assert used > num_seqs * max_context_len
    assert used <= draft_kv_indices_buffer_width(num_seqs, topk, max_context_len)


@settings(max_examples=300, deadline=None)
@given(
    seq_lens_sum=st.integers(0, 10**6),
    topk=st.integers(1, 16),
    num_seqs=st.integers(1, 64),
    i=st.integers(0, 16),
)
def test_used_len_grows_by_bs_per_step(seq_lens_sum, topk, num_seqs, i):
    bs = topk * num_seqs
    step = draft_kv_indices_used_len(seq_lens_sum, topk, bs, i + 1) - (
        draft_kv_indices_used_len(seq_lens_sum, topk, bs, i)
    )
    assert step == bs
    assert draft_kv_indices_used_len(seq_lens_sum, topk, bs, 0) == seq_lens_sum * topk


def test_width_int32_guard_boundary():
    assert draft_kv_indices_buffer_width(1, 1, 2**31 - 1) == 2**31 - 1
    # 2**31 - 1 is prime, so the largest accepted width puts it in one factor.
    assert draft_kv_indices_buffer_width(2**31 - 1, 1, 1) == 2**31 - 1
    assert draft_kv_indices_buffer_width(1, 2**31 - 1, 1) == 2**31 - 1
    for factors in [(2, 2**10, 2**20), (1, 1, 2**31), (2**31, 1, 1), (1, 2**31, 1)]:
        assert factors[0] * factors[1] * factors[2] == 2**31
        with pytest.raises(AssertionError, match="int32"):
            draft_kv_indices_buffer_width(*factors)


@settings(max_examples=300, deadline=None)
@given(
    num_seqs=st.integers(1, 2**20),
    topk=st.integers(1, 64),
    max_context_len=st.integers(1, 2**22),
)
def test_width_int32_guard_property(num_seqs, topk, max_context_len):
    product = num_seqs * topk * max_context_len
    if product >= 2**31:
        with pytest.raises(AssertionError, match="int32"):
            draft_kv_indices_buffer_width(num_seqs, topk, max_context_len)
    else:
        assert draft_kv_indices_buffer_width(num_seqs, topk, max_context_len) == product


# ---------------------------------------------------------------------------
# Self-containment: the patch inserts these functions' source into SGLang files.
# ---------------------------------------------------------------------------


def _is_type_checking_test(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id == "TYPE_CHECKING"
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "TYPE_CHECKING"
        and isinstance(node.value, ast.Name)
        and node.value.id == "typing"
    )


def _disallowed_imports(source: str) -> list[str]:
    """Imports other than __future__.annotations, typing, and torch under TYPE_CHECKING."""
    tree = ast.parse(source)
    type_checking_imports: set[int] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and _is_type_checking_test(node.test) and not node.orelse:
            for child in node.body:
                if isinstance(child, ast.Import) and all(a.name == "torch" and a.asname is None for a in child.names):
                    type_checking_imports.add(id(child))
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module == "__future__":
                if [a.name for a in node.names] == ["annotations"]:
                    continue
            elif node.level == 0 and node.module == "typing":
                continue
            bad.append(ast.unparse(node))
        elif isinstance(node, ast.Import):
            if id(node) in type_checking_imports:
                continue
            if all(a.name == "typing" and a.asname is None for a in node.names):
                continue
            bad.append(ast.unparse(node))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, (ast.Name, ast.Attribute))
            and (getattr(node.func, "id", None) or getattr(node.func, "attr", None)) in {"__import__", "import_module"}
        ):
            bad.append(ast.unparse(node))
    return bad


@pytest.mark.parametrize(
    "source,ok",
    [
        (
            "from __future__ import annotations\nfrom typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    import torch\n",
            True,
        ),
        ("import typing\nif typing.TYPE_CHECKING:\n    import torch\n", True),
        ("import torch\n", False),
        ("import os\n", False),
        ("from sglang.srt.utils import x\n", False),
        ("from . import sibling\n", False),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import numpy\n", False),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n" "else:\n    import torch\n", False),
        ("def f():\n    import torch\n", False),
        ("def f():\n    from typing import Any\n", True),
        ("from typing import TYPE_CHECKING\nimport typing as t, os\n", False),
        ("def f():\n    return __import__('torch')\n", False),
        ("import importlib\n", False),
    ],
)
def test_import_checker_itself(source, ok):
    assert (_disallowed_imports(source) == []) == ok


@pytest.mark.parametrize("module", [eagle_utils, spec_utils], ids=lambda m: m.__name__)
def test_helper_modules_are_self_contained(module):
    source = inspect.getsource(module)
    assert _disallowed_imports(source) == []


@pytest.mark.parametrize(
    "func",
    [per_step_draft_out_cache_loc, draft_kv_indices_buffer_width, draft_kv_indices_used_len],
    ids=lambda f: f.__name__,
)
def test_helper_bodies_use_only_params_locals_and_builtins(func):
    # The function's source alone, pasted into another module, must still work: its
    # body (annotations are strings under `from __future__ import annotations`) may
    # refer only to its parameters, its own locals and builtins.
    import builtins

    fn = ast.parse(textwrap.dedent(inspect.getsource(func))).body[0]
    assert isinstance(fn, ast.FunctionDef)
    params = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
    body = ast.Module(body=fn.body, type_ignores=[])
    stored = {n.id for n in ast.walk(body) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    loaded = {n.id for n in ast.walk(body) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    free = loaded - params - stored - set(dir(builtins))
    assert free == set(), f"{func.__name__} uses module-level names {sorted(free)}"
    assert not fn.decorator_list
