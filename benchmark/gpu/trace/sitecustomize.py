"""Import trace for the GPU harness: which file each draft-layout module is loaded from.

The harness puts this folder first on PYTHONPATH of every server it starts, with
SGL_DL_TRACE=/path/to/file. Python imports `sitecustomize` in every interpreter, so the
server's spawned scheduler processes load it too. For the modules listed in WATCH it appends
"pid module origin" to that file, then lets the normal path finder load them (the spec
returned is the one PathFinder would have produced anyway). Without SGL_DL_TRACE it does
nothing. Any other sitecustomize further down sys.path still runs (it is chained).
"""
import os
import sys

WATCH = {
    "sglang",
    "sglang.srt.speculative.spec_utils",
    "sglang.srt.speculative.eagle_utils",
    "sglang.srt.speculative.eagle_worker",
    "sglang.srt.speculative.eagle_worker_v2",
    "sglang.srt.layers.attention.flashinfer_backend",
    "sglang.srt.layers.attention.triton_backend",
    "sglang.srt.layers.attention.flashinfer_mla_backend",
    "sglang.srt.layers.attention.deepseek_v4_backend",
}
_HERE = os.path.dirname(os.path.abspath(__file__))
_TRACE = os.environ.get("SGL_DL_TRACE")

if _TRACE:
    from importlib.machinery import PathFinder

    class _TraceFinder:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name not in WATCH:
                return None
            spec = PathFinder.find_spec(name, path, target)
            try:
                with open(_TRACE, "a") as f:
                    f.write(f"{os.getpid()} {name} {spec.origin if spec else None}\n")
            except OSError:
                pass
            return spec

        @staticmethod
        def invalidate_caches():
            pass

    sys.meta_path.insert(0, _TraceFinder())

# chain to the next sitecustomize on sys.path, if any
for _p in sys.path:
    if not _p or os.path.abspath(_p) == _HERE:
        continue
    _f = os.path.join(_p, "sitecustomize.py")
    if os.path.isfile(_f):
        with open(_f) as _fh:
            exec(compile(_fh.read(), _f, "exec"), {"__name__": "sitecustomize", "__file__": _f})
        break
