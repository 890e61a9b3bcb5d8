"""Torch as a draft path sees it, without torch: a strided integer tensor and a ``torch`` module.

``Tensor`` keeps torch's semantics for what layout code does (views share storage and follow torch's
stride rules, ``view`` refuses what torch refuses, ``reshape`` copies where torch does, indexing,
broadcasting arithmetic); ``test/unit/test_harness_tensors.py`` checks each operation against torch
itself. Anything else a path calls on a tensor, or any ``torch`` function this module does not
define, is an ``Unknown`` handed the tensor. ``check`` runs on this; the written CPU test runs the
same harness on real torch (``torch_backend``).
"""

from __future__ import annotations

import itertools
import math
import operator
from typing import Any, Iterable, Iterator, Optional, Sequence

from .unknown import Unknown, note

INVALID_VIEW = (
    "view size is not compatible with input tensor's size and stride (at least one dimension spans "
    "across two contiguous subspaces). Use .reshape(...) instead."
)


class Dtype:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"torch.{self.name}"


class Device:
    type = "cpu"
    index = None

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        pass

    def __repr__(self) -> str:
        return "device(type='cpu')"


class Size(tuple):
    def numel(self) -> int:
        return math.prod(self)

    def __repr__(self) -> str:
        return f"torch.Size({list(self)})"


