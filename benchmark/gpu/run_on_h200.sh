#!/bin/bash
# Rerun the GPU proof on a machine with an NVIDIA GPU (tested on one H200, Python 3.12,
# torch 2.11.0+cu130, triton 3.6). From the repository root:
#
#   bash benchmark/gpu/run_on_h200.sh [SET or CONFIG ...]        (default: all)
#   bash benchmark/gpu/run_on_h200.sh --setup-only               (install, patch, build models)
#
# Steps:
#  1. SGLang 0.5.12: unpack .gpu/sitepack/site312.tar.xz (built by benchmark/gpu/fetch_wheels.sh)
#     into $GPU_WORK/site; without it, use the sglang installed in this python3.
#     FlashInfer modules in .gpu/fiaot/NAME/NAME.so or .gpu/fiaot/*.tgz, when carried, go into that site's
#     flashinfer/data/aot/ (flashinfer_aot.sh): flashinfer then loads them instead of compiling.
#  2. Patched copy: copy that sglang/ package to $GPU_WORK/patched/sglang and run the project's
#     own `python -m sglang_draft_layout apply` on it (libcst from .whl/ if python3 lacks it);
#     `check` must say 0 on the copy and 1 (sites left to patch) on the original.
#  3. Print sglang.__file__ and whether spec_utils has the helper, for each PYTHONPATH.
#  4. Build the tiny models (benchmark/gpu/make_models.py) into $GPU_WORK/models.
#  5. benchmark/gpu/serve_checks.py: the servers, requests and checks.
# A real fork instead of 0.5.12's own sglang/: FORK_TREE=.gpu/forks/NAME.tar.xz (pack_fork_tree.sh,
# carried in .gpu/forks) is unpacked to $GPU_WORK/fork-NAME/unpatched, which then stands in place of
# the site's sglang/ (first on PYTHONPATH; the rest of the site stays 0.5.12's), and step 2 patches a
# copy of it ($GPU_WORK/fork-NAME/patched) instead of the site's.
# Output: $OUT (default benchmark/results/gpu-<UTC time>): setup.txt, patch.txt (apply and check
# output), results.json, summary.md, trace.txt, logs.tar.gz.   Environment knobs: GPU_WORK (/tmp/sgl_dl), OUT, DEADLINE_S,
# STRESS (2), MEM_FRACTION (0.08), EXTRA_ARGS (appended to every server), MODEL_SHAPE (tiny | 8b:
# make_models.py --shape, models in $GPU_WORK/models or $GPU_WORK/models8b).
set -u
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
. benchmark/gpu/patch_copy.sh
. benchmark/gpu/flashinfer_aot.sh
OUT=${OUT:-$REPO/benchmark/results/gpu-$(date -u +%Y%m%dT%H%M%SZ)}
WORK=${GPU_WORK:-/tmp/sgl_dl}
SHAPE=${MODEL_SHAPE:-tiny}
MODELS=$WORK/models; [ "$SHAPE" = tiny ] || MODELS=$WORK/models$SHAPE
FORK=""
[ -n "${FORK_TREE:-}" ] && FORK=$WORK/fork-$(basename "$FORK_TREE" .tar.xz)
mkdir -p "$OUT" "$WORK"
T0=$(date +%s.%N)
el() { python3 -c "print(round($(date +%s.%N)-$T0,1))"; }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

