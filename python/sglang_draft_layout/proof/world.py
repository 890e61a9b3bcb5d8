"""The probe world: probe values, the objects standing in for SGLang's, and a tree's classes as a run sees them.

A probe is a draft shape ``(num_seqs, topk, num_steps)``; upstream's layout on it is what the
helpers compute (``rows``, ``width``). Classes come from the file under proof and, through its
``from sglang... import Name`` lines, from the tree's other modules (a base class or mixin
elsewhere), parsed on demand.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ..speculative import eagle_utils, spec_utils
from . import arrays
from .arrays import Tensor
from .interpret import Instance, Mode, Obj, Unknown, World

#: every probe's context length and sequence length (each sequence plus every draft step fits)
MAX_CONTEXT_LEN = 16
SEQ_LEN = 5
#: methods whose first parameter (after ``self``) is the forward batch, whatever its name
BATCH_FIRST = frozenset({"init_forward_metadata", "draft_forward", "common_template"})
HELPERS = ("draft_kv_indices_buffer_width", "draft_kv_indices_used_len", "per_step_draft_out_cache_loc")
HELPER_FUNCTIONS = {name: getattr(spec_utils, name, None) or getattr(eagle_utils, name) for name in HELPERS}


@dataclass(frozen=True)
class Probe:
    """A draft shape: ``num_seqs`` sequences, ``topk`` branches each, ``steps`` draft steps."""

    num_seqs: int
    topk: int
    steps: int

    def __str__(self) -> str:
        return f"bs={self.num_seqs}, topk={self.topk}, steps={self.steps}"

    @property
    def buffer_length(self) -> int:
        return self.num_seqs * self.topk * self.steps

    def rows(self) -> Tensor:
        """Upstream's per-step rows of the draft out_cache_loc buffer (``per_step_draft_out_cache_loc``)."""
        buffer = arrays.arange(self.buffer_length, draft=True)
        return eagle_utils.per_step_draft_out_cache_loc(buffer, self.num_seqs, self.topk, self.steps)

    @property
    def width(self) -> int:
        """Upstream's kv_indices row width (``draft_kv_indices_buffer_width``)."""
        return spec_utils.draft_kv_indices_buffer_width(self.num_seqs, self.topk, MAX_CONTEXT_LEN)

    def forward_batch(self) -> Obj:
        """A draft decode batch: its size, its draft buffer, its branches' pool indices and lengths."""
        branches = self.num_seqs * self.topk
        seq_lens = Tensor(np.full(branches, SEQ_LEN))
        return Obj(
            "forward_batch",
            batch_size=self.num_seqs,
            out_cache_loc=arrays.arange(self.buffer_length, draft=True),
            seq_lens_sum=SEQ_LEN * self.num_seqs,
            seq_lens=seq_lens,
            seq_lens_cpu=seq_lens,
            req_pool_indices=arrays.arange(branches),
            forward_mode=Mode(),
            spec_info=Obj("spec_info"),
        )

    def instance(self, cls: str, step: Optional[int] = None, **attrs: Any) -> Instance:
        """``self``: an instance of ``cls`` with the probe's topk, steps and context length (and step id)."""
        known = dict(
            topk=self.topk,
            speculative_num_steps=self.steps,
            max_context_len=MAX_CONTEXT_LEN,
            device="cpu",
            hot_token_id=None,
        )
        if step is not None:
            known["speculative_step_id"] = step
        return Instance(cls, **known, **attrs)

    def arguments(self, func: ast.FunctionDef) -> dict[str, Any]:
        """The method's parameters (after ``self``) as the draft path passes them, by name."""
        values = {
            "forward_batch": self.forward_batch(),
            "batch": self.forward_batch(),
            "max_bs": self.num_seqs,
            "max_num_tokens": self.num_seqs * self.topk,
            "kv_indices_buffer": arrays.zeros((self.steps, self.width)),
            "call_fn": _each_step,
        }
        params = [a for a in (*func.args.posonlyargs, *func.args.args)][1:]
        found = {a.arg: values.get(a.arg, Unknown(a.arg)) for a in params}
        if func.name == "init_cuda_graph_state":  # (max_bs, max_num_tokens) under any names, by position
            for arg, value in zip(params, (self.num_seqs, self.num_seqs * self.topk)):
                found[arg.arg] = value
        for index, arg in enumerate(params):  # the batch under another name: by its annotation, or first
            annotation = ast.unparse(arg.annotation) if arg.annotation is not None else ""
            if isinstance(found[arg.arg], Unknown) and (
                "ForwardBatch" in annotation or index == 0 and func.name in BATCH_FIRST
            ):
                found[arg.arg] = self.forward_batch()
        return found


def _each_step(*_args: Any, **_kwargs: Any) -> None:
    """``common_template``'s ``call_fn`` when it is the run's start: what a step does with its row is the caller's."""


PROBES = (Probe(1, 1, 2), Probe(3, 1, 4), Probe(2, 4, 3), Probe(1, 8, 5), Probe(2, 2, 1), Probe(1, 1, 1))


def _module_file(package: Path, module: str) -> Optional[Path]:
    if not module.startswith("sglang."):
        return None
    path = package / (module.removeprefix("sglang.").replace(".", "/") + ".py")
    return path if path.is_file() else None


@functools.lru_cache(maxsize=64)
def _parsed_text(code: str) -> Optional[ast.Module]:
    try:
        return ast.parse(code)
    except SyntaxError:
        return None


def _parsed(path: Path) -> Optional[ast.Module]:
    """Another module of the tree, parsed once per text: copies of a tree share its trees (the verdicts a
    process remembers name them)."""
    try:
        return _parsed_text(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return None


def world_of(tree: ast.Module, package: Optional[Path]) -> World:
    """The classes and functions of a module, with the classes its ``from sglang... import`` lines bring
    from the tree's other modules (read from ``package``, the tree's ``sglang`` folder), as deep as bases go."""
    classes = {c.name: c for c in tree.body if isinstance(c, ast.ClassDef)}
    functions = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    if package is not None:
        _add_imported_bases(classes, tree, package, set())
    return World(classes, functions, dict(HELPER_FUNCTIONS))


def _add_imported_bases(classes: dict[str, ast.ClassDef], tree: ast.Module, package: Path, seen: set[Path]) -> None:
    """The bases of ``classes`` that ``tree`` imports from the tree's modules, added (and theirs)."""
    wanted = {getattr(b, "id", getattr(b, "attr", None)) for c in list(classes.values()) for b in c.bases} - set(
        classes
    )
    for stmt in tree.body:
        if not isinstance(stmt, ast.ImportFrom) or stmt.module is None:
            continue
        names = [a.name for a in stmt.names if (a.asname or a.name) in wanted]
        path = _module_file(package, stmt.module) if names else None
        if path is None or path in seen:
            continue
        seen.add(path)
        other = _parsed(path)
        if other is None:
            continue
        defined = {c.name: c for c in other.body if isinstance(c, ast.ClassDef)}  # the bases' own bases too
        classes.update({k: v for k, v in defined.items() if k not in classes})
        _add_imported_bases(classes, other, package, seen)
