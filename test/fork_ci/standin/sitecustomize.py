"""Loaded by the interpreter from the stand-in site folder (test_run_fork_gpu_test.py) in
every process: serves torchvision from import_probe's stand-in (0.5.12's CUDA-only import)
and ``sglang.launch_server`` from server.py, so that the generated GPU test and
run_fork_gpu_test.sh run on CPU against a server that answers like the H200's."""

import importlib.machinery
import importlib.util
import os
import sys

sys.path.insert(0, os.environ["DRAFT_LAYOUT_TEST_SUPPORT"])
from import_probe import _StandInFinder  # noqa: E402

SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "server.py")


class _ServerFinder:
    """Finds ``sglang.launch_server`` in server.py (``python -m sglang.launch_server``)."""

    def find_spec(self, name, path=None, target=None):
        if name != "sglang.launch_server":
            return None
        return importlib.util.spec_from_file_location(name, SERVER)


sys.meta_path[:0] = [_ServerFinder(), _StandInFinder()]
