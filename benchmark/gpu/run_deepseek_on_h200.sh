#!/bin/bash
# DeepSeek runs of the GPU harness (tested on one H200, Python 3.12, torch 2.11.0+cu130, triton 3.6).
# From the repository root:
#
#   bash benchmark/gpu/run_deepseek_on_h200.sh [SET or CONFIG ...]     (default: dsmla)
#   bash benchmark/gpu/run_deepseek_on_h200.sh --unpack-only             (step 1 alone: a cold call
#                                                  whose carry holds only part of the packs)
#
# dsv4 sets (dsv4, dsv4_nocg, dsv4_cg, dsv4_steps) run on the DeepSeek-V4 models of make_dsv4_models.py, one
# serve_checks.py per layout in DSV4_LAYOUTS (default "mixed"; "mixed swa" runs both side by side),
# and need the extra packs .gpu/dsv4a and .gpu/dsv4b (benchmark/gpu/fetch_wheels.sh --dsv4).
#
# Same two trees as run_on_h200.sh (the installed SGLang 0.5.12 and a copy patched by the project's
# own `python -m sglang_draft_layout apply`), with the DeepSeek MLA models of make_deepseek_models.py.
# Steps:
#  1. unpack .gpu/sitepack/site312.tar.xz (benchmark/gpu/fetch_wheels.sh) into $GPU_WORK/site, and
#     any extra pack .gpu/dsv4*/site_*.tar.xz carried (tilelang, z3, flash_mla, deep_gemm, ...).
#  2. FlashInfer modules built ahead of time on a CPU machine (benchmark/gpu/build_flashinfer_aot.py),
#     if .gpu/fiaot/ holds them: each NAME/NAME.so goes to site/flashinfer/data/aot/NAME/, the place
#     flashinfer 0.6.11 loads a module from before it would JIT-compile it. Each is test-loaded
#     first (tvm_ffi.load_module); one that does not load is left out (flashinfer then JIT-compiles).
#  3. the patched copy: `apply` from .gpu/dl_head/python (a `git archive HEAD python` snapshot, so
#     that uncommitted edits in the checkout do not reach the device) or from python/;
#     `check` must say 0 on the copy and 1 on the original.
#  4. the models: make_deepseek_models.py into $GPU_WORK/ds_models (its --check float32 reference is
#     run on the CPU machine, not here: same seeds, same weights); for dsv4 sets
#     make_dsv4_models.py into $GPU_WORK/dsv4_models_LAYOUT.
#  5. serve_checks.py with --models $GPU_WORK/ds_models; EXTRA_ARGS (default
#     "--disable-piecewise-cuda-graph") is appended to every server.
# Output: $OUT (default benchmark/results/gpu-deepseek-<UTC time>): setup.txt, patch.txt,
# results.json, summary.md, trace.txt, logs.tar.gz.
set -u
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
. benchmark/gpu/patch_copy.sh
. benchmark/gpu/flashinfer_aot.sh
OUT=${OUT:-$REPO/benchmark/results/gpu-deepseek-$(date -u +%Y%m%dT%H%M%SZ)}
WORK=${GPU_WORK:-/tmp/sgl_dl}
SITE=$WORK/site
PATCHED=$WORK/patched
MODELS=$WORK/ds_models
mkdir -p "$OUT" "$WORK"
T0=$(date +%s.%N)
el() { python3 -c "print(round($(date +%s.%N)-$T0,1))"; }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export EXTRA_ARGS=${EXTRA_ARGS---disable-piecewise-cuda-graph}
for lib in .gpu/lib .gpu/recipe/lib; do
  if ! ldconfig -p 2>/dev/null | grep -q 'libnuma.so.1 ' && [ -f "$lib/libnuma.so.1" ]; then
    export LD_LIBRARY_PATH=$REPO/$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; break; fi
done

MODE=run
[ "${1:-}" = "--unpack-only" ] && MODE=unpack
[ "${1:-}" = "--setup-only" ] && MODE=setup
[ "$MODE" = run ] && [ $# -eq 0 ] && set -- dsmla
case " $* " in
  *" dsv4"*) MODEL_DIRS=""
             for l in ${DSV4_LAYOUTS:-mixed}; do MODEL_DIRS="$MODEL_DIRS $WORK/dsv4_models_$l"; done ;;
  *) MODEL_DIRS=$MODELS ;;
esac

