#!/bin/bash
# DeepSeek-V4 on a fork that fixed the eager multi-step draft its own way, unpatched against
# patched by `apply` (tested on one H200, Python 3.12, torch 2.11.0+cu130). From the repository root:
#
#   FORK_EDIT=dsv4-caller-split bash benchmark/gpu/run_dsv4_fork_on_h200.sh [CONFIG ...]
#
# The fork: SGLang 0.5.12 (the sitepack) edited as a real fork did, by test/support/fork_edits.py
# (stdlib only): with dsv4-caller-split (the default), DeepseekV4MultiStepBackend.init_forward_metadata
# splits forward_batch.out_cache_loc per step itself and hands each per-step backend its row. The
# patched copy is made by the project's own `apply` (patch_copy.sh); on such a fork it must rewrite
# the caller's split to the helper and add no second split in the per-step backend (a second split
# made the server die at startup with `out_cache_loc.shape[0]=1 != batch_size * topk * num_steps`).
# A real fork instead: FORK_TREE=.gpu/forks/NAME.tar.xz (benchmark/gpu/pack_fork_tree.sh: the fork's
# python/sglang at one commit, carried in .gpu/forks) is unpacked to $GPU_WORK/fork-NAME/unpatched and
# stands in place of the sitepack's sglang/ (first on PYTHONPATH; the rest of the site, sgl-kernel,
# flashinfer, tvm-ffi, tilelang ..., stays 0.5.12's); FORK_EDIT is then not used.
# Default configurations: dsv4_nocg_k1s4_{unpatched,patched} and dsv4_nocg_nonspec (4 steps, eager).
# Needs the packs of run_deepseek_on_h200.sh's dsv4 sets (.gpu/sitepack, .gpu/dsv4a, .gpu/dsv4b,
# .gpu/lib, .whl); a cold machine takes two calls, the first `run_deepseek_on_h200.sh --unpack-only`
# with [.gpu/sitepack, .gpu/dsv4b, .gpu/lib], this script in the second with [.gpu/dsv4a, .whl,
# .gpu/lib, .gpu/dl_head]. Output: $OUT/setup.txt, patch.txt (apply and check on the fork),
# results.json, summary.md, trace.txt.
set -u
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
. benchmark/gpu/patch_copy.sh
OUT=${OUT:-$REPO/benchmark/results/gpu-dsv4-fork-$(date -u +%Y%m%dT%H%M%SZ)}
WORK=${GPU_WORK:-/tmp/sgl_dl}
SITE=$WORK/site
EDIT=${FORK_EDIT:-dsv4-caller-split}
FORK=$WORK/fork-$EDIT
if [ -n "${FORK_TREE:-}" ]; then
  EDIT=""
  FORK=$WORK/fork-$(basename "$FORK_TREE" .tar.xz)
fi
MODELS=$WORK/dsv4_models_mixed
mkdir -p "$OUT"
[ $# -eq 0 ] && set -- dsv4_nocg_k1s4_unpatched dsv4_nocg_k1s4_patched dsv4_nocg_nonspec
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

{
  OUT=$OUT/unpack bash benchmark/gpu/run_deepseek_on_h200.sh --unpack-only | tail -3 || exit 1
  [ -f "$MODELS/prompts.json" ] || (PYTHONPATH=$SITE python3 benchmark/gpu/make_dsv4_models.py "$MODELS" \
      --layout mixed 2>&1 | grep -v Warning | tail -3) &
  if [ -n "${FORK_TREE:-}" ]; then
    unpack_fork_tree "$FORK_TREE" "$FORK/unpatched" || exit 1
    echo "[setup] fork tree $FORK_TREE in $FORK/unpatched"
  else
    if [ ! -f "$FORK/unpatched/.forked" ]; then
      rm -rf "$FORK" && mkdir -p "$FORK/unpatched" && cp -a "$SITE/sglang" "$FORK/unpatched/sglang" || exit 1
      find "$FORK/unpatched/sglang" -name __pycache__ -prune -exec rm -rf {} +
      python3 test/support/fork_edits.py "$EDIT" "$FORK/unpatched" || exit 1
      touch "$FORK/unpatched/.forked"
    fi
    echo "[setup] fork $EDIT in $FORK/unpatched"
  fi
  DLSRC=$REPO/python
  [ -d .gpu/dl_head/python/sglang_draft_layout ] && DLSRC=$REPO/.gpu/dl_head/python
  echo "[setup] sglang_draft_layout from $DLSRC $(cat .gpu/dl_head/COMMIT 2>/dev/null)"
  make_patched_copy "$FORK/unpatched" "$FORK/patched" "$DLSRC" || exit 1
  wait
  [ -f "$MODELS/prompts.json" ] || { echo "[setup] building $MODELS failed"; exit 1; }
  echo "[setup] done"
} 2>&1 | tee "$OUT/setup.txt"
grep -q "^\[setup\] done" "$OUT/setup.txt" || { echo "SETUP FAILED"; exit 1; }
{ echo "== the fork's own split, unpatched and patched"; diff -ru "$FORK/unpatched/sglang" "$FORK/patched/sglang"; } \
  > "$OUT/fork_patch.diff" 2>&1

# unpatched servers: the fork first, then 0.5.12's dependencies; patched: the patched copy first
L=$WORK/logs-$(basename "$OUT")
PYTHONPATH=$SITE python3 benchmark/gpu/serve_checks.py --models "$MODELS" --site "$FORK/unpatched" \
  --patched "$FORK/patched" --out "$OUT" --logdir "$L" --stress "${STRESS:-1}" \
  --mem-fraction "${MEM_FRACTION:-0.5}" --deadline-s "${DEADLINE_S:-1000000000}" \
  --extra-args="${EXTRA_ARGS---disable-piecewise-cuda-graph}" "$@"
rc=$?
cat "$L"/trace_*.txt 2>/dev/null | awk '{print $2, $3}' | sort | uniq -c > "$OUT/trace.txt"
for f in "$L"/*.log; do echo "== $(basename "$f")"; grep -E "AssertionError|Error|Traceback" "$f" | tail -5; done \
  > "$OUT/errors.txt" 2>/dev/null
echo "[run] rc=$rc"
exit $rc
