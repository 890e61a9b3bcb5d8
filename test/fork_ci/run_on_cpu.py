"""Run a test file as ``python3 FILE`` does, with SGLang's CUDA-only torchvision stood in.

    VENV/bin/python run_on_cpu.py FILE [ARGS...]

SGLang 0.5.12 imports torchvision at module level (sglang/srt/utils/common.py), whose PyPI
build cannot load beside a CPU torch; import_probe's stand-in finder serves it instead
(nothing the generated CPU test runs calls it). The exit status is the file's.
"""

import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from import_probe import _StandInFinder  # noqa: E402

sys.meta_path.insert(0, _StandInFinder())
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
