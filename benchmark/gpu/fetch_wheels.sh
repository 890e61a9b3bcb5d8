#!/bin/bash
# Build, on a machine with network access (no GPU needed), what the GPU harness carries to a
# GPU machine that has Python 3.12, torch 2.11.0+cu130 and triton 3.6 but no network:
#
#   .gpu/sitepack/site312.tar.xz   SGLang 0.5.12 and the ~50 packages it needs, installed with
#                                  pip --target for cp312/manylinux and packed with xz (~38 MB)
#   .gpu/lib/libnuma.so.1          needed by sgl_kernel's common_ops; some images lack it
#   .whl/libcst-*.whl              for `python -m sglang_draft_layout apply` on that machine
#
# All three paths are git-ignored (the script adds them to .git/info/exclude). Run from the
# repository root:  bash benchmark/gpu/fetch_wheels.sh [--dsv4]   (about 4 minutes, PyPI only;
# --dsv4 adds the DeepSeek-V4 packs, see the end)
# Files already there are kept; delete one to rebuild it.
set -euo pipefail
ROOT=$(git rev-parse --show-toplevel)
cd "$ROOT"
for p in /.gpu/ /.whl/; do grep -qx "$p" .git/info/exclude 2>/dev/null || echo "$p" >> .git/info/exclude; done
ALL=.gpu/wheels_all                  # every wheel, flat (not carried)
mkdir -p "$ALL" .gpu/lib .gpu/sitepack .whl
PIP="python3 -m pip"
python3.12 -V >/dev/null 2>&1 && PIP="python3.12 -m pip"
# the target: CPython 3.12 on x86-64 Linux
TGT="--python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none --platform any"
for t in manylinux1 manylinux2014 manylinux_2_5 manylinux_2_17 manylinux_2_24 manylinux_2_26 \
         manylinux_2_27 manylinux_2_28 manylinux_2_31 manylinux_2_34 manylinux_2_35; do
  TGT="$TGT --platform ${t}_x86_64"
done
# Pinned set that served on the H200 (2026-11-29). torch/triton/numpy/safetensors come from the
# GPU image. transformers 5.6 (5.17 clashes on 'qwen3_asr'), fastapi 0.136 (newer ones import
# opentelemetry), IPython (sglang/utils.py imports it). No xgrammar: servers use
# --grammar-backend none. No openai_harmony: only /v1/responses is lost.
PINS="sglang==0.5.12 flashinfer-python==0.6.11.post1 apache-tvm-ffi==0.1.9
 transformers==5.6.0 tokenizers==0.22.2 typing-extensions==4.16.0
 fastapi==0.136.3 starlette==1.10.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0
 typing-inspection==0.4.5 uvicorn==0.54.0 orjson==3.13.0 pyzmq==27.3.0 msgspec==0.22.0 pybase64==1.5.1
 setproctitle==1.3.8 partial-json-parser==0.2.1.1.post7 jsonschema==4.26.0
 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 openai==2.6.1 distro==1.9.0
 jiter==0.19.0 sniffio==1.3.1 dill==0.4.1 python-multipart==0.0.34 ipython==9.18.1
 ipython-pygments-lexers==1.1.1 jedi==0.20.1 parso==0.8.7 traitlets==5.16.1 matplotlib-inline==0.2.2
 pexpect==4.9.0 ptyprocess==0.7.0 prompt-toolkit==3.0.53 wcwidth==0.9.4 stack-data==0.6.3
 executing==2.3.0 asttokens==3.0.2 pure-eval==0.2.4 compressed-tensors==0.20.1 loguru==0.7.3
 gguf==0.19.0 soundfile==0.13.1 cffi==2.1.1 pycparser==3.12"
