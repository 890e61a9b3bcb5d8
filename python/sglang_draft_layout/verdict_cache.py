"""The harness's verdicts kept on disk between runs, as black keeps what it formatted.

A tree's draft paths give the same verdicts while the texts judged, every file the harness read for
them, this tool's own code and Python are the same: ``check`` (a pre-commit hook, a CI step) then
reads them instead of running the paths again. An entry is the verdicts of one ``judge_tree`` call
and the hash of each file its run read; it is used only while each of those files still hashes the
same. Kept under ``releases.cache_dir()`` / ``verdicts`` ($SGLANG_DRAFT_LAYOUT_CACHE moves it;
deleting the folder clears it); a cache that cannot be read or written is no cache.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import os
import pickle
import stat
import sys
import tempfile
from pathlib import Path
from typing import Collection, Iterator, Optional

from . import releases
from .harness import judged

#: entries kept; past it the least recently written go
KEPT = 4096


def _file_digest(package: Optional[Path], relative: str) -> Optional[str]:
    """The file's hash, None where it is no regular file (most of those a plan asks about are modules the harness looked
    for and did not find: with ``os``, not ``pathlib``, a few microseconds each)."""
    if package is None:
        return None
    path = os.path.join(package, relative)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
    except OSError as error:  # as ``Path.is_file`` answers: no such file (or no way to it), else the error
        if error.errno not in (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP):
            raise
        return None
    except ValueError:  # a name the file system cannot hold
        return None
    with open(path, "rb") as file:
        return hashlib.sha1(file.read()).hexdigest()


@functools.lru_cache(maxsize=None)
def _code_digest() -> str:
    """This tool's own code and the Python running it: a change to either is another cache (read once a process:
    every plan makes a store)."""
    sha = hashlib.sha1(sys.version.encode())
    for path in sorted(Path(__file__).parent.rglob("*.py")):
        sha.update(path.as_posix().encode() + path.read_bytes())
    return sha.hexdigest()


class DiskStore:
    """``judged.judge_tree``'s store: ``load(key, package)`` the verdicts kept for ``key`` (None: none, or
    a file they came from changed), ``save(key, package, verdicts, read)`` with the files (under the package)
    the run read, those it read a given text in place of included (which lines a rewrite wrote). Each file is hashed
    once a store (a plan's: it writes nothing; ``check`` of a tree it rewrites saves the tree before and after)."""

    def __init__(self, folder: Path) -> None:
        self.folder, self._code = folder, _code_digest()
        self._digests: dict[tuple[Optional[Path], str], Optional[str]] = {}

    def _digest(self, package: Optional[Path], relative: str) -> Optional[str]:
        if (package, relative) not in self._digests:
            self._digests[package, relative] = _file_digest(package, relative)
        return self._digests[package, relative]

    def _entry(self, key: tuple) -> Path:
        # not the package's place: the verdicts name files under it, so a copy of a tree shares its entries
        return self.folder / hashlib.sha1(repr((self._code, key[1:])).encode()).hexdigest()

    def load(self, key: tuple, package: Optional[Path]) -> Optional[dict]:
        try:
            read, verdicts = pickle.loads(self._entry(key).read_bytes())
        except Exception:  # none, or unreadable: judged again
            return None
        if any(self._digest(package, relative) != digest for relative, digest in read.items()):
            return None
        return verdicts

    def save(self, key: tuple, package: Optional[Path], verdicts: dict, read: Collection[str]) -> None:
        entry = ({relative: self._digest(package, relative) for relative in read}, verdicts)
        with contextlib.suppress(OSError, pickle.PicklingError):
            self.folder.mkdir(parents=True, exist_ok=True)
            handle, temp = tempfile.mkstemp(dir=self.folder, prefix=".new-")
            with os.fdopen(handle, "wb") as file:
                pickle.dump(entry, file, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(temp, self._entry(key))
            self._prune()

    def _prune(self) -> None:
        entries = list(os.scandir(self.folder))
        if len(entries) > KEPT:
            entries.sort(key=lambda entry: entry.stat().st_mtime)
            for entry in entries[: len(entries) - KEPT]:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


@contextlib.contextmanager
def in_use(folder: Optional[Path] = None) -> Iterator[None]:
    """The harness keeps its verdicts in ``folder`` (default: the tool's cache) while the block runs."""
    outer, judged.store = judged.store, DiskStore(folder or releases.cache_dir() / "verdicts")
    try:
        yield
    finally:
        judged.store = outer