setup() {
  # 1. SGLang 0.5.12
  if [ -f .gpu/sitepack/site312.tar.xz ] || [ -f "$WORK/site/.installed" ]; then
    SITE=$WORK/site
    if [ ! -f "$SITE/.installed" ]; then
      rm -rf "$SITE" "$WORK/x"; mkdir -p "$WORK/x"
      tar -xJf .gpu/sitepack/site312.tar.xz -C "$WORK/x" || return 1
      mv "$WORK/x/site312" "$SITE" && rm -rf "$WORK/x" && touch "$SITE/.installed"
      echo "[setup] unpacked .gpu/sitepack into $SITE at $(el) s"
    else
      echo "[setup] $SITE already there (warm machine)"
    fi
  else
    SITE=$(python3 -c "import importlib.util as u, os; s = u.find_spec('sglang'); print(os.path.dirname(os.path.dirname(s.origin)))" 2>/dev/null) \
      || { echo "[setup] no .gpu/sitepack and no sglang installed"; return 1; }
    echo "[setup] using the installed sglang under $SITE"
  fi
  # FlashInfer modules that need no JIT-compiling (.gpu/fiaot, when carried), into the unpacked site only
  [ "$SITE" = "$WORK/site" ] && install_flashinfer_aot .gpu/fiaot "$SITE" "$WORK"
  for lib in .gpu/lib .gpu/recipe/lib; do
    if ! ldconfig -p 2>/dev/null | grep -q 'libnuma.so.1 ' && [ -f "$lib/libnuma.so.1" ]; then
      export LD_LIBRARY_PATH=$REPO/$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
      echo "[setup] no system libnuma.so.1: using $lib"; break
    fi
  done
  # 2. the patched copy, made by the project's own apply
  PATCHED=$WORK/patched
  UNPATCHED=$SITE
  if [ -n "$FORK" ]; then
    unpack_fork_tree "$FORK_TREE" "$FORK/unpatched" || return 1
    UNPATCHED=$FORK/unpatched PATCHED=$FORK/patched
    echo "[setup] fork tree $FORK_TREE in $UNPATCHED, in place of $SITE/sglang"
  fi
  # from a `git archive HEAD python` snapshot in .gpu/dl_head when carried (uncommitted edits stay home)
  DLSRC=$REPO/python
  [ -d .gpu/dl_head/python/sglang_draft_layout ] && DLSRC=$REPO/.gpu/dl_head/python
  echo "[setup] sglang_draft_layout from $DLSRC $(cat .gpu/dl_head/COMMIT 2>/dev/null)"
  make_patched_copy "$UNPATCHED" "$PATCHED" "$DLSRC" || return 1
  # 3. which sglang each PYTHONPATH gives
  pps="$SITE $PATCHED:$SITE"
  [ -n "$FORK" ] && pps="$UNPATCHED:$SITE $PATCHED:$UNPATCHED:$SITE"
  for pp in $pps; do
    PYTHONPATH=$pp${PYTHONPATH:+:$PYTHONPATH} python3 -c "
import sglang, sglang.srt.speculative.spec_utils as su, sglang.srt.speculative.eagle_utils as eu
print('[setup] PYTHONPATH=$pp -> sglang', sglang.__version__, sglang.__file__,
      '| spec_utils has draft_kv_indices_buffer_width:', hasattr(su, 'draft_kv_indices_buffer_width'),
      '| eagle_utils has per_step_draft_out_cache_loc:', hasattr(eu, 'per_step_draft_out_cache_loc'))" 2>&1 | grep -v Warning | tail -2 &
  done
  # 4. models
  if [ ! -f "$MODELS/prompts.json" ]; then
    python3 benchmark/gpu/make_models.py --shape "$SHAPE" "$MODELS" 2>&1 | grep -v Warning | tail -4
    [ -f "$MODELS/prompts.json" ] || { echo "[setup] make_models.py failed"; return 1; }
    echo "[setup] models ($SHAPE) built at $(el) s: $(du -sh "$MODELS" | cut -f1)"
  else
    echo "[setup] models already in $MODELS"
  fi
  wait
  echo "[setup] done at $(el) s"
}

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader 2>/dev/null
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
  setup
} 2>&1 | tee "$OUT/setup.txt"
[ "${PIPESTATUS[0]}" = 0 ] && grep -q "^\[setup\] done" "$OUT/setup.txt" || { echo "SETUP FAILED"; exit 1; }
# re-derive what setup exported (it ran in a pipeline subshell)
if [ -f .gpu/sitepack/site312.tar.xz ] || [ -f "$WORK/site/.installed" ]; then SITE=$WORK/site; else
  SITE=$(python3 -c "import importlib.util as u, os; s = u.find_spec('sglang'); print(os.path.dirname(os.path.dirname(s.origin)))"); fi
for lib in .gpu/lib .gpu/recipe/lib; do
  if ! ldconfig -p 2>/dev/null | grep -q 'libnuma.so.1 ' && [ -f "$lib/libnuma.so.1" ]; then
    export LD_LIBRARY_PATH=$REPO/$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; break; fi
done
[ "${1:-}" = "--setup-only" ] && exit 0

UNPATCHED=$SITE PATCHED=$WORK/patched
if [ -n "$FORK" ]; then
  # a fork's tree hides the site's sglang/ only: the site itself stays on every server's PYTHONPATH
  UNPATCHED=$FORK/unpatched PATCHED=$FORK/patched
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
fi
python3 benchmark/gpu/serve_checks.py --models "$MODELS" --site "$UNPATCHED" --patched "$PATCHED" \
  --out "$OUT" --logdir "$WORK/logs-$(basename "$OUT")" --stress "${STRESS:-2}" \
  --mem-fraction "${MEM_FRACTION:-0.08}" --deadline-s "${DEADLINE_S:-1000000000}" "$@"
rc=$?
L=$WORK/logs-$(basename "$OUT")
cat "$L"/trace_*.txt 2>/dev/null | awk '{print $2, $3}' | sort | uniq -c > "$OUT/trace.txt"
for f in "$L"/trace_*.txt; do echo "== $(basename "$f")"; awk '{print $2, $3}' "$f" | sort -u; done >> "$OUT/trace.txt" 2>/dev/null
# which trees' patched modules were compiled (= imported) by some process
ls -la --time-style=+%T "$PATCHED"/sglang/srt/speculative/__pycache__/ "$PATCHED"/sglang/srt/layers/attention/__pycache__/ 2>/dev/null \
  | grep -E "spec_utils|eagle_utils|eagle_worker|flashinfer_backend|triton_backend" >> "$OUT/trace.txt"
tar -czf "$OUT/logs.tar.gz" -C "$L" . 2>/dev/null
cp "$OUT/results.json" "$WORK/results-$(basename "$OUT").json" 2>/dev/null   # for GPU_RESULTS=... pytest test/gpu
echo "[run] finished at $(el) s rc=$rc"
exit $rc
