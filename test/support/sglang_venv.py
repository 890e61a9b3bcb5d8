"""A virtualenv in which SGLang's attention backends and speculative modules import on CPU.

``proof_venv(version)`` builds it once into the cache (``$SGLANG_DRAFT_LAYOUT_CACHE`` or
``~/.cache/sglang-draft-layout``, folder ``proof-venvs/``), keyed by the SGLang version, the
Python version and the package list below, and returns its interpreter. Everything comes
from PyPI through pip (the machine's pip settings apply: torch==2.13.0 is the CPU build that
lies on this kind of machine's disk).

The venv sees the system site-packages (``--system-site-packages``) so that a torch 2.13.0
and triton 3.9.0 already installed there are reused, not installed again (1.9 GB); a
constraints file pins them, so pip installs exactly those versions into the venv when the
system lacks them and can never pull another torch (SGLang's own metadata asks for
torch==2.11.0, a CUDA build of several GB, which is why sglang goes in with --no-deps).
The other packages are pinned to the versions the list was found with, so the venv's copy
wins over whatever the system has.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from sglang_draft_layout.releases import cache_dir, release_wheel

PINNED = ("torch==2.13.0", "triton==3.9.0")

# What sglang 0.5.12's attention backends (flashinfer, flashinfer_mla, triton, aiter,
# deepseek_v4), spec_utils, eagle_utils, attention_registry, model_runner and
# schedule_batch import, found by importing them in an empty venv (torch + triton only)
# and adding the missing distribution until nothing was missing. transformers and openai
# are pinned to what sglang 0.5.12 requires (a newer transformers already registers a
# 'qwen3_asr' config and SGLang's own registration then fails). apache-tvm-ffi (the
# version 0.5.12 requires) is only for the DeepSeek-V4 backend, setproctitle only for the
# EAGLE workers (which then stop at sgl_kernel, a CUDA-only package). datasets is for
# sglang.test.test_utils (CustomTestCase; it imports datasets at module level), which the
# registered test that `apply` writes into a fork imports (test/fork_ci/).
PACKAGES = {
    "0.5.12": (
        "numpy==2.4.6",
        "orjson==3.13.0",
        "psutil==7.2.2",
        "pybase64==1.5.1",
        "requests==2.34.2",
        "packaging==26.4",
        "pillow==13.0.0",
        "starlette==1.10.0",
        "tqdm==4.70.1",
        "ipython==9.18.1",
        "pydantic==2.14.4",
        "aiohttp==3.14.5",
        "transformers==5.6.0",
        "pyzmq==27.3.0",
        "openai==2.6.1",
        "partial-json-parser==0.2.1.1.post7",
        "dill==0.4.1",
        "sentencepiece==0.2.3",
        "einops==0.8.2",
        "compressed-tensors==0.20.1",
        "gguf==0.19.0",
        "msgspec==0.22.0",
        "setproctitle==1.3.8",
        "apache-tvm-ffi==0.1.9",
        "datasets==5.2.0",
    ),
}
# SGLang 0.5.3 to 0.5.4.post3 import, besides 0.5.12's set, fastapi at module level
# (sglang/srt/utils/common.py; uvicorn beside it) and xgrammar (through
# sglang/srt/entrypoints/openai/protocol.py), found the same way; xgrammar needs a newer
# apache-tvm-ffi than 0.5.12's pin (no DeepSeek-V4 there). Older releases, and 0.5.5 to
# 0.5.7, do not import on this CPU machine with any set (docs/sites.md says why).
PACKAGES["0.5.3"] = tuple(p for p in PACKAGES["0.5.12"] if not p.startswith("apache-tvm-ffi==")) + (
    "apache-tvm-ffi==0.1.15.post2",
    "fastapi==0.165.0",
    "uvicorn==0.54.0",
    "xgrammar==0.2.9",
)


def _pip(python: Path, *args: str, log: Path) -> None:
    with log.open("a") as out:
        out.write(f"$ pip {' '.join(args)}\n")
        out.flush()
        subprocess.run(
            [str(python), "-m", "pip", "--disable-pip-version-check", *args],
            check=True,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def proof_venv(version: str = "0.5.12") -> Path:
    """The venv's python, with sglang==version (--no-deps) and PACKAGES[version] installed.

    Built once under a file lock (concurrent test runs wait for one build); a build that
    did not finish is thrown away and redone. The build log and its timing are kept in the
    venv folder (build.log, build.json). Raises CalledProcessError if pip fails."""
    packages = PACKAGES[version]
    key = hashlib.sha256(
        json.dumps([version, sys.version_info[:2], PINNED, packages, "system-site"]).encode()
    ).hexdigest()[:10]
    base = cache_dir() / "proof-venvs"
    base.mkdir(parents=True, exist_ok=True)
    root = base / f"sglang-{version}-py{sys.version_info[0]}{sys.version_info[1]}-{key}"
    python = root / "bin" / "python"
    done = root / "build.json"
    if done.exists():
        return python

    with open(base / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():  # built by another process while this one waited
            return python
        if root.exists():
            shutil.rmtree(root)
        start = time.monotonic()
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(root)], check=True)
        log = root / "build.log"
        constraints = root / "constraints.txt"
        constraints.write_text("\n".join(PINNED) + "\n")
        _pip(python, "install", "-c", str(constraints), *PINNED, *packages, log=log)
        _pip(python, "install", "--no-deps", str(release_wheel(version)), log=log)
        done.write_text(
            json.dumps(
                {
                    "sglang": version,
                    "packages": list(PINNED + packages),
                    "build_seconds": round(time.monotonic() - start, 1),
                },
                indent=1,
            )
            + "\n"
        )
    return python


def probe_imports(python: Path, tree: Path, modules: list[str], mode: str = "together", timeout: float = 600) -> dict:
    """Run test/support/import_probe.py in the venv with tree (the folder holding
    ``sglang/``) first on PYTHONPATH; returns its report (see import_probe.py)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = str(tree)
    env.setdefault("SGLANG_LOG_LEVEL", "error")
    # the server sets it (server_args.py) before the backends load; before 0.5.4 the
    # FlashInfer backends read it at import with os.environ[...]
    env.setdefault("SGLANG_ENABLE_TORCH_COMPILE", "0")
    probe = Path(__file__).with_name("import_probe.py")
    proc = subprocess.run(
        [str(python), str(probe), "--mode", mode, *modules],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=str(tree),
    )
    for line in proc.stdout.splitlines():
        if line.startswith("IMPORT-PROBE "):
            return json.loads(line[len("IMPORT-PROBE ") :])
    raise RuntimeError(f"import probe failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n" f"{proc.stderr[-3000:]}")


def proof_venv_or_skip(version: str) -> Path:
    """For tests: ``proof_venv(version)``, or pytest.skip naming the build log's tail when the
    wheel cannot be downloaded or pip cannot install a needed package (a skip CI counts as a failure)."""
    import pytest

    from support.sglang_release import require_release

    require_release(version)
    try:
        return proof_venv(version)
    except subprocess.CalledProcessError as exc:
        log = Path(exc.cmd[0]).parents[1] / "build.log"
        tail = log.read_text()[-1500:] if log.exists() else ""
        pytest.skip(f"the proof venv could not be installed ({exc}); {log}:\n{tail}")
