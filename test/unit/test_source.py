"""Source: segments, and the start lines that stand in for libcst's PositionProvider."""

from __future__ import annotations

import inspect

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from sglang_draft_layout import engine
from sglang_draft_layout.rules.base import Source, start_lines


def test_start_lines_equal_position_provider_on_every_node():
    """start_lines reads libcst's codegen internals; this catches a libcst that changes them."""
    module = cst.parse_module(inspect.getsource(engine))
    resolved = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    expected = {id(node): position.start.line for node, position in resolved.items()}
    assert start_lines(module) == expected


SOURCE = '''"""A module."""

import os


class Backend:
    def first(self):
        return 1

    # about second
    def second(self, x):
        y = x + 1
        return y


# about helper
def helper():
    pass
'''


def test_segments_report_file_lines_and_keep_the_comment_above():
    source = Source("mod.py", SOURCE)
    second = source.method("Backend", "second")
    assert source.line(second.body.body[1]) == SOURCE.splitlines().index("        return y") + 1
    assert [line.comment.value for line in second.leading_lines if line.comment] == ["# about second"]
    helper, line = source.first_definition()
    assert line == SOURCE.splitlines().index("class Backend:") + 1
    assert source.header().module.code == '"""A module."""\n\nimport os\n\n\n'
