"""Run a fork's draft layout code on probe values: a small interpreter over Python's own ``ast``.

It runs a method as Python would (locals, ``if``/``for``/``try``, ``self.`` calls, ``super()``,
explicit base calls, module functions, the live definition of a name defined twice), with the
probe world standing in for SGLang: ``self`` knows its topk / steps / step id / context length,
the forward batch its size and its draft ``out_cache_loc`` buffer (``arrays.arange``, marked
draft). Everything else is ``Unknown``: code that only touches unknowns is skipped; a branch,
loop or handler that cannot be decided and touches the draft layout stops the run with
``CannotProve``. What the run sees is recorded as ``Event`` s: row allocations, kv_indices
slice ends, the draft buffer where code other than layout code first takes it ("loc"), and a
raised error. ``proof.validate.prove`` compares the events of the fork's code with the rewritten code's.

A run given a ``sink`` (a call's name) takes "loc" only where the draft buffer is that call's argument:
the write target a path computes there (DeepSeek-V4's in-graph ``translate_loc_from_full_to_swa``),
whatever other code the batch is handed to; an error counts as the path's own only when raised
``within`` the method judged (``Raised.within``), not on the way to it.
"""

from __future__ import annotations

import ast
import builtins
import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional

from . import arrays
from .arrays import Tensor

#: how deep ``self.`` calls are followed
MAX_DEPTH = 12
_DECODE_MODES = {"is_decode", "is_decode_or_idle"}
_BUILTINS = {
    name: getattr(builtins, name)
    for name in (
        "range",
        "len",
        "int",
        "min",
        "max",
        "enumerate",
        "zip",
        "list",
        "tuple",
        "sum",
        "abs",
        "bool",
        "reversed",
        "isinstance",
        "AssertionError",
        "ValueError",
        "RuntimeError",
        "NotImplementedError",
        "Exception",
    )
}
_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.Div: operator.truediv,
}
_COMPARE = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
#: tensor methods that give a view or copy of their tensor: layout code, not a use of the buffer
LAYOUT_METHODS = frozenset(
    {
        "reshape",
        "view",
        "permute",
        "transpose",
        "swapaxes",
        "swapdims",
        "movedim",
        "flatten",
        "contiguous",
        "clone",
        "to",
        "long",
        "int",
        "chunk",
        "unbind",
        "split",
    }
)


#: tensor methods whose arguments (a dtype, a device) never change which slots a tensor holds
_ARGUMENTS_IGNORED = frozenset({"to", "long", "int", "contiguous", "clone"})


class CannotProve(Exception):
    """The probes cannot run this code: ``str()`` says what, at which line."""


class Diverged(CannotProve):
    """The path calls itself deeper than ``MAX_DEPTH``: on these decisions the code never returns."""


class Unknown:
    """A value the probe world does not bind; ``why`` names the first such expression."""

    def __init__(self, why: str) -> None:
        self.why = why

    def __repr__(self) -> str:
        return f"<unknown {self.why}>"


class Raised(Exception):
    """The code under probe raised ``error`` (a real exception of its own or of the arrays)."""

    def __init__(self, error: BaseException, line: int, explicit: bool = False) -> None:
        super().__init__(f"{type(error).__name__} at line {line}")
        self.error, self.line = error, line
        self.explicit = explicit  # a ``raise`` statement of the code's own, not an error of its arrays
        self.within = False  # raised inside the method a sink run judges (``Run.within``)


class _Return(Exception):
    def __init__(self, value: Any) -> None:
        self.value = value


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


@dataclass(frozen=True)
class Event:
    """What a run saw: ``kind`` "alloc" (a ``torch.empty/zeros`` shape), "slice" (a kv_indices row cut
    at ``value``), "loc" (the draft buffer as code other than layout code first takes it, at step
    ``step``), "handed" (the draft buffer a caller's batch holds as it calls step ``step``'s backend)."""

    kind: str
    value: Any
    step: Optional[int] = None
    line: int = 0

    def same(self, other: "Event") -> bool:
        return (self.kind, self.step) == (other.kind, other.step) and _equal(self.value, other.value)

    def same_value(self, value: Any) -> bool:
        return _equal(self.value, value)


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return isinstance(a, Tensor) and isinstance(b, Tensor) and a == b
    return bool(a == b)


class Obj:
    """An object of the probe world (a forward batch, its spec info): known attributes, the rest unknown."""

    def __init__(self, name: str, **attrs: Any) -> None:
        self.__dict__["_name"] = name
        self.__dict__.update(attrs)

    def __getattr__(self, attr: str) -> Any:
        return Unknown(f"{self._name}.{attr}")


def _probe_getattr(value: Any, name: str, *default: Any) -> Any:
    """``getattr`` in the probe world: an attribute the probe knows; one it does not is unknown (the real
    object may have it), never the default."""
    if isinstance(value, Obj):
        return value.__dict__.get(name, Unknown(f"{value._name}.{name}"))
    if isinstance(value, Instance):
        return value.attrs.get(name, Unknown(f"self.{name}"))
    if isinstance(value, Unknown) or not isinstance(name, str):
        return Unknown(f"getattr(..., {name!r})")
    return getattr(value, name, *default)


