"""Who splits the per-step out_cache_loc on a multi-step draft path, and is it split exactly once?

The one answer for DeepSeek-V4-like paths (a per-step backend that bakes out_cache_loc at init), read
by running the path as Python would (``proof.paths``: MRO, ``super()``, explicit base calls, callees at
any depth) on every probe: each multi-step caller that drives the per-step backends, or the per-step
backend alone when nothing in the file drives it. Each step's backend must take upstream's row for its
step (``Probe.rows``). The verdict says who split it (the caller handing each step its row, or the
per-step code itself), that it is never split (the whole buffer baked: the bug the patch fixes), or
what else the path does, on which probe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from . import arrays
from .interpret import Event, World
from .paths import DIVERGED, Entry, callers, paths
from .world import PROBES, Probe

CALLER = "caller"
PER_STEP = "per-step backend"
NEVER = "never"
WRONG = "wrong"


@dataclass(frozen=True)
class SplitVerdict:
    """``who`` splits (CALLER, PER_STEP), NEVER, or WRONG; ``why`` says what the path did (one line);
    ``caller``: the driving ``Class.method`` (CALLER), ``line`` its def line."""

    who: str
    why: str = ""
    caller: str = ""
    line: Optional[int] = None


def _kind(value: Event, probe: Probe, step: int) -> str:
    """Step ``step``'s slots as ``value`` holds them: upstream's row, the whole buffer, or other."""
    if probe.steps == 1:  # one step's row is the whole buffer: no probe of who splits
        return "either"
    if value.same_value(probe.rows()[step]):
        return "row"
    if value.same_value(arrays.arange(probe.buffer_length, draft=True)):
        return "whole"
    return "other"


def split_verdict(world: World, per_step: str) -> SplitVerdict:
    """The verdict on every path into ``per_step``'s ``init_forward_metadata`` (see the module)."""

    starts = callers(world, per_step) or [Entry(per_step, "init_forward_metadata", stepped=True)]
    taken: set[str] = set()
    where_kind: dict[str, str] = {}
    handed_rows = True
    for entry in starts:
        for probe in PROBES:
            steps = [None] if not entry.stepped else range(probe.steps)
            for step in steps:
                for outcome in paths(world, entry, probe, step).values():
                    where = f"{entry} ({probe}{'' if step is None else f', step {step}'})"
                    if outcome.cannot == DIVERGED:
                        continue
                    if outcome.cannot:
                        return SplitVerdict(WRONG, f"cannot tell who splits it from {where}: {outcome.cannot}")
                    locs = [e for e in outcome.of("loc") if e.step is not None]
                    if outcome.error is not None and not any(_kind(e, probe, e.step) == "whole" for e in locs):
                        return SplitVerdict(WRONG, f"{where} raises {type(outcome.error.error).__name__} at line "
                                                   f"{outcome.error.line}: split twice?")
                    for event in locs:
                        kind = _kind(event, probe, event.step)
                        if kind == "other":
                            return SplitVerdict(WRONG, f"{where}: step {event.step}'s backend takes other out_cache_loc "
                                                       f"slots than upstream's row {event.step} (line {event.line})")
                        taken.add(kind)
                        where_kind.setdefault(kind, where)
                    handed_rows &= all(_kind(e, probe, e.step) in ("row", "either") for e in outcome.of("handed"))
    taken.discard("either")
    if taken == {"row"}:
        caller = starts[0] if starts[0].backends_attr else None
        if caller is not None and handed_rows:
            function = world.lookup(caller.cls, caller.method)
            return SplitVerdict(CALLER, caller=f"{function.owner}.{caller.method}", line=function.node.lineno)
        return SplitVerdict(PER_STEP)
    if taken == {"whole"}:
        return SplitVerdict(NEVER, "each step's backend bakes the whole out_cache_loc")
    if not taken:
        return SplitVerdict(WRONG, f"no probe reaches where {per_step} bakes out_cache_loc")
    return SplitVerdict(WRONG, f"its row from {where_kind['row']}, the whole buffer from {where_kind['whole']}: "
                               "split for some topk or steps only")
