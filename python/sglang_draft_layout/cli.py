"""sglang-draft-layout check | diff | apply | demo: print the reports of ``api``.

Text output fits the terminal (``COLUMNS`` wins): a short header, one line per item that needs
action or that the fork decided (``-v``: every item), one summary line, and the one next step.
Colour only on a terminal, never with ``NO_COLOR``. Commands printed for the user to run are
wrapped, never cut. Error and warning lines on stderr are wrapped to its terminal only when it
is one; otherwise (a CI log, a pipe to ``grep``) each is one line, as black and ruff print them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import os
import re
import shlex
import shutil
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Optional, Sequence, TextIO, Union

from . import __version__, api, engine, releases, transaction
from .api import Item, Report
from .layout_patterns.ast_walk import parsing_once
from .rules.base import State
from .target import Target, TargetError, TreeBelow

PROG = "sglang-draft-layout"
DEMO_RELEASE = "0.5.12"
#: ANSI colours of a state, by what it means for the user
_RED, _YELLOW, _GREEN, _BOLD, _RESET = "\033[31m", "\033[33m", "\033[32m", "\033[1m", "\033[0m"
_UNBROKEN = "\0"  # a space that textwrap does not break at
_PLURALS = {
    api.HELPER: "helpers",
    api.CALL_SITE: "call sites",
    api.DRAFT_PATH: "draft paths",
    api.TEST: "test files",
    api.KEEP_COMMENT: "keep comments",
}
#: a kind's name in a count of one, where it is not the kind itself (a CPU test and its harness: two test files)
_SINGULARS = {api.TEST: "test file"}


def package_version() -> str:
    """This tool's version: the package's ``__version__`` (pyproject.toml reads it from there,
    so an editable install's stale metadata cannot disagree with the code that runs)."""
    return __version__


def color_wanted(stream: TextIO, environ: Optional[dict[str, str]] = None) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set to anything (no-color.org)."""
    environ = os.environ if environ is None else environ
    return bool(stream.isatty()) and not environ.get("NO_COLOR")


class Printer:
    """Lines to one stream, each cut to the terminal's width (``fit``) and coloured if wanted."""

    def __init__(self, stream: TextIO, width: int, color: bool) -> None:
        self.stream, self.width, self.color = stream, width, color

    def paint(self, text: str, code: str) -> str:
        return f"{code}{text}{_RESET}" if self.color and text else text

    def line(self, *segments: Union[str, tuple[str, str]]) -> None:
        """One line of ``segments`` (text, or (text, colour)), cut to the width with an ellipsis."""
        parts = [(part, "") if isinstance(part, str) else part for part in segments]
        whole = fit("".join(text for text, _code in parts), self.width)
        shown, position = [], 0
        for text, code in parts:
            piece = whole[position : position + len(text)]
            position += len(text)
            shown.append(self.paint(piece, code) if code else piece)
        print("".join(shown) + whole[position:], file=self.stream)

    def wrapped(self, text: str, code: str = "", indent: str = "") -> None:
        """A line never cut (a summary, an error): wrapped at spaces to the width, continued indented;
        a `quoted` span (a comment or flag to copy) is never broken."""
        whole_spans = re.sub(r"`[^`]*`", lambda span: span.group(0).replace(" ", _UNBROKEN), text)
        for part in textwrap.wrap(
            whole_spans,
            self.width,
            initial_indent=indent,
            subsequent_indent=indent + "  ",
            break_long_words=False,
            break_on_hyphens=False,
        ):
            print(self.paint(part.replace(_UNBROKEN, " "), code), file=self.stream)

    def command(self, text: str) -> None:
        """A command to run, whole however wide (wrapped at its arguments, with ``\\``)."""
        print(wrap_command(text, self.width), file=self.stream)


def fit(text: str, width: int) -> str:
    """``text`` cut to ``width`` columns, ending in an ellipsis when cut."""
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def fit_left(text: str, width: int) -> str:
    """``text`` cut from the left (a path keeps its file name), starting with an ellipsis when cut."""
    return text if len(text) <= width else "…" + text[len(text) - width + 1 :]


def wrap_command(command: str, width: int, indent: str = "  ") -> str:
    """The command on one line, or broken at spaces with ``\\`` continuations to fit ``width``."""
    if len(indent + command) <= width:
        return indent + command
    lines, current = [], indent
    for word in map(shlex.quote, shlex.split(command)):
        if current.strip() and len(current) + 1 + len(word) + 2 > width:
            lines.append(current + " \\")
            current = indent * 2 + word
        else:
            current = f"{current} {word}" if current.strip() else current + word
    return "\n".join([*lines, current])


def terminal_width(stream: Optional[TextIO] = None) -> int:
    """The width of ``stream``'s terminal (stdout's by default): ``COLUMNS`` wins; 80 off a terminal."""
    if stream is None or os.environ.get("COLUMNS", "").isdigit():
        return shutil.get_terminal_size().columns
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return shutil.get_terminal_size().columns


def stderr() -> Printer:
    """Errors and warnings: wrapped to stderr's terminal when it is one (``COLUMNS`` wins there);
    otherwise one line each, never wrapped, so that a CI log and ``grep`` get whole lines."""
    on_terminal = getattr(sys.stderr, "isatty", lambda: False)()
    return Printer(sys.stderr, terminal_width(sys.stderr) if on_terminal else sys.maxsize, False)


def plural(count: int, kind: str) -> str:
    return f"{count} {_SINGULARS.get(kind, kind) if count == 1 else _PLURALS.get(kind, kind + 's')}"


def summary(report: Report) -> str:
    """``3 helpers to patch; 17 call sites: 16 to patch, 1 kept by the fork; 2 test files to write; 3 call
    sites not in this release``: each kind counted apart, with the states of its items (which add up
    to its count), and the sites the tree does not have (rules for other releases) counted last,
    apart from the sites it has."""
    parts, absent = [], []
    for kind, states in report.counts().items():
        missing = states.pop(State.ABSENT.value, 0)
        count = sum(states.values())
        if len(states) == 1:
            [state] = states
            parts.append(f"{plural(count, kind)} {state}")
        elif states:
            parts.append(f"{plural(count, kind)}: " + ", ".join(f"{n} {state}" for state, n in states.items()))
        if missing:
            absent.append(f"{plural(missing, kind)} {State.ABSENT.value}")
    return "; ".join(parts + absent) if report.items else "no sites"


def where(target: Target, cwd: Optional[Path] = None, above: bool = False) -> str:
    """The target root as the user would name it: ``.`` when it is the working folder, relative
    when it is below it, else absolute: from a subfolder of the tree its root is named whole, not
    ``../../..``, which says nothing of which tree (``above``: relative there too, for a command
    to run from the working folder, e.g. ``git -C ../../.. add``)."""
    cwd = (cwd or Path.cwd()).resolve()
    root = target.root
    if root == cwd or cwd in root.parents or (above and root in cwd.parents):
        return os.path.relpath(root, cwd)
    return str(root)


def header(report: Report, width: int) -> str:
    """``SGLang 0.5.12 (_version.py), at ROOT``: the root cut from the left where it does not fit."""
    lead = f"{report.target.describe()}, at "
    return lead + fit_left(where(report.target), max(width - len(lead), 8))


def print_header(report: Report, verbose: bool, out: Printer) -> None:
    """The header; ``verbose``: and where the release was read (or why none is stated), wrapped."""
    out.line(header(report, out.width))
    if verbose:
        target = report.target
        described = f"; git describe: {target.git_describe}" if target.git_describe else ""
        out.wrapped(
            f"  release read from {target.version_source}{described}"
            if target.version
            else f"  no release stated ({target.version_source}): every site is judged by its code"
        )


def _state_code(item: Item, applied: bool) -> str:
    """Red: no rule knows it; yellow: left to do; green: done (now or before); plain: the rest."""
    if item.error:
        return _RED
    if item.needs_action:
        return _GREEN if applied else _YELLOW
    return _GREEN if item.state == State.PATCHED.value else ""


#: states shown without ``-v`` though they need no action: what the fork decided, which the patch leaves as it is
FORK_DECISIONS = (State.KEPT.value, State.BY_CALLER.value)


def shown_by_default(item: Item) -> bool:
    """What ``check`` lists without ``-v``: items to act on, refused, left as the fork decided, or a stale
    keep comment (one ``apply`` leaves: to delete by hand)."""
    return item.needs_action or item.error or item.state in FORK_DECISIONS or item.kind == api.KEEP_COMMENT


def print_items(out: Printer, items: Sequence[Item], applied: bool = False, verbose: bool = False) -> None:
    """Items grouped by file: the file on its own line, then ``line  state  Class.method  site``,
    and a detail beside them, or on a line of its own where it does not fit (wrapped, never
    cut). The site column is left out where it does not fit (``verbose``: the site goes with
    the detail). Without ``verbose`` the columns are those of the items to act on: a fork's
    decision (``FORK_DECISIONS``) follows them unpadded, a caller's split as where it is
    (``Class.method at FILE:LINE``, cut from the left to fit)."""
    if not items:
        return
    tabled = [item for item in items if verbose or item.state not in FORK_DECISIONS] or items
    line_width = max(len(str(item.line or "")) for item in items)
    state_width = max(len(item.state) for item in tabled)
    scope_width = max(len(item.scope) for item in tabled)
    site_width = max(len(item.site) for item in tabled)
    with_site = 2 + line_width + 2 + state_width + 2 + scope_width + 2 + site_width <= out.width
    current = None
    for item in items:
        if item.file != current:
            current = item.file
            out.line(fit_left(item.file, out.width))
        lead = f"  {str(item.line or ''):>{line_width}}  "
        padded = item in tabled
        state = (f"{item.state:<{state_width}}" if padded else item.state, _state_code(item, applied))
        if item.state == State.BY_CALLER.value and not padded:  # where the caller splits: its file:line kept
            out.line(lead, state, "  " + fit_left(item.detail, out.width - len(lead + item.state) - 2))
            continue
        rest = f"  {item.scope:<{scope_width}}  {item.site}".rstrip() if with_site and padded else f"  {item.scope}"
        judged = f"before: {item.judged}" if verbose and item.judged else ""
        extra = "; ".join(
            part for part in (item.site if verbose and not with_site else "", item.detail, judged) if part
        )
        detail = f" ({extra})" if extra else ""
        if len(lead) + len(state[0]) + len(rest) + len(detail) <= out.width:
            out.line(lead, state, rest + detail)
            continue
        if len(lead) + len(state[0]) + len(rest) <= out.width:
            out.line(lead, state, rest)
        else:
            out.line(lead, state)
            out.wrapped(rest.strip(), indent=" " * (len(lead) + 2))
        if extra:
            out.wrapped(extra, indent=" " * len(lead))


def next_step(report: Report, argv_target: Optional[str]) -> Optional[str]:
    """The command to run after a check that did not exit 0: apply, or (a site no rule knows,
    to be kept or rewritten by hand first, ``refusal_step``) check again."""
    if report.exit_code == 0:
        return None
    return command_line("apply" if report.exit_code == 1 else "check", report, argv_target)


def _package_file(report: Report, item: Item) -> str:
    """The item's file relative to the ``sglang`` package, as ``--keep FILE:Class.method`` takes it."""
    return (report.target.root / item.file).relative_to(report.target.package).as_posix()


def refusal_step(report: Report) -> str:
    """What to do before anything else on a refused tree: the advice every error line gives
    (``error_line``), for all of them at once (naming each, so it needs no list above it)."""
    sites = [item for item in report.errors if item.kind == api.CALL_SITE]
    paths = [item for item in report.errors if item.kind == api.DRAFT_PATH]
    helpers = [item for item in report.errors if item.kind not in (api.CALL_SITE, api.DRAFT_PATH)]
    steps = []
    if sites:
        lines = ", ".join(item.file + (f":{item.line}" if item.line else "") for item in sites)
        keeps = dict.fromkeys(f"{_package_file(report, item)}:{item.scope}" for item in sites)
        steps.append(f"{lines}: " + engine.refusal_hint(list(keeps), "that line" if len(sites) == 1 else "each line"))
    if helpers:
        steps.append(f"{', '.join(f'{item.file} ({item.scope})' for item in helpers)}: " + engine.refusal_hint([]))
    if paths:
        steps.append(f"{', '.join(f'{item.file} ({item.scope})' for item in paths)}: " + engine.PATH_HINT)
    return "; ".join(steps)


def command_line(command: str, report: Report, argv_target: Optional[str]) -> str:
    words = [PROG, command, *map(shlex.quote, report.options.cli_flags())]
    if argv_target is not None:
        words.append(shlex.quote(argv_target))
    return " ".join(words)


def print_check(report: Report, argv_target: Optional[str], verbosity: int, out: Printer) -> None:
    if verbosity >= 0:
        print_header(report, verbosity > 0, out)
        print_items(
            out,
            report.items if verbosity > 0 else [i for i in report.items if shown_by_default(i)],
            verbose=verbosity > 0,
        )
    out.wrapped(summary(report), _BOLD)
    for note in report.notes:
        out.wrapped(note)
    print_errors(report)
    following = next_step(report, argv_target)
    if following:
        out.wrapped("next: run" if report.exit_code == 1 else f"next: {refusal_step(report)}; then run")
        out.command(following)


def error_line(report: Report, item: Item) -> str:
    """``FILE:LINE: Class.method: site: detail; <what to do>`` (``engine.refusal_hint``, as ``refusal_step``)."""
    where_ = str(report.target.root / item.file) + (f":{item.line}" if item.line else "")
    return f"{where_}: {item.scope}: {item.site}: {item.detail or item.state}; {_what_to_do(report, item)}"


def _what_to_do(report: Report, item: Item, lines: str = "that line") -> str:
    """What to do about an item refusing the tree: ``engine.refusal_hint`` (keep a call site by the comment on
    ``lines`` or ``--keep``), or for a draft path ``engine.PATH_HINT``."""
    if item.kind == api.DRAFT_PATH:
        return engine.PATH_HINT
    keeps = [f"{_package_file(report, item)}:{item.scope}"] if item.kind == api.CALL_SITE else []
    return engine.refusal_hint(keeps, lines)


def print_errors(report: Report, suffix: str = "") -> None:
    """One ``error:`` line per site no rule knows, on stderr (wrapped to its terminal only, ``stderr``)."""
    err = stderr()
    for item in report.errors:
        err.wrapped(f"error: {error_line(report, item)}{suffix}")


def github_escape(text: str, property_value: bool = False) -> str:
    """GitHub workflow command escaping (data; and ``:``/``,`` in a property value)."""
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if property_value else text


#: GitHub shows at most 10 error annotations a step (and 10 notices); the rest of a step's are dropped
GITHUB_ERRORS = 10


def github_annotated(report: Report) -> list[Item]:
    """The items ``--format github`` annotates, in its order: the sites no rule knows (which block
    ``apply``) first, then the rest to act on, each group as listed."""
    return sorted((item for item in report.items if item.needs_action or item.error), key=lambda item: not item.error)


def print_github(report: Report, argv_target: Optional[str]) -> None:
    """One ``::error`` workflow annotation per item to act on (on a refused tree: the refusals
    first, and the others saying why ``apply`` refuses the tree, not to run it), at most
    ``GITHUB_ERRORS`` of them (GitHub drops the rest), the others named in one ``::notice``;
    then the summary and next step."""
    fix = command_line("apply", report, argv_target)
    refused = [item.file + (f":{item.line}" if item.line else "") for item in report.errors]
    blocked = (
        f"; `{fix}` refuses the tree until the {plural(len(refused), 'site')} no rule knows "
        f"({', '.join(refused)}) are kept or rewritten"
    )
    annotated = github_annotated(report)
    for item in annotated[:GITHUB_ERRORS]:
        properties = f"file={github_escape(item.file, True)}"
        if item.line:
            properties += f",line={item.line}"
        properties += f",title={PROG}"
        message = f"{item.scope}" + (f" ({item.site})" if item.site else "") + f": {item.state}"
        message += f" ({item.detail})" if item.detail else ""
        message += f"; upstream {item.upstream}" if item.upstream else ""
        if item.error:
            why = "" if item.kind == api.DRAFT_PATH else "no rule knows this form: "
            message += f"; {why}{_what_to_do(report, item, 'this line')}"
        else:
            message += blocked if refused else f"; run `{fix}`"
        print(f"::error {properties}::{github_escape(message)}")
    rest = annotated[GITHUB_ERRORS:]
    if rest:
        named = ", ".join(
            item.file + (f":{item.line}" if item.line else "") + f" {item.scope} ({item.state})" for item in rest
        )
        more = (
            f"{plural(len(rest), 'more item')} to act on, not annotated (GitHub shows {GITHUB_ERRORS} errors a step): "
        )
        print(f"::notice title={PROG}::{github_escape(more + named)}")
    for note in report.notes:
        print(f"::notice title={PROG}::{github_escape(note)}")
    print(summary(report))
    following = next_step(report, argv_target)
    if following:
        print(f"next: {refusal_step(report)}; then run `{following}`" if refused else f"next: {following}")


def print_json(report: Report, argv_target: Optional[str]) -> None:
    import json  # here, not above: text is the default

    data = report.to_json()
    data["next"] = next_step(report, argv_target)
    print(json.dumps(data, indent=2))


def print_apply(report: Report, verbosity: int, out: Printer) -> None:
    for item in report.items:
        if item.kind == api.TEMP_FILE and not item.needs_action:
            stderr().wrapped(f"warning: kept {report.target.root / item.file}: {item.detail}")
    if verbosity >= 0:
        print_header(report, verbosity > 0, out)
        if verbosity > 0:
            print_items(out, report.items, applied=True, verbose=True)
        for written in report.files:
            out.line(("new      ", _GREEN) if written.new else "patched  ", fit_left(written.path, out.width - 9))
    out.wrapped(summary(report), _BOLD)
    for note in report.notes:
        out.wrapped(note)
    new = [f.path for f in report.files if f.new]
    if not report.files:
        out.line("nothing to do: every site already follows upstream")
        return
    out.line(f"wrote {plural(len(report.files), 'file')}" + (f" ({len(new)} new)" if new else ""))
    if in_git_checkout(report.target.root):
        out.line("next: review, then stage exactly the files written, and commit")
        root = where(report.target, above=True)
        git = "git add" if root == "." else f"git -C {shlex.quote(root)} add"
        out.command(" ".join([git, *(shlex.quote(f.path) for f in report.files)]))


def in_git_checkout(folder: Path) -> bool:
    """``folder`` is in a git work tree (a ``.git`` in it or a folder above it)."""
    return any((each / ".git").exists() for each in (folder, *folder.parents))


def run(command: str, argv_target: Optional[str], options: api.Options, args: argparse.Namespace) -> int:
    fmt = getattr(args, "format", "text")
    verbosity = getattr(args, "verbose", 0) - getattr(args, "quiet", 0)
    out = Printer(sys.stdout, terminal_width(), color_wanted(sys.stdout))
    if command == "check":
        report = api.check(argv_target, options)
        {
            "json": lambda: print_json(report, argv_target),
            "github": lambda: print_github(report, argv_target),
            "text": lambda: print_check(report, argv_target, verbosity, out),
        }[fmt]()
        if fmt != "text":
            print_errors(report)
        return report.exit_code
    if command == "diff":
        report = api.diff(argv_target, options)
        if report.errors:
            print_errors(report)
            return 2
        sys.stdout.write(report.patch)
        return 1 if args.exit_code and report.patch else 0
    try:
        report = api.apply(argv_target, options)
    except engine.Refused as refused:  # every site no rule knows, as check names them
        report = dataclasses.replace(api.report("apply", refused.plan, options), files=())
        if fmt == "json":
            print_json(report, argv_target)
        print_errors(report, "; nothing written")
        return 2
    if fmt == "json":
        print_json(report, argv_target)
    else:
        print_apply(report, verbosity, out)
    return 1 if args.exit_non_zero_on_fix and report.files else 0


def demo(release: str, verbosity: int) -> int:
    """Fetch sglang==release from PyPI (cached), patch a scratch copy, show what changed and check it."""
    out = Printer(sys.stdout, terminal_width(), color_wanted(sys.stdout))
    with tempfile.TemporaryDirectory(prefix=f"{PROG}-demo-") as scratch:
        out.line(f"unpacking sglang=={release} from PyPI into a scratch folder")
        if verbosity > 0:
            out.line(f"  wheel cache: {releases.cache_dir() / 'wheels'}; scratch: {scratch}")
        releases.unpack_release(release, scratch)
        applied = api.apply(scratch)
        print_apply(applied, verbosity, out)
        after = api.check(scratch)
        out.wrapped(f"check after apply: {summary(after)}")
        if after.exit_code == 0:
            out.wrapped("next: check your own tree (PATH: any folder of a fork checkout or an SGLang install)")
            out.command(f"{PROG} check PATH")
        return after.exit_code


def _add_target(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "target",
        nargs="?",
        help="any folder inside a fork checkout or an SGLang tree, or the "
        "sglang package (default: the SGLang installed in this Python)",
    )
    tests = command.add_mutually_exclusive_group()
    tests.add_argument(
        "--tests",
        dest="tests",
        action="store_const",
        const=True,
        help="write the fork's tests even where no site is left to patch (an up-to-date fork)",
    )
    tests.add_argument(
        "--no-tests",
        dest="tests",
        action="store_const",
        const=False,
        help="leave out the test files written into a fork checkout's test/registered/",
    )
    command.add_argument(
        "--cpu-suite",
        metavar="NAME",
        help="register the CPU test to this suite (default: chosen from test/run_suite.py)",
    )
    command.add_argument(
        "--cuda-suite",
        metavar="NAME",
        help="write the GPU test, registered to this suite (default: chosen from test/run_suite.py)",
    )
    command.add_argument(
        "--gpu-test", action="store_true", help="also write the GPU test (about 240 s of per-commit GPU CI in the fork)"
    )
    command.add_argument(
        "--keep",
        metavar="FILE:Class.method",
        action="append",
        type=str,
        default=[],
        help="keep this site as the fork wrote it, like a `# sglang-draft-layout: keep` " "comment on it (repeatable)",
    )


def _add_verbosity(command: argparse.ArgumentParser) -> None:
    command.add_argument("-v", "--verbose", action="count", default=0, help="every site, not only those to act on")
    command.add_argument("-q", "--quiet", action="count", default=0, help="the summary (and next step) only")


def parser() -> argparse.ArgumentParser:
    main_parser = argparse.ArgumentParser(
        prog=PROG,
        description="Bring an SGLang tree to upstream's multi-step EAGLE draft layout helpers.",
    )
    main_parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    commands = main_parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser(
        "check",
        help="report what is left to patch; exit 0 nothing, 1 something (the next command is printed), "
        "2 a site no rule knows",
        description="Report every site's state; write nothing.",
    )
    _add_target(check)
    _add_verbosity(check)
    check.add_argument(
        "--format",
        choices=("text", "json", "github"),
        default="text",
        help="json: docs/json.md's schema; github: workflow annotations (::error file=...,line=...)",
    )
    diff_exits = (
        "write nothing; exit 0 (with --exit-code: 1 when there is a patch), 2 with nothing printed when a "
        "site no rule knows refuses the tree (or on bad input)"
    )
    diff = commands.add_parser(
        "diff",
        help=f"print the patch as a git diff (paths from the tree's root); {diff_exits}",
        description=f"Print the patch as a git diff; {diff_exits}.",
    )
    _add_target(diff)
    diff.add_argument(
        "--exit-code", action="store_true", help="exit 1 when there is a patch, like git diff --exit-code"
    )
    apply = commands.add_parser(
        "apply", help="patch the tree: every file or none", description="Patch the tree: every file or none."
    )
    _add_target(apply)
    _add_verbosity(apply)
    apply.add_argument("--format", choices=("text", "json"), default="text", help="json: docs/json.md's schema")
    apply.add_argument(
        "--exit-non-zero-on-fix",
        action="store_true",
        help="exit 1 when files were written (the fixing pre-commit hook)",
    )
    demo_parser = commands.add_parser("demo", help=f"patch a scratch copy of sglang=={DEMO_RELEASE} from PyPI")
    demo_parser.add_argument("--release", default=DEMO_RELEASE)
    _add_verbosity(demo_parser)
    return main_parser


def _options(args: argparse.Namespace) -> api.Options:
    """The api Options named by the command's flags (a flag's dest is the field's name)."""
    names = {f.name for f in dataclasses.fields(api.Options)}
    return api.Options(
        **{
            name: tuple(value) if isinstance(value, list) else value
            for name, value in vars(args).items()
            if name in names
        }
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(argv)
    try:
        with transaction.signal_gate() as gate:
            gate.holding = False  # until planning starts, a signal stops the command at once
            if args.command == "demo":
                return demo(args.release, args.verbose - args.quiet)
            return run(args.command, args.target, _options(args), args)
    except engine.Interrupted as interrupted:  # SIGINT, SIGTERM, SIGHUP (see transaction.py)
        stderr().wrapped(str(interrupted))
        return interrupted.exit_code
    except TreeBelow as error:  # a repository vendoring SGLang: the command to run on it
        below = [os.path.normpath(os.path.join(args.target, folder)) for folder in error.below]
        command = [PROG, args.command, *map(shlex.quote, _options(args).cli_flags()), shlex.quote(below[0])]
        stderr().wrapped(f"error: {error}; run: {' '.join(command)}")
        return 2
    except TargetError as error:
        stderr().wrapped(f"error: {error}")
        return 2
    except BrokenPipeError:  # the reader left (`| head`): say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as error:
        stderr().wrapped(f"error: {error.filename or ''}: {error.strerror or error}; nothing written")
        return 2


def console() -> None:
    """The command as a program (the console script, ``python -m sglang_draft_layout``): ``main``, its parsed
    trees kept to the end, and the process ended without tearing down what it built (as mypy ends): freeing
    a tree's syntax trees one by one took a fifth of a check of 0.5.23 whose verdicts were kept. Python's cycle
    collector stays off (a plan turns it off; turned on again, its first pass went over every object the plan
    made)."""
    gc.disable()
    with parsing_once():
        code = main()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError):  # the reader left (`| head`)
                stream.flush()
        os._exit(code)


if __name__ == "__main__":
    console()
