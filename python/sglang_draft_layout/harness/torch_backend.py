"""Torch as a draft path sees it, on real torch: the harness's ``torch`` for a tree where torch imports.

Every function and tensor is torch's own, on the CPU; only tensor and size creation is wrapped (a ``device`` is
dropped, an allocation is noted, a shape holding an ``Unknown`` gives an unknown), and torch's own
``__torch_function__`` protocol makes any operation an unknown takes part in an unknown. The written
CPU test runs the harness on this; ``check`` runs it on ``tensors.Torch``, checked against it.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from .unknown import Unknown, note

_CREATE = ("empty", "zeros", "ones", "full", "arange", "tensor", "empty_like", "zeros_like", "ones_like")


def _unknown_in(values: Any) -> bool:
    if isinstance(values, Unknown):
        return True
    if isinstance(values, (tuple, list)):
        return any(map(_unknown_in, values))
    if isinstance(values, dict):
        return any(map(_unknown_in, values.values()))
    return False


def _identity(*args: Any, **_kwargs: Any) -> Any:
    if len(args) == 1 and callable(args[0]):
        return args[0]
    return torch.no_grad()


class _SizeType(type):
    """``torch.Size`` as the tree's code sees it: built from a shape holding an unknown, an unknown (DeepSeek-V4's
    ``torch.Size((n, 1, self.index_n_heads, self.index_head_dim))``); torch's own sizes are its instances."""

    def __instancecheck__(cls, value: Any) -> bool:
        return isinstance(value, torch.Size)

    def __call__(cls, *args: Any) -> Any:
        return Unknown("torch.Size")(*args) if _unknown_in(args) else torch.Size(*args)


class _Size(metaclass=_SizeType):
    pass


class Torch:
    """The ``torch`` module the tree's code imports."""

    compile = staticmethod(_identity)
    Size = _Size

    def __getattr__(self, name: str) -> Any:
        if name in ("cuda", "distributed", "npu", "xpu", "_dynamo", "_logging"):
            return Unknown(f"torch.{name}")
        if name in _CREATE:
            return lambda *args, **kwargs: self._create(name, args, kwargs)
        value = getattr(torch, name)
        if not callable(value) or isinstance(value, type):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:  # torch.from_numpy(<unknown>): unknown, as torch's own ops are
            return (
                Unknown(f"torch.{name}")(*args, **kwargs)
                if _unknown_in(args) or _unknown_in(kwargs)
                else value(*args, **kwargs)
            )

        return call

    def _create(self, name: str, args: tuple, kwargs: dict) -> Any:
        if _unknown_in(args) or _unknown_in(kwargs):
            return Unknown(f"torch.{name}")(*args, **kwargs)
        kwargs = {k: v for k, v in kwargs.items() if k not in ("device", "pin_memory")}
        tensor = getattr(torch, "zeros" if name == "empty" else name)(*args, **kwargs)
        note("alloc", tensor)
        return tensor

    @staticmethod
    def _probe_tensor(values: Iterable[int]) -> torch.Tensor:
        return torch.tensor(list(values), dtype=torch.int64)

    @staticmethod
    def _is_tensor(value: Any) -> bool:
        return isinstance(value, torch.Tensor)

    @staticmethod
    def _values(tensor: torch.Tensor) -> tuple:
        return tuple(tensor.reshape(-1).tolist())

    @staticmethod
    def _place(tensor: torch.Tensor) -> tuple:
        """(storage, offset, shape, strides): where a view lies in the memory it shares."""
        return tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.stride()

    @staticmethod
    def _tag(tensor: torch.Tensor, base: int) -> None:
        tensor.copy_(torch.arange(base, base + tensor.numel()).view(tensor.shape))


FACADE = Torch()
