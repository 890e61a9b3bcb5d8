"""harness/coverage.py: the layout lines a rewrite wrote are traced until some run reaches each; a statement of a
function the runs entered that none reached is unrun."""

from __future__ import annotations

import ast
import sys

from sglang_draft_layout.harness.coverage import Lines, layout_statements

SOURCE = """\
class Backend:
    def init(self, out_cache_loc, split):
        seen = sys.gettrace() is not None
        if split:
            rows = out_cache_loc.chunk(2)
        steps = out_cache_loc.unbind(0)
        return seen
"""


def traced_backend() -> tuple[Lines, type]:
    namespace = {"sys": sys}
    exec(compile(SOURCE, "backend.py", "exec"), namespace)
    statements = layout_statements("backend.py", [ast.parse(SOURCE).body[0]], lines={5, 6})
    assert sorted(s.first for s in statements) == [5, 6]
    return Lines(statements), namespace["Backend"]


class Rows:
    def chunk(self, n):
        return [self] * n

    def unbind(self, dim):
        return [self]


def test_a_run_is_traced_until_each_layout_statement_is_reached():
    lines, backend = traced_backend()
    with lines:
        assert backend().init(Rows(), split=False)  # line 6 reached, line 5 not: traced
    assert [s.first for s in lines.unrun()] == [5]
    with lines:
        assert backend().init(Rows(), split=False)  # line 5 still to reach: traced again
    with lines:
        assert backend().init(Rows(), split=True)
    assert lines.unrun() == []
    outer = sys.gettrace()
    with lines:
        assert backend().init(Rows(), split=False) is (outer is not None)  # all reached: not traced
    assert lines.unrun() == [] and sys.gettrace() is outer


def test_a_function_no_run_entered_has_no_unrun_statement():
    lines, _backend = traced_backend()
    with lines:
        pass
    assert lines.unrun() == []
