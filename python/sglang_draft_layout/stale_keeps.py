"""Keep comments left on code that already follows upstream (stale), and how ``apply`` takes them out.

After an upstream merge a ``# sglang-draft-layout: keep`` comment can sit on upstream's own code: every
site that honours it is patched, so it keeps nothing. ``candidates`` lists each such comment (where
``keep.keep_comments`` looks for it, as ``check`` and ``apply`` do); the engine reports the ones whose
removal leaves every site's state as it is (a rule may read a keep comment elsewhere too). ``apply`` takes
one out where the fork's black form stays as it is (``removal``): a comment alone on its line goes with its
line; one at the end of a line goes with the spaces before it, and where black split the line only for it
(``head(`` / one line / ``)``, no trailing comma) the three lines are joined as black joins them when they
fit; any other is left to the maintainer (``StaleKeep.by_hand`` says why).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, replace
from typing import Collection, Mapping, Optional, Sequence

from .layout_patterns.keep import KEEP_PRAGMA, keep_comments
from .rules.base import MODULE_SCOPE, Finding, Source, State

#: the keep comment in a line, with the spaces before it, up to the next comment or the line's end
_PRAGMA = re.compile(r"[ \t]*#[ \t]*sglang-draft-layout: keep[^#\n]*")
_OPENING, _CLOSING = "([{", ")]}"
#: why ``apply`` leaves a stale keep comment where black would join the lines it ends
BY_HAND = "delete it by hand, then run black (it may join the lines around it)"


@dataclass(frozen=True)
class StaleKeep:
    """A keep comment that only patched sites honour."""

    file: str  # relative to the package
    line: int  # the line holding it
    span: tuple[int, int]  # the lines of the def header or statement it ends a line of; (line, line): alone above it
    finding: Finding  # the (first) patched site it is on
    by_hand: str = ""  # why ``apply`` leaves it; "": ``apply`` removes it


def candidates(findings: Sequence[Finding], sources: Mapping[str, Source], line_length: int) -> list[StaleKeep]:
    """Each keep comment honoured (``keep_comments``) by patched sites only, in the order of the findings."""
    uses: dict[tuple[str, int], list[tuple[Finding, tuple[int, int]]]] = {}
    for finding in findings:
        source = sources.get(finding.rule.file)
        if source is None or finding.line is None or KEEP_PRAGMA[2:] not in source.code:
            continue
        scope = finding.rule.scope
        method = source.method(*scope.split(".")) if scope != MODULE_SCOPE and scope.count(".") == 1 else None
        for line, span in keep_comments(source.lines, method, finding.line, source.tree).items():
            uses.setdefault((finding.rule.file, line), []).append((finding, span))
    stale = []
    for (file, line), found in uses.items():
        if all(finding.state is State.PATCHED for finding, _span in found):
            finding, span = found[0]
            removed = removal(sources[file].lines, line, span, line_length)
            stale.append(StaleKeep(file, line, span, finding, "" if removed is not None else BY_HAND))
    return stale


def blanked(lines: Sequence[str], keep: StaleKeep) -> str:
    """The file's text without the keep comment, its lines numbered as before (its own line left blank): what
    the rules read to tell whether the comment keeps anything."""
    text = list(lines)
    own = text[keep.line - 1].lstrip().startswith("#")
    text[keep.line - 1] = "\n" if own else _without_pragma(text[keep.line - 1])
    return "".join(text)


def _without_pragma(line: str) -> str:
    """``line`` without the keep comment (and the spaces before it); a comment after it stays."""
    match = _PRAGMA.search(line)
    assert match is not None, line
    code, rest = line[: match.start()], line[match.end() :].rstrip("\n")
    ending = line[len(line.rstrip("\n")) :]
    return code.rstrip() + (f"  {rest.strip()}" if rest.strip() else "") + ending


def removal(lines: Sequence[str], line: int, span: tuple[int, int], line_length: int) -> Optional[list[str]]:
    """Lines ``span`` (1-based, inclusive) without the keep comment on ``line``, as black would leave them, or
    None where black would lay them out anew (the comment alone inside a header, or at the end of a line of
    one black split in some other way)."""
    first, last = span
    own = lines[line - 1].lstrip().startswith("#")
    if own:
        return [] if first == last == line else None  # alone above the def or statement: its line goes
    if first == last:
        return [_without_pragma(lines[line - 1])]
    held = [
        _without_pragma(text) if n == line else text for n, text in zip(range(first, last + 1), lines[first - 1 : last])
    ]
    if any("#" in text for text in held):
        return None
    closing = held[-1].lstrip()
    closes = closing[:1] != "" and closing[0] in _CLOSING
    if closes and held[-2].rstrip().endswith(","):  # a magic trailing comma: black keeps the lines split
        return held
    opens = held[0].rstrip()[-1:] != "" and held[0].rstrip()[-1] in _OPENING
    if len(held) == 3 and opens and closes:
        joined = held[0].rstrip() + held[1].strip() + closing.rstrip("\n")
        return [joined + "\n"] if len(joined) <= line_length else held
    return None


def removed(text: str, keeps: Collection[StaleKeep], line_length: int, written: Optional[str] = None) -> Optional[str]:
    """``written`` (default ``text``, the file as read; else the text the patch writes for it, which keeps
    the lines the rules did not write) without ``keeps``' comments, found by their lines in ``text``; None
    when a comment's lines are not there as read in ``written`` (a rewrite changed them)."""
    old = text.splitlines(keepends=True)
    new = old if written is None else written.splitlines(keepends=True)
    at = {}  # a line of ``old`` -> its index in ``new``, where the patch left it as it was
    for tag, i1, i2, j1, _j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag == "equal":
            at.update({i: j1 + i - i1 for i in range(i1, i2)})
    out = list(new)
    for keep in sorted(keeps, key=lambda keep: keep.span, reverse=True):
        first, last = keep.span
        indexes = [at.get(n - 1) for n in range(first, last + 1)]
        if None in indexes or indexes != list(range(indexes[0], indexes[0] + len(indexes))):
            return None
        lines = removal(old, keep.line, keep.span, line_length)
        assert lines is not None, keep  # only the keeps ``apply`` removes are handed here
        out[indexes[0] : indexes[-1] + 1] = lines
    return "".join(out)


def by_hand(keep: StaleKeep, why: str) -> StaleKeep:
    return replace(keep, by_hand=why)
