"""Who splits the per-step out_cache_loc on a multi-step draft path, and is it split exactly once?

The one answer for DeepSeek-V4-like paths (a per-step backend that bakes out_cache_loc at init), read
by running the path as Python would (``proof.paths``: MRO, ``super()``, explicit base calls, callees at
any depth) on every probe: each multi-step caller that drives the per-step backends, or the per-step
backend alone when nothing in the file drives it. Each step's backend must take upstream's row for its
step (``Probe.rows``). The verdict says who split it (the caller handing each step its row, or the
per-step code itself), that it is never split (the whole buffer baked: the bug the patch fixes), or
what else the path does, on which probe.

DeepSeek-V4's in-graph method (``IN_GRAPH``, 0.5.13 on) is judged the same way on its own paths
(``PATHS``): the multi-step caller's in-graph method (the CUDA graph's) and its eager ``init_forward_metadata``
(the per-step init calls the in-graph method), each step's write target being what ``SWA_TARGET`` is
handed (``interpret.Run.sink``), not the first code the batch is handed to.

``once_verdict`` adds the EAGLE workers whose ``draft_forward`` hands each step its row
(``baking.worker_rows``): they split for every per-step backend they drive. ``check``, ``apply``, the
structural guard and the written CPU test all ask it, of the classes ``baking.baking_methods`` names.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from . import arrays
from .baking import ATTENTION, BAKING_STARTS, IN_GRAPH, SWA_TARGET, baking_methods, keeps_path, nodes, worker_rows
from .interpret import Event, World
from .paths import DIVERGED, Entry, callers, paths
from .world import PROBES, Probe, world_of

#: per judged per-step method: the methods of a multi-step caller (or of the per-step backend alone) whose
#: runs reach it, and the sink of those runs (``Run.sink``; "": the first take of the buffer)
#: (one entry per ``BAKING_STARTS``, in its order)
PATHS = {
    "init_forward_metadata": (("init_forward_metadata",), ""),
    IN_GRAPH: ((IN_GRAPH, "init_forward_metadata"), SWA_TARGET),
}

CALLER = "caller"
PER_STEP = "per-step backend"
NEVER = "never"
TWICE = "twice"
WRONG = "wrong"


@dataclass(frozen=True)
class SplitVerdict:
    """``who`` splits (CALLER, PER_STEP), NEVER, TWICE (the caller and the per-step code), or WRONG; ``why``
    says what the path did (one line); ``caller``: the driving ``Class.method`` (CALLER, TWICE; NEVER: the
    caller handing the whole buffer, if any), ``line`` where it sets each step's row (``path``: its module,
    relative to the sglang package, when not the per-step backend's)."""

    who: str
    why: str = ""
    caller: str = ""
    line: Optional[int] = None
    path: str = ""


def _kind(value: Event, probe: Probe, step: int) -> str:
    """Step ``step``'s slots as ``value`` holds them: upstream's row, the whole buffer, or other."""
    if probe.steps == 1:  # one step's row is the whole buffer: no probe of who splits
        return "either"
    if value.same_value(probe.rows()[step]):
        return "row"
    if value.same_value(arrays.arange(probe.buffer_length, draft=True)):
        return "whole"
    return "other"


def _unfollowed_driver(world: World, per_step: str, method: str) -> Optional[str]:
    """A class (not ``per_step`` nor a base of it) whose ``method`` calls another object's ``method`` in a
    loop that names out_cache_loc: a multi-step caller that may hand each step its row, to per-step backends
    ``callers`` cannot name. (One that never names it hands the whole buffer, whatever its backends are.)"""
    for name in world.classes:
        function = world.lookup(name, method)
        if function is None or name in world.mro(per_step):
            continue
        for loop in nodes(function.node, (ast.For, ast.While)):
            if "out_cache_loc" in ast.unparse(loop) and any(
                isinstance(c.func, ast.Attribute)
                and c.func.attr == method
                and not (isinstance(c.func.value, ast.Name) and c.func.value.id == "self")
                and not isinstance(c.func.value, ast.Call)
                for c in nodes(loop, ast.Call)
            ):
                return f"{name}.{method}"
    return None


def _owner(world: World, entry: Entry) -> str:
    """``Class.method`` where the caller's method is defined (a base or mixin, say)."""
    return f"{world.lookup(entry.cls, entry.method).owner}.{entry.method}"


def _twice(world: World, entry: Entry, handed: Sequence[Event], why: str) -> SplitVerdict:
    """A caller handing each step its row, and the per-step code splitting it again."""
    return SplitVerdict(TWICE, why, caller=_owner(world, entry), line=handed[0].line)


