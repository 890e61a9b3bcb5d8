"""A tree's draft paths judged in two processes at once (``judged.judge_tree``'s: the tool's, not embedded).

Where this process may use two CPUs and fork, a child forked from it and this process share out the paths that
are not workers: each, when free, claims the next one not yet claimed (the largest modules first: ``_Claims``);
both judge the workers, whose verdicts say who inits each per-step backend (``invariant.judge_each``). The child
hands back its verdicts and the files it read, pickled, or the exception its judging raised; a child that ends
without either leaves its paths to this process. Each path is judged on the same tree and probes by the same
code in either process: the verdicts are one process's. ``SGLANG_DRAFT_LAYOUT_JOBS=1`` judges in one process.
"""

from __future__ import annotations

import os
import pickle
import signal
from typing import Any, Callable, Collection, Optional, Sequence

from .invariant import Verdict, judge_each
from .paths import WORKER, DraftPath, draft_paths
from .world import Tree

JOBS = "SGLANG_DRAFT_LAYOUT_JOBS"


class Judging:
    """A tree's draft paths being judged: where two processes may (``_two_processes``) and two paths or more are
    not workers, a child forked at once claims paths while this process goes on (reading the tree for the rules,
    say); ``finish`` judges here the paths the child has not claimed and gathers its verdicts; ``cancel`` ends a
    child whose verdicts no one will ask for."""

    def __init__(self, tree: Tree, modules: Collection[str], judge_path: Callable[..., Verdict]) -> None:
        self.tree, self.judge_path, self.child = tree, judge_path, 0
        self.paths = draft_paths(tree, sorted(modules))
        others = sorted(
            (path for path in self.paths if path.kind != WORKER), key=lambda path: -len(tree.text(path.module) or "")
        )
        self.order = [*(path for path in self.paths if path.kind == WORKER), *others]
        if not 2 <= len(others) < 256 or not _two_processes():
            return
        claims, back = os.pipe(), os.pipe()
        os.write(claims[1], bytes(range(len(others))))  # each path's index, a byte each: within a pipe's buffer
        os.close(claims[1])
        self.child = os.fork()
        if self.child == 0:  # never returns
            os.close(back[0])
            _judge_share(tree, self.order, judge_path, _Claims(claims[0], others), back[1])
        os.close(back[1])
        self.claims, self.back, self.others = _Claims(claims[0], others), back[0], others

    def finish(self) -> tuple[dict[DraftPath, Verdict], set[str]]:
        """Each draft path and its verdict (``invariant.judge_paths``'s), and the files (under the package) read to
        judge them."""
        tree, judge_path = self.tree, self.judge_path
        if not self.child:
            return judge_each(tree, self.paths, judge_path), set(tree.texts)
        try:
            found = judge_each(tree, self.order, _only(judge_path, self.claims))
        except BaseException:
            self.cancel()
            raise
        handed = self._gathered()
        theirs = [path for path in self.others if path not in self.claims.taken]
        try:
            verdicts, read, error = pickle.loads(handed)
        except Exception:  # the child ended without its verdicts (killed, say): its paths judged here
            verdicts, read, error = judge_each(tree, self.order, _only(judge_path, set(theirs).__contains__)), (), None
        if error is not None:
            raise error
        found.update((path, verdicts[path]) for path in theirs)
        return {path: found[path] for path in self.paths}, {*tree.texts, *read}

    def cancel(self) -> None:
        if self.child:
            os.kill(self.child, signal.SIGKILL)
            self._gathered()

    def _gathered(self) -> bytes:
        """What the child handed back, once it has ended (its pipes closed here)."""
        os.close(self.claims.reader)
        with os.fdopen(self.back, "rb") as pipe:
            handed = pipe.read()
        os.waitpid(self.child, 0)
        self.child = 0
        return handed


class _Claims:
    """Whether this process judges a path, asked at each of ``others`` in turn: whether the next claim it reads (a
    path's index, from a pipe the two processes read) is that path's; ``taken``: the paths it claimed."""

    def __init__(self, reader: int, others: Sequence[DraftPath]) -> None:
        self.reader, self.index = reader, {path: n for n, path in enumerate(others)}
        self.claim: Optional[int] = -1
        self.taken: set[DraftPath] = set()

    def __call__(self, path: DraftPath) -> bool:
        index = self.index[path]
        while self.claim is not None and self.claim < index:
            read = os.read(self.reader, 1)
            self.claim = read[0] if read else None
        if self.claim == index:
            self.taken.add(path)
        return self.claim == index


def _judge_share(
    tree: Tree, order: Sequence[DraftPath], judge_path: Callable[..., Verdict], claims: _Claims, writer: int
) -> None:
    """The child: judge the workers and the paths it claims, write (their verdicts, the files read, None) or (None,
    None, the exception) to ``writer``, and end without running what the parent runs at its exit."""
    try:
        for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a signal ends it; the parent decides
            signal.signal(number, signal.SIG_DFL)
        try:
            found = judge_each(tree, order, _only(judge_path, claims))
            handed = pickle.dumps(({p: found[p] for p in claims.taken}, set(tree.texts), None))
        except Exception as error:
            handed = pickle.dumps((None, None, _picklable(error)))
        with os.fdopen(writer, "wb") as pipe:
            pipe.write(handed)
    finally:
        os._exit(0)


def _picklable(error: Exception) -> Exception:
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")


def _only(judge_path: Callable[..., Verdict], mine: Callable[[DraftPath], bool]) -> Callable[..., Verdict]:
    """``judge_path`` for the workers and the paths ``mine`` takes; any other path's verdict left empty."""

    def judged(tree: Tree, path: DraftPath, *by_worker: Any) -> Verdict:
        return judge_path(tree, path, *by_worker) if path.kind == WORKER or mine(path) else Verdict(path)

    return judged


def _two_processes() -> bool:
    """Two CPUs this process may run on, ``os.fork``, and no ``SGLANG_DRAFT_LAYOUT_JOBS=1``."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cpus >= 2 and hasattr(os, "fork") and os.environ.get(JOBS, "") != "1"
