"""Write a plan's files all or none: through SIGINT, SIGTERM and SIGHUP, OS errors and full disks.

Each file is written to a temp file beside it (``.NAME.sglang-draft-layout-XXXXXXXX.tmp``),
flushed to disk and renamed onto it; its original is first hard-linked aside under the same
pattern, so putting it back is a rename that needs no free space (where the filesystem has no
hard links, the original's bytes are written back instead). A symlinked file is written where
its link leads; the link stays.

Signals are held while the files are written: SIGINT, SIGTERM and SIGHUP are noted, and
acted on only between files, where every file is either its original or its new self. There,
every file written is put back (the tree ends as it was), or, if the last file was already
renamed into place, the tree stays fully patched; ``Interrupted`` says which. Putting files
back cannot be interrupted by a second signal (SIGKILL aside: then re-running ``apply``
finishes the tree, and removes the temp files left).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import signal
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

from .target import TargetError

TEMP_TAG = "sglang-draft-layout"
#: the tool's own temp files (and originals kept aside): ``.NAME.sglang-draft-layout-XXXXXXXX.tmp``
TEMP_NAME = re.compile(rf"^\.(?P<name>.+)\.{TEMP_TAG}-[0-9a-z_]{{8}}\.tmp$")
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

#: a test hook, called with (point, path) at "temp written" (before the rename), "renamed"
#: and "restoring" (before a file is put back); it may send a signal or raise an OSError
fault_hook: Optional[Callable[[str, Path], None]] = None


class TransactionError(TargetError):
    """Writing failed; the message names the file, the action and what the tree now holds."""


class Interrupted(Exception):
    """A signal stopped the command; the message says what the tree holds."""

    def __init__(self, signum: int, outcome: str) -> None:
        self.signum = signum
        super().__init__(f"interrupted ({signal.Signals(signum).name}): {outcome}")

    @property
    def exit_code(self) -> int:
        """The shell's code for a command a signal ended: 130 SIGINT, 143 SIGTERM, 129 SIGHUP."""
        return 128 + self.signum


@dataclass(frozen=True)
class FileWrite:
    """One file to write: ``before`` its bytes as planned (None: the file is created), ``after`` the new ones."""

    path: Path  # as the plan names it (a symlink, perhaps)
    real: Path  # where the bytes go: the path with every symlink resolved
    before: Optional[bytes]
    after: bytes


def temp_path(path: Path) -> Path:
    """A fresh name of the tool's own pattern beside ``path``."""
    return path.with_name(f".{path.name}.{TEMP_TAG}-{secrets.token_hex(4)}.tmp")


def leftovers(folders: Sequence[Path]) -> list[Path]:
    """The tool's temp files in ``folders`` (an interrupted or killed run's)."""
    found = []
    for folder in dict.fromkeys(folders):
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            found += [
                Path(entry.path)
                for entry in os.scandir(folder)
                if TEMP_NAME.match(entry.name) and entry.is_file(follow_symlinks=False)
            ]
    return sorted(found)


class SignalGate:
    """SIGINT, SIGTERM and SIGHUP: noted while ``holding`` (acted on at ``check``), else raised at once."""

    def __init__(self) -> None:
        self.holding = True
        self.pending: Optional[int] = None

    def __call__(self, signum: int, _frame: object) -> None:
        if self.pending is None:
            self.pending = signum
        if not self.holding:
            raise Interrupted(signum, "nothing changed")

    def check(self) -> None:
        """Raise ``Interrupted`` for a signal noted (where nothing has been written)."""
        if self.pending is not None:
            raise Interrupted(self.pending, "nothing changed")


@contextlib.contextmanager
def signal_gate() -> Iterator[SignalGate]:
    """The SignalGate handling the three signals while inside: the one installed already, or a
    new one, holding (in the main thread: Python sets handlers only there; in another thread
    the signals keep their handlers)."""
    installed = signal.getsignal(signal.SIGTERM)
    if isinstance(installed, SignalGate):
        yield installed
        return
    gate = SignalGate()
    if threading.current_thread() is not threading.main_thread():
        yield gate
        return
    previous = {signum: signal.signal(signum, gate) for signum in SIGNALS}
    try:
        yield gate
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


class _Failed(Exception):
    """An OS error at one action on one path."""

    def __init__(self, path: Path, action: str, error: OSError) -> None:
        super().__init__(f"{path}: {action}: {error.strerror or error}")
        self.path, self.error = path, error


@contextlib.contextmanager
def _action(path: Path, action: str) -> Iterator[None]:
    try:
        yield
    except OSError as error:
        raise _Failed(path, action, error) from error


def _hook(point: str, path: Path) -> None:
    if fault_hook is not None:
        fault_hook(point, path)


def _read_only(path: Path) -> bool:
    """No write permission bit (root writes anyway: the bits say what the owner wants), or no access."""
    return not stat.S_IMODE(path.stat().st_mode) & 0o222 or not os.access(path, os.W_OK)


