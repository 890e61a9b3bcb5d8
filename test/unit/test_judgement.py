"""judgement.on_disk: a refusal names a line of a rewritten file as the fork's file on disk numbers it."""

from __future__ import annotations

from sglang_draft_layout.judgement import on_disk

FILE = "srt/layers/attention/flashinfer_backend.py"
OLD = "import torch\n\n\ndef f(num_seqs):\n    if num_seqs <= 1000:\n        width = num_seqs * 64\n"
#: the rewrite: an import placed above, the width line rewritten
NEW = (
    "import torch\n\nfrom sglang.srt.speculative.spec_utils import draft_kv_indices_buffer_width\n\n\n"
    "def f(num_seqs):\n    if num_seqs <= 1000:\n        width = draft_kv_indices_buffer_width(num_seqs, 1, 64)\n"
)


def test_a_line_the_rewrite_kept_is_numbered_as_on_disk():
    assert NEW.splitlines()[6] == OLD.splitlines()[4] == "    if num_seqs <= 1000:"
    said = on_disk(f"`if num_seqs <= 1000:` at {FILE}:7 went the same way", {FILE: (OLD, NEW)})
    assert said == f"`if num_seqs <= 1000:` at {FILE}:5 went the same way"


def test_a_line_the_rewrite_wrote_is_said_to_be_one():
    said = on_disk(f"raises AssertionError at {FILE}:8", {FILE: (OLD, NEW)})
    assert said == f"raises AssertionError at {FILE}:8 (a line the rewrite wrote)"


def test_a_file_not_rewritten_keeps_its_numbers():
    other = "srt/speculative/eagle_worker.py:12"
    assert on_disk(f"raises at {other}; at {FILE}:7", {FILE: (OLD, NEW)}) == f"raises at {other}; at {FILE}:5"