class Mode:
    """``forward_mode``: a draft decode (``is_decode()`` and ``is_decode_or_idle()`` true, every other ``is_*`` false)."""

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("is_"):
            return lambda *_a, **_k: attr in _DECODE_MODES
        return Unknown(f"forward_mode.{attr}")


class Instance:
    """An instance of a class of the tree: its class name and attributes (``self``)."""

    def __init__(self, cls: str, **attrs: Any) -> None:
        self.cls = cls
        self.attrs = dict(attrs)


@dataclass
class Function:
    """A function of the tree: its ast, the class it is defined in (for ``super()``), the instance bound,
    and for a local ``def`` the locals of the function defining it (read live, as a closure does)."""

    node: ast.FunctionDef
    owner: Optional[str] = None
    bound: Optional[Instance] = None
    closure: Optional[dict[str, Any]] = None


class Super:
    def __init__(self, owner: str, instance: Instance) -> None:
        self.owner, self.instance = owner, instance


class TorchModule:
    """``torch``: allocations recorded as events, a few functions on probe tensors; anything else unknown."""

    def __init__(self, run: "Run") -> None:
        self._run = run

    def __getattr__(self, attr: str) -> Any:
        if attr in ("empty", "zeros", "ones", "full"):
            return self._run.allocate
        if attr in ("chunk", "split", "unbind"):
            return getattr(arrays, attr)
        return Unknown(f"torch.{attr}")


@dataclass
class World:
    """The tree as the run sees it: classes (name -> ast), a module's functions, helper functions by name."""

    classes: dict[str, ast.ClassDef]
    functions: dict[str, ast.FunctionDef] = field(default_factory=dict)
    helpers: dict[str, Callable[..., Any]] = field(default_factory=dict)
    _mro: dict[str, list[str]] = field(default_factory=dict, repr=False)
    _method_tables: dict[str, dict[str, ast.FunctionDef]] = field(default_factory=dict, repr=False)
    #: the multi-step callers driving each (per-step class, method) (``paths.callers``), found once
    callers: dict[tuple[str, str], list[Any]] = field(default_factory=dict, repr=False)

    def mro(self, name: str) -> list[str]:
        """The class and its bases in the tree, in Python's method resolution order (C3)."""
        if name not in self._mro:
            self._mro[name] = self._linear(name)
        return self._mro[name]

    def _linear(self, name: str) -> list[str]:
        def linear(cls: str, seen: tuple[str, ...]) -> list[str]:
            node = self.classes.get(cls)
            if node is None or cls in seen:
                return [cls]
            bases = [b for b in (_base_name(base) for base in node.bases) if b]
            merged, lists = [cls], [linear(b, seen + (cls,)) for b in bases] + [bases]
            while any(lists):
                for head in (lst[0] for lst in lists if lst):
                    if not any(head in lst[1:] for lst in lists):
                        break
                else:
                    raise CannotProve(f"class {cls}: no consistent method resolution order")
                merged.append(head)
                lists = [[c for c in lst if c != head] for lst in lists]
            return merged

        return linear(name, ())

    def lookup(self, cls: str, name: str, after: Optional[str] = None) -> Optional[Function]:
        """The method ``name`` as ``cls`` resolves it (``after``: past that class, as ``super()`` does);
        in a class body defining it twice, the last definition (the one Python keeps)."""
        order = self.mro(cls)
        if after is not None:
            order = order[order.index(after) + 1 :] if after in order else []
        for each in order:
            defined = self._methods(each).get(name)
            if defined is not None:
                return Function(defined, each)
        return None

    def _methods(self, cls: str) -> dict[str, ast.FunctionDef]:
        """The class's own methods by name, each its last definition, read once."""
        if cls not in self._method_tables:
            node = self.classes.get(cls)
            body = node.body if node is not None else []
            self._method_tables[cls] = {s.name: s for s in body if isinstance(s, ast.FunctionDef)}
        return self._method_tables[cls]


def _base_name(base: ast.expr) -> Optional[str]:
    if isinstance(base, ast.Name):
        return base.id
    if isinstance(base, ast.Attribute):
        return base.attr
    return None


@dataclass
class Frame:
    env: dict[str, Any]
    function: Function

    @property
    def outer(self) -> dict[str, Any]:
        return self.function.closure or {}