setup() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader 2>/dev/null
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
  # 1. SGLang 0.5.12
  if [ ! -f "$SITE/.installed" ]; then
    rm -rf "$SITE" "$WORK/x"; mkdir -p "$WORK/x"
    xz -dc -T0 .gpu/sitepack/site312.tar.xz | tar -x -C "$WORK/x" || return 1
    mv "$WORK/x/site312" "$SITE" && rm -rf "$WORK/x" && touch "$SITE/.installed"
    echo "[setup] unpacked .gpu/sitepack into $SITE at $(el) s"
  else
    echo "[setup] $SITE already there (warm machine)"
  fi
  for pack in .gpu/dsv4*/site_*.tar.xz; do
    [ -f "$pack" ] || continue
    mark=$SITE/.unpacked_$(basename "$pack" .tar.xz)
    [ -f "$mark" ] && continue
    xz -dc -T0 "$pack" | tar -x -C "$SITE" || return 1
    touch "$mark" && echo "[setup] unpacked $pack into $SITE at $(el) s"
  done
  [ "$MODE" = unpack ] && { echo "[setup] done at $(el) s (unpack only)"; return 0; }
  # 2. flashinfer modules built ahead of time
  install_flashinfer_aot .gpu/fiaot "$SITE" "$WORK"
  # 3. the patched copy, by the project's own apply; 4. models in the background meanwhile
  DLSRC=$REPO/python
  [ -d .gpu/dl_head/python/sglang_draft_layout ] && DLSRC=$REPO/.gpu/dl_head/python
  echo "[setup] sglang_draft_layout from $DLSRC $(cat .gpu/dl_head/COMMIT 2>/dev/null)"
  for m in $MODEL_DIRS; do
    [ -f "$m/prompts.json" ] && continue
    if [ "$m" = "$MODELS" ]; then
      (PYTHONPATH=$SITE python3 benchmark/gpu/make_deepseek_models.py "$m" 2>&1 | grep -v Warning | tail -3 > "$m.txt") &
    else
      (PYTHONPATH=$SITE python3 benchmark/gpu/make_dsv4_models.py "$m" --layout "${m##*_}" 2>&1 | grep -v Warning | tail -3 > "$m.txt") &
    fi
  done
  make_patched_copy "$SITE" "$PATCHED" "$DLSRC" || return 1
  wait
  for m in $MODEL_DIRS; do
    cat "$m.txt" 2>/dev/null
    [ -f "$m/prompts.json" ] || { echo "[setup] building $m failed"; return 1; }
  done
  echo "[setup] done at $(el) s"
}

setup 2>&1 | tee "$OUT/setup.txt"
grep -q "^\[setup\] done" "$OUT/setup.txt" || { echo "SETUP FAILED"; exit 1; }
[ "$MODE" != run ] && exit 0

# one serve_checks.py per model folder, side by side (ports 10000+ and 20000+)
L=$WORK/logs-$(basename "$OUT")
port=10000 pids=""
for m in $MODEL_DIRS; do
  sub=$OUT; [ "$m" = "$MODELS" ] || sub=$OUT/$(basename "$m")
  python3 benchmark/gpu/serve_checks.py --models "$m" --site "$SITE" --patched "$PATCHED" \
    --out "$sub" --logdir "$L/$(basename "$m")" --stress "${STRESS:-2}" --base-port $port \
    --mem-fraction "${MEM_FRACTION:-0.08}" --deadline-s "${DEADLINE_S:-1000000000}" \
    --extra-args="$EXTRA_ARGS" "$@" &
  pids="$pids $!" port=$((port + 10000))
done
rc=0
for p in $pids; do wait "$p" || rc=$?; done
cat "$L"/trace_*.txt "$L"/*/trace_*.txt 2>/dev/null | awk '{print $2, $3}' | sort | uniq -c > "$OUT/trace.txt"
for f in "$L"/trace_*.txt "$L"/*/trace_*.txt; do echo "== $(basename "$f")"; awk '{print $2, $3}' "$f" | sort -u; done >> "$OUT/trace.txt" 2>/dev/null
ls "$SITE"/flashinfer/data/aot/ > "$OUT/aot_modules.txt" 2>/dev/null
ls ~/.cache/flashinfer/*/*/cached_ops/ > "$OUT/jit_modules.txt" 2>/dev/null
tar -czf "$OUT/logs.tar.gz" -C "$L" . 2>/dev/null
cp "$OUT/results.json" "$WORK/results-$(basename "$OUT").json" 2>/dev/null
echo "[run] finished at $(el) s rc=$rc"
exit $rc
