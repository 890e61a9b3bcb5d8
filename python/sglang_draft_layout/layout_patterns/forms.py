"""The draft layout forms a method holds, and the reports over a module's classes: the layouts
written inline, the classes holding a form, the inline layouts a patched tree must not hold.
"""

from __future__ import annotations

import ast
from typing import FrozenSet, Iterator, List, Optional, Tuple

from .ast_walk import called_name, in_order, is_self_attr, methods, nodes_of
from .helper_names import PER_STEP_HELPER, USED_LEN_HELPER, WIDTH_HELPER
from .keep import has_keep_pragma
from .kv_indices import (
    is_helper_width,
    is_inline_width,
    kernel_launches,
    narrow_rows,
    row_allocations,
    used_len_operands,
)
from .out_cache_loc import out_cache_loc_layouts

#: the draft layout forms a function can hold (``draft_layout_forms``)
ROWS = "kv_indices rows"  # (self.speculative_num_steps, width) from max_context_len
STEP_LENGTH = "used length"  # seq_lens_sum * topk + bs * (i + 1), or the helper
CAPACITY = "capacity length"  # the same through self.speculative_num_steps
LAUNCH = "kernel launch"  # generate_draft_decode_kv_indices[grid](...)
OUT_CACHE_LOC = "per-step out_cache_loc"  # [bs, topk, num_steps] split per step


def _inline_forms(func: ast.AST) -> Iterator[Tuple[int, str]]:
    """(line, what) of each draft layout ``func`` computes without the helpers."""
    for stmt, shape in row_allocations(func):
        width = shape.elts[1]
        if not is_helper_width(width, func) and is_inline_width(width, func):
            yield stmt.lineno, f"row width without {WIDTH_HELPER}"
    for node in nodes_of(func, ast.BinOp):
        if used_len_operands(node):
            yield node.lineno, f"used length without {USED_LEN_HELPER}"
    for split in out_cache_loc_layouts(func):
        yield split.line, f"per-step out_cache_loc without {PER_STEP_HELPER}"


def _classes(tree: ast.Module) -> List[ast.ClassDef]:
    return [n for n in in_order(tree) if isinstance(n, ast.ClassDef)]


def inline_draft_layout(tree: ast.Module, lines: Optional[List[str]] = None) -> List[Tuple[str, str, int, str]]:
    """(class, method, line, what) for every draft layout computed inline in a class; with the
    file's ``lines``, none that the fork keeps (KEEP_PRAGMA on the def line or the statement).
    """
    return [
        (cls.name, method.name, line, what)
        for cls in _classes(tree)
        for method in methods(cls)
        for line, what in _inline_forms(method)
        if lines is None or not has_keep_pragma(lines, method, line)
    ]


def _used_length_form(steps: ast.expr) -> str:
    return CAPACITY if is_self_attr(steps, "speculative_num_steps") else STEP_LENGTH


def draft_layout_forms(func: ast.AST) -> FrozenSet[str]:
    """The draft layout forms ``func`` holds, written inline or through the helpers."""
    forms = set()
    if kernel_launches(func):
        forms.add(LAUNCH)
    for _stmt, shape in row_allocations(func):
        width = shape.elts[1]
        if is_helper_width(width, func) or is_inline_width(width, func):
            forms.add(ROWS)
    for node in nodes_of(func, ast.BinOp):
        operands = used_len_operands(node)
        if operands:
            forms.add(_used_length_form(operands[2]))
    if out_cache_loc_layouts(func):
        forms.add(OUT_CACHE_LOC)
    for call in nodes_of(func, ast.Call):
        name = called_name(call)
        if name == USED_LEN_HELPER and len(call.args) == 4:  # type: ignore[attr-defined]
            forms.add(_used_length_form(call.args[3]))  # type: ignore[attr-defined]
        elif name == PER_STEP_HELPER:
            forms.add(OUT_CACHE_LOC)
    return frozenset(forms)


def draft_layout_methods(
    cls: ast.ClassDef,
) -> List[Tuple[ast.FunctionDef, FrozenSet[str]]]:
    """(method, its forms) for each method of ``cls`` that holds a draft layout form."""
    found = [(method, draft_layout_forms(method)) for method in methods(cls)]
    return [(method, forms) for method, forms in found if forms]


def draft_layout_classes(tree: ast.Module) -> List[str]:
    """Classes with draft layout arithmetic or a draft kernel launch, inline or via the helpers."""
    return [cls.name for cls in _classes(tree) if draft_layout_methods(cls)]


#: the classes whose draft layouts ``apply`` brings to upstream's form (a rule names them, or
#: reads them as the caller of its site): every inline layout there is one to rewrite; in any other
#: class a layout giving upstream's values is left as the fork wrote it ("correct, by hand")
RULE_CLASSES = frozenset(
    {
        "FlashInferMultiStepDraftBackend",
        "FlashInferMLAMultiStepDraftBackend",
        "TritonMultiStepDraftBackend",
        "AiterMultiStepDraftBackend",
        "DeepseekV4AttnBackend",
        "DeepseekV4HipRadixBackend",
        "DeepseekV4MultiStepBackend",
        "EAGLEWorker",
        "EagleDraftWorker",
    }
)


def wrong_draft_layout(tree: ast.Module, lines: Optional[List[str]] = None) -> List[Tuple[str, str, int, str]]:
    """The entries of ``inline_draft_layout`` a patched tree must not hold: every one in a
    class of RULE_CLASSES, and in any other class only a layout that does not give
    upstream's values (a kv_indices row without the topk factor). A correct hand layout
    elsewhere (upstream's used length, a per-step split ``out_cache_loc_layouts`` proves
    equal, a row with the topk factor) is what ``check`` reports "correct, by hand".
    """
    wrong = []
    for cls in _classes(tree):
        for method in methods(cls):
            narrow = narrow_rows(method)
            for line, what in _inline_forms(method):
                if lines is not None and has_keep_pragma(lines, method, line):
                    continue
                narrow_row = what.startswith("row width") and line in narrow
                if cls.name in RULE_CLASSES or narrow_row:
                    wrong.append((cls.name, method.name, line, what))
    return wrong
