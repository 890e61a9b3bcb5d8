"""Upstream's draft layout at a probe, and what a path's runs show against it.

Upstream's values come from the helpers (``speculative``): step i writes row i of
``per_step_draft_out_cache_loc``, split once; the kernel fills rows ``draft_kv_indices_buffer_width``
wide (per batch eagerly, per ``max_bs`` in the CUDA graph) and step i reads the first
``draft_kv_indices_used_len(..., i + 1)`` of row i; FlashInfer's and FlashInfer-MLA's
``common_template`` stop rows narrower than what the kernel will write. ``judge`` runs a path on every
probe (``paths.run_path``) and says, one line each, where it differs.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Collection, Iterator, Optional, Sequence

from ..speculative import eagle_utils, spec_utils
from .paths import (
    CONTEXT_LEN,
    EXTRA,
    OTHER_CONTEXT,
    PROBES,
    ROWS,
    STEPS,
    WORKER,
    DraftPath,
    Outcome,
    Probe,
    capacity_run,
    draft_paths,
    past,
    run_path,
)
from .branches import Branches
from .unknown import TAG, in_package
from .world import Tree

#: the backends whose common_template upstream checks (and every class deriving from them)
CHECKED = ("FlashInferMultiStepDraftBackend", "FlashInferMLAMultiStepDraftBackend")


@dataclass(frozen=True)
class Verdict:
    """A path against upstream's invariant: ``problems`` (empty: upstream's values), the probes whose runs
    showed the layout (``judged``), why it cannot be run, and (STEPS) who hands each step its row in each
    phase."""

    path: DraftPath
    problems: tuple[str, ...] = ()
    judged: int = 0
    cannot: str = ""
    split: tuple[tuple[str, str], ...] = ()  # STEPS: (phase, "caller" / "per-step" / "either") of each handoff
    #: the problems that are values of the tree's own, not the bug the patch fixes (an unsplit buffer, a
    #: narrow row, an unchecked row, a raise): a slice end of its own, other slots, a wider row
    own: tuple[str, ...] = ()
    baked: tuple[str, ...] = ()  # STEPS: the phases in which some probe saw a step bake its write target
    inits_steps: bool = False  # WORKER: it inits each step's attention backend with the row it sets
    driven_by: Optional[DraftPath] = None  # STEPS: the worker path that inits each step (``inits_steps``)

    @property
    def upstream(self) -> bool:
        return not self.problems and not self.cannot and self.judged > 0


class Upstream:
    """Upstream's values at ``probe``."""

    def __init__(self, torch: Any, probe: Probe) -> None:
        n, topk, steps = probe.num_seqs, probe.topk, probe.steps
        rows = eagle_utils.per_step_draft_out_cache_loc(torch._probe_tensor(probe.buffer), n, topk, steps)
        self.rows = [torch._values(rows[i]) for i in range(steps)]
        self.whole = tuple(probe.buffer)
        self.width = spec_utils.draft_kv_indices_buffer_width(n, topk, probe.context_len)
        self.graph_width = spec_utils.draft_kv_indices_buffer_width(probe.max_bs, topk, probe.context_len)
        self.used = [
            spec_utils.draft_kv_indices_used_len(sum(probe.seq_lens), topk, n * topk, i + 1) for i in range(steps)
        ]


def _phases(outcome: Outcome) -> dict[str, list]:
    phases, current = {}, ""
    for event in outcome.events:
        if event[0] == "phase":
            current = event[1]
        phases.setdefault(current, []).append(event)
    return phases