class Run:
    """One run of the probe world over the tree's code, collecting ``events``; ``reached`` holds the
    id of every ast node evaluated."""

    def __init__(
        self,
        world: World,
        names: dict[str, Any],
        decisions: Optional[dict[str, bool]] = None,
        sink: str = "",
        within: str = "",
    ) -> None:
        self.world = world
        #: the call whose argument is the only "loc" (``""``: the first take by code other than layout code)
        self.sink = sink
        #: the method a sink run judges: errors raised inside it (or its callees) are the path's
        self.within = within
        self._helper_names = frozenset(world.helpers)
        #: how each undecided ``if`` that touches the layout goes on this path (``Run.pending``: those met
        #: without a decision, taken false); keyed by the test's text
        self.decisions = dict(decisions or {})
        self.pending: list[str] = []
        self.globals = {**_BUILTINS, "getattr": _probe_getattr, "torch": TorchModule(self), **names}
        self.events: list[Event] = []
        self.reached: set[int] = set()
        self.depth = 0
        self._line = 0
        self._loc_set: Optional[int] = None  # the line that last set a batch's out_cache_loc
        self._step: Optional[int] = None
        self._taken: set[tuple[int, int]] = set()  # (instance, step or tensor) whose draft loc was taken
        self._quiet = False

    # -- calls -----------------------------------------------------------------------------------
    def call(self, function: Function, args: list[Any], kwargs: dict[str, Any]) -> Any:
        if self.depth >= MAX_DEPTH:
            raise Diverged(f"line {function.node.lineno}: calls nested deeper than {MAX_DEPTH}")
        node = function.node
        params = [a.arg for a in (*node.args.posonlyargs, *node.args.args)]
        if function.bound is not None:
            args = [function.bound, *args]
        env: dict[str, Any] = {}
        defaults = node.args.defaults
        for name, default in zip(params[len(params) - len(defaults) :], defaults):
            env[name] = self._eval(default, Frame({}, function))
        env.update(zip(params, args))
        for arg in node.args.kwonlyargs:
            env[arg.arg] = Unknown(arg.arg)
        for key, value in kwargs.items():
            env[key] = value
        if node.args.vararg:
            env[node.args.vararg.arg] = tuple(args[len(params) :])
        if node.args.kwarg:
            env[node.args.kwarg.arg] = {k: v for k, v in kwargs.items() if k not in params}
        for name in params:
            env.setdefault(name, Unknown(name))
        frame = Frame(env, function)
        outer_step = self._step
        instance = env.get(params[0]) if params else None
        if isinstance(instance, Instance) and "speculative_step_id" in instance.attrs:
            self._step = instance.attrs["speculative_step_id"]
            handed = next(filter(None, map(_held_loc, env.values())), None)
            if outer_step is None and handed is not None:  # a caller hands this step's backend its batch
                line = self._loc_set or self._line  # where the caller set the batch's out_cache_loc, or the call
                self.events.append(Event("handed", handed, self._step, line))
        self.depth += 1
        try:
            self._block(node.body, frame)
        except _Return as returned:
            return returned.value
        except Raised as raised:
            raised.within = raised.within or node.name == self.within
            raise
        finally:
            self.depth -= 1
            self._step = outer_step
        return None

    def allocate(self, shape: Any = None, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(shape, (tuple, list)):
            shape = (shape, *args) if isinstance(shape, int) else None
        if shape is None or not all(isinstance(s, int) for s in shape):
            return Unknown("an allocation's shape")
        self.events.append(Event("alloc", tuple(shape), self._step, self._line))
        return arrays.zeros(shape)

    # -- statements ------------------------------------------------------------------------------
    def _block(self, body: Iterable[ast.stmt], frame: Frame) -> None:
        for stmt in body:
            self._stmt(stmt, frame)

    def _stmt(self, stmt: ast.stmt, frame: Frame) -> None:
        self._line = stmt.lineno
        self.reached.add(id(stmt))
        if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            value = stmt.value
            if value is None:
                return
            if not self._is_layout(value, frame):
                self._take_locs(value, frame)
            result = self._eval(value, frame)
            if isinstance(stmt, ast.AugAssign):
                current = (
                    self._eval(ast.Name(stmt.target.id, ast.Load()), frame)
                    if isinstance(stmt.target, ast.Name)
                    else Unknown("an augmented target")
                )
                result = self._binop(stmt.op, current, result)
            for target in getattr(stmt, "targets", None) or [stmt.target]:
                self._assign(target, result, frame)
        elif isinstance(stmt, ast.Expr):
            self._take_locs(stmt.value, frame)
            self._eval(stmt.value, frame)
        elif isinstance(stmt, ast.Assert):
            self._take_locs(stmt.test, frame)
            test = self._eval(stmt.test, frame)
            if not isinstance(test, Unknown) and not test:
                raise Raised(AssertionError(), stmt.lineno)
        elif isinstance(stmt, ast.Return):
            if stmt.value is not None and not self._is_layout(stmt.value, frame):
                self._take_locs(stmt.value, frame)
            raise _Return(self._eval(stmt.value, frame) if stmt.value is not None else None)
        elif isinstance(stmt, ast.If):
            test = self._eval(stmt.test, frame)
            if isinstance(test, Unknown):
                if self._same_either_way(stmt, frame):
                    return
                if not self._touches([*stmt.body, *stmt.orelse], frame):
                    self._undecided(stmt, [*stmt.body, *stmt.orelse], frame, f"`if {text_of(stmt.test)}`")
                    return
                self._block(stmt.body if self._decide(stmt.test) else stmt.orelse, frame)
            else:
                self._block(stmt.body if test else stmt.orelse, frame)
        elif isinstance(stmt, ast.For):
            self._for(stmt, frame)
        elif isinstance(stmt, ast.While):
            self._undecided(stmt, [stmt.test, *stmt.body, *stmt.orelse], frame, "a `while` loop")
        elif isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
            self._try(stmt, frame)
        elif isinstance(stmt, ast.With):
            suppressing = any(
                isinstance(item.context_expr, ast.Call) and _called(item.context_expr) == "suppress"
                for item in stmt.items
            )
            if suppressing and self._touches(stmt.body, frame):
                raise CannotProve(f"line {stmt.lineno}: `{text_of(stmt.items[0])}` may swallow the layout's errors")
            for item in stmt.items:
                if item.optional_vars is not None:
                    self._assign(item.optional_vars, Unknown("a `with` target"), frame)
            self._block(stmt.body, frame)
        elif isinstance(stmt, ast.Break):
            raise _Break()
        elif isinstance(stmt, ast.Continue):
            raise _Continue()
        elif isinstance(stmt, ast.Raise):
            raise Raised(RuntimeError(text_of(stmt.exc) if stmt.exc else "raise"), stmt.lineno, explicit=True)
        elif isinstance(stmt, ast.FunctionDef):
            frame.env[stmt.name] = Function(stmt, frame.function.owner, closure=_Live(frame))
        elif isinstance(stmt, (ast.AsyncFunctionDef, ast.ClassDef)):
            frame.env[stmt.name] = (
                _Opaque(stmt) if self._touches(stmt.body, frame) else Unknown(f"the local definition {stmt.name}")
            )
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            for alias in stmt.names:
                name = alias.asname or alias.name.split(".")[0]
                frame.env[name] = self.world.helpers.get(alias.name, Unknown(f"the import {name}"))
        elif isinstance(stmt, ast.Delete):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    frame.env.pop(target.id, None)
        elif isinstance(stmt, ast.Nonlocal):
            raise CannotProve(f"line {stmt.lineno}: `nonlocal {', '.join(stmt.names)}` rebinds the caller's locals")
        elif isinstance(stmt, (ast.Pass, ast.Global)):
            return
        elif self._touches([stmt], frame):
            raise CannotProve(f"line {stmt.lineno}: a `{type(stmt).__name__.lower()}` statement around the layout")

    def _decide(self, test: ast.expr) -> bool:
        """How an undecided test goes on this path (``decisions``); one met for the first time goes false
        and is ``pending``, for the caller to run the path where it goes true."""
        key = text_of(test)  # read again on the same objects, the same test goes the same way
        if key not in self.decisions:
            self.pending.append(key)
            self.decisions[key] = False
        return self.decisions[key]

    def _same_either_way(self, stmt: ast.If, frame: Frame) -> bool:
        """Both branches of an undecided ``if`` bind only layout values to locals (``x = x.contiguous()``)
        and give every local the same value: the branch taken does not matter (run, bindings kept)."""
        branches = [stmt.body, stmt.orelse]
        touching = [s for branch in branches for s in branch if self._touches([s], frame)]
        if not touching or not all(
            isinstance(s, ast.Assign)
            and all(isinstance(t, ast.Name) for t in s.targets)
            and self._is_layout(s.value, frame)
            for s in touching
        ):
            return False
        results = []
        self._quiet = True
        try:
            for branch in branches:
                copy = Frame(dict(frame.env), frame.function)
                self._block([s for s in branch if s in touching], copy)
                results.append(copy.env)
        except (Raised, CannotProve):
            return False
        finally:
            self._quiet = False
        names = set(results[0]) | set(results[1])
        if not all(_equal(results[0].get(n), results[1].get(n)) for n in names):
            return False
        frame.env.update(results[0])
        return True

    def _undecided(self, stmt: ast.stmt, parts: list[ast.AST], frame: Frame, what: str) -> None:
        """A branch or loop the probes cannot decide: skipped when it touches no draft layout."""
        if self._touches(parts, frame):
            raise CannotProve(f"line {stmt.lineno}: {what} cannot be decided on the probes and holds draft layout code")
        for name in _stored_names(parts):
            frame.env[name] = Unknown(name)

    def _for(self, stmt: ast.For, frame: Frame) -> None:
        items = self._eval(stmt.iter, frame)
        if isinstance(items, Unknown) or not isinstance(items, (range, list, tuple, enumerate, zip, reversed)):
            self._undecided(stmt, [*stmt.body, *stmt.orelse], frame, f"`for ... in {text_of(stmt.iter)}`")
            return
        for item in items:
            self._assign(stmt.target, item, frame)
            try:
                self._block(stmt.body, frame)
            except _Break:
                return
            except _Continue:
                continue
        self._block(stmt.orelse, frame)

    def _try(self, stmt: ast.Try, frame: Frame) -> None:
        if stmt.handlers and self._touches(stmt.body, frame):
            raise CannotProve(f"line {stmt.lineno}: a `try` whose handlers could catch the layout's errors")
        if any(isinstance(n, (ast.Return, ast.Break, ast.Continue)) for s in stmt.finalbody for n in ast.walk(s)):
            if self._touches(stmt.body, frame):
                raise CannotProve(f"line {stmt.lineno}: a `finally` that returns could swallow the layout's errors")
        try:
            self._block(stmt.body, frame)
            self._block(stmt.orelse, frame)
        finally:
            self._block(stmt.finalbody, frame)

    def _assign(self, target: ast.expr, value: Any, frame: Frame) -> None:
        if isinstance(target, ast.Name):
            frame.env[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            values = list(value) if isinstance(value, (tuple, list)) and len(value) == len(target.elts) else None
            for index, element in enumerate(target.elts):
                self._assign(element, values[index] if values else Unknown(text_of(element)), frame)
        elif isinstance(target, ast.Attribute):
            owner = self._eval(target.value, frame)
            if target.attr == "out_cache_loc" and not isinstance(owner, Instance):
                self._loc_set = target.lineno
            if isinstance(owner, Instance):
                kept = _contained_loc(value)
                if kept is not None and not self._quiet:  # baked into the backend's state
                    self._record_loc(kept, target.lineno, frame)
                owner.attrs[target.attr] = value
            elif isinstance(owner, Obj):
                owner.__dict__[target.attr] = value
        elif isinstance(target, ast.Starred):
            self._assign(target.value, Unknown("a starred target"), frame)

    # -- which code touches the layout --------------------------------------------------------------
    def _touches(self, parts: Iterable[ast.AST], frame: Frame) -> bool:
        """``parts`` read or bind a local holding a probe value, name the draft buffer or the steps, call
        a helper, a ``self.`` method or ``super()``, or return or raise."""
        for part in parts:
            names, marked = _touch_marks(part, self.world.helpers)
            if marked or any(_is_probe_value(frame.env.get(name)) for name in names):
                return True
        return False

    def _is_layout(self, node: ast.expr, frame: Frame) -> bool:
        """Layout code: only tensor layout methods, helpers, indexing and arithmetic on names and attributes
        (kept on the node, per set of helper names)."""
        known = node.__dict__.setdefault("_is_layout", {})
        if self._helper_names not in known:
            known[self._helper_names] = self._layout_only(node)
        return known[self._helper_names]

    def _layout_only(self, node: ast.expr) -> bool:
        for each in ast.walk(node):
            if isinstance(each, ast.Call):
                name = _called(each)
                if not (name in LAYOUT_METHODS and isinstance(each.func, ast.Attribute) or name in self.world.helpers):
                    return False
            elif not isinstance(
                each,
                (
                    ast.Name,
                    ast.Attribute,
                    ast.Subscript,
                    ast.Slice,
                    ast.Constant,
                    ast.BinOp,
                    ast.UnaryOp,
                    ast.Tuple,
                    ast.List,
                    ast.expr_context,
                    ast.operator,
                    ast.unaryop,
                    ast.keyword,
                ),
            ):
                return False
        return True

    def _take_locs(self, node: ast.AST, frame: Frame) -> None:
        """Record the draft buffer as ``node`` (not layout code) takes it: a name, attribute or item
        holding a draft tensor (or its ``.shape``), or a probe object holding one passed whole, read
        anywhere in ``node`` except as an argument of a call that the run follows (the callee decides).
        Each tensor once per instance (a stepped instance: its first use only)."""
        names, _marked = _touch_marks(node, self.world.helpers)
        if not any(
            _is_probe_value(frame.env[n] if n in frame.env else frame.outer[n] if n in frame.outer else None)
            for n in names
        ):
            return
        for loc, line in _draft_reads(node, self, frame):
            self._record_loc(loc, line, frame)

    def take_returned(self, value: Any, line: int, instance: Any) -> None:
        """The draft buffer the run's first function returns (its caller takes it)."""
        loc = _contained_loc(value)
        if loc is not None:
            self._record_loc(loc, line, Frame({"self": instance}, _CALLER))

    def _took(self, frame: Frame) -> bool:
        """The frame's instance has taken the draft buffer already (later uses do not count)."""
        instance = frame.env.get(_first_param(frame.function.node))
        return any(key[0] == id(instance) for key in self._taken)

    def _record_loc(self, loc: Tensor, line: int, frame: Frame, at_sink: bool = False) -> None:
        if self.sink and not at_sink:
            return
        instance = frame.env.get(_first_param(frame.function.node))
        key = (id(instance), self._step if self._step is not None else id(loc))
        if key not in self._taken:
            self._taken.add(key)
            self.events.append(Event("loc", loc, self._step, line))

    def quiet_eval(self, node: ast.expr, frame: Frame) -> Any:
        """``node``'s value without recording events (a chain of names, attributes and items: no calls)."""
        self._quiet = True
        try:
            return self._eval(node, frame)
        except (Raised, CannotProve):
            return None
        finally:
            self._quiet = False

    # -- expressions -------------------------------------------------------------------------------
    def _eval(self, node: ast.expr, frame: Frame) -> Any:
        self.reached.add(id(node))
        try:
            return self._eval_node(node, frame)
        except (Raised, CannotProve, _Return, _Break, _Continue):
            raise
        except (AssertionError, ValueError, RuntimeError, IndexError) as error:  # a helper's assert, a shape's
            raise Raised(error, getattr(node, "lineno", self._line)) from None
        except (TypeError, AttributeError, KeyError, ZeroDivisionError) as error:  # what the probes do not model
            return Unknown(f"{text_of(node)} ({type(error).__name__} on the probes)")

    def _eval_node(self, node: ast.expr, frame: Frame) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in frame.env:
                return frame.env[node.id]
            if node.id in frame.outer:
                return frame.outer[node.id]
            if node.id in self.world.functions:
                return Function(self.world.functions[node.id])
            if node.id in self.world.classes:
                return _ClassRef(node.id)
            return self.globals.get(node.id, self.world.helpers.get(node.id, Unknown(node.id)))
        if isinstance(node, ast.Attribute):
            return self._attribute(self._eval(node.value, frame), node.attr, node)
        if isinstance(node, ast.Subscript):
            return self._subscript(node, frame)
        if isinstance(node, ast.Slice):
            parts = [self._eval(p, frame) if p is not None else None for p in (node.lower, node.upper, node.step)]
            return Unknown("a slice bound") if any(isinstance(p, Unknown) for p in parts) else slice(*parts)
        if isinstance(node, (ast.Tuple, ast.List)):
            values = [self._eval(e, frame) for e in node.elts]
            return tuple(values) if isinstance(node, ast.Tuple) else values
        if isinstance(node, ast.BinOp):
            return self._binop(node.op, self._eval(node.left, frame), self._eval(node.right, frame))
        if isinstance(node, ast.UnaryOp):
            operand = self._eval(node.operand, frame)
            if isinstance(operand, Unknown):
                return operand
            return {
                ast.USub: operator.neg,
                ast.Not: operator.not_,
                ast.UAdd: operator.pos,
                ast.Invert: operator.invert,
            }[type(node.op)](operand)
        if isinstance(node, ast.BoolOp):
            return self._boolop(node, frame)
        if isinstance(node, ast.Compare):
            return self._compare(node, frame)
        if isinstance(node, ast.IfExp):
            test = self._eval(node.test, frame)
            if isinstance(test, Unknown):
                return Unknown(text_of(node.test))
            return self._eval(node.body if test else node.orelse, frame)
        if isinstance(node, ast.Call):
            return self._call(node, frame)
        if isinstance(node, ast.NamedExpr):
            value = self._eval(node.value, frame)
            self._assign(node.target, value, frame)
            return value
        if isinstance(node, ast.JoinedStr):
            return "<f-string>"
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            own = _own_names(node)
            names, _marked = _touch_marks(node, self.world.helpers)
            values = [frame.env.get(n) for n in names - own]
            holding = any(_held_loc(v) is not None for v in values)  # a batch: only once its buffer was taken
            layout = any(
                isinstance(n, ast.Attribute)
                and n.attr in ("out_cache_loc", "speculative_num_steps")
                or isinstance(n, ast.Call)
                and _called(n) in self.world.helpers
                for n in ast.walk(node)
            )
            if self.sink:  # only tree code handed the draft buffer may reach the sink with it
                calls = [n for n in ast.walk(node) if isinstance(n, ast.Call)]
                layout = layout or any(_called(n) == self.sink for n in calls)
                holding = any(_runs_tree_code(n, self) for n in calls) and any(map(_reaches_loc, values))
            elif holding:
                holding = not self._took(frame)
            if layout or any(isinstance(v, Tensor) for v in values) or holding:
                raise CannotProve(
                    f"line {node.lineno}: draft layout code inside a "
                    f"{'lambda' if isinstance(node, ast.Lambda) else 'comprehension'}"
                )
            return Unknown("a lambda or comprehension")
        return Unknown(type(node).__name__)

    def _attribute(self, owner: Any, attr: str, node: ast.AST) -> Any:
        if isinstance(owner, Unknown):
            return Unknown(f"{owner.why}.{attr}")
        if isinstance(owner, Instance):
            if attr in owner.attrs:
                return owner.attrs[attr]
            method = self.world.lookup(owner.cls, attr)
            return Function(method.node, method.owner, owner) if method else Unknown(f"self.{attr}")
        if isinstance(owner, Super):
            method = self.world.lookup(owner.instance.cls, attr, after=owner.owner)
            if method is None:
                return Unknown(f"super().{attr}")
            return Function(method.node, method.owner, owner.instance)
        if isinstance(owner, _ClassRef):
            method = self.world.lookup(owner.name, attr)
            return Function(method.node, method.owner) if method else Unknown(f"{owner.name}.{attr}")
        if isinstance(owner, Tensor) and not hasattr(owner, attr):
            return Unknown(f"<tensor>.{attr}")
        if isinstance(owner, (Obj, Mode, TorchModule, Tensor)):
            return getattr(owner, attr)
        try:
            return getattr(owner, attr)
        except AttributeError:
            return Unknown(f"<value>.{attr}")

    def _subscript(self, node: ast.Subscript, frame: Frame) -> Any:
        owner = self._eval(node.value, frame)
        index = self._eval(node.slice, frame)
        if isinstance(owner, Unknown) or isinstance(index, Unknown):
            return owner if isinstance(owner, Unknown) else Unknown(text_of(node.slice))
        if isinstance(index, tuple) and any(isinstance(i, Unknown) for i in index):
            return Unknown(text_of(node.slice))
        result = owner[index]
        if (
            isinstance(owner, Tensor)
            and isinstance(index, slice)
            and index.stop is not None
            and not owner.draft
            and not self._quiet
        ):
            self.events.append(Event("slice", index.stop, self._step, node.lineno))
        return result

    def _binop(self, op: ast.operator, left: Any, right: Any) -> Any:
        if isinstance(left, Unknown):
            return left
        if isinstance(right, Unknown):
            return right
        if isinstance(left, Tensor) or isinstance(right, Tensor):
            return Unknown("arithmetic on a tensor")
        return _BINOPS[type(op)](left, right)

    def _boolop(self, node: ast.BoolOp, frame: Frame) -> Any:
        """``and`` / ``or`` with unknowns: a false operand decides ``and``, a true one ``or``."""
        unknown: Optional[Unknown] = None
        value: Any = None
        for operand in node.values:
            value = self._eval(operand, frame)
            if isinstance(value, Unknown):
                unknown = unknown or value
            elif isinstance(node.op, ast.And) and not value:
                return value
            elif isinstance(node.op, ast.Or) and value:
                return value
        return unknown if unknown is not None else value

    def _compare(self, node: ast.Compare, frame: Frame) -> Any:
        left = self._eval(node.left, frame)
        for op, comparator in zip(node.ops, node.comparators):
            right = self._eval(comparator, frame)
            if isinstance(left, Unknown) or isinstance(right, Unknown):
                return left if isinstance(left, Unknown) else right
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True

    def _call(self, node: ast.Call, frame: Frame) -> Any:
        if isinstance(node.func, ast.Name) and node.func.id == "super" and not node.args:
            function = frame.function
            instance = frame.env.get(_first_param(function.node))
            if function.owner is None or not isinstance(instance, Instance):
                return Unknown("super()")
            return Super(function.owner, instance)
        func = self._eval(node.func, frame)
        args = []
        for arg in node.args:
            if isinstance(arg, ast.Starred):
                value = self._eval(arg.value, frame)
                if not isinstance(value, (tuple, list)):
                    return Unknown("a starred argument")
                args += list(value)
            else:
                args.append(self._eval(arg, frame))
        kwargs = {k.arg: self._eval(k.value, frame) for k in node.keywords if k.arg is not None}
        if any(k.arg is None for k in node.keywords):
            return Unknown("a ** argument")
        if self.sink and _called(node) == self.sink and not self._quiet:
            for loc in filter(None, map(_contained_loc, [*args, *kwargs.values()])):
                self._record_loc(loc, node.lineno, frame, at_sink=True)
        if isinstance(func, Function):
            return self.call(func, args, kwargs)
        if isinstance(func, _Opaque):
            raise CannotProve(
                f"line {node.lineno}: calls the local function {func.node.name}, "
                "which reads or binds the draft layout"
            )
        if isinstance(func, Unknown):
            if _is_self_call(node) and not self._quiet:  # a method outside the tree takes what it is given
                for loc in filter(None, map(_contained_loc, [*args, *kwargs.values()])):
                    self._record_loc(loc, node.lineno, frame)
            return Unknown(f"{func.why}(...)")
        unknown = next((a for a in [*args, *kwargs.values()] if isinstance(a, Unknown)), None)
        if getattr(func, "__name__", "") in _ARGUMENTS_IGNORED and isinstance(getattr(func, "__self__", None), Tensor):
            unknown = None  # x.to(torch.int32): the dtype does not move a slot
        if func == self.allocate and not any(isinstance(a, Unknown) for a in args):
            unknown = None  # torch.zeros(shape, dtype=torch.int32, device=...): the shape is what counts
        if unknown is not None or func is isinstance:
            return unknown or Unknown("isinstance(...)")
        return func(*args, **kwargs)


class _Live(dict):
    """A local ``def``'s view of the locals of the function defining it: read when the ``def`` runs."""

    def __init__(self, frame: Frame) -> None:
        super().__init__()
        self._frame = frame

    def __contains__(self, name: object) -> bool:
        return name in self._frame.env or name in self._frame.outer

    def __getitem__(self, name: str) -> Any:
        return self._frame.env[name] if name in self._frame.env else self._frame.outer[name]

    def __bool__(self) -> bool:
        return True


#: the frame a run's first function returns into (its ``self``: the instance the run started on)
_CALLER = Function(ast.parse("def caller(self): pass").body[0])


class _ClassRef:
    def __init__(self, name: str) -> None:
        self.name = name


class _Opaque:
    """A local ``def`` that reads or binds the draft layout: calling it cannot be proven."""

    def __init__(self, node: ast.stmt) -> None:
        self.node = node


def _called(call: ast.Call) -> Optional[str]:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def _is_self_call(call: ast.Call) -> bool:
    func = call.func
    return isinstance(func, ast.Attribute) and (
        isinstance(func.value, ast.Name)
        and func.value.id == "self"
        or isinstance(func.value, ast.Call)
        and _called(func.value) == "super"
    )


def _first_param(node: ast.FunctionDef) -> str:
    params = [a.arg for a in (*node.args.posonlyargs, *node.args.args)]
    return params[0] if params else ""


def _is_probe_value(value: Any) -> bool:
    return isinstance(value, Tensor) or _held_loc(value) is not None


def _held_loc(value: Any) -> Optional[Tensor]:
    """The draft tensor a probe object holds as its ``out_cache_loc``."""
    held = value.__dict__.get("out_cache_loc") if isinstance(value, Obj) else None
    return held if isinstance(held, Tensor) and held.draft else None


def _own_names(node: ast.AST) -> frozenset[str]:
    """The names a lambda's parameters or a comprehension's targets bind: its own, not its definer's."""
    if isinstance(node, ast.Lambda):
        return frozenset(a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg))
    return frozenset(
        n.id for gen in getattr(node, "generators", []) for n in ast.walk(gen.target) if isinstance(n, ast.Name)
    )


def _reaches_loc(value: Any) -> bool:
    """``value`` holds the draft buffer, or is an instance one of whose attributes does."""
    attrs = value.attrs.values() if isinstance(value, Instance) else ()
    return _contained_loc(value) is not None or any(_contained_loc(a) is not None for a in attrs)


def _contained_loc(value: Any, depth: int = 0) -> Optional[Tensor]:
    """The draft tensor ``value`` is or holds (in a tuple, list or dict, or as a probe object's out_cache_loc)."""
    if isinstance(value, Tensor):
        return value if value.draft else None
    if depth < 3 and isinstance(value, (tuple, list, dict)):
        items = value.values() if isinstance(value, dict) else value
        return next(filter(None, (_contained_loc(v, depth + 1) for v in items)), None)
    return _held_loc(value)


def _stored_names(parts: Iterable[ast.AST]) -> set[str]:
    return {name for part in parts for name in _stored_in(part)}


def _stored_in(node: ast.AST) -> frozenset[str]:
    """The names ``node`` binds (kept on the node)."""
    if not hasattr(node, "_stored_in"):
        node._stored_in = frozenset(  # type: ignore[attr-defined]
            n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
        )
    return node._stored_in  # type: ignore[attr-defined]


def text_of(node: ast.AST) -> str:
    """``ast.unparse(node)``, kept on the node."""
    if not hasattr(node, "_text"):
        node._text = ast.unparse(node)  # type: ignore[attr-defined]
    return node._text  # type: ignore[attr-defined]


def _has_call(node: ast.AST) -> bool:
    """``node`` holds a call (kept on the node)."""
    if not hasattr(node, "_has_call"):
        node._has_call = any(isinstance(n, ast.Call) for n in ast.walk(node))  # type: ignore[attr-defined]
    return node._has_call  # type: ignore[attr-defined]


def _touch_marks(node: ast.AST, helpers: Iterable[str]) -> tuple[frozenset[str], bool]:
    """(the names ``node`` holds, whether it names the draft buffer or the steps, calls a helper, a ``self.``
    method or ``super()``, or returns or raises), kept on the node."""
    if not hasattr(node, "_touch_marks"):
        names, marked = set(), False
        for each in ast.walk(node):
            if isinstance(each, ast.Name):
                names.add(each.id)
            elif isinstance(each, ast.Attribute) and each.attr in ("out_cache_loc", "speculative_num_steps"):
                marked = True
            elif isinstance(each, (ast.Return, ast.Raise, ast.Nonlocal, ast.Global)):
                marked = True
            elif isinstance(each, ast.Call) and (
                _called(each) in helpers or _is_self_call(each) or _called(each) == "super"
            ):
                marked = True
        node._touch_marks = (frozenset(names), marked)  # type: ignore[attr-defined]
    return node._touch_marks  # type: ignore[attr-defined]


def _runs_tree_code(call: ast.Call, run: Run) -> bool:
    """A call of the tree's code the run follows: a ``self.`` method, ``super()``, a module function or class."""
    name = _called(call)
    of_class = (
        isinstance(call.func, ast.Attribute)
        and isinstance(call.func.value, ast.Name)
        and call.func.value.id in run.world.classes
    )
    return _is_self_call(call) or of_class or name in run.world.functions or name in run.world.classes


def _followed(call: ast.Call, run: Run) -> bool:
    """A call the run follows (``_runs_tree_code``) or layout code (a helper, a tensor layout method): its
    arguments are not a use of the buffer."""
    name = _called(call)
    return (
        _runs_tree_code(call, run)
        or name in run.world.helpers
        or (name in LAYOUT_METHODS and isinstance(call.func, ast.Attribute))
        or (name in _INSPECTING and isinstance(call.func, ast.Name))
    )


#: builtins that read an object without taking it (``getattr(forward_batch, "x", None)``): what they
#: return is judged where it is used
_INSPECTING = frozenset({"getattr", "hasattr", "isinstance", "type"})


def _draft_reads(node: ast.AST, run: Run, frame: Frame, whole: bool = True) -> Iterator[tuple[Tensor, int]]:
    """(draft tensor, line) of each read in ``node`` that takes the draft buffer (``Run._take_locs``):
    the outermost name / attribute / item chain (without calls) holding a draft tensor, a draft tensor's
    attribute (``.shape``), or (``whole``: not the base of an attribute) a probe object holding one. Not in
    a lambda or comprehension: its names are its own (one reading the layout cannot be proven: ``_eval``)."""
    if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        return
    if isinstance(node, ast.Call):
        if _followed(node, run):
            if _called(node) in LAYOUT_METHODS and isinstance(node.func, ast.Attribute):
                yield from _draft_reads(node.func.value, run, frame)
            return
        for child in [node.func, *node.args, *(k.value for k in node.keywords)]:
            yield from _draft_reads(child, run, frame)
        return
    if (
        isinstance(node, (ast.Name, ast.Attribute, ast.Subscript))
        and isinstance(node.ctx, ast.Load)
        and not _has_call(node)
    ):
        value = run.quiet_eval(node, frame)
        if isinstance(value, Tensor) and value.draft:
            yield value, node.lineno
            return
        if isinstance(node, ast.Attribute):
            base = run.quiet_eval(node.value, frame)
            if isinstance(base, Tensor) and base.draft:
                yield base, node.lineno
                return
        held = _held_loc(value) if whole else None
        if held is not None:
            yield held, node.lineno
            return
    for child in ast.iter_child_nodes(node):
        yield from _draft_reads(child, run, frame, whole=not (isinstance(node, ast.Attribute) and child is node.value))
