"""Probe tensors: torch's layout methods on numpy arrays, so ``check`` can run a fork's layout code.

Each method is numpy's own operation under torch's name and argument convention (``view`` refuses a
copy as torch does); ``test/unit/test_proof_arrays.py`` checks every one against torch itself.
``draft`` marks a tensor that is the draft out_cache_loc buffer or a view of it.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def _dims(args: Sequence[Any]) -> tuple[int, ...]:
    """torch's ``f(a, b, c)`` or ``f((a, b, c))``."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = args[0]
    return tuple(int(a) for a in args)


class Tensor:
    """A numpy array with the torch tensor methods draft layout code calls."""

    def __init__(self, array: np.ndarray, draft: bool = False) -> None:
        self.array = array
        self.draft = draft

    def _new(self, array: np.ndarray) -> "Tensor":
        return Tensor(array, self.draft)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def dim(self) -> int:
        return self.array.ndim

    def numel(self) -> int:
        return int(self.array.size)

    def __len__(self) -> int:
        return len(self.array)

    def reshape(self, *shape: Any) -> "Tensor":
        return self._new(self.array.reshape(_dims(shape)))

    def view(self, *shape: Any) -> "Tensor":
        viewed = self.array.reshape(_dims(shape))
        if viewed.size and not np.shares_memory(viewed, self.array):
            raise RuntimeError("view size is not compatible with input tensor's size and stride")
        return self._new(viewed)

    def permute(self, *dims: Any) -> "Tensor":
        return self._new(np.transpose(self.array, _dims(dims)))

    def transpose(self, dim0: int, dim1: int) -> "Tensor":
        return self._new(np.swapaxes(self.array, dim0, dim1))

    swapaxes = swapdims = transpose

    def movedim(self, source: Any, destination: Any) -> "Tensor":
        return self._new(np.moveaxis(self.array, source, destination))

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> "Tensor":
        shape = self.shape
        start, end = start_dim % len(shape), end_dim % len(shape)
        merged = int(np.prod(shape[start : end + 1]))
        return self._new(self.array.reshape(shape[:start] + (merged,) + shape[end + 1 :]))

    def contiguous(self) -> "Tensor":
        return self._new(np.ascontiguousarray(self.array))

    def clone(self) -> "Tensor":
        return self._new(self.array.copy())

    def to(self, *_args: Any, **_kwargs: Any) -> "Tensor":
        return self

    def long(self) -> "Tensor":
        return self

    int = long

    def chunk(self, chunks: int, dim: int = 0) -> tuple["Tensor", ...]:
        return tuple(self._new(a) for a in np.array_split(self.array, chunks, axis=dim))

    def unbind(self, dim: int = 0) -> tuple["Tensor", ...]:
        return tuple(self._new(np.take(self.array, i, axis=dim)) for i in range(self.shape[dim]))

    def split(self, size: int, dim: int = 0) -> tuple["Tensor", ...]:
        edges = list(range(size, self.shape[dim], size))
        return tuple(self._new(a) for a in np.split(self.array, edges, axis=dim))

    def tolist(self) -> Any:
        return self.array.tolist()

    def __getitem__(self, index: Any) -> "Tensor":
        return self._new(self.array[index])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tensor) and self.shape == other.shape and bool(np.array_equal(self.array, other.array))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"tensor{self.shape}"


def arange(n: int, draft: bool = False) -> Tensor:
    return Tensor(np.arange(n), draft)


def zeros(shape: Sequence[int]) -> Tensor:
    return Tensor(np.zeros(tuple(int(s) for s in shape), dtype=np.int64))


def chunk(tensor: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    return tensor.chunk(chunks, dim)


def split(tensor: Tensor, size: int, dim: int = 0) -> tuple[Tensor, ...]:
    return tensor.split(size, dim)


def unbind(tensor: Tensor, dim: int = 0) -> tuple[Tensor, ...]:
    return tensor.unbind(dim)
