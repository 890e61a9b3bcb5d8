"""Translation validation: a rewrite is written only when it is proven on probe arrays.

For each site to patch, the fork's code and the rewritten code are run (``interpret``) from the
site's method, and from every multi-step caller in the file that drives it per step, on each probe
of ``world.PROBES`` (topk 1, one step and one sequence among them). What they compute must agree:
the draft buffer each step's code takes (``loc``), the kv_indices rows allocated and the row ends
sliced. The rewritten code must give upstream's values (``Probe.rows``, ``Probe.width``); the fork's
code must give the same, or have the bug the patch fixes: the unsplit buffer where a step's row
belongs, a row narrower than upstream's. Every rewritten line must run on some probe. Anything
else is refused in one line (``Proof.why``), and nothing is written.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence, TypeVar

from ..layout_patterns.ast_walk import called_name, in_order, parse
from ..rules.base import Edit, Source
from .interpret import Event, World
from .paths import DIVERGED, Entry, Outcome, callers, knows_its_step, outcomes, step_param
from .baking import worker_rows
from .splice import spliced
from .split_once import NEVER, PER_STEP, SplitVerdict, once_verdict
from .world import HELPERS, PROBES, Probe, world_of

T = TypeVar("T")


@dataclass(frozen=True)
class Proof:
    """The verdict on one rewrite: proven, or why not (one line) and the line it points at;
    ``probes``: each run (entry, probe shape, step) and what it showed ("equal", "fixes the fork's bug")."""

    proven: bool
    why: str = ""
    line: Optional[int] = None
    probes: tuple[tuple[str, str], ...] = ()
    #: the fork's code showed the layout (a row allocated, a row cut, the buffer taken) on every probe from
    #: every entry: an "equal" there compared values, not two runs that saw nothing
    fork_seen_everywhere: bool = False

    def to_json(self) -> dict:
        return {
            "proven": self.proven,
            "summary": self.summary(),
            "runs": [{"run": run, "verdict": verdict} for run, verdict in self.probes],
        }

    def summary(self) -> str:
        fixed = sum("fixes" in verdict for _run, verdict in self.probes)
        shown = f"{len(PROBES)} probes ({len(self.probes)} runs" + (
            f", the fork's bug fixed in {fixed}" if fixed else ""
        )
        return f"proven on {shown})" if self.proven else self.why


def _loc_verdict(old: Event, new: Event, probe: Probe, ordinal: int) -> str:
    """ "" when ``new`` is ``old`` (the fork's value kept); "fixes" when it is upstream's row for its step
    where ``old`` is the unsplit buffer (the bug); else why not."""
    if old.same(new):
        return ""
    step = new.step if new.step is not None else ordinal
    expected = probe.rows()[step] if step < probe.steps else None
    if expected is None or not new.same_value(expected):
        return f"the rewritten code gives step {step} other out_cache_loc slots than upstream's ({probe})"
    if old.step == new.step and len(old.value) == probe.buffer_length:
        return "fixes"
    return f"the fork's code gives step {step} other slots than upstream's, not the unsplit buffer ({probe})"


def judge(old: Outcome, new: Outcome, probe: Probe) -> str:
    """ "" (the same values), "fixes" (upstream's where the fork had the bug), or why the two differ."""
    if new.cannot == old.cannot == DIVERGED:
        return ""
    if new.cannot or old.cannot:
        return new.cannot or old.cannot
    if new.error is not None and (old.error is None or type(old.error.error) is not type(new.error.error)):
        return f"the rewritten code raises {type(new.error.error).__name__} at line {new.error.line} ({probe})"
    verdicts = []
    old_locs, new_locs = old.of("loc"), new.of("loc")
    if len(new_locs) < len(old_locs):
        return (
            f"the rewritten code hands on the draft buffer {len(new_locs)} times, the fork's {len(old_locs)} ({probe})"
        )
    if len(new_locs) > len(old_locs) and old.error is None:
        return (
            f"the rewritten code hands on the draft buffer {len(new_locs)} times, the fork's {len(old_locs)} ({probe})"
        )
    for ordinal, new_loc in enumerate(new_locs):
        if ordinal >= len(old_locs):  # the fork's code stopped at its bug (an assert on the unsplit buffer)
            verdicts.append(_loc_verdict(new_loc, new_loc, probe, ordinal) or "fixes")
        else:
            verdicts.append(_loc_verdict(old_locs[ordinal], new_loc, probe, ordinal))
    old_rows, new_rows = old.of("alloc"), new.of("alloc")
    if len(old_rows) != len(new_rows):
        return f"the rewritten code allocates {len(new_rows)} buffers, the fork's {len(old_rows)} ({probe})"
    for before, after in zip(old_rows, new_rows):
        if before.same(after):
            continue
        widened = (
            len(after.value) == 2
            and after.value == (probe.steps, probe.width)
            and len(before.value) == 2
            and before.value[0] == probe.steps
            and before.value[1] < probe.width
        )
        if not widened:
            return (
                f"the rewritten code allocates {after.value} at line {after.line} where the fork's allocates "
                f"{before.value} ({probe}; upstream's rows: {(probe.steps, probe.width)})"
            )
        verdicts.append("fixes")
    old_ends, new_ends = [e.value for e in old.of("slice")], [e.value for e in new.of("slice")]
    if old_ends != new_ends:
        return f"the rewritten code cuts kv_indices rows at {new_ends}, the fork's at {old_ends} ({probe})"
    bad = next((v for v in verdicts if v not in ("", "fixes")), None)
    return bad if bad is not None else ("fixes" if "fixes" in verdicts else "")


def _matched(old: dict[frozenset, Outcome], new: dict[frozenset, Outcome]) -> Optional[list[tuple[Outcome, Outcome]]]:
    """Each path of the fork's code with the rewritten code's paths that go the same way where both decide
    (a path that stopped early, at the fork's bug, decided fewer branches); None when a path has no partner."""
    pairs = [(o, n) for n in new.values() for o in old.values() if o.path <= n.path or n.path <= o.path]
    partnered_old = {id(o) for o, _n in pairs}
    partnered_new = {id(n) for _o, n in pairs}
    if len(partnered_old) != len(old) or len(partnered_new) != len(new):
        return None
    return pairs


def _method_at(tree: ast.Module, node: ast.AST) -> Optional[tuple[str, str]]:
    for cls in (s for s in tree.body if isinstance(s, ast.ClassDef)):
        for method in (s for s in cls.body if isinstance(s, ast.FunctionDef)):
            if method.lineno <= node.lineno <= method.end_lineno:
                return cls.name, method.name
    return None


def entries(world: World, scope: str) -> list[Entry]:
    """The site's method, and each multi-step caller in the file that drives its class per step."""
    cls, method = scope.split(".")
    stepped = knows_its_step(world, cls)
    found = [Entry(cls, method, stepped=stepped, step_param="" if stepped else step_param(world, cls, method))]
    if method == "init_forward_metadata" and found[0].stepped:
        found += callers(world, cls)
    return found


def prove(
    scope: str,
    old: Source,
    new_code: str,
    edits: Sequence[Edit],
    package: Optional[Path] = None,
    new: Optional[Source] = None,
) -> Proof:
    """Whether ``new_code`` (``old`` with ``edits``) computes the draft layout as proven above, from ``scope``.
    Proven once per process for the same code, edits and imported classes (``_PROOFS``)."""
    new = new or Source(old.path, new_code)
    old_world, new_world = _world(old, package), _world(new, package)
    imported = (*_imported(old_world, old.tree), *_imported(new_world, new.tree))
    key = (
        scope,
        old.path,
        old.code,
        new_code,
        tuple(_where(old.tree)),
        tuple(_where(new.tree)),
        tuple((_span(e.node), tuple(map(_span, e.absorb)), e.remove) for e in edits),
        tuple(map(id, imported)),
    )
    return _remembered(_PROOFS, key, imported, lambda: _prove(scope, old, new, edits, old_world, new_world))


def _prove(scope: str, old: Source, new: Source, edits: Sequence[Edit], old_world: World, new_world: World) -> Proof:
    kept = [edit for edit in edits if not edit.remove]  # a removed method need not run
    anchors = {id(n) for edit in kept for n in (edit.node, *edit.absorb)}
    touched = {_method_at(old.tree, edit.node) for edit in kept} - {None}
    added = [
        n
        for cls, method in touched
        for n in _helper_calls(new_world, cls, method)
        if not _had(old_world, cls, method, n)
    ]
    reached_old: set[int] = set()
    reached_new: set[int] = set()
    verdicts: list[tuple[str, str]] = []
    seen = False
    fork_seen_everywhere = True
    line = edits[0].node.lineno if edits else None
    for entry in entries(new_world, scope):
        for probe in PROBES:
            fork_seen = False
            for (step, old_paths), (_step, new_paths) in zip(
                outcomes(old_world, entry, probe), outcomes(new_world, entry, probe)
            ):
                fork_seen = fork_seen or any(o.events for o in old_paths.values())
                at = f"{probe}{'' if step is None else f', step {step}'}"
                where = f"{entry} ({at})"
                pairs = _matched(old_paths, new_paths)
                if pairs is None:
                    return Proof(
                        False,
                        f"cannot prove the rewrite from {where}: the rewritten code branches "
                        "otherwise than the fork's",
                        line,
                        tuple(verdicts),
                    )
                for before, after in pairs:
                    seen = seen or bool(before.events or after.events)
                    reached_old |= before.reached
                    reached_new |= after.reached
                    verdict = judge(before, after, probe)
                    if verdict not in ("", "fixes"):
                        return Proof(False, f"cannot prove the rewrite from {where}: {verdict}", line, tuple(verdicts))
                    verdicts.append((f"{entry}: {at}", "fixes the fork's bug" if verdict else "equal"))
            fork_seen_everywhere = fork_seen_everywhere and fork_seen
    if not seen:
        return Proof(
            False,
            f"cannot prove the rewrite: the probes see no draft layout from {scope} "
            "(no rows allocated, sliced or handed on)",
            line,
            tuple(verdicts),
        )
    if not anchors <= reached_old:
        return Proof(
            False,
            "cannot prove the rewrite: the fork's code there never runs on the probes "
            f"from {scope} (a method defined twice runs its last definition)",
            line,
            tuple(verdicts),
        )
    if not {id(n) for n in added} <= reached_new:
        return Proof(
            False,
            f"cannot prove the rewrite: the rewritten code never runs on the probes from {scope}",
            line,
            tuple(verdicts),
        )
    return Proof(True, probes=tuple(verdicts), fork_seen_everywhere=fork_seen_everywhere)


def prove_split_once(source: Source, new_code: str, scope: str) -> Proof:
    """A rewrite that changes who splits (a caller's split taken out where the per-step class splits as
    upstream does; upstream's slice added on the in-graph path), proven by the split-once verdict on
    ``new_code``: ``scope``'s (``Class.method``) own code takes upstream's row at every step of every probe,
    from every path into it, split once."""
    cls, method = scope.split(".")
    resolved = Source(source.path, new_code)
    resolved.others, resolved.package, resolved.line_length = source.others, source.package, source.line_length
    verdict = split_once_of(resolved, cls, method)
    if verdict.who != PER_STEP:
        why = verdict.why or f"split by {verdict.who} {verdict.caller}".rstrip()
        return Proof(False, f"cannot prove the rewrite: the per-step out_cache_loc path after it: {why}")
    fixed = split_once_of(source, cls, method).who == NEVER  # the fork never split it: the bug, fixed
    runs = tuple((f"{scope} (split once): {probe}", "fixes the fork's bug" if fixed else "equal") for probe in PROBES)
    return Proof(True, probes=runs, fork_seen_everywhere=True)


def _world(source: Source, package: Optional[Path]) -> World:
    """``world_of(source)``, made once per source."""
    if getattr(source, "_world", None) is None:
        source._world = world_of(source.tree, package)  # type: ignore[attr-defined]
    return source._world  # type: ignore[attr-defined]


def split_once_of(source: Source, cls: str, method: str = "init_forward_metadata") -> SplitVerdict:
    """Who splits the per-step out_cache_loc on the paths into ``cls.method`` (``split_once.PATHS``), the
    EAGLE workers of ``source.others`` counted (``split_once.once_verdict``): the one verdict the rules ask,
    on the whole module as the written CPU test reads it (its functions too, not only the class blocks
    ``check`` parsed). Judged once per process for the same code (``_VERDICTS``)."""
    verdicts = source.__dict__.setdefault("_split_once", {})
    if (cls, method) not in verdicts:
        world = _whole_world(source)
        imported = _imported(world, source._whole_tree)  # type: ignore[attr-defined]
        key = (
            source.path,
            source.code,
            cls,
            method,
            tuple(map(id, imported)),
            tuple(sorted((relative, other.code) for relative, other in source.others.items())),
        )
        verdicts[cls, method] = _remembered(
            _VERDICTS, key, imported, lambda: once_verdict(world, cls, worker_rows(source.other_trees()), method)
        )
    return verdicts[cls, method]


#: (path, code, class, ids of the classes imported from the tree's other modules, the workers' code) ->
#: (those classes, the verdict); ``_PROOFS`` likewise for ``prove`` (the code before and after, the
#: class blocks parsed, the edits' places): a check, an apply and a check of one tree prove each path
#: once. The imported classes are the trees ``world._parsed`` keeps while their file stays as it is;
#: held here, so their ids name them as long as the entry lives.
_VERDICTS: dict[tuple, tuple[tuple[ast.ClassDef, ...], SplitVerdict]] = {}
_PROOFS: dict[tuple, tuple[tuple[ast.ClassDef, ...], Proof]] = {}
_KEPT = 256


def _remembered(memo: dict, key: tuple, held: tuple, compute: Callable[[], T]) -> T:
    """``memo``'s value for ``key``, computed once (``held`` kept beside it; the oldest of ``_KEPT`` dropped)."""
    if key not in memo:
        if len(memo) >= _KEPT:
            del memo[next(iter(memo))]
        memo[key] = (held, compute())
    return memo[key][1]


def _imported(world: World, tree: ast.Module) -> tuple[ast.ClassDef, ...]:
    """The classes of ``world`` that came from the tree's other modules (not defined in ``tree``)."""
    own = {c.name for c in tree.body if isinstance(c, ast.ClassDef)}
    return tuple(c for name, c in world.classes.items() if name not in own)


def _where(tree: ast.Module) -> list[tuple[int, int]]:
    """Where the top-level statements parsed start and end (a Source may hold only some class blocks)."""
    return [(n.lineno, n.end_lineno or 0) for n in tree.body]


def _span(node: ast.AST) -> tuple:
    return (type(node).__name__, node.lineno, node.col_offset, node.end_lineno, node.end_col_offset)


def _whole_world(source: Source) -> World:
    """``world_of`` the whole module (``source`` may hold only its class blocks), made once per source."""
    if getattr(source, "_whole_world", None) is None:
        source._whole_tree = parse(source.code, source.path)  # type: ignore[attr-defined]
        source._whole_world = world_of(source._whole_tree, source.package)  # type: ignore[attr-defined]
    return source._whole_world  # type: ignore[attr-defined]


def _helper_calls(world: World, cls: str, method: str) -> list[ast.Call]:
    function = world.lookup(cls, method)
    return (
        [n for n in in_order(function.node) if isinstance(n, ast.Call) and called_name(n) in HELPERS]
        if function
        else []
    )


def _had(world: World, cls: str, method: str, call: ast.Call) -> bool:
    """The fork's method already has this helper call (the same text)."""
    text = ast.unparse(call)
    return any(ast.unparse(c) == text for c in _helper_calls(world, cls, method))


__all__ = [
    "Proof",
    "Probe",
    "PROBES",
    "prove",
    "prove_split_once",
    "spliced",
    "judge",
    "entries",
    "world_of",
    "split_once_of",
]
