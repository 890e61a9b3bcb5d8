"""Work shared by two processes at once (the tool's, not embedded): a tree's draft paths judged
(``judged.judge_tree``'s ``Judging``), the files ``apply`` writes rendered (``each_apart``).

Where this process may use two CPUs and fork, a child forked from it and this process share out the pieces of work:
each, when free, claims one more (``_Claims``): the child from the first piece on, this process from the last back
(draft paths: smallest module first and per-step paths, the costliest, last, so that this process, which parsed the
largest classes for the rules, judges those; the workers judged by the child first, which hands this process who
inits each per-step backend, what a per-step path runs as: ``invariant.judge_each``'s ``by_worker``). The child
hands back what its work returned, pickled, or the exception it raised (raised here); a child that ends without
either leaves its pieces to this process. Each piece is done by the same code in either process: the results are
one process's.
``SGLANG_DRAFT_LAYOUT_JOBS=1`` works in one process.
"""

from __future__ import annotations

import functools
import os
import pickle
import select
import signal
import threading
from typing import Any, Callable, Collection, Iterable, Iterator, Optional, Sequence

from .invariant import Verdict, inits_steps, judge_each
from .paths import STEPS, WORKER, DraftPath, draft_paths
from .world import Tree

JOBS = "SGLANG_DRAFT_LAYOUT_JOBS"


class Judging:
    """A tree's draft paths being judged: where two processes may share the paths that are not workers
    (``_two_processes``), a child forked at once judges the workers, hands this process who inits each step (what a
    per-step path runs as), and claims paths while this process goes on (reading the tree for the rules, say);
    ``finish`` judges here the paths the child has not claimed and gathers its verdicts; ``cancel`` ends a child
    whose verdicts no one will ask for."""

    def __init__(
        self, tree: Tree, modules: Collection[str], judge_path: Callable[..., Verdict], guess: tuple = ()
    ) -> None:
        """``guess``: (who likely inits each step,), as the tree before its rewrite said: a per-step path this process
        claims before the child has handed who does is judged on the guess, and again where it was wrong."""
        self.tree, self.judge_path, self.forked, self.guess = tree, judge_path, None, guess
        self.paths = draft_paths(tree, sorted(modules))
        self.workers = [path for path in self.paths if path.kind == WORKER]
        self.others = sorted(
            (path for path in self.paths if path.kind != WORKER),
            key=lambda path: (path.kind == STEPS, len(tree.text(path.module) or "")),
        )
        self.by_worker: Optional[tuple[Optional[DraftPath]]] = None  # (who inits each step,) once known here
        self.workers_here: dict[DraftPath, Verdict] = {}
        self.handed: Optional[int] = None  # where the child hands who inits each step
        if _two_processes(len(self.others)):
            self.handed, writer = os.pipe()
            self.forked = _Forked(len(self.others), functools.partial(self._judged_there, writer))
            os.close(writer)

    def _judged_there(self, writer: int, mine: Iterable[int]) -> tuple[dict[DraftPath, Verdict], dict[str, bool]]:
        """The child's work: the workers judged, who inits each step written to ``writer``, the paths it claims."""
        os.close(self.handed)
        self.handed = None
        try:
            os.write(writer, pickle.dumps(self._by_worker()))  # a few bytes: within a pipe's buffer
        except OSError:  # the parent no longer reads: it ends this child
            pass
        finally:
            os.close(writer)
        return self._judged_by(mine)

    def _judged_by(self, mine: Iterable[int]) -> tuple[dict[DraftPath, Verdict], dict[str, bool]]:
        """The verdicts of the paths ``mine`` claims (and of the workers where judged here), and the files read. A
        per-step path claimed before the child has handed who inits each step is judged on the ``guess`` (again
        where the child's answer differs), or with no guess after the other claims."""
        found, later, guessed = {}, [], []
        for path in (self.others[n] for n in mine):
            if path.kind != STEPS:
                found[path] = self.judge_path(self.tree, path)
            elif self.by_worker is None and self.handed is not None and not _readable(self.handed):
                if self.guess:
                    guessed.append(path)
                    found[path] = self.judge_path(self.tree, path, *self.guess)
                else:
                    later.append(path)
            else:
                found[path] = self.judge_path(self.tree, path, self._by_worker())
        later += [path for path in guessed if self._by_worker() != self.guess[0]]
        found.update({path: self.judge_path(self.tree, path, self._by_worker()) for path in later})
        return {**self.workers_here, **found}, read_by(self.tree)

    def _by_worker(self) -> Optional[DraftPath]:
        """The worker path that inits each step's backend (``invariant.inits_steps``): as the child hands it (this
        process waits), else (the child ended first, or this is the child) from the workers judged here."""
        if self.by_worker is None:
            handed = b""
            if self.handed is not None:
                with os.fdopen(self.handed, "rb") as pipe:
                    handed = pipe.read()
                self.handed = None
            self.by_worker = (pickle.loads(handed) if handed else inits_steps(self._workers()),)
        return self.by_worker[0]

    def _workers(self) -> dict[DraftPath, Verdict]:
        if not self.workers_here:
            self.workers_here = {path: self.judge_path(self.tree, path) for path in self.workers}
        return self.workers_here

    def finish(self) -> tuple[dict[DraftPath, Verdict], dict[str, bool]]:
        """Each draft path and its verdict (``invariant.judge_paths``'s), and the files (under the package) the judging
        read (``read_by``)."""
        if self.forked is None:
            return judge_each(self.tree, self.paths, self.judge_path), read_by(self.tree)
        try:
            found, _read = self.forked.shared(self._judged_by)  # what this process read: read_by(self.tree), below
        finally:
            self._unread()
        theirs, read_there = self.forked.result
        found = {**theirs, **found}
        if any(path not in found for path in self.workers):  # the child ended before handing them back
            found.update(self._workers())
        read = read_by(self.tree)
        for relative, text in read_there.items():
            read[relative] = read.get(relative, False) or text
        return {path: found[path] for path in self.paths}, read

    def cancel(self) -> None:
        if self.forked is not None:
            self.forked.cancel()
            self._unread()

    def _unread(self) -> None:
        """The pipe from the child closed here, where this process never asked who inits each step."""
        if self.handed is not None:
            os.close(self.handed)
            self.handed = None


