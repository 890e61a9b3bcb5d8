"""The paths a run takes: where a run starts (``Entry``), one run on a probe, every way its undecided
branches go, and the multi-step callers that drive a per-step backend.

Standard library, numpy and the helpers only (with ``arrays``, ``interpret``, ``world`` and
``split_once``): the CPU test written into a fork embeds these modules to reach the same verdict.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Optional

from .interpret import CannotProve, Diverged, Event, Function, Raised, Run, World, text_of
from .world import Probe

#: the most paths (ways the undecided branches go) one run may take
MAX_PATHS = 32
#: an ``Outcome.cannot`` of a path that never returns (it calls itself on and on): no value to compare
DIVERGED = "diverges"


@dataclass(frozen=True)
class Outcome:
    """One path of a run: its events, the error it raised, why it could not run, the nodes it reached,
    and how its undecided branches went (``Run.decisions``)."""

    events: tuple[Event, ...]
    error: Optional[Raised]
    cannot: str
    reached: frozenset[int]
    path: frozenset[tuple[str, bool]] = frozenset()

    def of(self, kind: str) -> list[Event]:
        return [e for e in self.events if e.kind == kind]


@dataclass(frozen=True)
class Entry:
    """Where a run starts: ``cls.method``, per step when the class knows its step (``stepped``) or the
    method takes the step as a parameter (``step_param``), and (a multi-step caller) the attribute
    holding its per-step backends of class ``per_step``."""

    cls: str
    method: str
    stepped: bool = False
    per_step: str = ""
    backends_attr: str = ""
    step_param: str = ""

    @property
    def per_step_run(self) -> bool:
        return self.stepped or bool(self.step_param)

    def __str__(self) -> str:
        return f"{self.cls}.{self.method}"


#: the names a method takes the draft step's index by (``_step_out_cache_loc(self, forward_batch, step)``)
STEP_PARAMS = ("step", "step_id", "step_idx", "speculative_step_id")


def step_param(world: World, cls: str, method: str) -> str:
    """The parameter of ``cls.method`` naming the draft step's index, if any."""
    function = world.lookup(cls, method)
    names = [a.arg for a in (*function.node.args.posonlyargs, *function.node.args.args)] if function else []
    return next((name for name in names if name in STEP_PARAMS), "")


def knows_its_step(world: World, cls: str) -> bool:
    return any("speculative_step_id" in text_of(world.classes[c]) for c in world.mro(cls) if c in world.classes)


def _subclasses(world: World, cls: str) -> set[str]:
    return {name for name in world.classes if cls in world.mro(name)}


def callers(world: World, per_step: str, method: str = "init_forward_metadata") -> list[Entry]:
    """The multi-step classes that build per-step backends of ``per_step`` (or a subclass) into a list
    attribute (``self.X.append(C(...))`` / ``self.X = [C(...) ...]``) and have a ``method``."""
    if (per_step, method) not in world.callers:
        world.callers[per_step, method] = _callers(world, per_step, method)
    return world.callers[per_step, method]


def _callers(world: World, per_step: str, method: str) -> list[Entry]:
    kinds = _subclasses(world, per_step)
    found = []
    for name, node in world.classes.items():
        built = _built_backends(world, name, kinds)
        if built and world.lookup(name, method) is not None:
            attr, cls = built
            found.append(Entry(name, method, per_step=cls, backends_attr=attr))
    return found


def _built_backends(world: World, name: str, kinds: set[str]) -> Optional[tuple[str, str]]:
    """(attribute, class) of the per-step backends the class's methods build, along its MRO."""
    for each in world.mro(name):
        node = world.classes.get(each)
        appended, listed = _builds(node) if node is not None else ((), ())
        for attr, built in appended:
            made = _made_by(world, name, built)
            if made in kinds:
                return attr, made
        for attr, cls in listed:
            if cls in kinds:
                return attr, cls
    return None