have() {  # is NAME==VERSION already in $ALL?
  local n v; n=$(echo "${1%%==*}" | tr 'A-Z-' 'a-z_'); v=${1##*==}
  ls "$ALL" | tr 'A-Z' 'a-z' | grep -q "^${n}-${v}-"
}
for pin in $PINS; do
  have "$pin" || $PIP download -q --no-deps --only-binary=:all: $TGT -d "$ALL" "$pin"
done
# sglang-kernel 0.4.2.post2: 322 MB as published; an H200 (sm90) needs ~17 MB of it.
# Dropped: FA3 flash_ops, the sm100 build, flashmla_ops, headers, bundled libs, mscclpp.
SK=sglang_kernel-0.4.2.post2-cp310-abi3-manylinux2014_x86_64.whl
if [ ! -f "$ALL/$SK" ]; then
  T=$(mktemp -d)
  $PIP download -q --no-deps --only-binary=:all: $TGT -d "$T" sglang-kernel==0.4.2.post2
  mkdir "$T/x"
  (cd "$T/x" && unzip -q "../$SK" -x 'sgl_kernel/flash_ops.abi3.so' 'sgl_kernel/sm100/*' \
      'sgl_kernel/flashmla_ops.abi3.so' 'lib/*' 'include/*' '_mscclpp*')
  python3 - "$T/x" <<'PY'
import glob, os, sys
root = sys.argv[1]
rec = glob.glob(os.path.join(root, "sglang_kernel-*.dist-info", "RECORD"))[0]
lines = [l for l in open(rec) if os.path.exists(os.path.join(root, l.split(",")[0]))]
open(rec, "w").writelines(lines)          # RECORD lists only what is left
PY
  (cd "$T/x" && zip -q -r -9 "$ROOT/$ALL/$SK" .)
  rm -rf "$T"
fi
if [ ! -f .gpu/lib/libnuma.so.1 ]; then
  T=$(mktemp -d)
  (cd "$T" && apt-get download libnuma1 >/dev/null && dpkg-deb -x libnuma1_*.deb x)
  cp -L "$T"/x/usr/lib/x86_64-linux-gnu/libnuma.so.1 .gpu/lib/
  rm -rf "$T"
fi
if [ ! -f .gpu/sitepack/site312.tar.xz ]; then
  T=$(mktemp -d)
  $PIP install -q --no-deps --no-compile --only-binary=:all: $TGT --target "$T/site312" "$ALL"/*.whl
  rm -rf "$T/site312/bin"
  tar -cf - -C "$T" site312 | xz -9 -T0 > .gpu/sitepack/site312.tar.xz
  rm -rf "$T"
fi
ls .whl/libcst-1.9.0-*.whl >/dev/null 2>&1 || $PIP download -q --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl libcst==1.9.0
du -sh .gpu/sitepack/site312.tar.xz .gpu/lib/libnuma.so.1 .whl/libcst-*.whl
echo "wheels in $ALL: $(ls "$ALL" | wc -l)"

# --dsv4: what SGLang 0.5.12's DeepSeek-V4 path imports beyond the sitepack, pre-installed for
# cp312 in two xz packs that run_deepseek_on_h200.sh unpacks over the site (each fits one carry
# beside others): .gpu/dsv4a/site_a.tar.xz = tilelang 0.1.8 (without its AMD composable_kernel
# headers), torch-c-dlpack-ext, cuda-tile (flashinfer 0.6.11 imports cuda.tile);
# .gpu/dsv4b/site_b.tar.xz = z3-solver 4.15.4.0 (library only, tilelang needs < 4.15.5),
# sgl-flash-mla 1.0.0 (FlashMLA sparse decode), sgl-deep-gemm 0.1.0 (the version 0.5.12 pins).
[ "${1:-}" = "--dsv4" ] || exit 0
pack() {  # pack NAME FOLDER PINS...: install PINS for cp312 into a temp site, xz it to FOLDER
  local name=$1 dir=$2 T; shift 2
  [ -f "$dir/$name.tar.xz" ] && return 0
  T=$(mktemp -d); mkdir -p "$T/w" "$T/s" "$dir"
  for pin in "$@"; do $PIP download -q --no-deps --only-binary=:all: $TGT -d "$T/w" "$pin"; done
  $PIP install -q --no-deps --no-compile --only-binary=:all: $TGT --target "$T/s" "$T"/w/*.whl
  rm -rf "$T/s/bin" "$T/s/tilelang/3rdparty/composable_kernel"
  tar -cf - -C "$T/s" . | xz -6 -T0 > "$dir/$name.tar.xz"
  rm -rf "$T"
}
pack site_a .gpu/dsv4a tilelang==0.1.8 torch-c-dlpack-ext==0.1.5 cuda-tile==1.7.0
pack site_b .gpu/dsv4b z3-solver==4.15.4.0 sgl-flash-mla==1.0.0 sgl-deep-gemm==0.1.0
du -sh .gpu/dsv4a/site_a.tar.xz .gpu/dsv4b/site_b.tar.xz
