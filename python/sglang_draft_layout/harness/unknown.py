"""What a draft path reads from outside itself, and the decisions Python takes on it.

An ``Unknown`` stands for anything the path does not own: the model runner and server args past
the probe's facts, kernels, other modules. It records what it is handed (``Run.handed``). Where
Python needs a decision from one (``bool``, ``in``, ``isinstance``, how many items a loop gets)
the run takes it (``Run.decide``), by name, so one unknown answers alike each time; the caller
repeats the run with each choice. Where Python needs a number (``int``, ``len``, an index) the path
cannot be run: ``NeedsValue``. An unknown is never None.
"""

from __future__ import annotations

import dis
import sys
from typing import Any, Callable, Optional

RAISE = dis.opmap["RAISE_VARARGS"]
#: the draft kernel's launch k fills its kv_indices rows with ``TAG * (k + 1) + position``: a slice or copy of them
#: says which row and where in it
TAG = 10_000_000
#: the file names the tree's code is compiled under: its frames are the ones decisions are charged to
TREE_FILES: set[str] = set()
_UNPACK_SEQUENCE, _UNPACK_EX = dis.opmap["UNPACK_SEQUENCE"], dis.opmap["UNPACK_EX"]


def in_package(filename: str) -> str:
    """A file of the tree as a problem names it: its path under the ``sglang`` package."""
    return filename.rpartition("sglang/")[2]


class NeedsValue(Exception):
    """Python needs a number from an unknown: this path cannot be run."""


class Run:
    """One execution of a path: decisions ``forced`` on it, those it ``took`` (in order, ``fresh``: taken by
    default here), the frames that took them, and what it saw (``events``, ``handed`` adds to them)."""

    current: Optional["Run"] = None

    def __init__(self, forced: Optional[dict[str, bool]] = None, handed: Optional[Callable] = None) -> None:
        self.forced, self.took, self.fresh = dict(forced or {}), {}, []
        self.frames: list = []
        self.events: list = []
        self.on_handed = handed
        self.step: Optional[int] = None  # the draft step whose per-step backend runs now
        self.facts: dict = {}  # what the run's world knows (``paths.facts``)

    def decide(self, key: str) -> bool:
        if key not in self.took:
            self.took[key] = self.forced.get(key, True)
            if key not in self.forced:
                self.fresh.append(key)
        frame = tree_frame(sys._getframe(1))
        if frame is not None:
            self.frames.append(frame)
        return self.took[key]

    def __enter__(self) -> "Run":
        self.outer, Run.current = Run.current, self
        return self

    def __exit__(self, *exc: object) -> None:
        Run.current = self.outer
        self.frames.clear()


def decide(key: str) -> bool:
    """The run's choice (outside any run, module code: True)."""
    return Run.current.decide(key) if Run.current is not None else True


def handed(callee: "Unknown", args: tuple, kwargs: dict) -> None:
    run = Run.current
    if run is not None and run.on_handed is not None:
        run.on_handed(callee, args, kwargs)


def note(kind: str, *data: Any) -> None:
    """Something the run saw (``Run.events``): an allocation, a kernel launch, a step's write target."""
    if Run.current is not None:
        Run.current.events.append((kind, *data))


def tree_frame(frame: Any) -> Any:
    while frame is not None and frame.f_code.co_filename not in TREE_FILES:
        frame = frame.f_back
    return frame


def refused_by_decision(error: BaseException, run: Run) -> bool:
    """``error`` is a ``raise`` or ``assert`` of the tree's own, in a frame that took a decision on an
    unknown: the code refusing a value the run chose, not a result on the probe."""
    tb, last = error.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename in TREE_FILES:
            last = tb
        tb = tb.tb_next
    if last is None or last.tb_next is not None or last.tb_frame.f_code.co_code[last.tb_lasti] != RAISE:
        return False
    return any(frame is last.tb_frame for frame in run.frames)


