"""Proof tests: SGLang's real code (from PyPI wheels) run on CPU.

TRITON_INTERPRET must be set before triton builds a kernel; set it as early as possible.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

# test/support/ holds the helpers shared by these tests.
_TEST_DIR = str(Path(__file__).resolve().parents[1])
if _TEST_DIR not in sys.path:
    sys.path.insert(0, _TEST_DIR)
