"""sglang-draft-layout check | apply | diff | demo."""

from __future__ import annotations

import argparse
import sys
import tempfile
from importlib import metadata
from typing import Optional, Sequence

from . import __version__, engine, releases
from .engine import Plan
from .fork_tests import FileState
from .rules.base import State
from .target import TargetError, resolve

DEMO_RELEASE = "0.5.12"


def package_version() -> str:
    """This tool's version, from its package metadata (the source tree's when not installed)."""
    try:
        return metadata.version("sglang-draft-layout")
    except metadata.PackageNotFoundError:
        return f"{__version__} (not installed)"


def table(plan: Plan, applied: bool = False) -> str:
    """One row per site: file, Class.method, site, state (``applied``: the plan was just written)."""
    rows = [("file", "class.method", "site", "state")]
    for finding in plan.findings:
        rule = finding.rule
        where = rule.file + (f":{finding.line}" if finding.line and finding.state is not State.ABSENT else "")
        state = "patched now" if applied and finding.state is State.TO_PATCH else finding.state.value
        if finding.state is State.UNRECOGNISED or (finding.state is State.TO_PATCH and finding.detail):
            state += f" ({finding.detail})"  # what is unknown, or what a site in between releases keeps
        rows.append((where, rule.scope, rule.site, state))
    for generated in plan.generated:  # a fork's own test files
        state = generated.state.value
        if applied and generated.state is not FileState.PRESENT:
            state = "written now"
        rows.append((generated.path.relative_to(plan.target.root).as_posix(), "-", generated.what, state))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[3] for row in rows]
    sites = [f for f in plan.findings if f.rule.counts_as_site]
    summary = ", ".join(
        f"{sum(f.state is state for f in sites)} "
        f"{'patched now' if applied and state is State.TO_PATCH else state.value}"
        for state in State if any(f.state is state for f in sites)
    )
    target = plan.target
    return "\n".join([f"{target.describe()} at {target.package}", *lines, f"sites: {summary}"])


def _plan_exit_code(plan: Plan) -> int:
    if plan.unrecognised:
        return 2
    to_write = any(g.state is not FileState.PRESENT for g in plan.generated)
    return 1 if plan.count(State.TO_PATCH) or to_write else 0


def check(path: Optional[str], tests: bool = True, keep: Sequence[str] = ()) -> int:
    plan = engine.plan(resolve(path), render_changes=False, tests=tests, keep=keep)
    print(table(plan))
    for finding in plan.unrecognised:
        print(f"error: {engine.describe(finding, plan.target)}", file=sys.stderr)
    return _plan_exit_code(plan)


def diff(path: Optional[str], tests: bool = True, keep: Sequence[str] = ()) -> int:
    plan = engine.plan(resolve(path), tests=tests, keep=keep)
    for finding in plan.unrecognised:
        print(f"error: {engine.describe(finding, plan.target)}", file=sys.stderr)
        return 2
    sys.stdout.write(plan.diff())
    return _plan_exit_code(plan)


def apply(path: Optional[str], tests: bool = True, keep: Sequence[str] = ()) -> int:
    target = resolve(path)
    plan = engine.apply(target, tests=tests, keep=keep)
    print(table(plan, applied=True))
    print(f"wrote {len(plan.changes)} file(s)" if plan.changes else "nothing to do: every site already follows upstream")
    return 0


def demo(release: str) -> int:
    """Fetch sglang==release from PyPI (cached), patch a scratch copy, show what changed."""
    with tempfile.TemporaryDirectory(prefix="sglang-draft-layout-demo-") as scratch:
        print(f"unpacking sglang=={release} (wheel cached in {releases.cache_dir() / 'wheels'}) into {scratch}")
        releases.unpack_release(release, scratch)
        target = resolve(scratch)
        plan = engine.apply(target)
        print(table(plan, applied=True))
        for change in plan.changes:
            old, new = change.old.splitlines(), change.new.splitlines()
            print(f"  {change.path.relative_to(target.package.parent)}: {len(old)} -> {len(new)} lines")
        after = engine.plan(target, render_changes=False)
        print(f"check after apply: {after.count(State.PATCHED)} sites and helpers patched, "
              f"{after.count(State.TO_PATCH)} to patch")
        return 0 if after.count(State.TO_PATCH) == 0 else 1


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sglang-draft-layout",
        description="Bring an SGLang tree to upstream's multi-step EAGLE draft layout helpers.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("check", "report every site's state; exit 0 if nothing is left to do, 1 if something is, 2 on error"),
        ("diff", "print the patch as a unified diff; write nothing"),
        ("apply", "patch the tree: every file or none"),
    ):
        command = commands.add_parser(name, help=text, description=text)
        command.add_argument("target", nargs="?", help="fork checkout, folder holding sglang/, or the sglang package "
                                                       "(default: the SGLang installed in this Python)")
        command.add_argument("--no-tests", dest="tests", action="store_false",
                             help="leave out the test files written into a fork checkout's test/registered/")
        command.add_argument("--keep", action="append", default=[], metavar="FILE:Class.method",
                             help="keep this site as the fork wrote it (like a `# sglang-draft-layout: keep` "
                                  "comment on it); repeatable")
    command = commands.add_parser("demo", help=f"patch a scratch copy of sglang=={DEMO_RELEASE} from PyPI")
    command.add_argument("--release", default=DEMO_RELEASE)
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            return demo(args.release)
        return {"check": check, "diff": diff, "apply": apply}[args.command](args.target, args.tests, args.keep)
    except TargetError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"error: {error.filename or ''}: {error.strerror or error}; nothing written", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
