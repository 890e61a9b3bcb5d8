"""The warm interpreter the fork CI tests run the proof venv's processes with (support/warm_python.py),
here on this venv's own python: a command runs as in a fresh interpreter (argv, sys.path, environment,
folder, streams, exit status, atexit), signals end it as they end a real one, and a client killed by
SIGKILL takes its child's processes with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import warm_python


@pytest.fixture(scope="module")
def python3(tmp_path_factory):
    folder = tmp_path_factory.mktemp("warm")
    python3, server = warm_python.start(Path(sys.executable), folder)
    yield python3
    warm_python.stop(server)


def run(python3: Path, *args: str, **options) -> subprocess.CompletedProcess:
    return subprocess.run([str(python3), *args], capture_output=True, text=True, timeout=60, **options)


def test_a_command_runs_as_in_a_fresh_interpreter(python3, tmp_path):
    code = (
        "import os, sys; print(sys.argv, sys.path[0] == '', sys.executable, os.getcwd(), os.environ['X']); sys.exit(3)"
    )
    done = run(python3, "-c", code, "arg", cwd=tmp_path, env={"X": "y", "PATH": os.environ["PATH"]})
    assert done.returncode == 3, done.stderr
    assert done.stdout == f"['-c', 'arg'] True {python3} {tmp_path} y\n"
    assert "torch" in run(python3, "-c", "import sys; print(sorted(sys.modules))").stdout  # it started warm
    script = tmp_path / "script.py"
    script.write_text(
        "import atexit, sys\natexit.register(print, 'at exit')\nprint(sys.argv, sys.path[0], sys.stdin.read())\n"
    )
    done = run(python3, str(script), "a", input="in")
    assert (done.returncode, done.stdout) == (0, f"[{str(script)!r}, 'a'] {tmp_path} in\nat exit\n")
    raised = run(python3, "-c", "raise ValueError('boom')")
    assert raised.returncode == 1 and raised.stderr.rstrip().endswith("ValueError: boom")
    assert run(python3, "-m", "json.tool", input='{"a": 1}').stdout == '{\n    "a": 1\n}\n'
    ended = run(
        python3, "-c", "import atexit, os; atexit.register(print, 'at exit'); print('x', flush=True); os._exit(4)"
    )
    assert (ended.returncode, ended.stdout, ended.stderr) == (4, "x\n", "")  # at once: no atexit, as a fresh one
    forks = "import os\nif os.fork() == 0:\n    os._exit(5)\nprint(os.waitstatus_to_exitcode(os.wait()[1]))"
    done = run(python3, "-c", forks)  # a child the program forks ending at once is its own business
    assert (done.returncode, done.stdout, done.stderr) == (0, "5\n", "")


def test_an_option_it_does_not_handle_runs_in_the_venvs_own_interpreter(python3):
    done = run(python3, "-X", "importtime", "-c", "import sys; print('torch' in sys.modules)")
    assert (done.returncode, done.stdout) == (0, "False\n") and "import time:" in done.stderr


def test_signals_end_it_and_a_killed_client_takes_its_processes_along(python3, tmp_path):
    sleeper = subprocess.Popen([str(python3), "-c", "import time; time.sleep(60)"])
    time.sleep(1)
    sleeper.terminate()
    assert sleeper.wait(timeout=30) == -signal.SIGTERM
    marker = tmp_path / "grandchild"
    grandchild_code = tmp_path / "grandchild.py"
    grandchild_code.write_text(f"import os, time\nopen({str(marker)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)\n")
    starter = (
        f"import subprocess, sys, time; subprocess.Popen([sys.executable, {str(grandchild_code)!r}]); time.sleep(60)"
    )
    parent = subprocess.Popen([str(python3), "-c", starter])
    deadline = time.monotonic() + 30
    while not (marker.exists() and marker.read_text()):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    grandchild = int(marker.read_text())
    parent.kill()
    parent.wait(timeout=30)
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{grandchild}") and Path(f"/proc/{grandchild}/stat").read_text().split()[2] != "Z":
        assert time.monotonic() < deadline, "the killed client's grandchild is still running"
        time.sleep(0.1)
