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

With SGL_DL_MEMPROBE=/path/to/file, it measures the draft kv_indices CUDA-graph rows from the
running server: around each ``init_cuda_graph_state`` of FlashInfer's, Triton's and
FlashInfer-MLA's multi-step draft backends (the call that allocates the rows once for the
server's life) it appends one
JSON line: the class, the tree's file, ``torch.cuda.memory_allocated()`` before and after (the
allocation diff of the whole call), and the rows tensor's own shape, dtype and bytes.
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

_MEMPROBE = os.environ.get("SGL_DL_MEMPROBE")
_PROBED = {
    "sglang.srt.layers.attention.flashinfer_backend": "FlashInferMultiStepDraftBackend",
    "sglang.srt.layers.attention.triton_backend": "TritonMultiStepDraftBackend",
    "sglang.srt.layers.attention.flashinfer_mla_backend": "FlashInferMLAMultiStepDraftBackend",
}

if _MEMPROBE:
    import functools
    import json
    from importlib.machinery import PathFinder

    def _probe(module, class_name):
        cls = getattr(module, class_name, None)
        original = getattr(cls, "init_cuda_graph_state", None)
        if original is None:
            return

        @functools.wraps(original)
        def init_cuda_graph_state(self, *args, **kwargs):
            import torch

            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            result = original(self, *args, **kwargs)
            torch.cuda.synchronize()
            after = torch.cuda.memory_allocated()
            rows = getattr(self, "cuda_graph_kv_indices", None)
            record = {
                "pid": os.getpid(),
                "class": class_name,
                "file": module.__file__,
                "args": [a for a in args if isinstance(a, int)],
                "topk": getattr(self, "topk", None),
                "steps": getattr(self, "speculative_num_steps", None),
                "max_context_len": getattr(self, "max_context_len", None),
                "allocated_before": before,
                "allocated_after": after,
                "allocated_diff": after - before,
            }
            if isinstance(rows, torch.Tensor):
                record.update(
                    rows_shape=list(rows.shape),
                    rows_dtype=str(rows.dtype),
                    rows_bytes=rows.numel() * rows.element_size(),
                )
            try:
                with open(_MEMPROBE, "a") as f:
                    f.write(json.dumps(record) + "\n")
            except OSError:
                pass
            return result

        cls.init_cuda_graph_state = init_cuda_graph_state

    class _MemProbeFinder:
        @classmethod
        def find_spec(cls, name, path=None, target=None):
            if name not in _PROBED:
                return None
            # the spec the finders after this one give (the import trace's included)
            spec = None
            for finder in sys.meta_path:
                if finder is not cls and hasattr(finder, "find_spec"):
                    spec = finder.find_spec(name, path, target)
                    if spec is not None:
                        break
            if spec is not None and spec.loader is not None:
                load = spec.loader.exec_module
                spec.loader.exec_module = lambda module: (load(module), _probe(module, _PROBED[name]))
            return spec

        @staticmethod
        def invalidate_caches():
            pass

    sys.meta_path.insert(0, _MemProbeFinder)

# chain to the next sitecustomize on sys.path, if any
for _p in sys.path:
    if not _p or os.path.abspath(_p) == _HERE:
        continue
    _f = os.path.join(_p, "sitecustomize.py")
    if os.path.isfile(_f):
        with open(_f) as _fh:
            exec(compile(_fh.read(), _f, "exec"), {"__name__": "sitecustomize", "__file__": _f})
        break