INT64 = Dtype("int64")
#: an allocation larger than this (a workspace buffer) is unknown: no layout of a probe is that large
LARGE = 1 << 20


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _view_strides(shape: Sequence[int], strides: Sequence[int], new: Sequence[int]) -> Optional[list[int]]:
    """The strides of ``new`` over the same storage, or None (ATen's ``computeStride``)."""
    if not shape:
        return [1] * len(new)
    if math.prod(shape) == 0:
        return list(_contiguous_strides(new))
    result, view_d = [0] * len(new), len(new) - 1
    base, tensor_numel, view_numel = strides[-1], 1, 1
    for tensor_d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[tensor_d]
        if tensor_d == 0 or (shape[tensor_d - 1] != 1 and strides[tensor_d - 1] != tensor_numel * base):
            while view_d >= 0 and (view_numel < tensor_numel or new[view_d] == 1):
                result[view_d] = view_numel * base
                view_numel *= new[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if tensor_d > 0:
                base, tensor_numel, view_numel = strides[tensor_d - 1], 1, 1
    return result if view_d == -1 else None


def _dims(args: tuple) -> tuple:
    return tuple(args[0]) if len(args) == 1 and isinstance(args[0], (tuple, list)) else tuple(args)


def _has_unknown(values: Any) -> bool:
    if isinstance(values, Unknown):
        return True
    if isinstance(values, (tuple, list)):
        return any(map(_has_unknown, values))
    if isinstance(values, dict):
        return any(map(_has_unknown, values.values()))
    return False


def _shape(args: tuple, numel: int) -> tuple[int, ...]:
    shape = [operator.index(s) for s in _dims(args)]
    if shape.count(-1) == 1:
        known = math.prod(s for s in shape if s != -1)
        if known == 0 or numel % known:
            raise RuntimeError(f"shape '{shape}' is invalid for input of size {numel}")
        shape[shape.index(-1)] = numel // known
    if math.prod(shape) != numel:
        raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {numel}")
    return tuple(shape)


class Tensor:
    """A strided view of a list of integers, with torch's names."""

    def __init__(self, data: list, shape: Sequence[int], strides: Optional[Sequence[int]] = None, offset: int = 0,
                 dtype: Dtype = INT64) -> None:  # fmt: skip
        self._data, self._shape = data, tuple(shape)
        self._strides = tuple(strides) if strides is not None else _contiguous_strides(shape)
        self._offset, self.dtype = offset, dtype

    # -- what a tensor is ------------------------------------------------------------------------
    device = Device()
    is_cuda = False

    @property
    def shape(self) -> Size:
        return Size(self._shape)

    def size(self, dim: Optional[int] = None) -> Any:
        return self.shape if dim is None else self._shape[dim]

    def dim(self) -> int:
        return len(self._shape)

    ndim = property(dim)

    def numel(self) -> int:
        return math.prod(self._shape)

    nelement = numel

    def stride(self, dim: Optional[int] = None) -> Any:
        return self._strides if dim is None else self._strides[dim]

    def storage_offset(self) -> int:
        return self._offset

    def data_ptr(self) -> int:
        return id(self._data) + 8 * self._offset

    def untyped_storage(self) -> "Tensor":
        return Tensor(self._data, (len(self._data),))

    def element_size(self) -> int:
        return 8

    def is_contiguous(self) -> bool:
        return self.numel() == 0 or all(
            n == 1 or s == c for n, s, c in zip(self._shape, self._strides, _contiguous_strides(self._shape))
        )

    def _places(self) -> Iterator[int]:
        if self.is_contiguous():
            return iter(range(self._offset, self._offset + self.numel()))
        return self._strided_places()

    def _strided_places(self) -> Iterator[int]:
        for index in itertools.product(*map(range, self._shape)):
            yield self._offset + sum(i * s for i, s in zip(index, self._strides))

    def _flat(self) -> list:
        if self.is_contiguous():
            return self._data[self._offset : self._offset + self.numel()]
        return [self._data[p] for p in self._places()]

    def _new(self, values: list, shape: Sequence[int], dtype: Optional[Dtype] = None) -> "Tensor":
        return Tensor(values, shape, dtype=dtype or self.dtype)

    def tolist(self) -> Any:
        values = iter(self._flat())

        def nested(shape: tuple) -> Any:
            return [nested(shape[1:]) for _ in range(shape[0])] if shape else next(values)

        return nested(self._shape)

    def item(self) -> int:
        if self.numel() != 1:
            raise RuntimeError(f"a Tensor with {self.numel()} elements cannot be converted to Scalar")
        return self._flat()[0]

    __int__ = __index__ = item

    def __bool__(self) -> bool:
        if self.numel() != 1:
            raise RuntimeError("Boolean value of Tensor with more than one value is ambiguous")
        return bool(self._flat()[0])

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d tensor")
        return self._shape[0]

    def __iter__(self) -> Iterator["Tensor"]:
        return (self[i] for i in range(len(self)))

    def __repr__(self) -> str:
        return f"tensor({self.tolist()})"

    __hash__ = object.__hash__

    # -- views -----------------------------------------------------------------------------------
    def _as(self, shape: Sequence[int], strides: Sequence[int], offset: Optional[int] = None) -> "Tensor":
        return Tensor(self._data, shape, strides, self._offset if offset is None else offset, self.dtype)

    def view(self, *shape: Any) -> "Tensor":
        if len(shape) == 1 and isinstance(shape[0], Dtype):
            return self._as(self._shape, self._strides)
        new = _shape(shape, self.numel())
        strides = _view_strides(self._shape, self._strides, new)
        if strides is None:
            raise RuntimeError(INVALID_VIEW)
        return self._as(new, strides)

    def reshape(self, *shape: Any) -> "Tensor":
        new = _shape(shape, self.numel())
        strides = _view_strides(self._shape, self._strides, new)
        return self._as(new, strides) if strides is not None else self.contiguous().view(new)

    def view_as(self, other: "Tensor") -> "Tensor":
        return self.view(other.shape)

    def reshape_as(self, other: "Tensor") -> "Tensor":
        return self.reshape(other.shape)

    def _dim(self, dim: int) -> int:
        rank = max(len(self._shape), 1)
        if not -rank <= dim < rank:
            raise IndexError(
                f"Dimension out of range (expected to be in range of [{-rank}, {rank - 1}], but got {dim})"
            )
        return dim % rank

    def permute(self, *dims: Any) -> "Tensor":
        order = [self._dim(d) for d in _dims(dims)]
        if sorted(order) != list(range(len(self._shape))):
            raise RuntimeError("permute(): dims don't match the tensor's dimensions")
        return self._as([self._shape[d] for d in order], [self._strides[d] for d in order])

    def transpose(self, dim0: int, dim1: int) -> "Tensor":
        if not self._shape:  # a 0-d tensor: dims 0 and -1 are itself
            self._dim(dim0), self._dim(dim1)
            return self
        order = list(range(len(self._shape)))
        a, b = self._dim(dim0), self._dim(dim1)
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    swapaxes = swapdims = transpose

    def t(self) -> "Tensor":
        if len(self._shape) > 2:
            raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {len(self._shape)}D")
        return self.transpose(0, 1) if len(self._shape) == 2 else self

    def movedim(self, source: Any, destination: Any) -> "Tensor":
        if not self._shape:
            return self.transpose(source, destination)
        sources = [self._dim(d) for d in (source if isinstance(source, (tuple, list)) else [source])]
        targets = [self._dim(d) for d in (destination if isinstance(destination, (tuple, list)) else [destination])]
        rest = [d for d in range(len(self._shape)) if d not in sources]
        order = [-1] * len(self._shape)
        for s, d in zip(sources, targets):
            order[d] = s
        free = iter(rest)
        return self.permute([d if d != -1 else next(free) for d in order])

    moveaxis = movedim

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> "Tensor":
        if not self._shape:
            self._dim(start_dim), self._dim(end_dim)
            return self.reshape(1)
        start, end = self._dim(start_dim), self._dim(end_dim)
        return self.reshape(self._shape[:start] + (math.prod(self._shape[start : end + 1]),) + self._shape[end + 1 :])

    def unflatten(self, dim: int, sizes: Sequence[int]) -> "Tensor":
        dim = self._dim(dim)
        inner = _shape(tuple(sizes), self._shape[dim])
        return self.view(self._shape[:dim] + inner + self._shape[dim + 1 :])

    def unsqueeze(self, dim: int) -> "Tensor":
        rank = len(self._shape) + 1
        if not -rank <= dim < rank:
            raise IndexError(
                f"Dimension out of range (expected to be in range of [{-rank}, {rank - 1}], but got {dim})"
            )
        dim = dim % rank
        stride = self._strides[dim] * self._shape[dim] if dim < len(self._shape) else 1
        return self._as(
            self._shape[:dim] + (1,) + self._shape[dim:], self._strides[:dim] + (stride,) + self._strides[dim:]
        )

    def squeeze(self, dim: Optional[int] = None) -> "Tensor":
        keep = [d for d, n in enumerate(self._shape) if n != 1 or (dim is not None and d != self._dim(dim))]
        return self._as([self._shape[d] for d in keep], [self._strides[d] for d in keep])

    def expand(self, *sizes: Any) -> "Tensor":
        sizes = _dims(sizes)
        shape, strides = list(self._shape), list(self._strides)
        pad = len(sizes) - len(shape)
        shape, strides = [1] * pad + shape, [0] * pad + strides
        for d, size in enumerate(sizes):
            if size != -1 and size != shape[d]:
                if shape[d] != 1:
                    raise RuntimeError(
                        f"The expanded size of the tensor ({size}) must match the existing size ({shape[d]})"
                    )
                shape[d], strides[d] = size, 0
        return self._as(shape, strides)

    def contiguous(self) -> "Tensor":
        return self if self.is_contiguous() else self._new(self._flat(), self._shape)

    def clone(self) -> "Tensor":
        return self._new(self._flat(), self._shape)

    def to(self, *args: Any, **kwargs: Any) -> "Tensor":
        dtype = next((a for a in (*args, kwargs.get("dtype")) if isinstance(a, Dtype)), None)
        return self if dtype is None or dtype is self.dtype else self._new(self._flat(), self._shape, dtype)

    def long(self) -> "Tensor":
        return self.to(INT64)

    def int(self) -> "Tensor":
        return self.to(FACADE.int32)

    def cpu(self, *_args: Any, **_kwargs: Any) -> "Tensor":
        return self

    cuda = pin_memory = detach = cpu

    def __getitem__(self, index: Any) -> Any:
        if _has_unknown(index) or isinstance(index, Tensor):
            return Unknown("tensor[...]")(self, index)
        shape, strides, offset = [], [], self._offset
        parts = list(index) if isinstance(index, tuple) else [index]
        if any(isinstance(p, (list, Tensor)) for p in parts):
            return Unknown("tensor[...]")(self, index)
        if Ellipsis in parts:
            at = parts.index(Ellipsis)
            taken = sum(p is not None for p in parts) - 1
            parts[at : at + 1] = [slice(None)] * (len(self._shape) - taken)
        dim = 0
        for part in parts:
            if part is None:  # as unsqueeze there
                shape.append(1)
                strides.append(self._shape[dim] * self._strides[dim] if dim < len(self._shape) else 1)
                continue
            if dim >= len(self._shape):
                raise IndexError(f"too many indices for tensor of dimension {len(self._shape)}")
            size, stride = self._shape[dim], self._strides[dim]
            if isinstance(part, slice):
                start, stop, step = part.indices(size)
                if step <= 0:
                    raise ValueError("step must be greater than zero")
                shape.append(max(0, (stop - start + step - 1) // step))
                strides.append(stride * step)
                offset += start * stride if shape[-1] else 0
            else:
                position = operator.index(part)
                if not -size <= position < size:
                    raise IndexError(f"index {position} is out of bounds for dimension {dim} with size {size}")
                offset += (position % size) * stride
            dim += 1
        return self._as(shape + list(self._shape[dim:]), strides + list(self._strides[dim:]), offset)

    def __setitem__(self, index: Any, value: Any) -> None:
        target = self[index]
        if isinstance(target, Unknown) or isinstance(value, Unknown):
            return
        target.copy_(value)

    # -- values ----------------------------------------------------------------------------------
    def copy_(self, other: Any, *_args: Any, **_kwargs: Any) -> "Tensor":
        if isinstance(other, Unknown):
            return other.copy_(self)
        values = _broadcast(other, self._shape) if isinstance(other, Tensor) else None
        for place, value in zip(self._places(), values or itertools.repeat(other)):
            self._data[place] = value
        return self

    def fill_(self, value: Any) -> "Tensor":
        return self.copy_(value)

    def zero_(self) -> "Tensor":
        return self.copy_(0)

    def _binary(self, other: Any, op: Any, reflected: bool = False) -> Any:
        if isinstance(other, Unknown):
            return NotImplemented
        if not isinstance(other, (Tensor, int, float, bool)):
            return NotImplemented
        shape = _broadcast_shape(self._shape, other._shape if isinstance(other, Tensor) else ())
        left, right = _broadcast(self, shape), _broadcast(other, shape)
        if reflected:
            left, right = right, left
        return self._new([op(a, b) for a, b in zip(left, right)], shape)

    def _reduce(self, op: Any, dim: Any = None) -> Any:
        if dim is not None:
            return Unknown("tensor.reduce")(self, dim)
        values = self._flat()
        if not values:
            raise RuntimeError("operation does not have an identity")
        return self._new([op(values)], ())

    def sum(self, dim: Any = None, **_kwargs: Any) -> Any:
        return self._reduce(sum, dim) if self.numel() else self._new([0], ())

    def max(self, dim: Any = None) -> Any:
        return self._reduce(max, dim)

    def min(self, dim: Any = None) -> Any:
        return self._reduce(min, dim)

    def chunk(self, chunks: int, dim: int = 0) -> tuple:
        """torch's: parts of ceil(size / chunks), the last smaller (so maybe fewer than ``chunks``); an empty
        dimension gives ``chunks`` empty parts."""
        if not self._shape:
            raise RuntimeError("chunk expects at least a 1-dimensional tensor")
        if isinstance(chunks, int) and chunks <= 0:
            raise RuntimeError(f"chunk expects `chunks` to be greater than 0, got: {chunks}")
        size = self._shape[self._dim(dim)]
        if size == 0:
            return self.split([0] * chunks, dim)
        return self.split(-(-size // chunks), dim)

    def split(self, size: Any, dim: int = 0) -> tuple:
        """torch's: parts ``size`` wide, the last smaller (an empty dimension: one empty part), or the parts
        the list ``size`` gives, which must sum to the dimension's size."""
        if not self._shape:
            raise RuntimeError("split expects at least a 1-dimensional tensor")
        dim = self._dim(dim)
        length = self._shape[dim]
        if isinstance(size, (list, tuple)):
            sizes = list(size)
            if all(isinstance(s, int) for s in sizes) and (sum(sizes) != length or min(sizes, default=0) < 0):
                raise RuntimeError(
                    f"split_with_sizes expects split_sizes to sum exactly to {length} with only non-negative "
                    f"entries, but got split_sizes={sizes}"
                )
        elif isinstance(size, int):
            if size < 0 or (size == 0 and length):
                raise RuntimeError(f"split_size {size} is negative, or 0 with dimension size {length}")
            sizes = [size] * (length // size) + [length % size] * bool(length % size) if size else []
            sizes = sizes or [0]
        else:  # an unknown width: parts of it until the dimension is covered
            sizes, start = [], 0
            while start < length:
                sizes.append(size)
                start += size
        parts, start = [], 0
        for width in sizes:
            parts.append(self[tuple([slice(None)] * dim + [slice(start, start + width)])])
            start += width
        return tuple(parts)

    def unbind(self, dim: int = 0) -> tuple:
        dim = self._dim(dim)
        return tuple(self[tuple([slice(None)] * dim + [i])] for i in range(self._shape[dim]))

    def new_zeros(self, *size: Any, **kwargs: Any) -> Any:
        return FACADE.zeros(*size, dtype=kwargs.get("dtype", self.dtype))

    def new_empty(self, *size: Any, **kwargs: Any) -> Any:
        return FACADE.empty(*size, dtype=kwargs.get("dtype", self.dtype))

    def new_ones(self, *size: Any, **kwargs: Any) -> Any:
        return FACADE.ones(*size, dtype=kwargs.get("dtype", self.dtype))

    def new_full(self, size: Any, fill_value: Any, **kwargs: Any) -> Any:
        return FACADE.full(size, fill_value, dtype=kwargs.get("dtype", self.dtype))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        unknown = Unknown(f"tensor.{name}")
        return lambda *args, **kwargs: unknown(self, *args, **kwargs)


def _broadcast_shape(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    shape = []
    for x, y in itertools.zip_longest(reversed(a), reversed(b), fillvalue=1):
        if x != y and 1 not in (x, y):
            raise RuntimeError(f"The size of tensor a ({x}) must match the size of tensor b ({y})")
        shape.append(max(x, y) if 0 not in (x, y) else 0)
    return tuple(reversed(shape))


def _broadcast(value: Any, shape: Sequence[int]) -> list:
    if not isinstance(value, Tensor):
        return [value] * math.prod(shape)
    return value.expand(shape)._flat() if value._shape != tuple(shape) else value._flat()


_ARITHMETIC = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "floordiv": operator.floordiv,
    "mod": operator.mod,
    "and": operator.and_,
    "or": operator.or_,
}
for _name, _op in _ARITHMETIC.items():
    setattr(Tensor, f"__{_name}__", lambda self, other, op=_op: self._binary(other, op))
    setattr(Tensor, f"__r{_name}__", lambda self, other, op=_op: self._binary(other, op, reflected=True))
for _name, _op in {"eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le,
                   "gt": operator.gt, "ge": operator.ge}.items():  # fmt: skip
    setattr(Tensor, f"__{_name}__", lambda self, other, op=_op: self._binary(other, lambda a, b: int(op(a, b))))
Tensor.__neg__ = lambda self: self._binary(-1, operator.mul)
Tensor.add_ = lambda self, other, **_kw: self.copy_(self + other)


def _identity_decorator(*args: Any, **_kwargs: Any) -> Any:
    """``torch.compile(fn)``, ``@torch.compile(dynamic=True)``, ``@torch.no_grad()`` and ``with torch.no_grad():``."""
    if len(args) == 1 and callable(args[0]):
        return args[0]
    return _Passthrough()


class _Passthrough:
    def __call__(self, fn: Any) -> Any:
        return fn

    def __enter__(self) -> "_Passthrough":
        return self

    def __exit__(self, *exc: object) -> bool:
        return False


class Torch:
    """The ``torch`` the tree's modules import: tensor creation here (each allocation noted), dtypes and
    devices; any other name an ``Unknown`` (``torch.cuda``, ``torch.nn.functional``, kernels)."""

    Tensor, Size, device, dtype = Tensor, Size, Device, Dtype
    compile = no_grad = inference_mode = _identity_decorator

    def __init__(self) -> None:
        for name in ("int8", "int16", "int32", "int64", "uint8", "bool", "float16", "bfloat16", "float32", "float64",
                     "float8_e4m3fn", "float8_e5m2"):  # fmt: skip
            setattr(self, name, INT64 if name == "int64" else Dtype(name))
        self.long, self.int, self.half, self.float, self.double = (
            self.int64,
            self.int32,
            self.float16,
            self.float32,
            self.float64,
        )

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Unknown(f"torch.{name}")

    def _made(self, name: str, args: tuple, kwargs: dict, values: Any, shape: Any) -> Any:
        if _has_unknown(args) or _has_unknown(kwargs) or math.prod(shape) > LARGE:
            return Unknown(f"torch.{name}")(*args, **kwargs)
        dtype = kwargs.get("dtype") if isinstance(kwargs.get("dtype"), Dtype) else INT64
        tensor = Tensor(values(math.prod(shape)), shape, dtype=dtype)
        note("alloc", tensor)
        return tensor

    def empty(self, *size: Any, **kwargs: Any) -> Any:
        shape = _dims(size)
        return self._made("empty", size, kwargs, lambda n: [0] * n, shape if not _has_unknown(shape) else ())

    zeros = empty

    def ones(self, *size: Any, **kwargs: Any) -> Any:
        shape = _dims(size)
        return self._made("ones", size, kwargs, lambda n: [1] * n, shape if not _has_unknown(shape) else ())

    def full(self, size: Any, fill_value: Any, **kwargs: Any) -> Any:
        shape = _dims((size,))
        fill = fill_value if not isinstance(fill_value, Unknown) else 0
        args = (size, fill_value)
        return self._made("full", args, kwargs, lambda n: [fill] * n, shape if not _has_unknown(args) else ())

    def arange(self, *args: Any, **kwargs: Any) -> Any:
        bounds = args if not _has_unknown(args) else (0,)
        values = list(range(*[operator.index(a) for a in bounds]))
        return self._made("arange", args, kwargs, lambda _n: values, (len(values),))

    def tensor(self, data: Any, **kwargs: Any) -> Any:
        if _has_unknown(data) or isinstance(data, Tensor):
            return Unknown("torch.tensor")(data, **kwargs)
        shape, level = [], data
        while isinstance(level, (list, tuple)):
            shape.append(len(level))
            level = level[0] if level else None
        values = list(data) if isinstance(data, (list, tuple)) else [data]
        for _ in shape[1:]:
            values = [v for row in values for v in row]
        return self._made("tensor", (), kwargs, lambda _n: values, tuple(shape))

    def empty_like(self, other: Any, **kwargs: Any) -> Any:
        return self.zeros(other.shape, **kwargs) if isinstance(other, Tensor) else Unknown("torch.empty_like")(other)

    def zeros_like(self, other: Any, **kwargs: Any) -> Any:
        return self.zeros(other.shape, **kwargs) if isinstance(other, Tensor) else Unknown("torch.zeros_like")(other)

    def ones_like(self, other: Any, **kwargs: Any) -> Any:
        return self.ones(other.shape, **kwargs) if isinstance(other, Tensor) else Unknown("torch.ones_like")(other)

    @staticmethod
    def chunk(tensor: Any, chunks: int, dim: int = 0) -> Any:
        return tensor.chunk(chunks, dim) if isinstance(tensor, Tensor) else Unknown("torch.chunk")(tensor, chunks, dim)

    @staticmethod
    def split(tensor: Any, size: Any, dim: int = 0) -> Any:
        return tensor.split(size, dim) if isinstance(tensor, Tensor) else Unknown("torch.split")(tensor, size, dim)

    @staticmethod
    def unbind(tensor: Any, dim: int = 0) -> Any:
        return tensor.unbind(dim) if isinstance(tensor, Tensor) else Unknown("torch.unbind")(tensor, dim)

    def cat(self, tensors: Any, dim: int = 0, **kwargs: Any) -> Any:
        parts = list(tensors) if isinstance(tensors, (list, tuple)) else None
        if not parts or dim != 0 or not all(isinstance(t, Tensor) and t.dim() >= 1 for t in parts):
            return Unknown("torch.cat")(tensors, dim=dim, **kwargs)
        if len({t.shape[1:] for t in parts}) != 1:
            raise RuntimeError("Sizes of tensors must match except in dimension 0")
        values = [v for t in parts for v in t._flat()]
        return Tensor(values, (sum(t.shape[0] for t in parts),) + tuple(parts[0].shape[1:]), dtype=parts[0].dtype)

    # -- what the harness asks of tensors (the same on real torch: torch_backend) ------------------
    @staticmethod
    def _probe_tensor(values: Iterable[int]) -> Tensor:
        values = list(values)
        return Tensor(values, (len(values),))

    @staticmethod
    def _is_tensor(value: Any) -> bool:
        return isinstance(value, Tensor)

    @staticmethod
    def _values(tensor: Tensor) -> tuple:
        return tuple(tensor._flat())

    @staticmethod
    def _place(tensor: Tensor) -> tuple:
        """(storage, offset, shape, strides): where a view lies in the memory it shares."""
        return id(tensor._data), tensor._offset, tuple(tensor._shape), tuple(tensor._strides)

    @staticmethod
    def _tag(tensor: Tensor, base: int) -> None:
        """Fill ``tensor`` with ``base + position`` (what a kernel writes: its rows, position by position)."""
        if tensor.is_contiguous():
            tensor._data[tensor._offset : tensor._offset + tensor.numel()] = range(base, base + tensor.numel())
        else:
            tensor.copy_(Tensor(list(range(base, base + tensor.numel())), tensor.shape))


FACADE = Torch()