def read_by(tree: Tree) -> dict[str, bool]:
    """The files (under the package) ``tree``'s judging asked about: True where it read the text (a text standing in for
    it included) or searched its bytes (``Tree.mentions``), False where it asked only whether the tree has it
    (``Tree.has``)."""
    return {**dict.fromkeys(tree.found, False), **dict.fromkeys(tree.scanned, True), **dict.fromkeys(tree.texts, True)}


def each_apart(calls: Sequence[Callable[[], Any]]) -> list[Any]:
    """What each of ``calls`` returns, in their order, made in two processes where they may (``_two_processes``):
    each makes the next call not yet claimed (``apply``'s rendering of the files it writes)."""
    if not _two_processes(len(calls)):
        return [call() for call in calls]

    def made(mine: Iterable[int]) -> dict[int, Any]:
        return {n: calls[n]() for n in mine}

    forked = _Forked(len(calls), made)
    returned = forked.shared(made)
    returned.update(forked.result)
    return [returned[n] for n in range(len(calls))]


class _Forked:
    """A child forked to share ``count`` pieces of work with this process (fewer than 256): each claims one more
    piece at a time (``_Claims``), the child from the first on, this process from the last back. The child runs
    ``work`` on its claims and hands back what it returns, pickled, or the exception it raised, and ends; ``shared``
    runs ``work`` here on this process's claims, then takes the child's (``result``)."""

    def __init__(self, count: int, work: Callable[[Iterable[int]], Any]) -> None:
        self.count, (claims, back) = count, (os.pipe(), os.pipe())
        os.write(claims[1], bytes(count))  # a byte for each piece: within a pipe's buffer
        os.close(claims[1])
        self.pid = os.fork()
        if self.pid == 0:  # never returns
            os.close(back[0])
            _hand_back(back[1], lambda: work(_Claims(claims[0], range(count))))
        os.close(back[1])
        self.mine, self.back, self.result = _Claims(claims[0], range(count - 1, -1, -1)), back[0], None

    def shared(self, work: Callable[[Iterable[int]], Any]) -> Any:
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
            self.result, error = work(sorted(left)), None
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
    """The pieces of work this process takes, in ``order`` as it iterates: one for each claim it reads (a byte of a
    pipe holding one per piece, which both processes read). One process goes from the first piece up, the other
    from the last down: their pieces never meet, as there are no more claims than pieces. ``taken``: the claimed."""

    def __init__(self, reader: int, order: range) -> None:
        self.reader, self.order = reader, order
        self.taken: set[int] = set()

    def __iter__(self) -> Iterator[int]:
        for index in self.order:
            if not os.read(self.reader, 1):
                return
            self.taken.add(index)
            yield index


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


def _readable(fd: int) -> bool:
    """Whether reading ``fd`` would not wait."""
    return bool(select.select([fd], [], [], 0)[0])


def _picklable(error: Exception) -> Exception:
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")


def _two_processes(pieces: int) -> bool:
    """Two to 255 pieces of work to share, two CPUs this process may run on, ``os.fork``, one thread (a fork copies
    no other thread, nor frees a lock one holds: the tool's API called from a threaded program works in one
    process), and no ``SGLANG_DRAFT_LAYOUT_JOBS=1``."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    alone = threading.active_count() == 1
    return 2 <= pieces < 256 and cpus >= 2 and hasattr(os, "fork") and alone and os.environ.get(JOBS, "") != "1"
