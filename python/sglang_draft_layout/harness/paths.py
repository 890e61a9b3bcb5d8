"""The draft paths of a tree, run on probes: what each draft step writes to, and the rows it sizes and cuts.

A path starts where the server enters the draft code: an EAGLE worker's ``draft_forward`` (WORKER), a
multi-step draft backend's ``init_forward_metadata`` and its CUDA-graph state (ROWS), a multi-step
backend handing each step's backend the batch (STEPS: DeepSeek-V4, whose per-step backend bakes its
step's write target at init). ``self`` is built by the class's own ``__init__`` from a model runner and
server args that know the probe (topk, steps, context length) and nothing else; the batch is a draft
decode batch whose ``out_cache_loc`` is ``BASE, BASE + 1, ...``. Each run is repeated with every choice
of the decisions it takes on unknowns (``explore``); a run that ends in the tree's own ``raise`` or
``assert`` on such a choice is no result. ``events`` records what the run saw (``unknown.note``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import operator
import re
import sys
import types
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Iterator, Optional

from ..speculative import eagle_utils
from .unknown import TAG, TREE_FILES, Known, NeedsValue, Run, Unknown, in_package, note, refused_by_decision, tree_frame
from .world import KERNEL, Tree

BASE = 1_000_000  # the draft buffer's slots
CONTEXT_LEN = 64
MAX_RUNS = 512
WORKER, ROWS, STEPS = "draft_forward", "kv_indices rows", "per-step out_cache_loc"
ATTENTION, SPECULATIVE = "srt/layers/attention/", "srt/speculative/"
#: what ForwardMode.DECODE answers True to (read off sglang 0.5.12's ForwardMode)
DECODE = frozenset({"is_decode", "is_decode_or_idle", "is_cuda_graph", "is_cpu_graph"})
#: SGLang's EAGLE workers (V2's draft side, v1): always judged; another class with a ``draft_forward`` only where
#: it splits out_cache_loc per step
WORKERS = ("EagleDraftWorker", "EAGLEWorker")
#: the per-step backend methods a multi-step backend calls with the batch
STEP_METHODS = ("init_forward_metadata", "init_forward_metadata_in_graph")


@dataclass(frozen=True)
class Probe:
    num_seqs: int
    topk: int
    steps: int
    context_len: int = CONTEXT_LEN

    @property
    def max_bs(self) -> int:
        """The CUDA graph's largest batch: one past the batch it captures and replays (SGLang sizes the graph's rows for
        the largest batch it captures and replays smaller ones in them)."""
        return self.num_seqs + 1

    @property
    def seq_lens(self) -> list[int]:
        return [(5, 9, 4)[i % 3] for i in range(self.num_seqs)]

    @property
    def buffer(self) -> list[int]:
        return list(range(BASE, BASE + self.num_seqs * self.topk * self.steps))

    def __str__(self) -> str:
        context = f", context {self.context_len}" if self.context_len != CONTEXT_LEN else ""
        return f"bs {self.num_seqs}, topk {self.topk}, {self.steps} step{'s' * (self.steps > 1)}{context}"


PROBES = (Probe(1, 1, 2), Probe(3, 1, 4), Probe(2, 4, 3), Probe(1, 8, 5), Probe(2, 2, 1), Probe(1, 1, 1))
#: how many probes a path runs past ``PROBES`` at most (``past``), and the most sequences, topk, steps and context
#: length they take
EXTRA = 6
PAST_AT_MOST = Probe(512, 128, 16, 1 << 16)
#: the probe showing whether an ``if``'s operand, the same on every probe so far, follows the context length (which
#: every base probe takes at ``CONTEXT_LEN``)
OTHER_CONTEXT = Probe(2, 1, 3, 2 * CONTEXT_LEN)


def past(value: int) -> list[Probe]:
    """Where an ``if`` comparing with a number went one way on every probe so far (``branches.comparisons``): the
    probes taking sequences, then topk, then steps, then context length at ``value``, the other side's (one past an
    ordering's number, an equality's number), each within ``PAST_AT_MOST`` and where no base probe took it (an ``if``
    on that parameter took its other side there: the context only past ``CONTEXT_LEN``)."""
    most, taken = PAST_AT_MOST, [{getattr(probe, name) for probe in PROBES} for name in ("num_seqs", "topk", "steps")]
    probes = [Probe(value, 1, 3), Probe(2, value, 3), Probe(2, 2, value)]
    within = [
        probe
        for probe, at_most, base in zip(probes, (most.num_seqs, most.topk, most.steps), taken)
        if value <= at_most and value not in base
    ]
    return within + ([Probe(2, 2, 3, value)] if CONTEXT_LEN < value <= most.context_len else [])


@dataclass(frozen=True)
class DraftPath:
    """``cls`` of ``module`` (under the sglang package) and the kind of path it starts; STEPS: ``alone``
    when no multi-step backend of the module drives the per-step class ``cls``; ROWS: the tree's draft CUDA-graph
    runners, whose ``__init__`` hands its ``init_cuda_graph_state`` the sizes (``graph_frame``)."""

    kind: str
    module: str
    cls: str
    alone: bool = False
    per_step: tuple[str, ...] = ()
    runners: tuple[tuple[str, str], ...] = ()  # ROWS: (module, class) of each draft CUDA-graph runner sizing its rows

    def __str__(self) -> str:
        return f"{self.module}: {self.cls}"


@dataclass
class Outcome:
    """One run: what it saw, how it ended (``ok``; ``refused``: the tree's raise on a choice the run made;
    ``raised``; ``cannot``: it needs a number no probe gives) and where, and the decisions it took."""

    events: list
    end: str = "ok"
    error: Optional[BaseException] = None
    took: dict = field(default_factory=dict)

    def of(self, kind: str) -> list:
        return [e[1:] for e in self.events if e[0] == kind]

    @property
    def where(self) -> str:
        tb, line = self.error.__traceback__ if self.error else None, ""
        while tb is not None:
            if tb.tb_frame.f_code.co_filename in TREE_FILES:
                line = f"{in_package(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"
            tb = tb.tb_next
        return f"{type(self.error).__name__} at {line or 'the harness'}: {str(self.error)[:120]}"


_CLASS = re.compile(r"\nclass (\w+)")
#: a line at the left margin that is code (not blank, not a comment, not closing a bracket), with the newline before it
MARGIN = re.compile(r"\n[^\s#)\]}]")


def _class_blocks(text: str) -> list[tuple[str, str]]:
    """(name, text) of each top-level class, cut at the next top-level statement (no parse; the text searched from a
    newline put before it: a search for a newline is fast, one for a line's start is not)."""
    blocks, text = [], "\n" + text
    for match in _CLASS.finditer(text):
        end = MARGIN.search(text, match.end())
        blocks.append((match.group(1), text[match.start() + 1 : end.start() + 1 if end else len(text)]))
    return blocks


_DRIVES = re.compile(r"speculative_step_id=(?!\s*\d)")


_SETS_ROW = re.compile(r"\.out_cache_loc\s*=[^=]")


def _drives(block: str, built: list[str]) -> bool:
    """A multi-step backend: it builds backends handing each its ``speculative_step_id=`` (not a parameter's
    default), or, launching no draft kernel, builds its ``attn_backends`` (``built``) and hands each a batch whose
    out_cache_loc it sets (0.5.20's QwenSparseMultiStepDraftBackend, whose per-step backends know no step)."""
    return bool(_DRIVES.search(block)) or (
        bool(built)
        and KERNEL not in block
        and "attn_backends" in block
        and ".init_forward_metadata(" in block
        and bool(_SETS_ROW.search(block))
    )


_BASES = re.compile(r"^class (\w+)\(([^)]*)\)", re.MULTILINE)
#: what a subclass's own text shows where it sizes or cuts kv_indices rows itself (the rows, a width, a used length)
_OWN_ROWS = re.compile(r"kv_indices|max_context_len|seq_lens_sum\s*\*")


def _derived(blocks: dict[tuple[str, str], str], roots: set[str]) -> list[tuple[str, str]]:
    """(module, class) of each class of ``blocks`` ((module, class) -> its text) other than ``roots`` deriving, by its
    bases' names through any depth, from a class named in ``roots``."""
    bases = {}
    for key, block in blocks.items():
        match = _BASES.match(block)
        if match is not None:
            bases[key] = {part.strip().rpartition(".")[2] for part in match.group(2).split(",")}
    derived, grew = set(roots), True
    while grew:
        new = {name for (_m, name), names in bases.items() if names & derived} - derived
        derived, grew = derived | new, bool(new)
    return [key for key, names in bases.items() if key[1] not in roots and names & derived]


def draft_paths(tree: Tree, modules: Iterable[str]) -> list[DraftPath]:
    """The paths of ``modules``, found by what their classes' text names: a worker's ``draft_forward`` of
    ``WORKERS``, of a class deriving from one, or splitting out_cache_loc itself; a multi-step backend launching the
    kernel, or deriving from one and sizing or cutting rows in its own text (``_OWN_ROWS``: a fork's subclass
    overriding ``init_cuda_graph_state`` runs its base's ``common_template`` on the rows it sizes); a multi-step
    backend driving per-step backends, or a per-step backend baking its step's out_cache_loc alone. A multi-step
    backend's rows are sized by the draft CUDA-graph runners the EAGLE workers (``WORKERS``) name, not another
    worker's (0.5.23's ``FrozenKVMTPCudaGraphRunner`` hands ``max_bs * topk``: its worker drafts at topk 1)."""
    found, blocks, workers = [], {}, {}  # (module, class) -> text, of the attention modules and the workers
    runners, drafting = [], []  # (module, class) of the draft CUDA-graph runners; the drafting workers' texts
    for relative in modules:
        if not tree.mentions(relative, "speculative_num_steps"):
            continue
        text = tree.text(relative)
        classes = _class_blocks(text)
        if relative.startswith(SPECULATIVE):
            runners += [(relative, name) for name, body in classes if sizes_rows(body)]
            forwards = [(name, body) for name, body in classes if "def draft_forward" in body]
            drafting += [body for name, body in forwards if name in WORKERS]
            workers.update({(relative, name): body for name, body in forwards if "out_cache_loc" in body})
            found += [DraftPath(WORKER, relative, name) for name, body in forwards if name in WORKERS or "out_cache_loc"
                      in body and ("permute" in body or "per_step_draft_out_cache_loc" in body)]  # fmt: skip
        if not relative.startswith(ATTENTION):
            continue
        blocks.update({(relative, name): body for name, body in classes})
        found += [DraftPath(ROWS, relative, name) for name, body in classes if KERNEL in body]
        classes_text = dict(classes)
        reading = [name for name, body in classes if "out_cache_loc" in body]
        built = {  # the classes reading out_cache_loc that each class able to drive steps builds
            name: [c for c in reading if c != name and re.search(rf"\b{c}\(", body)]
            for name, body in classes
            if "attn_backends" in body or _DRIVES.search(body)
        }
        drivers = [name for name, body in classes if name in built and _drives(body, built[name])]
        handed_a_step = {c for name in drivers if _DRIVES.search(classes_text[name]) for c in built[name]}
        # a per-step class handing out_cache_loc= on, knowing its step itself or from its driver (a subclass's)
        bakers = [
            name
            for name, body in classes
            if "out_cache_loc=" in body
            and name not in drivers
            and ("speculative_step_id" in body or name in handed_a_step)
        ]
        for name in drivers:  # the bakers, and the classes it builds (a fork's own per-step subclass too)
            if bakers or not _DRIVES.search(classes_text[name]):
                per_step = tuple(dict.fromkeys([*bakers, *(c for c in built[name] if c not in drivers)]))
                found.append(DraftPath(STEPS, relative, name, per_step=per_step))
        if not drivers:
            found += [DraftPath(STEPS, relative, name, True, (name,)) for name in bakers]
    launching, listed = {path.cls for path in found if path.kind == ROWS}, {(p.module, p.cls) for p in found}
    rows = [DraftPath(ROWS, *key) for key in _derived(blocks, launching) if _OWN_ROWS.search(blocks[key])]
    runners = [(module, name) for module, name in runners if any(re.search(rf"\b{name}\b", w) for w in drafting)]
    found = [replace(path, runners=tuple(runners)) if path.kind == ROWS else path for path in found + rows]
    return found + [DraftPath(WORKER, *key) for key in _derived(workers, set(WORKERS)) if key not in listed]


#: a draft CUDA-graph runner sizing the multi-step draft backend's rows (``EAGLEDraftCudaGraphRunner.__init__``:
#: ``self.draft_attn_backend.init_cuda_graph_state(self.max_bs, self.max_num_token)``)
_SIZES_ROWS = re.compile(r"\bdraft_attn_backend\s*\.\s*init_cuda_graph_state\s*\(")


def sizes_rows(text: str) -> bool:
    """A module's text holds a draft CUDA-graph runner (``draft_paths`` reads its sizes: a file to read)."""
    return "draft_attn_backend" in text and _SIZES_ROWS.search(text) is not None  # a search for a word is fast


class _Sized(Exception):
    """The runner handed the draft backend's ``init_cuda_graph_state`` these arguments (``args[0]``: positional,
    keyword)."""


#: whether each size a runner hands counts branches: (those handed by position, those handed by name)
Frame = tuple[tuple[bool, ...], dict[str, bool]]


def graph_frame(tree: Tree, runner: tuple[str, str]) -> Optional[Frame]:
    """Whether each size ``runner`` hands its draft backend's ``init_cuda_graph_state`` counts branches: its
    ``__init__`` (the tree's own) run at two topks up to that call, a size counting branches where it changes with
    topk. Upstream's ``(max_bs, max_num_token)`` is ((False, True), {}); None where the runner does not run to the
    call."""
    key = ("graph frame", *runner)
    if key not in tree.memo:
        handed, frame = [handed_sizes(tree, runner, Probe(1, topk, 2)) for topk in (2, 3)], None
        if None not in handed:
            (args, kwargs), (other_args, other_kwargs) = handed
            if len(args) == len(other_args) and kwargs.keys() == other_kwargs.keys():
                changed = {name: repr(kwargs[name]) != repr(other_kwargs[name]) for name in kwargs}
                frame = tuple(repr(a) != repr(b) for a, b in zip(args, other_args)), changed
        tree.memo[key] = frame
    return tree.memo[key]


def handed_sizes(tree: Tree, runner: tuple[str, str], probe: "Probe") -> Optional[tuple[tuple, dict]]:
    """What ``runner``'s ``__init__`` (the tree's own) hands its draft backend's ``init_cuda_graph_state`` at ``probe``
    (its captured batch sizes up to ``probe.max_bs``: ``unknown.batch_sizes_to_capture``): (args, kwargs), or None
    where it does not run to the call. Run for each path it sizes, each time: the ``if``s it takes are that path's."""
    cls = tree.module(runner[0]).get(runner[1])
    if not isinstance(cls, type):
        return None

    def sized(callee: Unknown, args: tuple, kwargs: dict) -> None:
        if _SIZES_ROWS.search(f"{callee._name}("):
            raise _Sized((args, kwargs))

    run = Run(handed=sized)
    run.facts = facts(probe)
    worker = Known("worker", like={"runner": run.facts["model_runner"]})  # its model_runner, draft_runner, ...
    first = next(iter(inspect.signature(cls).parameters), None)
    with run:
        try:
            construct(tree.probe_class(cls), probe, **({first: worker} if first else {}))
        except _Sized as sized_error:
            return sized_error.args[0]
        except Exception:  # it stops before the call on this world: its sizes are not known
            return None
    return None


# -- a run -----------------------------------------------------------------------------------------
def explore(body: Callable[[Run], Any], forced: Optional[dict] = None, probe: Optional["Probe"] = None,
            limit: int = MAX_RUNS, first: bool = False) -> list[Outcome]:  # fmt: skip
    """``body`` run until each decision it takes has gone both ways (``first``: until one ends well): a run per
    choice not yet taken, the decisions before it as the run that met it took them."""
    todo, outcomes, covered = [dict(forced or {})], [], set()
    while todo:
        if len(outcomes) >= limit:
            error = NeedsValue(f"more than {limit} ways the unknowns it decides on go")
            return [Outcome([], "cannot", error)]
        run = Run(todo.pop(), _observer)
        run.facts = facts(probe) if probe is not None else {}
        outcome = Outcome(run.events, took=run.took)
        with run:
            try:
                body(run)
            except NeedsValue as error:
                outcome.end, outcome.error = "cannot", error
            except RecursionError as error:  # on these choices the path never returns: no result
                outcome.end, outcome.error = "refused", error
            except Exception as error:
                outcome.end, outcome.error = ("refused" if refused_by_decision(error, run) else "raised"), error
        outcomes.append(outcome)
        if first and outcome.end == "ok":
            return outcomes
        covered |= set(run.took.items())
        keys = list(run.took)
        for key in run.fresh:  # the latest first: the choice nearest where a run was refused
            if (key, False) not in covered:
                covered.add((key, False))
                prefix = {k: run.took[k] for k in keys[: keys.index(key)]}
                todo.append({**run.forced, **prefix, key: False})
    return outcomes


#: what ``_stored`` never looks into: the scalars (most of a backend's fields, by exact type) and ``_NOT_WALKED``,
#: whose fields ``_observer`` skips too
_SCALARS = frozenset({type(None), bool, int, float, str, bytes})
_NOT_WALKED = (Unknown, type, types.ModuleType, types.FunctionType)


def _observer(callee: Unknown, args: tuple, kwargs: dict) -> None:
    """What code outside the path is handed: the kernel's rows, each batch's write target and kv_indices. A
    draft step's write target is a tensor of draft slots handed as a write target (``is_write_target``); a
    worker's, any tensor of draft slots, or the batch a model's forward is handed."""
    if not args and not kwargs:
        return
    run, torch = Run.current, _TORCH[0]
    fn, bound = callee._fn, kwargs
    if fn is not None:
        try:
            bound = _signature(fn).bind_partial(*args, **kwargs).arguments
        except (TypeError, ValueError):
            pass
        if fn.__name__ == KERNEL and callee._name.endswith("]"):  # kernel[grid](...)
            rows, base = bound.get("kv_indices"), TAG * (1 + len([e for e in run.events if e[0] == "launch"]))
            indptr = bound.get("kv_indptr") if torch._is_tensor(bound.get("kv_indptr")) else None
            if torch._is_tensor(rows):
                torch._tag(rows, base)
            if indptr is not None:  # its kv_indptr rows as ``-base + position``: never a kv_indices value
                torch._tag(indptr, -base)
            note("launch", rows, bound.get("kv_indices_stride"), base, indptr)
    graph = callee._name.endswith(".init_cuda_graph_state")
    if graph and torch._is_tensor(row := _handed(callee, "init_cuda_graph_state", "kv_indices_buf", args, kwargs)):
        note("graph row", torch._place(row))  # a per-step backend's CUDA-graph row
    if callee._name in _STANDING_IN and torch._is_tensor(
        row := _handed(callee, "__init__", "kv_indptr_buf", args, kwargs)
    ):
        note("indptr row", torch._place(row))  # a per-step backend built on its kv_indptr row
    if run.step is None and "attn_backend" in kwargs:  # ``ForwardContext(attn_backend=...)``: the steps after read it
        note("context backend", _backend_key(kwargs["attn_backend"]))
    named = None
    for value in (*args, *kwargs.values()):
        if torch._is_tensor(value):
            named = {id(v): k for k, v in bound.items()} if named is None else named
            name = named.get(id(value), callee._name.rpartition(".")[2])  # unnamed: the callee's own name
            if run.step is None or is_write_target(name):
                _bake(torch, run, value)
        elif not isinstance(value, _NOT_WALKED) and hasattr(value, "__dict__"):
            forward = callee._name.endswith(".forward") or callee._name.endswith(".forward(...)")
            inits = run.step is None and callee._name.endswith(".init_forward_metadata")  # a worker's per-step init
            if forward:  # a model's forward handed the batch: its KV write, and the attention backend it reads with
                _bake(torch, run, value.__dict__.get("out_cache_loc"))
                if run.step is None:  # a worker's step: None where the batch carries none (a context may)
                    backend = value.__dict__.get("attn_backend")
                    note("backend", None if backend is None else _backend_key(backend))
            held = _draft(torch, value.__dict__.get("out_cache_loc")) if inits else None
            if held is not None:
                note("inits", *held)
            spec = value if "kv_indices" in value.__dict__ else value.__dict__.get("spec_info")
            fields = getattr(spec, "__dict__", {})
            if torch._is_tensor(rows := fields.get("kv_indices")):  # what a step reads: kv_indices and kv_indptr
                frame = tree_frame(sys._getframe(1))  # the tree's code handing it: its module's host kv_indptr
                host = frame.f_globals.get(HOST_INDPTR) if frame is not None else None
                ptrs = [
                    torch._values(ptr) if torch._is_tensor(ptr) else None for ptr in (fields.get("kv_indptr"), host)
                ]
                note("kv", torch._values(rows), *ptrs)


#: the module global FlashInfer's ``common_template`` sets to each step's kv_indptr row on the host before handing the
#: step's backend the batch: its plan reads it (``indptr_cpu_whole[i]``, 0.4.8 on)
HOST_INDPTR = "global_override_indptr_cpu"


def _backend_key(backend: Any) -> Any:
    """What tells one attention backend from another: an outside one's name (``...attn_backends[2]``), else itself."""
    return backend._name if isinstance(backend, Unknown) else id(backend)


def is_write_target(name: str) -> bool:
    """A parameter, field or callee named for the KV slots a step writes (``out_cache_loc``, ``raw_out_loc``,
    ``swa_out_cache_loc``, ``translate_loc_from_full_to_swa``), as SGLang names them; not the slots of earlier
    steps a step reads (FlashAttention's page table for topk > 1)."""
    return "out_cache_loc" in name or "out_loc" in name or name.startswith("translate_loc")


_TORCH: list = [None]


@functools.lru_cache(maxsize=64)
def _signature(fn: Callable) -> inspect.Signature:
    return inspect.signature(fn)


def _draft(torch: Any, value: Any) -> Optional[tuple]:
    """(values, shape) of a tensor holding draft slots only."""
    if not torch._is_tensor(value) or value.numel() > 4096:
        return None
    values = torch._values(value)
    return (values, tuple(value.shape)) if values and all(BASE <= v < TAG for v in values) else None


def _bake(torch: Any, run: Run, value: Any) -> None:
    held = _draft(torch, value)
    if held is not None:
        note("bake", run.step, *held)


def _stored(
    torch: Any, value: Any, batch: Any, depth: int = 0, name: str = "", found: Optional[list] = None
) -> list[tuple]:
    """The draft write targets a per-step backend keeps (its attributes, their fields, lists and dicts, three deep):
    a tensor of draft slots under a write target's name (``is_write_target``), or of one dimension (2-D tables of
    earlier steps' slots are what a step reads)."""
    found = [] if found is None else found
    if type(value) in _SCALARS or value is batch or isinstance(value, _NOT_WALKED):
        return found
    held = _draft(torch, value)
    if held is not None and (is_write_target(name) or len(held[1]) == 1):
        found.append(held)
    elif depth < 3:
        if isinstance(value, (list, tuple)):
            items = [(name, item) for item in value[:16]]
        elif isinstance(value, dict) or hasattr(value, "__dict__") and not torch._is_tensor(value):
            fields = value if isinstance(value, dict) else vars(value)
            items = [(str(key), item) for key, item in list(fields.items())[:64]]
        else:
            items = []
        for key, item in items:
            if type(item) not in _SCALARS and not isinstance(item, _NOT_WALKED):
                _stored(torch, item, batch, depth + 1, key, found)
    return found


# -- the probe world -------------------------------------------------------------------------------
class DecodeMode:
    """``forward_batch.forward_mode`` of a draft decode step."""

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("is_"):
            return Unknown(f"forward_mode.{name}")
        return lambda *args, **kwargs: name in DECODE


#: what the model runner and every batch share (``forward_batch.req_to_token_pool is model_runner.req_to_token_pool``)
SHARED = ("req_to_token_pool", "token_to_kv_pool")


def facts(probe: Probe) -> dict:
    """What one run's world knows: server args with the probe's topk and steps (``model_runner.server_args``,
    ``get_spec()`` and the like: ``unknown.server_args``), a model runner, the pools it shares with every batch,
    the attributes of any outside object (``Unknown``)."""
    server = Known("server_args", speculative_eagle_topk=probe.topk, speculative_num_steps=probe.steps, device="cpu")
    config = Known("model_runner.model_config", context_len=probe.context_len)
    shared = {name: Unknown(name) for name in SHARED}
    # the request pool holds the graph's largest batch (a multi-step backend's kv_indptr rows: its size * topk + 1)
    shared["req_to_token_pool"] = Known("req_to_token_pool", size=probe.max_bs)
    runner = Known("model_runner", server_args=server, model_config=config, device="cpu", **shared)
    # every attention backend's max_context_len is the model's context length (its model_config.context_len)
    attributes = {"max_context_len": probe.context_len}
    capture = sorted({1, probe.num_seqs, probe.max_bs})  # a CUDA graph's batch sizes: the probe's largest last
    return {"server_args": server, "model_runner": runner, "attributes": attributes, "capture_bs": capture, **shared}


def forward_batch(torch: Any, probe: Probe) -> Known:
    lens = probe.seq_lens
    shared = {name: Run.current.facts[name] for name in SHARED}
    mode = DecodeMode()  # every mode the batch holds (``actual_forward_mode``, ``_original_forward_mode``) is DECODE
    return Known("forward_batch", {"forward_mode": mode}, **shared, batch_size=probe.num_seqs, out_cache_loc=torch._probe_tensor(probe.buffer),
                 seq_lens=torch._probe_tensor(lens), seq_lens_cpu=torch._probe_tensor(lens), seq_lens_sum=sum(lens),
                 req_pool_indices=torch._probe_tensor(range(probe.num_seqs)), forward_mode=mode,
                 spec_info=Known("forward_batch.spec_info"))  # fmt: skip


def construct(cls: type, probe: Probe, **given: Any) -> Any:
    """``cls(...)`` as a draft worker or backend factory calls it, its own ``__init__`` run."""
    known = Run.current.facts
    facts = {"model_runner": known["model_runner"], "draft_model_runner": known["model_runner"],
             "server_args": known["server_args"], "topk": probe.topk, "speculative_num_steps": probe.steps, **given}  # fmt: skip
    kwargs = {}
    for name, parameter in list(inspect.signature(cls).parameters.items()):
        if name in facts:
            kwargs[name] = facts[name]
        elif parameter.default is inspect.Parameter.empty and parameter.kind not in (
            parameter.VAR_POSITIONAL,
            parameter.VAR_KEYWORD,
        ):
            kwargs[name] = Unknown(name)
    instance = cls(**kwargs)
    context_len = instance.__dict__.get("max_context_len")
    if isinstance(context_len, Unknown) and not context_len._name.startswith("("):  # read off, not computed
        instance.max_context_len = probe.context_len
    return instance


def bare(cls: type, probe: Probe, **given: Any) -> Any:
    """``cls`` (a ``Tree.probe_class``) without its ``__init__``, where that cannot run: the probe's topk, steps
    (and step) where the class's code assigns them; any other attribute it assigns unknown."""
    instance = object.__new__(cls)
    known = {"topk": probe.topk, "speculative_num_steps": probe.steps, "device": "cpu", **given}
    instance.__dict__.update({k: v for k, v in known.items() if k in cls.assigned()})
    return instance


def per_step_backends(instance: Any) -> list[tuple[int, Any]]:
    """(step, backend) of each per-step backend a multi-step backend holds: its ``speculative_step_id``, or
    where it knows none, its place in the list holding it."""
    found = []
    for value in vars(instance).values():
        if not isinstance(value, (list, tuple)):
            continue
        for index, backend in enumerate(value):
            if (
                not hasattr(backend, "__dict__")
                or isinstance(backend, Unknown)
                or not hasattr(type(backend), "init_forward_metadata")
            ):
                continue
            step = backend.__dict__.get("speculative_step_id")
            found.append((step if isinstance(step, int) else index, backend))
    return found


def watch(run: Run, torch: Any, step: int, backend: Any, batch: Any) -> None:
    """Note the batch each of ``backend``'s ``STEP_METHODS`` is handed, and what its step bakes."""
    for name in STEP_METHODS:
        method = getattr(type(backend), name, None)
        if method is None:
            continue

        def entered(*args: Any, _method: Any = method, _name: str = name, **kwargs: Any) -> Any:
            given = args[0] if args else kwargs.get("forward_batch")
            note("handed", step, _name, _draft(torch, getattr(given, "out_cache_loc", None)))
            outer, run.step = run.step, step
            try:
                returned = _method(backend, *args, **kwargs)
                for held in _stored(torch, returned, batch):  # what it hands back, its caller keeps
                    note("stored", step, *held)
                return returned
            finally:
                for held in _stored(torch, vars(backend), batch):
                    note("stored", step, *held)
                run.step = outer

        backend.__dict__[name] = entered


def run_path(tree: Tree, path: DraftPath, probe: Probe, by_worker: bool = False) -> tuple[str, list[Outcome]]:
    """Every run of ``path`` on ``probe``: (how ``self`` was built, the outcomes); ("infeasible", []) when the
    class's own ``__init__`` refuses the probe (DeepSeek-V4 and topk > 1, say). ``by_worker`` (STEPS): the
    draft worker inits each step's backend with the batch it sets (``_run_steps_by_worker``)."""
    _TORCH[0] = torch = tree.torch
    cls = tree.module(path.module).get(path.cls)
    if not isinstance(cls, type):
        return "cannot", [Outcome([], "cannot", NeedsValue(f"{path.cls} is not a class of the tree's module"))]
    steps = range(probe.steps) if path.alone else [None]
    built = tree.probe_class(cls)

    how = "__init__"

    def build(run: Run) -> list:
        if how == "bare":
            return [bare(built, probe, **({} if step is None else {"speculative_step_id": step})) for step in steps]
        return [construct(built, probe, **({} if step is None else {"speculative_step_id": step})) for step in steps]

    with only_the_path(tree, path):
        tries = explore(build, probe=probe, first=True)
    if tries[-1].end == "cannot":  # its __init__ needs a number no probe gives (an option taken as set)
        how, tries = "bare", [Outcome([], "ok")]
    elif tries[-1].end != "ok":
        return "infeasible", tries[-1:]
    setup = tries[-1].took

    def body(run: Run) -> None:
        instances = build(run)
        batch = forward_batch(torch, probe)
        if path.kind == STEPS:
            steps = enumerate(instances) if path.alone else per_step_backends(instances[0])
            for step, backend in steps:
                watch(run, torch, step, backend, batch)
        entry = _run_steps_by_worker if by_worker and path.kind == STEPS else ENTRIES[path.kind]
        if path.kind == ROWS:
            entry = functools.partial(entry, frames=frames)
        entry(run, torch, instances if path.alone else instances[0], batch, probe)

    frames = _frames(tree, path, getattr(built, "init_cuda_graph_state", None), probe)
    with only_the_path(tree, path):
        return how, explore(body, setup, probe)


def _frames(tree: Tree, path: DraftPath, graph: Optional[Callable], probe: Probe) -> list[tuple[tuple[int, ...], str]]:
    """(sizes, the runner handing them: "" for the first where they are SGLang's) of each way the path's runners hand
    ``graph`` its sizes at ``probe``. SGLang's: a two-parameter method gets ``(max_bs, max_num_token)``, a
    one-parameter one (SGLang 0.4.6.post5 to 0.4.7.post1) ``max_num_token``. A size is the number the runner hands as it
    runs (``handed_sizes``); one it takes from outside the path is SGLang's, counting branches where it does so as the
    runner runs (``graph_frame``: changing with topk)."""
    if graph is None:
        return []
    try:
        signature: Optional[inspect.Signature] = inspect.signature(graph)
    except (TypeError, ValueError):  # not the tree's function (a decorator outside the path made it unknown)
        signature = None
    count = len(signature.parameters) - 1 if signature is not None else 2
    sglangs = (True,) if count == 1 else (False, True)

    def sized(flags: Iterable[bool]) -> tuple[int, ...]:
        return tuple(probe.max_bs * probe.topk if branches else probe.max_bs for branches in flags)

    frames = {}
    for module, runner in path.runners:
        frame = graph_frame(tree, (module, runner))
        flags = _in_order(signature, frame) if frame is not None else None
        if flags is not None and len(flags) == count:
            sizes = sized(map(operator.or_, sglangs, flags))
            handed = handed_sizes(tree, (module, runner), probe)
            numbers = _in_order(signature, handed) if handed is not None else None
            if numbers is not None and len(numbers) == count:
                sizes = tuple(n if type(n) is int else size for n, size in zip(numbers, sizes))
            frames.setdefault(sizes, runner if frames or sizes != sized(sglangs) else "")  # sized otherwise: named
    return list(frames.items()) or [(sized(sglangs), "")]


def _in_order(signature: Optional[inspect.Signature], handed: tuple[tuple, dict]) -> Optional[tuple]:
    """What a runner hands, by position and by name (its ``graph_frame``, its ``handed_sizes``), in the order of the
    parameters of ``signature`` (a multi-step backend's ``init_cuda_graph_state``, taking ``self``), as Python binds
    the call; None where it cannot be bound."""
    positional, named = handed
    if signature is None:  # not read outside a run (a decorator): the sizes as handed by position
        return None if named else positional
    try:
        return tuple(signature.bind(None, *positional, **named).arguments.values())[1:]
    except TypeError:  # a call it cannot take
        return None


@contextlib.contextmanager
def only_the_path(tree: Tree, path: DraftPath) -> Iterator[None]:
    """The other attention backends of the modules the path's classes come from unknown while ``path`` runs
    (a multi-step FlashInfer backend's per-step backends are outside its path: what it hands them is what
    it sizes and cuts)."""
    namespace = tree.module(path.module)
    own = {c for name in (path.cls, *path.per_step) for c in getattr(namespace.get(name), "__mro__", ())}
    modules = [tree.namespaces[tree.names[c.__module__]] for c in own if c.__module__ in tree.names]
    swapped = []
    for module in {id(m): m for m in modules}.values():
        others = {name: value for name, value in module.items() if isinstance(value, type) and value not in own
                  and value.__module__ == module["__name__"] and hasattr(value, "init_forward_metadata")}  # fmt: skip
        module.update({name: Unknown(f"{name}") for name in others})
        swapped.append((module, others))
        _STANDING_IN.update(others)
    try:
        yield
    finally:
        for module, others in swapped:
            module.update(others)
        _STANDING_IN.clear()


#: the classes ``only_the_path`` made unknown, by name: how each takes its arguments (``_handed``)
_STANDING_IN: dict[str, type] = {}


def _handed(callee: Unknown, method: str, name: str, args: tuple, kwargs: dict) -> Any:
    """The argument ``name`` a call of ``method`` of a class made unknown while the path runs is handed (a per-step
    backend's ``kv_indptr_buf``, the ``kv_indices_buf`` its ``init_cuda_graph_state`` gets), bound as its class takes
    it, by name or by position."""
    function = getattr(_STANDING_IN.get(callee._name.partition("(")[0]), method, None)
    try:
        return _signature(function).bind_partial(None, *args, **kwargs).arguments.get(name)
    except (TypeError, ValueError):  # no such class, or not a call it takes
        return kwargs.get(name)


def _run_worker(run: Run, torch: Any, worker: Any, batch: Any, probe: Probe) -> None:
    worker.draft_forward(batch)


def _run_rows(run: Run, torch: Any, backend: Any, batch: Any, probe: Probe, frames: Iterable[tuple] = ()) -> None:
    if hasattr(backend, "init_forward_metadata"):  # a fork's own backend may keep only its CUDA-graph rows
        note("phase", "eager")
        backend.init_forward_metadata(batch)
    graph = getattr(backend, "init_cuda_graph_state", None)
    if graph is None:
        return
    for sizes, by in frames:
        _run_graph(torch, backend, graph, probe, sizes, by)


def _run_graph(torch: Any, backend: Any, graph: Callable, probe: Probe, sizes: tuple[int, ...], by: str) -> None:
    """The CUDA-graph phases: the rows sized with the ``sizes`` a runner hands for ``probe.max_bs``, then planned at
    capture and at replay of the probe's batch; ``by``: the runner, named in the phases where it hands other sizes
    than SGLang's or is not the first whose sizes the path runs on."""

    def note_phase(phase: str) -> None:
        note("phase", f"{phase} (max bs {probe.max_bs}{', sized by ' + by if by else ''})")

    note_phase("cuda graph")
    graph(*sizes)
    note_phase("capture")
    if hasattr(backend, "init_forward_metadata_capture_cuda_graph"):
        backend.init_forward_metadata_capture_cuda_graph(forward_batch(torch, probe))
    note_phase("replay")
    replay = getattr(backend, "init_forward_metadata_replay_cuda_graph", None)
    if replay is not None and "forward_batch" in inspect.signature(replay).parameters:
        replay(forward_batch(torch, probe), probe.num_seqs)
    out_graph = getattr(backend, "init_forward_metadata_out_graph", None)
    if out_graph is not None:  # the draft CUDA-graph runner of 0.5.2x: at capture (in_capture=True), at replay
        note_phase("capture")
        in_capture = {"in_capture": True} if "in_capture" in inspect.signature(out_graph).parameters else {}
        out_graph(forward_batch(torch, probe), **in_capture)
        note_phase("replay")
        out_graph(forward_batch(torch, probe))


def _run_steps(run: Run, torch: Any, driven: Any, batch: Any, probe: Probe) -> None:
    """Each step's eager init, then its in-graph method (DeepSeek-V4 0.5.13 on), each judged on its own: an
    error of the eager init is noted, and the in-graph method runs still (the CUDA graph's path skips it)."""
    for each in driven if isinstance(driven, list) else [driven]:
        note("phase", "eager")
        try:
            each.init_forward_metadata(batch)
        except (NeedsValue, RecursionError):
            raise
        except Exception as error:
            if refused_by_decision(error, run) or not hasattr(each, "init_forward_metadata_in_graph"):
                raise
            note("raised", Outcome([], "raised", error).where)
        if hasattr(each, "init_forward_metadata_in_graph"):
            note("phase", "in graph")
            each.init_forward_metadata_in_graph(batch)


def _run_steps_by_worker(run: Run, torch: Any, driven: Any, batch: Any, probe: Probe) -> None:
    """Each step's eager init as a draft worker that inits the step's backend itself runs it, after the multi-step
    init: with the batch holding the step's row (``out_cache_loc[i]`` of its split: a fork's ``draft_forward``)."""
    rows = eagle_utils.per_step_draft_out_cache_loc(batch.out_cache_loc, probe.num_seqs, probe.topk, probe.steps)
    note("phase", "eager")
    backends = list(enumerate(driven)) if isinstance(driven, list) else per_step_backends(driven)
    for step, backend in backends:
        if step < probe.steps - 1:  # the worker's last step runs no forward
            batch.out_cache_loc = rows[step]
            backend.init_forward_metadata(batch)


ENTRIES = {WORKER: _run_worker, ROWS: _run_rows, STEPS: _run_steps}


def capacity_run(tree: Tree, path: DraftPath, probe: Probe, width: int, graph: bool = False) -> list[Outcome]:
    """``common_template`` handed rows ``width`` wide (the check must stop a row narrower than it fills); ``graph``:
    the backend's own CUDA-graph rows, as its graph capture and replay hand them (``self.cuda_graph_kv_indices``)."""
    _TORCH[0] = torch = tree.torch
    cls = tree.module(path.module).get(path.cls)
    with only_the_path(tree, path):
        tries = explore(lambda run: construct(tree.probe_class(cls), probe), probe=probe, first=True)
        if tries[-1].end != "ok":
            return tries[-1:]

        def body(run: Run) -> None:
            rows = torch.zeros((probe.steps, width), dtype=torch.int32)
            backend = construct(tree.probe_class(cls), probe)
            if graph:
                backend.cuda_graph_kv_indices = rows
            backend.common_template(forward_batch(torch, probe), rows, lambda *args, **kwargs: None)

        return explore(body, tries[-1].took, probe)
