"""A file's bytes as the rules read them, and the rules' new text back in the file's own form.

The rules and libcst see one form of every file: decoded (a UTF-8 BOM stripped, a PEP 263
encoding cookie honoured, as ``tokenize.detect_encoding`` reads it) and with ``\\n`` line
ends. ``StoredText.encode`` maps a new text back: each line kept from the old text gets
its old line end back (``\\r\\n``, ``\\r`` or ``\\n``, mixed ones included), each new line
the file's most common one; then the BOM and the encoding. Every byte outside the lines
the rules wrote is the file's own.
"""

from __future__ import annotations

import codecs
import difflib
import io
import re
import tokenize
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from .target import TargetError

#: a line end as Python counts it
_LINE_END = re.compile(r"(\r\n|\r|\n)$")


def _raw(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise TargetError(f"{path}: reading: {error.strerror or error}; nothing written") from None


def lines(text: str) -> list[str]:
    """The lines of ``text`` with their ends, cut where Python cuts lines (not at form feeds and the like)."""
    return io.StringIO(text, newline="").readlines()


@dataclass(frozen=True)
class StoredText:
    """One file: its bytes, its encoding, and its text as the rules read it."""

    path: Path
    raw: bytes
    encoding: str  # a codec name; "utf-8-sig" for a file that starts with a UTF-8 BOM
    text: str  # decoded, with "\n" line ends
    ends: tuple[str, ...]  # each line's end in the file ("" for a last line without one); () if all are "\n"

    @classmethod
    def read(cls, path: Path) -> "StoredText":
        """The file at ``path``; a file it cannot read or decode is a TargetError naming it."""
        return cls.decode(path, _raw(path))

    @classmethod
    def read_naming(cls, path: Path, words: Sequence[bytes]) -> Optional["StoredText"]:
        """The file at ``path`` (``read``), or None where it is ASCII and holds none of ``words``: not decoded (most
        modules a plan looks at are left so)."""
        raw = _raw(path)
        return cls.decode(path, raw) if not raw.isascii() or any(word in raw for word in words) else None

    @classmethod
    def decode(cls, path: Path, raw: bytes) -> "StoredText":
        try:
            encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
        except SyntaxError as error:  # an unknown encoding cookie, a BOM with another cookie, or bad UTF-8 up top
            if "invalid or missing encoding declaration" not in error.msg:
                raise TargetError(f"{path}: cannot be read ({error.msg}); nothing written") from None
            encoding = "utf-8-sig" if raw.startswith(codecs.BOM_UTF8) else "utf-8"
        try:
            decoded = raw.decode(encoding)
        except UnicodeDecodeError as error:
            line = raw[: error.start].count(b"\n") + 1
            raise TargetError(
                f"{path}:{line}: not valid {encoding} (byte 0x{raw[error.start]:02x}); nothing written"
            ) from None
        if "\r" not in decoded:  # every line ends "\n" (most files): nothing to map
            return cls(path, raw, encoding, decoded, ())
        text_lines = lines(decoded)
        ends = tuple(found.group() if (found := _LINE_END.search(line)) else "" for line in text_lines)
        text = "".join(line[: len(line) - len(end)] + ("\n" if end else "") for line, end in zip(text_lines, ends))
        return cls(path, raw, encoding, text, ends)

    @property
    def newline(self) -> str:
        """The line end new lines get: the file's most common one (the first seen on a tie), else ``\\n``."""
        counts = Counter(end for end in self.ends if end)
        return max(counts, key=lambda end: (counts[end], -self.ends.index(end))) if counts else "\n"

    def encode(self, new_text: str) -> bytes:
        """``new_text`` (``\\n`` line ends) in this file's form: its line ends, BOM and encoding."""
        if set(self.ends) <= {self.newline, ""}:  # one kind of line end: every "\n" becomes it
            with_ends = new_text if self.newline == "\n" else new_text.replace("\n", self.newline)
        else:
            with_ends = self._mixed_ends(new_text)
        try:
            return codecs.encode(with_ends, self.encoding)
        except UnicodeEncodeError as error:
            raise TargetError(
                f"{self.path}: the new text has {error.object[error.start]!r}, which {self.encoding} "
                "cannot encode; nothing written"
            ) from None

    def _mixed_ends(self, new_text: str) -> str:
        """Lines kept from the old text keep their own ends; the others get ``newline``."""
        old, new = lines(self.text), lines(new_text)
        out = []
        matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
        for tag, old_start, _old_end, new_start, new_end in matcher.get_opcodes():
            for offset, line in enumerate(new[new_start:new_end]):
                if not line.endswith("\n"):
                    out.append(line)
                    continue
                end = self.ends[old_start + offset] if tag == "equal" else self.newline
                out.append(line[:-1] + end)
        return "".join(out)