def _builds(node: ast.ClassDef) -> tuple[tuple[tuple[str, ast.Call], ...], tuple[tuple[str, str], ...]]:
    """What the class's methods build into ``self`` attributes: (attribute, call) of each
    ``self.X.append(<call>)``, and (attribute, class) of each ``self.X = [C(...) ...]`` (kept on the node)."""
    if not hasattr(node, "_builds"):
        appended = tuple(
            (call.func.value.attr, call.args[0])
            for call in (n for n in ast.walk(node) if isinstance(n, ast.Call))
            if isinstance(call.func, ast.Attribute)
            and call.func.attr == "append"
            and call.args
            and isinstance(call.args[0], ast.Call)
            and isinstance(call.func.value, ast.Attribute)
            and isinstance(call.func.value.value, ast.Name)
            and call.func.value.value.id == "self"
        )
        listed = []
        for assign in (n for n in ast.walk(node) if isinstance(n, ast.Assign)):
            target, value = assign.targets[0], assign.value
            element = (
                value.elt
                if isinstance(value, ast.ListComp)
                else (value.elts[0] if isinstance(value, ast.List) and value.elts else None)
            )
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
                and isinstance(element, ast.Call)
                and isinstance(element.func, ast.Name)
            ):
                listed.append((target.attr, element.func.id))
        node._builds = (appended, tuple(listed))  # type: ignore[attr-defined]
    return node._builds  # type: ignore[attr-defined]


def _made_by(world: World, name: str, call: ast.Call) -> Optional[str]:
    """The class ``call`` builds: ``C(...)``, or ``self.m(...)`` where ``name``'s method ``m`` returns ``C(...)``."""
    if isinstance(call.func, ast.Name):
        return call.func.id
    func = call.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
        method = world.lookup(name, func.attr)
        returned = [r.value for r in ast.walk(method.node) if isinstance(r, ast.Return)] if method else []
        made = {r.func.id for r in returned if isinstance(r, ast.Call) and isinstance(r.func, ast.Name)}
        return made.pop() if len(made) == 1 else None
    return None


def run(
    world: World,
    entry: Entry,
    probe: Probe,
    step: Optional[int] = None,
    decisions: Optional[dict[str, bool]] = None,
    sink: tuple[str, str] = ("", ""),
) -> tuple[Outcome, list[str]]:
    """``entry`` run once on ``probe`` (at ``step``) along ``decisions``; the undecided branches it met first.
    ``sink``: the call whose argument is the run's "loc" and the method judged (``Run.sink``, ``Run.within``)."""
    function = world.lookup(entry.cls, entry.method)
    if function is None:
        return Outcome((), None, f"no {entry}", frozenset()), []
    instance = probe.instance(entry.cls, step if entry.stepped else None)
    if entry.backends_attr:
        instance.attrs[entry.backends_attr] = [probe.instance(entry.per_step, j) for j in range(probe.steps)]
    state = Run(world, {}, decisions, *sink)
    error, cannot = None, ""
    try:
        state._step = step
        arguments = probe.arguments(function.node)
        if entry.step_param:
            arguments[entry.step_param] = step
        returned = state.call(Function(function.node, function.owner, instance), [], arguments)
        state.take_returned(returned, function.node.lineno, instance)
    except Raised as raised:
        error = raised
    except Diverged:
        cannot = DIVERGED
    except CannotProve as refused:
        cannot = str(refused)
    except RecursionError:
        cannot = f"{entry}: recursion too deep to run"
    path = frozenset(state.decisions.items())
    return Outcome(tuple(state.events), error, cannot, frozenset(state.reached), path), state.pending


def paths(
    world: World, entry: Entry, probe: Probe, step: Optional[int], sink: tuple[str, str] = ("", "")
) -> dict[frozenset, Outcome]:
    """Every path of ``entry`` on ``probe``: each undecided branch that touches the layout both ways."""
    found: dict[frozenset, Outcome] = {}
    todo: list[dict[str, bool]] = [{}]
    while todo:
        if len(found) >= MAX_PATHS:
            return {
                frozenset(): Outcome(
                    (), None, f"{entry}: more than {MAX_PATHS} ways its undecided branches go", frozenset()
                )
            }
        decisions = todo.pop()
        outcome, pending = run(world, entry, probe, step, decisions, sink)
        found[outcome.path] = outcome
        todo += [{**dict(outcome.path), key: True} for key in pending]
    return found


def outcomes(world: World, entry: Entry, probe: Probe) -> list[tuple[Optional[int], dict[frozenset, Outcome]]]:
    steps = range(probe.steps) if entry.per_step_run else [None]
    return [(step, paths(world, entry, probe, step)) for step in steps]
