"""The harness's verdicts kept on disk between runs, as black keeps what it formatted.

A tree's draft paths give the same verdicts while the texts judged, every file the harness read for
them, the modules it looked for being there or not, this tool's own code and Python are the same:
``check`` (a pre-commit hook, a CI step) then reads them instead of running the paths again. An entry
is the verdicts of one ``judge_tree`` call, the hash of each file its run read and whether each module
it only looked for is there; it is used only while each of those files still hashes the same and each
of those modules is still there or not. Kept under ``releases.cache_dir()`` / ``verdicts``
($SGLANG_DRAFT_LAYOUT_CACHE moves it; deleting the folder clears it); a cache that cannot be read or
written is no cache.
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
from typing import Iterator, Mapping, Optional, Union

from . import releases
from .harness import judged

#: entries kept; past it the least recently written go
KEPT = 4096


def _is_file(path: str) -> bool:
    """``Path.is_file``'s answer, with ``os`` (a plan asks about a thousand paths on 0.5.23, most of them modules the
    harness looked for and did not find: a few microseconds each, not pathlib's tens)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError as error:  # no such file, or no way to it; else the error
        if error.errno not in (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP):
            raise
        return False
    except ValueError:  # a name the file system cannot hold
        return False


def _file_digest(package: Optional[Path], relative: str) -> Optional[str]:
    """The file's hash, None where it is no regular file."""
    path = os.path.join(package, relative) if package is not None else None
    if path is None or not _is_file(path):
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
    the run asked about (``apart.read_by``): the hash of each whose text it read, those it read a given text in place
    of included (which lines a rewrite wrote), and whether each other is there (a module it looked for). Each file is
    asked about once a store (a plan's: it writes nothing; ``check`` of a tree it rewrites saves the tree before and
    after)."""

    def __init__(self, folder: Path) -> None:
        self.folder, self._code = folder, _code_digest()
        self._seen: dict[tuple[Optional[Path], str, bool], Union[Optional[str], bool]] = {}

    def _state(self, package: Optional[Path], relative: str, text: bool) -> Union[Optional[str], bool]:
        """What a judging that read the file's ``text`` (else asked only whether it is there) depends on: its hash
        (None: there is none), else whether it is there."""
        if (package, relative, text) not in self._seen:
            self._seen[package, relative, text] = (
                _file_digest(package, relative)
                if text
                else package is not None and _is_file(os.path.join(package, relative))
            )
        return self._seen[package, relative, text]

    def _entry(self, key: tuple) -> Path:
        # not the package's place: the verdicts name files under it, so a copy of a tree shares its entries
        return self.folder / hashlib.sha1(repr((self._code, key[1:])).encode()).hexdigest()

    def load(self, key: tuple, package: Optional[Path]) -> Optional[dict]:
        try:
            read, verdicts = pickle.loads(self._entry(key).read_bytes())
        except Exception:  # none, or unreadable: judged again
            return None
        if any(self._state(package, relative, not isinstance(seen, bool)) != seen for relative, seen in read.items()):
            return None
        return verdicts

    def save(self, key: tuple, package: Optional[Path], verdicts: dict, read: Mapping[str, bool]) -> None:
        entry = ({relative: self._state(package, relative, text) for relative, text in read.items()}, verdicts)
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
