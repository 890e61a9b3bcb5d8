"""Import SGLang modules on CPU and report, as JSON, what imported and what did not.

Run by the proof venv's interpreter (test/support/sglang_venv.py), with the tree to import
first on PYTHONPATH:

    PYTHONPATH=TREE VENV/bin/python import_probe.py --mode MODE MODULE...

--mode together  imports the modules one after another in this fresh interpreter.
--mode first     imports each module as the FIRST SGLang module of its own process: the probe
                 loads only third-party libraries (torch, triton, transformers, ...), checks
                 that no ``sglang`` module is loaded, then forks one child per module. Import
                 cycles between SGLang modules show only when a cycle's member is imported
                 first, and third-party modules never import SGLang, so this is as good as
                 one fresh interpreter per module, at a fraction of the time. Children
                 run min(4, cpu count) at a time.

One stand-in is installed before anything is imported: ``torchvision``. SGLang 0.5.12
imports ``torchvision.io.decode_jpeg`` at module level in ``sglang/srt/utils/common.py``
(and torchvision's transforms in some multimodal processors), but PyPI's torchvision is built
against CUDA torch: beside torch 2.13.0+cpu its ``_C.so`` cannot load libc10_cuda.so and the
import fails ("operator torchvision::nms does not exist"). Every ``torchvision`` attribute of
the stand-in is a placeholder that raises if called; nothing the proof covers calls it.

For each module the report holds ok, error ("Type: message" and the innermost frames), the
file it was loaded from, the draft layout helpers bound in its namespace, its public names,
and seconds taken.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
import time
import traceback
import types

HELPERS = ("draft_kv_indices_buffer_width", "draft_kv_indices_used_len", "per_step_draft_out_cache_loc")
PRELOAD = (
    "torch",
    "triton",
    "triton.language",
    "numpy",
    "transformers",
    "openai",
    "aiohttp",
    "huggingface_hub",
    "pydantic",
    "PIL.Image",
    "zmq",
    "requests",
    "compressed_tensors",
    "gguf",
    "sentencepiece",
    "einops",
    "IPython",
)


class _Placeholder:
    def __init__(self, name):
        self._name = name

    def __repr__(self):
        return f"<torchvision stand-in {self._name}>"

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"{self._name}: torchvision stand-in (CPU import proof)")

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self._name}.{attr}")

    def __mro_entries__(self, bases):  # lets a module subclass a stand-in class
        return (object,)


class _StandInLoader(importlib.abc.Loader):
    def __init__(self, placeholder):
        self.placeholder = placeholder

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        placeholder = self.placeholder

        def __getattr__(attr, _name=spec.name):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return placeholder(f"{_name}.{attr}")

        module.__getattr__ = __getattr__
        return module

    def exec_module(self, module):
        pass


class _StandInFinder(importlib.abc.MetaPathFinder):
    """Serves `package` and its submodules as empty modules whose every public attribute is a
    `placeholder` (default: the torchvision one above)."""

    def __init__(self, package="torchvision", placeholder=_Placeholder):
        self.package = package
        self.placeholder = placeholder

    def find_spec(self, name, path=None, target=None):
        if name == self.package or name.startswith(self.package + "."):
            return importlib.machinery.ModuleSpec(name, _StandInLoader(self.placeholder), is_package=True)
        return None


def _import(name: str) -> dict:
    start = time.perf_counter()
    try:
        module = importlib.import_module(name)
    except BaseException as exc:  # noqa: BLE001  (SystemExit from a module counts too)
        frames = traceback.extract_tb(exc.__traceback__)[-3:]
        return {
            "ok": False,
            "error": f"{type(exc).__name__}: {exc}",
            "missing": getattr(exc, "name", None) if isinstance(exc, ImportError) else None,
            "frames": [f"{f.filename.rsplit('site-packages/', 1)[-1]}:{f.lineno}" for f in frames],
            "seconds": round(time.perf_counter() - start, 2),
        }
    return {
        "ok": True,
        "file": getattr(module, "__file__", None),
        "helpers": sorted(h for h in HELPERS if callable(getattr(module, h, None))),
        "names": sorted(n for n in vars(module) if not n.startswith("_")),
        "seconds": round(time.perf_counter() - start, 2),
    }


def _fork(name: str):
    """Start a child that imports name as its first SGLang module; returns (pid, read fd)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read)
        try:
            result = _import(name)
        except BaseException as exc:  # noqa: BLE001
            result = {"ok": False, "error": f"probe: {exc!r}"}
        with os.fdopen(write, "w") as out:
            json.dump(result, out)
        os._exit(0)
    os.close(write)
    return pid, read


def _collect(pid: int, read: int) -> dict:
    with os.fdopen(read) as inp:
        data = inp.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        return {"ok": False, "error": f"child died (wait status {status})"}
    return json.loads(data)


def _first(names: list[str], jobs: int) -> dict:
    """Each name imported first in its own forked child, up to jobs children at a time."""
    results, running, todo = {}, [], list(names)
    while todo or running:
        while todo and len(running) < jobs:
            name = todo.pop(0)
            running.append((name, *_fork(name)))
        name, pid, read = running.pop(0)
        results[name] = _collect(pid, read)
    return {name: results[name] for name in names}


def main(argv: list[str]) -> int:
    mode = "together"
    if argv[:1] == ["--mode"]:
        mode, argv = argv[1], argv[2:]
    sys.meta_path.insert(0, _StandInFinder())
    report = {"mode": mode, "python": sys.version.split()[0], "modules": {}}

    if mode == "first":
        for name in PRELOAD:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001  (a missing one is simply not preloaded)
                pass
        loaded = sorted(m for m in sys.modules if m == "sglang" or m.startswith("sglang."))
        if loaded:
            raise SystemExit(f"preloading pulled in SGLang modules: {loaded[:5]}")
        report["modules"] = _first(argv, jobs=max(1, min(4, os.cpu_count() or 1)))
    else:
        for name in argv:
            report["modules"][name] = _import(name)

    try:
        import torch  # noqa: F401

        report["torch"] = sys.modules["torch"].__version__
        import triton

        report["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        pass
    sglang = sys.modules.get("sglang")
    report["sglang_file"] = getattr(sglang, "__file__", None)
    print("IMPORT-PROBE " + json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
