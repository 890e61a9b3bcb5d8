"""StoredText: a file's bytes read as the rules see them, and new text written back in the file's form."""

from __future__ import annotations

import codecs
from pathlib import Path

import pytest

from sglang_draft_layout.rules.base import Source, code_lines
from sglang_draft_layout.stored import StoredText
from sglang_draft_layout.target import TargetError

PATH = Path("pkg/mod.py")


def stored(raw: bytes) -> StoredText:
    return StoredText.decode(PATH, raw)


@pytest.mark.parametrize(
    "raw",
    [
        b"a = 1\r\nb = 2\r\n",
        b"a = 1\nb = 2\r\nc = 3\rd = 4",
        codecs.BOM_UTF8 + "s = 'é'\n".encode(),
        "# -*- coding: latin-1 -*-\ns = 'é'\r\n".encode("latin-1"),
        b"",
        b"x = 1  \t\n\n\n",
    ],
)
def test_the_text_read_is_written_back_as_the_same_bytes(raw):
    text = stored(raw)
    assert "\r" not in text.text
    assert text.encode(text.text) == raw


def test_new_lines_get_the_most_common_line_end_and_kept_lines_their_own():
    text = stored(b"a = 1\r\nb = 2\nc = 3\r\nd = 4\r\n")
    assert text.newline == "\r\n"
    new = text.text.replace("b = 2\n", "b = 2\nadded = 0\n").replace("d = 4\n", "d = 5\n")
    assert text.encode(new) == b"a = 1\r\nb = 2\nadded = 0\r\nc = 3\r\nd = 5\r\n"


def test_a_tie_between_line_ends_goes_to_the_first_seen():
    assert stored(b"a\nb\r\n").newline == "\n"
    assert stored(b"a\r\nb\n").newline == "\r\n"
    assert stored(b"no line end").newline == "\n"


def test_bom_and_cookie_are_kept_and_text_the_encoding_cannot_hold_is_refused():
    bom = stored(codecs.BOM_UTF8 + b"x = 1\n")
    assert (bom.encoding, bom.text) == ("utf-8-sig", "x = 1\n")
    assert bom.encode("x = 2\n") == codecs.BOM_UTF8 + b"x = 2\n"
    latin = stored(b"# coding: latin-1\nx = 1\n")
    with pytest.raises(TargetError, match=r"^pkg/mod.py: the new text has '→', which iso-8859-1 cannot encode"):
        latin.encode("# coding: latin-1\nx = '→'\n")


@pytest.mark.parametrize(
    "raw, message",
    [
        (b"x = 1\n# \xff\n", "pkg/mod.py:2: not valid utf-8 (byte 0xff); nothing written"),
        (b"# \xc3\n", "pkg/mod.py:1: not valid utf-8 (byte 0xc3); nothing written"),
        (b"# coding: no-such-codec\n", "pkg/mod.py: cannot be read (unknown encoding: no-such-codec); nothing written"),
    ],
)
def test_a_file_that_cannot_be_decoded_is_named(raw, message):
    with pytest.raises(TargetError) as error:
        stored(raw)
    assert str(error.value) == message


def test_a_form_feed_does_not_end_a_line():
    """Python counts lines at line ends only; ``str.splitlines`` also breaks at a form feed."""
    code = "x = 1\n\x0c\ndef f():\n    return 2\n"
    assert code_lines(code) == ["x = 1\n", "\x0c\n", "def f():\n", "    return 2\n"]
    source = Source("mod.py", code)
    assert source.text(source.function("f").body[0]) == "return 2"


@pytest.mark.parametrize(
    "raw, decoded",
    [
        (b"x = 1\n", False),  # ASCII without the words: left undecoded
        (b"steps = self.speculative_num_steps\n", True),
        ("s = 'é'\n".encode(), True),  # not ASCII: decoded, so that a file Python cannot read is named
    ],
)
def test_read_naming_decodes_a_file_only_where_it_may_name_the_words(tmp_path, raw, decoded):
    path = tmp_path / "mod.py"
    path.write_bytes(raw)
    found = StoredText.read_naming(path, (b"speculative_num_steps",))
    assert (found is not None) == decoded
    assert found is None or found.text == raw.decode()


def test_read_naming_names_a_file_it_cannot_decode(tmp_path):
    path = tmp_path / "mod.py"
    path.write_bytes(b"x = 1\n# \xff\n")
    with pytest.raises(TargetError, match=r"mod\.py:2: not valid utf-8"):
        StoredText.read_naming(path, (b"speculative_num_steps",))
