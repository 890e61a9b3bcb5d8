"""Per-step out_cache_loc in the EAGLE workers' ``draft_forward``.

Site: ``EagleDraftWorker.draft_forward`` (V2 worker, overlap scheduling) and, where a
release still has it, ``EAGLEWorker.draft_forward`` (v1, ``--disable-overlap-schedule``
or topk > 1), which reshape the flat draft buffer by hand:
``x = x.reshape(bs, self.topk, self.speculative_num_steps)`` then
``x = x.permute((2, 0, 1)).reshape(self.speculative_num_steps, -1)``.
Upstream (PR 26239) calls
``per_step_draft_out_cache_loc(x, bs, self.topk, self.speculative_num_steps)``.
Invariant: the worker writes step i's KV to the same slots that DeepSeek-V4 bakes into
its metadata, because both read the layout off one helper, which also checks the
buffer's length.
"""

from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst
import libcst.matchers as m
from libcst.helpers import parse_template_statement

from .base import EAGLE_UTILS, Edit, Finding, Rule, Source, State, locate_method, self_attr, walk

HELPER = "per_step_draft_out_cache_loc"
WORKERS = (
    ("srt/speculative/eagle_worker_v2.py", "EagleDraftWorker"),
    ("srt/speculative/eagle_worker.py", "EAGLEWorker"),
)
CALL = f"""
{{target}} = {HELPER}(
    {{buffer}},
    {{batch_size}},
    self.topk,
    self.speculative_num_steps,
)
"""
STEPS = self_attr("speculative_num_steps")


def _is_steps_first_order(args) -> bool:
    """``permute((2, 0, 1))`` or ``permute(2, 0, 1)``."""
    values = [a.value for a in args]
    if len(values) == 1 and isinstance(values[0], cst.Tuple):
        values = [e.value for e in values[0].elements]
    return [v.value if isinstance(v, cst.Integer) else None for v in values] == ["2", "0", "1"]


PERMUTE_ORDER = m.MatchIfTrue(_is_steps_first_order)


def method_call(name: str, receiver: m.BaseMatcherNode, args) -> m.Call:
    return m.Call(func=m.Attribute(value=receiver, attr=m.Name(name)), args=args)


def split_3d(receiver: m.BaseMatcherNode = m.DoNotCare()) -> m.Call:
    """``x.reshape|view(bs, self.topk, self.speculative_num_steps)``."""
    shape = [m.Arg(), m.Arg(self_attr("topk")), m.Arg(STEPS)]
    return method_call("reshape", receiver, shape) | method_call("view", receiver, shape)


def steps_first(receiver: m.BaseMatcherNode) -> m.Call:
    """``<receiver>.permute((2, 0, 1)).reshape(self.speculative_num_steps, -1)``."""
    minus_one = m.UnaryOperation(operator=m.Minus(), expression=m.Integer("1"))
    return method_call("reshape", method_call("permute", receiver, PERMUTE_ORDER), [m.Arg(STEPS), m.Arg(minus_one)])


def assigns(stmt: cst.CSTNode, value: m.BaseMatcherNode) -> Optional[cst.Assign]:
    pattern = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name())], value=value)])
    return stmt.body[0] if m.matches(stmt, pattern) else None


def hand_written_layouts(method: cst.FunctionDef) -> Iterator[tuple[list[cst.SimpleStatementLine], cst.Name, cst.BaseExpression, cst.BaseExpression]]:
    """(statements, target, buffer, batch size) of each inline reshape + permute, one or two statements."""
    for block in walk(method.body):
        if not isinstance(block, cst.IndentedBlock):
            continue
        body = block.body
        for index, stmt in enumerate(body):
            one = assigns(stmt, steps_first(split_3d()))
            if one:
                split = one.value.func.value.func.value
                yield [stmt], one.targets[0].target, split.func.value, split.args[0].value
                continue
            first = assigns(stmt, split_3d())
            if first is None or index + 1 == len(body):
                continue
            target = first.targets[0].target
            second = assigns(body[index + 1], steps_first(m.Name(target.value)))
            if second and second.targets[0].target.value == target.value:
                yield [stmt, body[index + 1]], target, first.value.func.value, first.value.args[0].value


def _find(rule: Rule, source: Source) -> Finding:
    method = locate_method(rule, source)
    if isinstance(method, Finding):
        return method
    helper_calls = m.findall(method, m.Call(func=m.Name(HELPER)))
    if helper_calls:
        return rule.report(State.PATCHED, source.line(helper_calls[0]))
    for stmts, target, buffer, batch_size in hand_written_layouts(method):
        new = parse_template_statement(CALL.lstrip(), target=target, buffer=buffer, batch_size=batch_size)
        comments = [line for stmt in stmts for line in stmt.leading_lines]
        edits = [Edit(stmts[0], rewrite=lambda _old: new.with_changes(leading_lines=comments))]
        edits += [Edit(extra, rewrite=lambda _old: cst.RemoveFromParent()) for extra in stmts[1:]]
        return rule.report(State.TO_PATCH, source.line(stmts[0]), edits=edits, imports=[(EAGLE_UTILS, HELPER)])
    return rule.report(State.UNRECOGNISED, source.line(method),
                       "no `reshape(bs, topk, steps)` + `permute((2, 0, 1)).reshape(steps, -1)` of out_cache_loc")


RULES = [
    Rule(
        id=f"draft-forward:{cls}",
        file=file,
        scope=f"{cls}.draft_forward",
        site="per-step out_cache_loc",
        upstream="PR 26239",
        find=_find,
    )
    for file, cls in WORKERS
]
