"""harness/tensors.py: the torch stand-in ``check`` runs a tree's code on gives what torch gives.

Chains of the operations draft layout code uses, drawn by hypothesis, run on a real torch tensor and
on the stand-in: the same values, shape and strides (views share storage as torch's do), or both
raise.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st
from sglang_draft_layout.harness import tensors
from sglang_draft_layout.harness.unknown import Unknown

FACADE = tensors.FACADE

LAYOUT = st.one_of(
    st.sampled_from([(2, 3, 4), (4, 6), (6, 4), (24,), (3, 8), (2, 12), (-1, 4), (2, -1, 3), (5, 5)]).flatmap(
        lambda shape: st.sampled_from([("view", shape), ("reshape", shape), ("reshape", (shape,))])
    ),
    st.permutations([0, 1, 2]).map(lambda p: ("permute", tuple(p))),
    st.permutations([0, 1]).map(lambda p: ("permute", (tuple(p),))),
    st.tuples(st.integers(-3, 2), st.integers(-3, 2)).map(lambda d: ("transpose", d)),
    st.tuples(st.integers(-2, 1), st.integers(-2, 1)).map(lambda d: ("movedim", d)),
    st.sampled_from([("contiguous", ()), ("clone", ()), ("flatten", ()), ("flatten", (1,)), ("t", ())]),
    st.integers(-2, 2).map(lambda d: ("unsqueeze", (d,))),
    st.sampled_from([("squeeze", ()), ("squeeze", (0,))]),
    st.tuples(st.integers(1, 5), st.integers(-1, 0)).map(lambda a: ("chunk", a)),
    st.tuples(st.integers(1, 5), st.integers(-1, 0)).map(lambda a: ("split", a)),
    st.integers(-1, 0).map(lambda d: ("unbind", (d,))),
)
INDEX = st.one_of(
    st.integers(-3, 3),
    st.builds(
        slice,
        st.one_of(st.none(), st.integers(-4, 4)),
        st.one_of(st.none(), st.integers(-4, 8)),
        st.one_of(st.none(), st.integers(1, 3)),
    ),  # fmt: skip
    st.tuples(st.integers(-2, 2), st.builds(slice, st.none(), st.integers(0, 5))),
    st.tuples(st.builds(slice, st.none(), st.none()), st.integers(-2, 1)),
    st.just((None, 0)),
    st.just((Ellipsis, 0)),
)
STEP = st.one_of(LAYOUT, INDEX.map(lambda i: ("getitem", i)))


def _apply(tensor, name, args):
    if name == "getitem":
        return tensor[args]
    result = getattr(tensor, name)(*args)
    return result[-1] if isinstance(result, tuple) else result  # chunk, split, unbind: go on with the last part


def _outcome(tensor, chain):
    try:
        for name, args in chain:
            tensor = _apply(tensor, name, args)
        strides = tuple(s if n > 1 else None for n, s in zip(tensor.shape, tensor.stride()))  # a size-1 dim's is moot
        return tensor.tolist(), tuple(tensor.shape), strides, tensor.is_contiguous()
    except (RuntimeError, IndexError, ValueError):
        return "raises"  # the harness takes any error a path raises as its result


@settings(max_examples=400, deadline=None)
@given(st.lists(STEP, max_size=4))
def test_layout_chains_match_torch(chain):
    expected = _outcome(torch.arange(24), chain)
    got = _outcome(FACADE._probe_tensor(range(24)), chain)
    assert got == expected, chain


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["+", "-", "*", "//", "==", "<"]), st.sampled_from([(), (1,), (4,), (3, 1), (1, 4), (3, 4)]),
       st.integers(1, 5))  # fmt: skip
def test_arithmetic_broadcasts_as_torch(op, other_shape, scalar):
    apply = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
             "//": lambda a, b: a // b, "==": lambda a, b: (a == b).long(), "<": lambda a, b: (a < b).long()}[op]  # fmt: skip
    left_real = torch.arange(1, 13).view(3, 4)
    left = FACADE._probe_tensor(range(1, 13)).view(3, 4)
    count = 1
    for size in other_shape:
        count *= size
    right_real = torch.arange(1, count + 1).view(other_shape) if other_shape else scalar
    right = FACADE._probe_tensor(range(1, count + 1)).view(other_shape) if other_shape else scalar
    assert apply(left, right).tolist() == apply(left_real, right_real).tolist()
    assert apply(right, left).tolist() == apply(right_real, left_real).tolist()


def test_views_share_storage_and_writes_go_through():
    real, probe = torch.arange(24), FACADE._probe_tensor(range(24))
    for tensor in (real, probe):
        rows = tensor.view(2, 3, 4).permute(2, 0, 1)
        rows[1] = 100
        tensor[:2] = rows[0, 0, :2]
    assert probe.tolist() == real.tolist()


def test_creation_reductions_and_item():
    assert FACADE.zeros((2, 3), dtype=FACADE.int32).tolist() == torch.zeros((2, 3), dtype=torch.int32).tolist()
    assert FACADE.arange(2, 9, 3).tolist() == torch.arange(2, 9, 3).tolist()
    assert FACADE.full((3,), 7).tolist() == torch.full((3,), 7).tolist()
    assert FACADE.tensor([[1, 2], [3, 4]]).shape == torch.tensor([[1, 2], [3, 4]]).shape
    seq_lens = FACADE._probe_tensor([5, 9, 4])
    assert seq_lens.max().item() == 9 and int(seq_lens.sum()) == 18
    assert FACADE.cat([seq_lens, seq_lens]).tolist() == [5, 9, 4, 5, 9, 4]
    assert repr(seq_lens.shape) == repr(torch.tensor([5, 9, 4]).shape)
    with pytest.raises(RuntimeError):
        bool(seq_lens)


def test_what_the_stand_in_does_not_know_is_unknown():
    tensor = FACADE._probe_tensor(range(6))
    assert isinstance(tensor.repeat_interleave(2), Unknown)
    assert isinstance(FACADE.softmax(tensor, dim=-1), Unknown)
    assert isinstance(tensor[FACADE._probe_tensor([0, 1])], Unknown)
    assert isinstance(FACADE.empty((2, Unknown("n"))), Unknown)
    assert isinstance(tensor + Unknown("offset"), Unknown)