def _unpacked(frame: Any) -> Optional[int]:
    """How many items the instruction running in ``frame`` unpacks (``a, b = x``), or None: read off its bytecode
    (an instruction's argument past 255 held by the ``EXTENDED_ARG`` units before it)."""
    code, at = frame.f_code.co_code, frame.f_lasti
    op = code[at]
    if op not in (_UNPACK_SEQUENCE, _UNPACK_EX):
        return None
    arg, shift = code[at + 1], 8
    while at >= 2 and code[at - 2] == dis.EXTENDED_ARG:
        at -= 2
        arg, shift = arg | code[at + 1] << shift, shift + 8
    return arg if op == _UNPACK_SEQUENCE else (arg & 0xFF) + (arg >> 8)


def _name(value: Any) -> str:
    return value._name if isinstance(value, Unknown) else repr(value) if isinstance(value, (int, str)) else "?"


class Unknown:
    """A value from outside the path, named by where it came from; ``_fn``: the function a decorator
    (``@triton.jit``) was given; ``_resolve``: the class it is when used as a base. An attribute the run's
    world knows of every outside object (``Run.facts["attributes"]``) is that value."""

    __slots__ = ("_name", "_fn", "_resolve", "_attrs")

    def __init__(self, name: str, fn: Any = None, resolve: Optional[Callable[[], Any]] = None) -> None:
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_fn", fn)
        object.__setattr__(self, "_resolve", resolve)
        object.__setattr__(self, "_attrs", {})

    def __repr__(self) -> str:
        return f"<{self._name}>"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        if attr not in self._attrs:
            known = Run.current.facts.get("attributes", {}) if Run.current is not None else {}
            if attr in known:  # the run's, not kept: an unknown may outlive the run
                return known[attr]
            self._attrs[attr] = Unknown(f"{self._name}.{attr}")
        return self._attrs[attr]

    def __setattr__(self, attr: str, value: Any) -> None:
        self._attrs[attr] = value

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        handed(self, args, kwargs)
        if self._fn is None and len(args) == 1 and not kwargs and hasattr(args[0], "__code__"):
            return Unknown(args[0].__name__, fn=args[0])  # a decorator keeps the function it wraps
        return Unknown(f"{self._name}(...)", self._fn)

    def __getitem__(self, index: Any) -> "Unknown":
        handed(self, (index,), {})
        return Unknown(f"{self._name}[{_name(index)}]", self._fn)

    def __setitem__(self, index: Any, value: Any) -> None:
        handed(self, (index, value), {})

    def __bool__(self) -> bool:
        return decide(self._name)

    def __contains__(self, item: Any) -> bool:
        return decide(f"{_name(item)} in {self._name}")

    def __iter__(self):
        count = _unpacked(sys._getframe(1))
        if count is None:
            count = int(decide(f"items of {self._name}"))
        return iter([Unknown(f"{self._name}[{i}]") for i in range(count)])

    def __len__(self) -> int:
        raise NeedsValue(f"len({self._name})")

    def __index__(self) -> int:
        raise NeedsValue(f"the number {self._name}")

    __int__ = __float__ = __complex__ = __index__

    def __hash__(self) -> int:
        return id(self)

    def __enter__(self) -> "Unknown":
        return self

    def __exit__(self, *exc: object) -> bool:
        return False

    def __instancecheck__(self, instance: Any) -> bool:
        return decide(f"isinstance({_name(instance)}, {self._name})")

    def __subclasscheck__(self, cls: Any) -> bool:
        return decide(f"issubclass(?, {self._name})")

    def __mro_entries__(self, bases: tuple) -> tuple:
        resolved = self._resolve() if self._resolve is not None else None
        return (resolved if isinstance(resolved, type) else Outside,)

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> "Unknown":
        handed(Unknown(f"torch.{getattr(func, '__name__', '?')}"), args, kwargs or {})
        return Unknown(f"torch.{getattr(func, '__name__', '?')}(...)")


