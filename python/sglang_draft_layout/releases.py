"""Fetch SGLang release wheels from PyPI into a cache and unpack scratch copies."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def cache_dir() -> Path:
    """Where wheels and unpacked trees are kept: $SGLANG_DRAFT_LAYOUT_CACHE or ~/.cache."""
    root = os.environ.get("SGLANG_DRAFT_LAYOUT_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "sglang-draft-layout"


def release_wheel(version: str) -> Path:
    """The cached wheel of sglang==version, downloaded with pip on first use."""
    import subprocess  # here, not above: every check reads cache_dir, only the demo and tests download

    wheels = cache_dir() / "wheels"
    found = sorted(wheels.glob(f"sglang-{version}-*.whl"))
    if not found:
        wheels.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--quiet",
                "--disable-pip-version-check",
                f"sglang=={version}",
                "-d",
                str(wheels),
            ],
            check=True,
        )
        found = sorted(wheels.glob(f"sglang-{version}-*.whl"))
    if not found:
        raise FileNotFoundError(f"pip downloaded no wheel for sglang=={version}")
    return found[0]


def unpack_release(version: str, dest: Path) -> Path:
    """Unpack the Python sources of sglang==version under dest; returns dest/sglang."""
    import zipfile

    with zipfile.ZipFile(release_wheel(version)) as wheel:
        members = [n for n in wheel.namelist() if n.startswith("sglang/") and n.endswith(".py")]
        wheel.extractall(dest, members)
    return Path(dest) / "sglang"
