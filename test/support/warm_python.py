"""A warm interpreter for the proof venv: a ``python3`` that starts with torch and transformers loaded.

Every process the fork CI tests start in the proof venv (run_suite.py, the written tests, the stand-in
servers) imports SGLang, and SGLang's import spends most of its 11 s on this machine importing torch,
torch._dynamo and transformers' Llama model (sglang/__init__.py's transformers patches). Here one server
process imports those third-party modules once (never a ``sglang`` module: it checks) and forks a child per
command; the ``python3`` it writes is a small client that hands the server its command line, working
folder, environment and standard streams, and exits with the child's status. Third-party modules never
import SGLang, so a child imports the fork's SGLang as a fresh interpreter would (the argument
import_probe.py's --mode first makes); its sys.path, sitecustomize, sys.argv, sys.executable (this
``python3``), stdio buffering and exit (non-daemon threads joined, atexit run; or ``os._exit``'s, at
once) are a fresh one's too.
The server installs import_probe's torchvision stand-in before it imports anything, as every process
these tests start does first (run_on_cpu.py, the stand-in site's sitecustomize): transformers records
at import whether torchvision is there.

Signals: SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to the client go to the child's process group (each
child leads its own: the clients it starts, and so their children, get them too), and the client then ends
by the same signal; when the client dies otherwise (SIGKILL, as kill_process_tree and ``timeout -k`` send),
the child kills its process group. A killed tree ends as a real one does. Anything the client does not
handle (options other than -u, -B, -c and -m) runs in the venv's own interpreter.

    server:  VENV/bin/python warm_python.py serve SOCKET
    python3: start(VENV/bin/python, FOLDER) writes FOLDER/bin/python3 (and python) and starts the server
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: imported once by the server: import_probe's third-party set and the heavy part of SGLang's own import
EXTRA_PRELOAD = ("torch._dynamo", "torch._inductor.compile_fx", "transformers.models.llama.modeling_llama")
#: the environment the preloaded modules read at import (run_fork_gpu_test.sh exports the same)
PRELOAD_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
_HEADER = struct.Struct("!I")
CLIENT = """#!{python} -SE
import sys
sys.path.insert(0, {support!r})
from warm_python import client
client({socket!r}, {python!r})
"""


def _recv_exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


# ---- the client: the ``python3`` a test puts first on PATH ------------------------------------------


def _command(args: list[str]) -> tuple[dict, bool]:
    """What to run (``{"path"|"module"|"code": ..., "argv": [...]}``) and -u, or ({}, False) when the
    command line has an option the server does not handle."""
    unbuffered = False
    while args and args[0].startswith("-") and args[0] != "-":
        option = args.pop(0)
        if option in ("-c", "-m") and args:
            value = args.pop(0)
            kind = "code" if option == "-c" else "module"
            return {kind: value, "argv": [option, *args]}, unbuffered
        if option == "-u":
            unbuffered = True
        elif option != "-B":
            return {}, False
    if not args or args[0] == "-":
        return {}, False
    return {"path": args[0], "argv": args}, unbuffered


def client(socket_path: str, python: str) -> None:
    args = sys.argv[1:]
    command, unbuffered = _command(list(args))
    conn = socket.socket(socket.AF_UNIX)
    try:
        if not command:
            raise OSError("not handled")
        conn.connect(socket_path)
    except OSError:
        os.execv(python, [python, *args])
    request = json.dumps(
        {**command, "unbuffered": unbuffered, "cwd": os.getcwd(), "env": dict(os.environ), "executable": sys.argv[0]}
    ).encode()
    socket.send_fds(conn, [_HEADER.pack(len(request)) + request], [0, 1, 2])
    pid = _HEADER.unpack(_recv_exactly(conn, _HEADER.size))[0]
    forwarded = []

    def forward(number: int, frame: object) -> None:
        forwarded.append(number)
        os.killpg(pid, number)  # the child's group, as a signal to a process group reaches all of it

    for number in SIGNALS:
        signal.signal(number, forward)
    try:
        status = _HEADER.unpack(_recv_exactly(conn, _HEADER.size))[0]
    except EOFError:  # killed: end as the child did
        if forwarded:
            signal.signal(forwarded[-1], signal.SIG_DFL)
            os.kill(os.getpid(), forwarded[-1])
        sys.stderr.write("warm python: the process ended without an exit status\n")
        status = 1
    os._exit(status)


# ---- the server -------------------------------------------------------------------------------------


def serve(socket_path: str) -> None:
    """Import the preloaded modules, then fork a child per connection."""
    import importlib

    sys.path.insert(0, str(HERE))
    from import_probe import PRELOAD, _StandInFinder

    sys.meta_path.insert(0, _StandInFinder())  # installed first, as every process these tests start does
    for name in PRELOAD + EXTRA_PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    loaded = sorted(name for name in sys.modules if name == "sglang" or name.startswith("sglang."))
    assert not loaded, f"a preloaded module imported SGLang: {loaded[:5]}"
    sys.path.remove(str(HERE))
    base_path = list(sys.path[1:])  # the interpreter's own (stdlib, site-packages), not this script's folder
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children report their own status; none is waited for
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(socket_path + ".new")
    listener.listen(64)
    os.replace(socket_path + ".new", socket_path)  # ready
    while True:
        conn, _ = listener.accept()
        data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 3)  # the streams come with the first bytes
        size = _HEADER.unpack(data[: _HEADER.size])[0]
        data = data[_HEADER.size :]
        data += _recv_exactly(conn, size - len(data))
        if os.fork() == 0:
            listener.close()
            _child(conn, json.loads(data), fds, base_path)  # never returns
        conn.close()
        for fd in fds:
            os.close(fd)


def _stdio(unbuffered: bool) -> None:
    import io

    def stream(fd: int, mode: str, **options) -> io.TextIOWrapper:
        raw = io.FileIO(fd, mode, closefd=False)
        buffered = io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw)
        return io.TextIOWrapper(buffered, encoding="utf-8", **options)

    sys.stdin = sys.__stdin__ = stream(0, "r")
    sys.stdout = sys.__stdout__ = stream(1, "w", write_through=unbuffered)
    sys.stderr = sys.__stderr__ = stream(2, "w", errors="backslashreplace", line_buffering=True)


def _watch(conn: socket.socket, exiting) -> None:
    """The client gone before this process exits (killed): this process group is killed too."""
    conn.recv(1)
    if not exiting.is_set():
        os.killpg(0, signal.SIGKILL)


def _child(conn: socket.socket, request: dict, fds: list[int], base_path: list[str]) -> None:
    import runpy
    import threading
    import types

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setpgid(0, 0)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    _stdio(request["unbuffered"] or bool(os.environ.get("PYTHONUNBUFFERED")))
    if "path" in request:
        first = os.path.dirname(os.path.realpath(request["path"]))
    else:
        first = os.getcwd() if "module" in request else ""
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [first, *map(os.path.abspath, extra), *base_path]
    sys.argv = list(request["argv"])
    sys.executable = request["executable"]
    sys.orig_argv = [sys.executable, *request["argv"]]
    conn.sendall(_HEADER.pack(os.getpid()))

    status = 0
    exiting = threading.Event()
    real_exit, me = os._exit, os.getpid()

    def _exit(code: int) -> None:  # a program that ends itself at once (the tool's console script): its status
        if os.getpid() == me:  # not a process the program forked
            exiting.set()
            conn.sendall(_HEADER.pack(code & 0xFF))
        real_exit(code)

    os._exit = _exit
    try:
        threading.Thread(target=_watch, args=(conn, exiting), daemon=True).start()
        sys.modules.pop("sitecustomize", None)
        try:
            import sitecustomize  # noqa: F401  (the one on PYTHONPATH, as site imports it)
        except ImportError:
            pass
        if "path" in request:
            runpy.run_path(request["path"], run_name="__main__")
        elif "module" in request:
            runpy._run_module_as_main(request["module"])  # what python -m runs
        else:
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(request["code"], "<string>", "exec"), main.__dict__)
    except SystemExit as exit:
        status = _exit_status(exit.code)
    except BaseException:
        import traceback

        traceback.print_exc()
        status = 1
    threading._shutdown()  # what interpreter exit does: join the non-daemon threads, then atexit
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    _exit(status)


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def start(python: Path, folder: Path):
    """Start the server for the venv's ``python`` under ``folder``; returns (its ``python3``, the server
    process). Stop it with ``stop(process)``."""
    import subprocess

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "warm.sock"
    path.unlink(missing_ok=True)  # a server's from an earlier run
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    server = subprocess.Popen(
        [str(python), str(Path(__file__).resolve()), "serve", str(path)],
        env={**env, **PRELOAD_ENV},
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while not path.exists():
        if server.poll() is not None or time.monotonic() > deadline:
            stop(server)
            raise RuntimeError(f"the warm python server for {python} did not start (rc {server.returncode})")
        time.sleep(0.1)
    bin_dir = folder / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("python3", "python"):
        shim = bin_dir / name
        shim.write_text(CLIENT.format(python=str(python), support=str(HERE), socket=str(path)))
        shim.chmod(0o755)
    return bin_dir / "python3", server


def stop(server) -> None:
    """Stop the server (its children, each in its own process group, end with their clients)."""
    server.kill()
    server.wait()


if __name__ == "__main__" and sys.argv[1:2] == ["serve"]:
    serve(sys.argv[2])