def split_verdict(world: World, per_step: str, method: str = "init_forward_metadata") -> SplitVerdict:
    """The verdict on every path into ``per_step``'s ``method`` (``PATHS``; see the module)."""
    driven, sink = PATHS[method]
    driving = [entry for each in driven for entry in callers(world, per_step, each)]
    driver = None if driving else next(filter(None, (_unfollowed_driver(world, per_step, m) for m in driven)), None)
    if driver:
        return SplitVerdict(
            WRONG,
            f"cannot tell who splits it: {driver} drives per-step "
            "backends it does not build as `self.<list>.append(<Class>(...))` or "
            "`self.<list> = [<Class>(...) ...]`",
        )
    starts = driving or [Entry(per_step, m, stepped=True) for m in driven if world.lookup(per_step, m)]
    taken: set[str] = set()
    where_kind: dict[str, str] = {}
    handed_rows, handed_line = True, None
    for entry in starts:
        for probe in PROBES:
            steps = [None] if not entry.per_step_run else range(probe.steps)
            for step in steps:
                for outcome in paths(world, entry, probe, step, (sink, method if sink else "")).values():
                    where = f"{entry} ({probe}{'' if step is None else f', step {step}'})"
                    if outcome.cannot == DIVERGED or outcome.error is not None and outcome.error.explicit:
                        continue  # a path with no value: it never returns, or the code raises of its own
                    if sink and outcome.error is not None and not outcome.error.within:
                        continue  # it raised on the way to the method judged: another site's error
                    if outcome.cannot:
                        return SplitVerdict(WRONG, f"cannot tell who splits it from {where}: {outcome.cannot}")
                    locs = [e for e in outcome.of("loc") if e.step is not None]
                    handed = outcome.of("handed")
                    by_caller = bool(handed) and all(_kind(e, probe, e.step) == "row" for e in handed)
                    if outcome.error is not None and not any(_kind(e, probe, e.step) == "whole" for e in locs):
                        why = f"{where} raises {type(outcome.error.error).__name__} at line {outcome.error.line}"
                        return (
                            _twice(world, entry, handed, why)
                            if by_caller
                            else SplitVerdict(WRONG, why + ": split twice?")
                        )
                    for event in locs:
                        kind = _kind(event, probe, event.step)
                        if kind == "other":
                            why = (
                                f"{where}: step {event.step}'s backend takes other out_cache_loc slots than "
                                f"upstream's row {event.step} (line {event.line})"
                            )
                            return _twice(world, entry, handed, why) if by_caller else SplitVerdict(WRONG, why)
                        taken.add(kind)
                        where_kind.setdefault(kind, where)
                    handed_rows &= all(_kind(e, probe, e.step) in ("row", "either") for e in handed)
                    handed_line = handed_line or next((e.line for e in handed), None)
    taken.discard("either")
    if taken == {"row"}:
        caller = starts[0] if starts[0].backends_attr else None
        if caller is not None and handed_rows:
            return SplitVerdict(
                CALLER,
                caller=_owner(world, caller),
                line=handed_line or world.lookup(caller.cls, caller.method).node.lineno,
            )
        return SplitVerdict(PER_STEP)
    if taken == {"whole"}:
        caller = _owner(world, starts[0]) if starts[0].backends_attr else ""
        return SplitVerdict(NEVER, "each step's backend bakes the whole out_cache_loc", caller=caller)
    if not taken:
        return SplitVerdict(WRONG, f"no probe reaches where {per_step} bakes out_cache_loc")
    return SplitVerdict(
        WRONG,
        f"its row from {where_kind['row']}, the whole buffer from {where_kind['whole']}: "
        "split for some topk or steps only",
    )


def once_verdict(
    world: World, per_step: str, workers: Sequence[tuple[str, str, int]] = (), method: str = "init_forward_metadata"
) -> SplitVerdict:
    """``split_verdict``, with the ``workers`` (``worker_rows``) that hand each step its row: then the
    backend must bake what it is handed (NEVER on its own path: split once, by the worker). Not on the
    in-graph path: the CUDA graph's multi-step caller hands it the whole buffer, whatever the worker does."""
    verdict = split_verdict(world, per_step, method)
    if not workers or verdict.who in (WRONG, TWICE):
        return verdict
    (path, worker, line), *_ = workers
    if verdict.who == NEVER and method == IN_GRAPH:
        return SplitVerdict(
            WRONG,
            f"{worker} ({path}:{line}) hands each step its row, and the in-graph path hands it the whole "
            "buffer: no one split fits both",
        )
    if verdict.who == NEVER:
        return SplitVerdict(CALLER, caller=worker, line=line, path=path)
    where = ", ".join(f"{scope} ({file}:{number})" for file, scope, number in workers)
    why = f"split by the {verdict.who} {verdict.caller}".rstrip() + f", and by {where}: twice"
    return SplitVerdict(TWICE, why, caller=worker, line=line, path=path)


def split_once_problems(
    package: Optional[Path], modules: dict[str, tuple[ast.Module, Sequence[str]]]
) -> tuple[list[str], list[tuple[str, int, str, SplitVerdict]]]:
    """The classes under ``ATTENTION`` that bake out_cache_loc (``baking_methods``, from each method of
    ``PATHS``), and for each such path not kept (``keeps_path``) that is not split once: (module, line,
    ``Class.method``, verdict); ``modules``: path under the sglang package -> (tree, lines), the attention
    modules and the workers' (``WORKERS``)."""
    workers = worker_rows({path: tree for path, (tree, _lines) in modules.items()})
    found, problems = [], []
    for path, (tree, lines) in modules.items():
        world = None  # the module's, made once for its first class judged
        for cls in [c for c in tree.body if isinstance(c, ast.ClassDef)] if path.startswith(ATTENTION) else []:
            for start in PATHS:
                path_methods = baking_methods(cls, start)
                found += [cls.name] if path_methods and cls.name not in found else []
                if path_methods and not keeps_path(lines, path_methods):
                    world = world or world_of(tree, package)
                    verdict = once_verdict(world, cls.name, workers, start)
                    if verdict.who not in (CALLER, PER_STEP):
                        problems.append((path, path_methods[0].lineno, f"{cls.name}.{start}", verdict))
    return found, problems