def _operator(symbol: str, reflected: bool = False) -> Callable:
    def apply(self: Unknown, other: Any = None) -> Unknown:
        handed(self, (other,), {})
        left, right = (_name(other), self._name) if reflected else (self._name, _name(other))
        return Unknown(f"({left} {symbol} {right})")

    return apply


#: the operators an unknown takes part in (each reflected too): symbol, the name of its method
_BINARY = "+ add - sub * mul @ matmul / truediv // floordiv % mod ** pow << lshift >> rshift & and | or ^ xor".split()
for _symbol, _names in zip(_BINARY[::2], _BINARY[1::2]):
    setattr(Unknown, f"__{_names}__", _operator(_symbol))
    setattr(Unknown, f"__r{_names}__", _operator(_symbol, reflected=True))
for _symbol, _names in {"==": "eq", "!=": "ne", "<": "lt", "<=": "le", ">": "gt", ">=": "ge"}.items():
    setattr(Unknown, f"__{_names}__", _operator(_symbol))
for _names in ("neg", "pos", "abs", "invert"):
    setattr(Unknown, f"__{_names}__", _operator(_names))


def server_args(*_args: Any, **_kwargs: Any) -> Any:
    """The run's server args (``get_global_server_args()``, ``get_spec()``, ...)."""
    facts = getattr(Run.current, "facts", None)
    return facts["server_args"] if facts else Unknown("server_args")


def batch_sizes_to_capture(*args: Any, **kwargs: Any) -> Any:
    """``get_batch_sizes_to_capture(model_runner)``: the batch sizes a CUDA-graph runner captures, sorted, the largest
    the probe's ``max_bs``, and those it compiles (none), as SGLang returns them (0.5.12's
    ``model_executor/cuda_graph_runner.py``)."""
    facts = getattr(Run.current, "facts", None)
    if not facts:
        return Unknown("get_batch_sizes_to_capture")(*args, **kwargs)
    return list(facts["capture_bs"]), []


def cuda_graph_max_batch_size(*args: Any) -> Any:
    """``get_cuda_graph_max_batch_size(n)`` (0.5.19 on; ``(server_args, n)`` in 0.5.17 and 0.5.18): ``n`` rounded up to
    the CUDA graph's batch alignment, 1 on the probe's one GPU (``utils/common.py``)."""
    return args[-1]


def one_gpu(*_args: Any, **_kwargs: Any) -> int:
    """``get_attention_tp_size()``, ``get_attention_cp_size()``, ``get_attention_dp_size()`` (``layers/dp_attention.py``,
    0.4.8 on): the probe's server runs on one GPU."""
    return 1


def parallel(*_args: Any, **_kwargs: Any) -> "Known":
    """``get_parallel()`` (``runtime_context.py``, 0.5.2x): on one GPU every size (``attn_tp_size``) is 1, every rank 0."""
    return Known("parallel", like={"_size": 1, "_rank": 0})


class ServerArgsDict:
    """``global_server_args_dict``: the run's server args by key."""

    def __getitem__(self, key: str) -> Any:
        return getattr(server_args(), key)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(server_args(), key)

    __getattr__ = __getitem__


class Outside:
    """A base class from outside the tree: takes any arguments; what it would have set is unknown."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __init_subclass__(cls, **kwargs: Any) -> None:
        pass

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        value = Unknown(f"{type(self).__name__}.{attr}")
        object.__setattr__(self, attr, value)
        return value


class Known:
    """A probe object: the attributes the probe gives it (``like``: any attribute whose name holds a key is
    that key's value); any other is an unknown of its own, kept."""

    def __init__(self, name: str, like: Optional[dict] = None, **attrs: Any) -> None:
        self.__dict__.update(attrs)
        self.__dict__["_name"], self.__dict__["_like"] = name, like or {}

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        like = next((v for k, v in self._like.items() if k in attr), None)
        value = like if like is not None else Unknown(f"{self._name}.{attr}")
        self.__dict__[attr] = value
        return value

    def __repr__(self) -> str:
        return f"<{self._name}>"
