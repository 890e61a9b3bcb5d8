"""Import trace for the GPU harness: which file each draft-layout module is loaded from.

The harness puts this folder first on PYTHONPATH of every server it starts, with
SGL_DL_TRACE=/path/to/file. Python imports `sitecustomize` in every interpreter, so the
server's spawned scheduler processes load it too. For the modules listed in WATCH it appends
"pid module origin" to that file, then lets the normal path finder load them (the spec
returned is the one PathFinder would have produced anyway). Without SGL_DL_TRACE it does
nothing. Any other sitecustomize further down sys.path still runs (it is chained).

With SGL_DL_FLASHMLA_LEGACY=FORMAT (the dsv4 servers set V4), it also adapts SGLang 0.5.12 to
the only FlashMLA wheel on PyPI, sgl-flash-mla 1.0.0: that wheel keeps the DeepSeek-V4 KV format
and every SM90 kernel on its "legacy" side (use_legacy=True, kv_format=...), while 0.5.12's
DeepSeek-V4 backend calls flash_mla.flash_mla_with_kvcache without those arguments and so reaches
the V4.1, SM100-only kernel ("sparse_decode_fwd is only supported on SM100f architectures" on
an H200). The adapter makes those two arguments default to (True, FORMAT) when `flash_mla` is
imported; the unpatched and the patched trees get it alike.
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

_FLASHMLA_FORMAT = os.environ.get("SGL_DL_FLASHMLA_LEGACY")

if _FLASHMLA_FORMAT:
    import functools
    from importlib.machinery import PathFinder

    def _legacy_defaults(module):
        original = module.flash_mla_with_kvcache

        @functools.wraps(original)
        def flash_mla_with_kvcache(*args, use_legacy=True, kv_format=_FLASHMLA_FORMAT, **kwargs):
            return original(*args, use_legacy=use_legacy, kv_format=kv_format, **kwargs)

        module.flash_mla_with_kvcache = flash_mla_with_kvcache

    class _FlashMLAFinder:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name != "flash_mla":
                return None
            spec = PathFinder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                load = spec.loader.exec_module
                spec.loader.exec_module = lambda module: (load(module), _legacy_defaults(module))
            return spec

        @staticmethod
        def invalidate_caches():
            pass

    sys.meta_path.insert(0, _FlashMLAFinder())

# chain to the next sitecustomize on sys.path, if any
for _p in sys.path:
    if not _p or os.path.abspath(_p) == _HERE:
        continue
    _f = os.path.join(_p, "sitecustomize.py")
    if os.path.isfile(_f):
        with open(_f) as _fh:
            exec(compile(_fh.read(), _f, "exec"), {"__name__": "sitecustomize", "__file__": _f})
        break
