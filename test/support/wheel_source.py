"""Files of a cached SGLang release wheel, read without unpacking it."""

from __future__ import annotations

import zipfile

from sglang_draft_layout.releases import release_wheel


def wheel_source(version: str, path: str) -> str:
    """The text of ``path`` (e.g. ``sglang/bench_serving.py``) as shipped in the sglang==version wheel."""
    with zipfile.ZipFile(release_wheel(version)) as wheel:
        return wheel.read(path).decode()
