"""proof/arrays.py: each torch layout method on the numpy-backed probe tensor gives what torch gives.

Chains of layout calls drawn by hypothesis run on a real torch tensor and on the probe tensor: the
same values in the same shape, or both raise.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_draft_layout.proof import arrays

SHAPE = (2, 3, 4)


def _call(tensor, name: str, args: tuple):
    return getattr(tensor, name)(*args)


MOVES = st.one_of(
    st.permutations([0, 1, 2]).map(lambda p: ("permute", tuple(p))),
    st.permutations([0, 1, 2]).map(lambda p: ("permute", (tuple(p),))),
    st.tuples(st.integers(-3, 2), st.integers(-3, 2)).map(lambda d: ("transpose", d)),
    st.tuples(st.integers(-3, 2), st.integers(-3, 2)).map(lambda d: ("swapaxes", d)),
    st.tuples(st.integers(-3, 2), st.integers(-3, 2)).map(lambda d: ("movedim", d)),
    st.just(("contiguous", ())),
)
ENDS = st.one_of(
    st.just(("reshape", (4, -1))),
    st.just(("reshape", (-1, 6))),
    st.just(("reshape", ((4, 6),))),
    st.just(("view", (4, -1))),
    st.just(("flatten", (1,))),
    st.just(("flatten", ())),
    st.just(("reshape", (5, -1))),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(MOVES, max_size=3), ENDS, st.sampled_from(["reshape", "view"]))
def test_layout_chains_match_torch(moves, end, first):
    real = torch.arange(24)
    probe = arrays.arange(24, draft=True)
    chain = [(first, SHAPE), *moves, end]
    try:
        for name, args in chain:
            real = _call(real, name, args)
        expected = real.tolist(), tuple(real.shape)
    except RuntimeError:
        expected = None
    try:
        for name, args in chain:
            probe = _call(probe, name, args)
        got = probe.tolist(), probe.shape
    except (RuntimeError, ValueError, IndexError):
        got = None
    assert got == expected
    if got is not None:
        assert probe.draft


@pytest.mark.parametrize("index", [1, slice(None, 3), (slice(None), 2), -1])
def test_indexing_matches_torch(index):
    real = torch.arange(24).reshape(4, 6)
    probe = arrays.arange(24).reshape(4, 6)
    assert probe[index].tolist() == real[index].tolist()


def test_pieces_match_torch():
    real = torch.arange(24)
    probe = arrays.arange(24)
    assert [p.tolist() for p in probe.chunk(5)] == [p.tolist() for p in real.chunk(5)]
    assert [p.tolist() for p in probe.split(7)] == [p.tolist() for p in real.split(7)]
    assert [p.tolist() for p in probe.reshape(4, 6).unbind(1)] == [p.tolist() for p in real.reshape(4, 6).unbind(1)]


def test_view_of_a_permuted_tensor_refuses_as_torch_does():
    with pytest.raises(RuntimeError):
        torch.arange(24).reshape(2, 3, 4).permute(2, 0, 1).view(-1)
    with pytest.raises(RuntimeError):
        arrays.arange(24).reshape(2, 3, 4).permute(2, 0, 1).view(-1)


def test_equality_is_by_shape_and_values():
    assert arrays.arange(6).reshape(2, 3) == arrays.Tensor(np.arange(6).reshape(2, 3))
    assert not arrays.arange(6).reshape(2, 3) == arrays.arange(6).reshape(3, 2)
