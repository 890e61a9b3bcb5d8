#!/usr/bin/env python3
"""Build, on a CPU machine with nvcc (CUDA 13), the flashinfer 0.6.11.post1 JIT modules that the
DeepSeek MLA runs need, so that the H200 does not spend its device time compiling them.

Usage (repository root, after benchmark/gpu/fetch_wheels.sh):
    python3 benchmark/gpu/build_flashinfer_aot.py [--site DIR] [--out .gpu/fiaot] [--list] [MODULE ...]
MODULE: mla (BatchMLAPagedAttentionWrapper, fa3, bf16, head_dim_ckv 512 / kpe 64: decode, verify,
draft extend), prefill (BatchPrefillWithRaggedKVCacheWrapper, fa3, bf16, head_dim_qk 192 / vo 128:
the MHA prefill of MLA), dsv3 (fused_topk_deepseek: noaux_tc routing of the NextN layer's MoE).
Default: all three. Each lands in OUT/NAME/NAME.so; run_deepseek_on_h200.sh copies it to
site/flashinfer/data/aot/NAME/NAME.so, where flashinfer loads a module from (JitSpec.is_aot) before
it would compile it.

The module names (URIs) are flashinfer's own, from its gen_*_module functions with the arguments
SGLang 0.5.12's flashinfer_mla_backend passes on an sm90 GPU (backend "auto" -> "fa3").

What this machine lacks, and the stand-ins used (none of them ends up in the built code):
  * tvm_ffi's compiled core does not import here (it is a cp312 build; any Python works with the
    stub): a stub package with the real tvm_ffi/libinfo.py and include dirs gives the header paths.
  * flashinfer/__init__ imports everything (and tvm_ffi's core): the flashinfer package is entered
    without running its __init__ (only flashinfer.jit is needed).
  * libcuda.so (the driver) is absent: an empty stub with soname libcuda.so.1 satisfies `-lcuda`
    (the built modules end up not needing it: see `readelf -d`).
  * cuBLAS headers are absent: nv_internal's cudaUtils.h includes cublasLt.h / cublas_v2.h only for
    the cublasStatus_t enum of an error-string helper: a stub header defines that enum.
  * cuRAND headers are absent: cutlass' tensor_fill.h includes curand_kernel.h: the headers of the
    nvidia-curand wheel (PyPI, cu13) are used (DIR given by --curand-include, or downloaded with pip).
Needs: torch (any build, CPU is fine), jinja2, filelock, ninja, nvcc 13.x, g++.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CUBLAS_STUB = """#pragma once
#include <math.h>
#include <stdint.h>
#ifdef __cplusplus
#include <cmath>
#endif
/* Minimal stand-in for the cuBLAS headers: only the cublasStatus_t enum (values as in cuBLAS). */
typedef enum {
  CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_NOT_INITIALIZED = 1, CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7, CUBLAS_STATUS_ARCH_MISMATCH = 8, CUBLAS_STATUS_MAPPING_ERROR = 11,
  CUBLAS_STATUS_EXECUTION_FAILED = 13, CUBLAS_STATUS_INTERNAL_ERROR = 14, CUBLAS_STATUS_NOT_SUPPORTED = 15,
  CUBLAS_STATUS_LICENSE_ERROR = 16
} cublasStatus_t;
"""


def prepare_stubs(site, tmp, curand_include):
    tvm = os.path.join(tmp, "stubs", "tvm_ffi")
    os.makedirs(tvm)
    shutil.copy(os.path.join(site, "tvm_ffi", "libinfo.py"), tvm)
    for d in ("include", "3rdparty", "lib", "share", "src", "cpp"):
        if os.path.exists(os.path.join(site, "tvm_ffi", d)):
            os.symlink(os.path.join(site, "tvm_ffi", d), os.path.join(tvm, d))
    with open(os.path.join(tvm, "__init__.py"), "w") as f:
        f.write("from . import libinfo\n\ndef load_module(path):\n    raise RuntimeError('stub tvm_ffi')\n")
    inc = os.path.join(tmp, "include")
    os.makedirs(inc)
    open(os.path.join(inc, "cublas_api_stub.h"), "w").write(CUBLAS_STUB)
    for h in ("cublasLt.h", "cublas_v2.h"):
        open(os.path.join(inc, h), "w").write('#include "cublas_api_stub.h"\n')
    lib = os.path.join(tmp, "lib")
    os.makedirs(lib)
    open(os.path.join(lib, "e.c"), "w").write("\n")
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-Wl,-soname,libcuda.so.1",
            "-o",
            os.path.join(lib, "libcuda.so"),
            os.path.join(lib, "e.c"),
        ],
        check=True,
    )
    if curand_include is None:
        dl = os.path.join(tmp, "curand")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--only-binary=:all:",
                "--python-version",
                "3.12",
                "--platform",
                "manylinux_2_27_x86_64",
                "--platform",
                "manylinux_2_28_x86_64",
                "-d",
                dl,
                "nvidia-curand==10.4.*",
            ],
            check=True,
        )
        whl = [f for f in os.listdir(dl) if f.endswith(".whl")][0]
        subprocess.run(["unzip", "-q", "-o", os.path.join(dl, whl), "nvidia/*/include/*", "-d", dl], check=True)
        curand_include = [os.path.join(r) for r, _, fs in os.walk(dl) if "curand_kernel.h" in fs][0]
    return os.path.join(tmp, "stubs"), inc, lib, curand_include


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--site", default="/tmp/sgl_dl/site", help="unpacked sitepack (flashinfer, tvm_ffi)")
    ap.add_argument("--out", default=os.path.join(REPO, ".gpu", "fiaot"))
    ap.add_argument("--workspace", default=None, help="FLASHINFER_WORKSPACE_BASE for the build (temp dir)")
    ap.add_argument("--curand-include", default=None)
    ap.add_argument("--list", action="store_true", help="print the module names only")
    ap.add_argument("modules", nargs="*", default=["mla", "prefill", "dsv3"])
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="fiaot_")
    stubs, inc, lib, curand = (
        prepare_stubs(a.site, tmp, None if a.list else (a.curand_include or None))
        if not a.list
        else (None, None, None, None)
    )
    if a.list:
        stubs = os.path.join(tmp, "stubs")
        os.makedirs(os.path.join(stubs, "tvm_ffi"))
        shutil.copy(os.path.join(a.site, "tvm_ffi", "libinfo.py"), os.path.join(stubs, "tvm_ffi"))
        open(os.path.join(stubs, "tvm_ffi", "__init__.py"), "w").write("from . import libinfo\n")
    cuda_home = os.environ.get("CUDA_HOME") or ("/usr/local/cuda" if os.path.isdir("/usr/local/cuda") else None)
    env = {
        "FLASHINFER_CUDA_ARCH_LIST": "9.0a",
        "FLASHINFER_WORKSPACE_BASE": a.workspace or os.path.join(tmp, "ws"),
        "MAX_JOBS": os.environ.get("MAX_JOBS", str(os.cpu_count() or 2)),
    }
    if cuda_home:
        env["CUDA_HOME"] = cuda_home
    if not a.list:
        flags = f"-I{inc} -I{curand}"
        env.update(
            {
                "FLASHINFER_EXTRA_CFLAGS": flags,
                "FLASHINFER_EXTRA_CUDAFLAGS": flags,
                "FLASHINFER_EXTRA_LDFLAGS": f"-L{lib}" + (f" -L{cuda_home}/lib64" if cuda_home else ""),
            }
        )
    os.environ.update(env)
    sys.path.insert(0, stubs)
    pkg = types.ModuleType("flashinfer")
    pkg.__path__ = [os.path.join(a.site, "flashinfer")]
    sys.modules["flashinfer"] = pkg
    import torch
    from flashinfer.jit import gen_batch_mla_module, gen_batch_prefill_module, gen_dsv3_fused_routing_module

    bf = torch.bfloat16
    make = {
        "mla": lambda: gen_batch_mla_module("fa3", bf, bf, bf, torch.int32, 512, 64, False),
        "prefill": lambda: gen_batch_prefill_module("fa3", bf, bf, bf, torch.int32, 192, 128, 0, False, False, False),
        "dsv3": gen_dsv3_fused_routing_module,
    }
    failed = []
    for m in a.modules:
        spec = make[m]()
        if a.list:
            print(m, spec.name)
            continue
        t = time.time()
        print(f"[build] {m}: {spec.name}", flush=True)
        try:
            spec.build(verbose=True)
        except Exception as e:  # keep going with the others
            print(f"[build] FAILED {spec.name}: {e!r}"[:2000], flush=True)
            failed.append(m)
            continue
        d = os.path.join(a.out, spec.name)
        os.makedirs(d, exist_ok=True)
        shutil.copy(spec.jit_library_path, d)
        print(
            f"[build] built {spec.name} in {time.time() - t:.0f} s, {os.path.getsize(spec.jit_library_path)} bytes",
            flush=True,
        )
    shutil.rmtree(tmp, ignore_errors=True) if not a.workspace else None
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