def _row(width: int, base: int, values: tuple) -> tuple:
    """(row, start, length) of what a step reads of the rows the kernel filled (``base + position``)."""
    start = values[0] - base if values else -1
    if width and 0 <= start < TAG and list(values) == list(range(values[0], values[0] + len(values))):
        return (start // width, start % width, len(values))
    return ("?", "?", len(values))


def _rows(torch: Any, outcome: Outcome, up: Upstream, probe: Probe) -> tuple[bool, list[str], list[str]]:
    """(launched, the bug's lines, other values'): rows narrower than upstream's (per batch eagerly, per ``max_bs`` in
    the CUDA graph) are the bug (27338/27460), and so are the cut rows they leave; any other width or slice end, or a
    per-step backend's CUDA-graph row other than its step's, is a value of the tree's own."""
    bugs, own, judged, handed = [], [], False, []
    launched, built = outcome.of("launch"), [e[1] for e in outcome.events if e[0] == "indptr row"]
    if launched and launched[0][3] is not None and built:  # per-step backend i is built on kv_indptr row i
        rows = [_row_of(torch._place(launched[0][3]), place) for place in built]
        if rows != list(range(len(rows))):
            own.append(f"the per-step backends are built on kv_indptr rows {rows}; upstream's {list(range(len(rows)))}")
    for phase, events in _phases(outcome).items():
        if phase.startswith("cuda graph"):  # a frame's rows: each per-step backend handed its own
            handed = [e[1] for e in events if e[0] == "graph row"]
        launches = [e[1:] for e in events if e[0] == "launch"]
        if not launches:
            continue
        judged = True
        buffer, stride, base, indptr = launches[0]
        width = up.width if phase == "eager" else up.graph_width
        shape = tuple(buffer.shape) if torch._is_tensor(buffer) else buffer
        narrow = isinstance(shape, tuple) and len(shape) == 2 and shape[1] < width
        if shape != (probe.steps, width) or stride != shape[-1]:
            line = f"{phase}: kv_indices rows {shape} (row stride {stride}); upstream's {(probe.steps, width)}"
            (bugs if narrow else own).append(line)
        rows = [_row_of(torch._place(buffer), place) for place in handed] if torch._is_tensor(buffer) else []
        upstreams = list(range(len(rows)))
        if rows and set(rows) == {"?"}:  # at capture and at replay, the graph reads the rows the kernel fills
            own.append(f"{phase}: the kernel fills other rows than those the per-step backends were handed")
        elif rows != upstreams:
            own.append(f"{phase}: the per-step backends' CUDA-graph kv_indices are rows {rows}; upstream's {upstreams}")
        cut = [_row(shape[-1] if isinstance(shape, tuple) else 0, base, e[1]) for e in events if e[0] == "kv"]
        expected = [(i, 0, up.used[i]) for i in range(probe.steps)]
        if cut != expected[: len(cut)] or phase == "eager" and len(cut) < probe.steps - 1:
            line = f"{phase}: steps read kv_indices (row, start, length) {cut}; upstream's {expected[:-1]}"
            (bugs if narrow else own).append(line)
        for at, what in ((2, "kv_indptr"), (3, "kv_indptr on the host")) if indptr is not None else ():
            # step i reads the first bs + 1 of kv_indptr row i, and FlashInfer plans with a host copy of them (where it
            # copies them: 0.5.2x may build them on the host from the sequence lengths instead)
            ptrs = [_row(indptr.shape[-1], -base, e[at]) for e in events if e[0] == "kv" and e[at] is not None]
            branches = [(i, 0, probe.num_seqs * probe.topk + 1) for i in range(len(ptrs))]
            if ptrs != branches and not (at == 3 and any(ptr[0] == "?" for ptr in ptrs)):
                own.append(f"{phase}: steps read {what} (row, start, length) {ptrs}; upstream's {branches}")
    return judged, bugs, own


def _row_of(rows: tuple, place: tuple) -> Any:
    """Which row of ``rows`` the view at ``place`` is, whole (``_place``'s), else "?"."""
    storage, offset, shape, strides = rows
    row = (place[1] - offset) // strides[0] if len(shape) == 2 and strides[0] else -1
    whole = (storage, offset + row * strides[0], shape[1:], strides[1:])
    return row if 0 <= row < shape[0] and place == whole else "?"


def _steps(torch: Any, outcome: Outcome, up: Upstream, probe: Probe) -> tuple[set, list[str], list[str], set]:
    """(the phases a step baked in, the bug's lines: a step baking the whole buffer, other values' (a draft step
    baking nothing too), and (phase, who handed each step what)), each line naming its phase ("eager", "in graph")."""
    bugs, own, split, shown, baking = [], [], set(), set(), {}
    for phase, events in _phases(outcome).items():
        for event in events:
            if event[0] == "raised":
                bugs.append(f"{phase}: raises {event[1]}")
            elif event[0] == "handed":
                step, held = event[1], event[3]
                who = (
                    "either"
                    if up.rows[step] == up.whole
                    else "caller" if held and held[0] == up.rows[step] else "per-step"
                )
                split.add((phase, who))
            elif event[0] in ("bake", "stored") and event[1] is not None:
                step, values, shape = event[1:]
                shown.add(phase)
                baking.setdefault(phase, set()).add(step)
                if values != up.rows[step] or len(shape) != 1:
                    which = "the whole buffer" if values == up.whole else f"slots {list(values)[:8]}"
                    line = f"{phase}: step {step} bakes {which}; upstream's row {step} is {list(up.rows[step])[:8]}"
                    (bugs if values == up.whole else own).append(line)
    for phase, steps in baking.items():  # every draft step that runs a forward bakes its row
        if missing := [i for i in range(probe.steps - 1) if i not in steps]:
            own.append(f"{phase}: steps {missing} bake nothing; upstream's step i bakes row i")
    return shown, bugs, own, split


def _worker(outcome: Outcome, up: Upstream, probe: Probe) -> tuple[bool, list[str], list[str]]:
    written = [values for step, values, shape in outcome.of("bake") if step is None]
    order = [v for i, v in enumerate(written) if i == 0 or v != written[i - 1]]
    expected = up.rows[: probe.steps - 1]
    if order == expected:
        return bool(written), [], _backends(outcome)
    seen = [
        "the whole buffer" if v == up.whole else f"row {up.rows.index(v)}" if v in up.rows else "other slots"
        for v in order
    ]
    line = f"the draft steps write to {seen or 'nothing'}; upstream's rows 0..{probe.steps - 2}"
    return True, ([line] if "the whole buffer" in seen else []), ([] if "the whole buffer" in seen else [line])


def _backends(outcome: Outcome) -> list[str]:
    """Upstream's draft steps each read with their own per-step backend (``attn_backends[i]``: the kv_indices row and
    slice end the multi-step backend planned for step i); a worker handing its forwards fewer is a problem."""
    backends, context = [], None
    for kind, *data in outcome.events:  # each forward's: the one a context was handed last, else the batch's
        if kind == "context backend":
            context = data[0]
        elif kind == "backend" and (backend := context if context is not None else data[0]) is not None:
            backends.append(backend)
    shared = len(set(backends))
    if shared == len(backends):
        return []
    return [
        f"the draft steps' forwards read with {shared} attention backend{'s' if shared != 1 else ''} for "
        f"{len(backends)} steps; upstream's step i reads with its own (attn_backends[i])"
    ]


def judge(
    tree: Tree, path: DraftPath, by_worker: Optional[DraftPath] = None, traced: Any = contextlib.nullcontext()
) -> Verdict:
    """Every probe's runs of ``path`` held against upstream's values (``by_worker``: the worker path that inits
    each step, ``run_path``'s; ``traced``: a context each run is made in)."""
    by_worker = by_worker if path.kind == STEPS else None
    torch, problems, own, judged, split, refusals, baked = tree.torch, [], [], 0, set(), [], set()
    inits, tried = False, 0
    for probe, label in _probes(tree):
        tried += 1
        with traced:
            how, outcomes = run_path(tree, path, probe, by_worker is not None)
        if how == "infeasible":
            refusals.append(f"{label}: {outcomes[0].where}")
            continue
        if how == "cannot" or all(o.end == "cannot" for o in outcomes):
            return Verdict(path, cannot=f"{label}: {outcomes[0].where}")
        up, seen = Upstream(torch, probe), False
        for outcome in outcomes:
            if outcome.end in ("refused", "cannot"):  # no result: the code refused a choice, or needs a number
                continue
            if path.kind == STEPS:  # who handed each step what, up to an error too (split twice, say)
                phases, bugs, others, kinds = _steps(torch, outcome, up, probe)
                split, baked, shown = split | kinds, baked | phases, bool(phases)
            elif path.kind == ROWS:
                shown, bugs, others = _rows(torch, outcome, up, probe)
            else:
                shown, bugs, others = _worker(outcome, up, probe)
                inits = inits or any(values in up.rows for values, _shape in outcome.of("inits"))
            if outcome.end == "raised":
                phase = next((e[1] for e in reversed(outcome.events) if e[0] == "phase"), "")
                problems.append(
                    f"{label}: {phase + ': ' if path.kind == STEPS and phase else ''}raises {outcome.where}"
                )
                continue
            seen = seen or shown
            problems += [f"{label}: {line}" for line in bugs + others]
            own += [f"{label}: {line}" for line in others]
        if path.kind == ROWS and seen and any(name in CHECKED for name in _bases(tree, path)):
            problems += [f"{label}: {line}" for line in _capacity(tree, path, probe, up)]
        judged += seen
    if len(refusals) == tried:
        return Verdict(path, cannot=f"no probe builds {path.cls}: {refusals[0]}")
    one_way = [
        f"{_branch(key)} went the same way on every probe: its other side cannot be judged"
        for key in tree.branches.one_way()
        if not tree.branches.configuration(key)
    ]
    unique = tuple(dict.fromkeys(problems + one_way))
    return Verdict(path, unique, judged, split=tuple(sorted(split)), own=tuple(dict.fromkeys(own)),
                   baked=tuple(sorted(baked)), inits_steps=inits, driven_by=by_worker)  # fmt: skip


def _probes(tree: Tree) -> Iterator[tuple[Probe, str]]:
    """(probe, its label in a problem): ``PROBES``, then, while an ``if`` comparing with a number went one way in
    every run so far (``Tree.branches``: a fork's ``if num_seqs <= 12:``, ``if num_seqs != 5:``), a probe taking the
    value of its other side (``past``: sequences, topk, steps, context length), then, where its operand took the same
    values on every probe, ``OTHER_CONTEXT``; the label naming it; ``EXTRA`` of them at most, those of an ``if`` whose
    operand varied first. One still one way after them is a problem but where its operand is configuration
    (``judge``)."""
    branches = tree.branches
    branches.clear()
    for probe in PROBES:
        yield probe, str(probe)
        branches.probed(other_context=False)
    tried = set(PROBES)
    for _ in range(EXTRA):
        one_way = sorted(branches.one_way(), key=lambda key: not branches.varied(key))
        found = next(((key, probe) for key in one_way for probe in _past(branches, key) if probe not in tried), None)
        if found is None:
            return
        key, probe = found
        tried.add(probe)
        yield probe, f"{probe} (for {_branch(key)})"
        branches.probed(other_context=probe.context_len != CONTEXT_LEN)


def _past(branches: Branches, key: tuple[str, int, str, tuple[int, ...]]) -> list[Probe]:
    """The probes for the ``if`` at ``key``: at each value of its other side, then, where its operand has not varied
    (configuration, or the context length), ``OTHER_CONTEXT``."""
    probes = [probe for value in key[3] for probe in past(value)]
    return probes if branches.varied(key) else [*probes, OTHER_CONTEXT]


def _branch(key: tuple[str, int, str, tuple[int, ...]]) -> str:
    filename, line, test, _numbers = key
    written = test[:60] if test.startswith(("min(", "max(")) else f"if {test[:60]}:"  # a bound (``branches.bounds``)
    return f"`{written}` at {in_package(filename)}:{line}"


def _bases(tree: Tree, path: DraftPath) -> list[str]:
    cls = tree.module(path.module).get(path.cls)
    return [c.__name__ for c in getattr(cls, "__mro__", ())]


def _capacity(tree: Tree, path: DraftPath, probe: Probe, up: Upstream) -> list[str]:
    """Upstream's capacity check: rows one narrower than the kernel fills are stopped, eager rows and the CUDA-graph
    rows alike; rows as wide pass it."""
    need = up.used[-1]
    for graph in (False, True):
        for outcome in capacity_run(tree, path, probe, need - 1, graph):
            stopped = isinstance(outcome.error, AssertionError) and not outcome.of("launch")
            if outcome.end == "ok" or outcome.end == "raised" and not stopped:
                rows = "CUDA-graph rows" if graph else "rows"
                return [f"common_template fills {rows} {need - 1} wide (it writes {need}) without a capacity check"]
    for outcome in capacity_run(tree, path, probe, need):
        if outcome.end == "raised" and not outcome.of("launch"):
            return [f"common_template stops rows {need} wide, as wide as it fills: {outcome.where}"]
    return []


def judge_paths(
    tree: Tree, modules: Collection[str], judge_path: Callable[..., Verdict] = judge
) -> dict[DraftPath, Verdict]:
    """Each draft path of ``modules`` (under the package) and its verdict (``judge_path``: ``judge``'s): the workers
    first, so that a per-step path runs as a worker that inits each step's backend with its row would."""
    return judge_each(tree, draft_paths(tree, sorted(modules)), judge_path)


def judge_each(
    tree: Tree, paths: Sequence[DraftPath], judge_path: Callable[..., Verdict] = judge
) -> dict[DraftPath, Verdict]:
    """Each of the draft ``paths`` and its verdict, as ``judge_paths`` judges them."""
    workers = {path: judge_path(tree, path) for path in paths if path.kind == WORKER}
    by_worker = inits_steps(workers)
    return {path: workers.get(path) or judge_path(tree, path, by_worker) for path in paths}


def inits_steps(workers: dict[DraftPath, Verdict]) -> Optional[DraftPath]:
    """The first worker path whose verdict says it inits each step's backend with its row, if any."""
    return next((path for path, verdict in workers.items() if verdict.inits_steps), None)


#: the folders whose modules the draft paths are looked for in (under the sglang package)
GUARDED = ("srt/layers/attention", "srt/speculative")


def guarded_modules(package: Optional[Path], given: Collection[str] = ()) -> list[str]:
    """The modules the draft paths are looked for in (paths under the package): every module under ``GUARDED`` of the
    package, and each of ``given`` there (a text standing in for a file); a path in a module of the fork's own is
    judged whatever its text names."""
    found = {relative for relative in given if relative.startswith(GUARDED)}
    for folder in GUARDED if package is not None else ():
        for root, _folders, files in os.walk(os.path.join(package, folder)):  # a walk, not rglob: a plan asks often
            under = os.path.relpath(root, package).replace(os.sep, "/")
            found.update(f"{under}/{name}" for name in files if name.endswith(".py"))
    return sorted(found)
