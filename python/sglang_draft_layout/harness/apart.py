"""Work shared by two processes at once (the tool's, not embedded): a tree's draft paths judged
(``judged.judge_tree``'s ``Judging``), the files ``apply`` writes rendered (``each_apart``).

Where this process may use two CPUs and fork, a child forked from it and this process share out the pieces of work:
each, when free, claims the next one not yet claimed (``_Claims``; draft paths: the largest modules first, the workers
judged by both, their verdicts saying who inits each per-step backend, ``invariant.judge_each``). The child hands back
what its work returned, pickled, or the exception it raised (raised here); a child that ends without either leaves its
pieces to this process. Each piece is done by the same code in either process: the results are one process's.
``SGLANG_DRAFT_LAYOUT_JOBS=1`` works in one process.
"""

from __future__ import annotations

import os
import pickle
import signal
import threading
from typing import Any, Callable, Collection, Optional, Sequence

from .invariant import Verdict, judge_each
from .paths import WORKER, DraftPath, draft_paths
from .world import Tree

JOBS = "SGLANG_DRAFT_LAYOUT_JOBS"


class Judging:
    """A tree's draft paths being judged: where two processes may share the paths that are not workers
    (``_two_processes``), a child forked at once claims paths while this process goes on (reading the tree for the
    rules, say); ``finish`` judges here the paths the child has not claimed and gathers its verdicts; ``cancel`` ends
    a child whose verdicts no one will ask for."""

    def __init__(self, tree: Tree, modules: Collection[str], judge_path: Callable[..., Verdict]) -> None:
        self.tree, self.judge_path, self.forked = tree, judge_path, None
        self.paths = draft_paths(tree, sorted(modules))
        others = sorted(
            (path for path in self.paths if path.kind != WORKER), key=lambda path: -len(tree.text(path.module) or "")
        )
        self.order = [*(path for path in self.paths if path.kind == WORKER), *others]
        self.index = {path: n for n, path in enumerate(others)}
        if _two_processes(len(others)):
            self.forked = _Forked(len(others), self._judged_by)

    def _judged_by(self, mine: Callable[[int], bool]) -> tuple[dict[DraftPath, Verdict], set[str]]:
        """The verdicts of the workers and of the paths ``mine`` claims, and the files read."""
        claimed = set()

        def taken(path: DraftPath) -> bool:
            if mine(self.index[path]):
                claimed.add(path)
            return path in claimed

        found = judge_each(self.tree, self.order, _only(self.judge_path, taken))
        return {p: v for p, v in found.items() if p.kind == WORKER or p in claimed}, set(self.tree.texts)

    def finish(self) -> tuple[dict[DraftPath, Verdict], set[str]]:
        """Each draft path and its verdict (``invariant.judge_paths``'s), and the files (under the package) read to
        judge them."""
        if self.forked is None:
            return judge_each(self.tree, self.paths, self.judge_path), set(self.tree.texts)
        found, read = self.forked.shared(self._judged_by)
        theirs, read_there = self.forked.result
        found = {**theirs, **found}
        return {path: found[path] for path in self.paths}, {*read, *read_there}

    def cancel(self) -> None:
        if self.forked is not None:
            self.forked.cancel()


def each_apart(calls: Sequence[Callable[[], Any]]) -> list[Any]:
    """What each of ``calls`` returns, in their order, made in two processes where they may (``_two_processes``):
    each makes the next call not yet claimed (``apply``'s rendering of the files it writes)."""
    if not _two_processes(len(calls)):
        return [call() for call in calls]

    def made(mine: Callable[[int], bool]) -> dict[int, Any]:
        return {n: call() for n, call in enumerate(calls) if mine(n)}

    forked = _Forked(len(calls), made)
    returned = forked.shared(made)
    returned.update(forked.result)
    return [returned[n] for n in range(len(calls))]


class _Forked:
    """A child forked to share ``count`` pieces of work with this process (fewer than 256): each claims the next
    piece not yet claimed (``_Claims``). The child runs ``work`` on its claims and hands back what it returns,
    pickled, or the exception it raised, and ends; ``shared`` runs ``work`` here on this process's claims, then
    takes the child's (``result``)."""

    def __init__(self, count: int, work: Callable[[Callable[[int], bool]], Any]) -> None:
        self.count, (claims, back) = count, (os.pipe(), os.pipe())
        os.write(claims[1], bytes(range(count)))  # each piece's index, a byte each: within a pipe's buffer
        os.close(claims[1])
        self.pid = os.fork()
        if self.pid == 0:  # never returns
            os.close(back[0])
            _hand_back(back[1], lambda: work(_Claims(claims[0])))
        os.close(back[1])
        self.mine, self.back, self.result = _Claims(claims[0]), back[0], None

    def shared(self, work: Callable[[Callable[[int], bool]], Any]) -> Any:
        """What ``work`` returns on this process's claims (the child ended where it raises); the child's ``result``
        taken, or where the child ended without one (killed, say), ``work``'s here on the pieces this process did
        not claim; the exception the child's work raised, raised here."""
        try:
            mine = work(self.mine)
        except BaseException:
            self.cancel()
            raise
        handed = self._gathered()
        try:
            self.result, error = pickle.loads(handed)
        except Exception:  # the child ended without its result: its pieces are this process's
            left = set(range(self.count)) - self.mine.taken
            self.result, error = work(left.__contains__), None
        if error is not None:
            raise error
        return mine

    def cancel(self) -> None:
        if self.pid:
            os.kill(self.pid, signal.SIGKILL)
            self._gathered()

    def _gathered(self) -> bytes:
        """What the child handed back, once it has ended (its pipes closed here)."""
        os.close(self.mine.reader)
        with os.fdopen(self.back, "rb") as pipe:
            handed = pipe.read()
        os.waitpid(self.pid, 0)
        self.pid = 0
        return handed


class _Claims:
    """Whether this process takes a piece of work, asked at each piece's index in turn: whether the next claim it
    reads (an index, from a pipe the two processes read) is that one; ``taken``: the indexes it claimed."""

    def __init__(self, reader: int) -> None:
        self.reader, self.claim = reader, -1
        self.taken: set[int] = set()

    def __call__(self, index: int) -> bool:
        while self.claim is not None and self.claim < index:
            read = os.read(self.reader, 1)
            self.claim = read[0] if read else None
        if self.claim == index:
            self.taken.add(index)
        return self.claim == index


def _hand_back(writer: int, work: Callable[[], Any]) -> None:
    """The child: ``work()``, then (what it returned, None) or (None, the exception it raised) written to ``writer``,
    pickled; ended without running what the parent runs at its exit."""
    try:
        for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a signal ends it; the parent decides
            signal.signal(number, signal.SIG_DFL)
        try:
            handed = pickle.dumps((work(), None))
        except Exception as error:
            handed = pickle.dumps((None, _picklable(error)))
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


def _two_processes(pieces: int) -> bool:
    """Two to 255 pieces of work to share, two CPUs this process may run on, ``os.fork``, one thread (a fork copies
    no other thread, nor frees a lock one holds: the tool's API called from a threaded program works in one
    process), and no ``SGLANG_DRAFT_LAYOUT_JOBS=1``."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    alone = threading.active_count() == 1
    return 2 <= pieces < 256 and cpus >= 2 and hasattr(os, "fork") and alone and os.environ.get(JOBS, "") != "1"