def _existing_ancestor(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


def preflight(writes: Sequence[FileWrite]) -> None:
    """Refuse before writing anything: a file changed since planning, a read-only file or folder."""
    for write in writes:
        if write.before is None:
            if write.real.exists():
                raise TargetError(f"{write.path}: changed while planning; nothing written")
            folder = _existing_ancestor(write.real.parent)
        else:
            if _read_only(write.real):
                raise TargetError(f"{write.path}: read-only; nothing written")
            if write.real.read_bytes() != write.before:
                raise TargetError(f"{write.path}: changed while planning; nothing written")
            folder = write.real.parent
        if _read_only(folder):
            raise TargetError(f"{folder}/: read-only folder (holds {write.path.name}); nothing written")


def _replace(path: Path, data: bytes) -> None:
    """Write ``data`` to a temp file beside ``path`` (flushed to disk) and rename it onto ``path``,
    keeping its mode (and owner, where allowed)."""
    info = path.stat()

    def keep_mode_and_owner(temp: Path) -> None:
        os.chmod(temp, stat.S_IMODE(info.st_mode))
        with contextlib.suppress(PermissionError):
            os.chown(temp, info.st_uid, info.st_gid)

    _write_through_temp(path, data, 0o600, keep_mode_and_owner)


def _create(path: Path, data: bytes, created_folders: list[Path]) -> None:
    """Write the new file ``path`` (mode 0666 less the umask), making its missing folders."""
    for folder in [f for f in reversed(path.parents) if not f.exists()]:
        created_folders.append(folder)
        with _action(folder, "creating folder"):
            folder.mkdir()
    umask = os.umask(0)
    os.umask(umask)
    _write_through_temp(path, data, 0o666 & ~umask)


def _write_through_temp(path: Path, data: bytes, mode: int, finish: Optional[Callable[[Path], None]] = None) -> None:
    """``data`` into a new temp file beside ``path`` (created with ``mode``, flushed to disk,
    then ``finish``-ed), renamed onto ``path``; the temp file never outlives a failure."""
    temp = temp_path(path)
    try:
        with _action(path.parent, "writing a temp file into the folder"):
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with _action(path, "writing"):
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            if finish is not None:
                finish(temp)
        _hook("temp written", path)
        with _action(path, "renaming"):
            os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


def _keep_aside(path: Path) -> Optional[Path]:
    """A hard link to the file's original under the temp pattern; None where the filesystem has none."""
    aside = temp_path(path)
    try:
        os.link(path, aside)
    except OSError as error:
        if error.errno in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK, errno.ENOSYS):
            return None
        raise _Failed(path.parent, "keeping the original aside", error) from error
    return aside


@dataclass
class _Transaction:
    writes: Sequence[FileWrite]
    gate: SignalGate
    started: list[FileWrite] = field(default_factory=list)
    aside: dict[Path, Path] = field(default_factory=dict)  # real path -> its original, hard-linked
    created_folders: list[Path] = field(default_factory=list)

    def run(self) -> None:
        try:
            for write in self.writes:
                self.gate.check()  # caught below: the files written are put back
                self.started.append(write)
                if write.before is None:
                    _create(write.real, write.after, self.created_folders)
                else:
                    kept = _keep_aside(write.real)
                    if kept is not None:
                        self.aside[write.real] = kept
                    _replace(write.real, write.after)
                _hook("renamed", write.path)
            for write in self.writes:
                with _action(write.path, "reading back"):
                    if write.real.read_bytes() != write.after:
                        raise TransactionError(f"{write.path}: reads back other than written")
        except Interrupted as interrupted:
            raise Interrupted(interrupted.signum, self._restore("nothing changed")) from None
        except _Failed as failed:
            raise TransactionError(f"{failed}; {self._restore()}") from None
        except TransactionError as error:
            raise TransactionError(f"{error}; {self._restore()}") from None
        except OSError as error:
            failed = _Failed(self.started[-1].path, "writing", error)
            raise TransactionError(f"{failed}; {self._restore()}") from None
        except BaseException:
            self._restore()
            raise
        for kept in self.aside.values():
            with contextlib.suppress(OSError):  # one left is reported by check and removed by apply
                os.unlink(kept)
        if self.gate.pending is not None:
            raise Interrupted(self.gate.pending, f"all {len(self.writes)} files already patched")

    def _restore(self, unchanged: str = "nothing written") -> str:
        """Put back every file started (signals stay held); what the tree now holds, in words."""
        restored = 0
        try:
            for write in reversed(self.started):
                with _action(write.path, "restoring"):
                    _hook("restoring", write.path)
                    restored += self._restore_one(write)
            for folder in reversed(self.created_folders):
                with contextlib.suppress(OSError):
                    folder.rmdir()
        except _Failed as failed:
            return (
                f"then {failed.path}: restoring: {failed.error.strerror or failed.error}: the tree is mixed; "
                "fix that and re-run apply"
            )
        if not restored:
            return unchanged
        return f"{restored} file{'s' if restored > 1 else ''} restored, nothing changed"

    def _restore_one(self, write: FileWrite) -> int:
        """Put one file back; 1 if it had changed."""
        kept = self.aside.pop(write.real, None)
        if write.before is None:
            if not write.real.exists():
                return 0
            write.real.unlink()
            return 1
        if kept is not None:
            if os.path.samestat(kept.stat(), write.real.stat()):  # not replaced yet
                kept.unlink()
                return 0
            os.replace(kept, write.real)
            return 1
        if write.real.read_bytes() == write.before:
            return 0
        _replace(write.real, write.before)
        return 1


def write(writes: Sequence[FileWrite]) -> None:
    """Write every file or none (see the module's docstring)."""
    with signal_gate() as gate:
        gate.holding = True
        preflight(writes)
        _Transaction(writes, gate).run()
