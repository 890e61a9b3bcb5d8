#!/bin/bash
# Issue 19's A/B on the lent H200, in one device call (or two warm ones):
#   set -o pipefail; DEADLINE_S=560 bash benchmark/gpu/ab_h200.sh --configs flashinfer_cg_k8s5 \
#       --concurrencies 32 2>&1 | tee $OUT/console.txt          (carry .gpu/sitepack .gpu/lib .whl)
# 1. run_on_h200.sh --setup-only with MODEL_SHAPE=8b: SGLang 0.5.12 from the sitepack, the
#    patched copy (apply + check), the exact 8B-shaped models (exact_8b.py, built on the GPU);
#    all kept in $GPU_WORK (/tmp/sgl_dl) for a warm second call;
# 2. ab_bench.py with the remaining arguments, stopping cleanly DEADLINE_S seconds after this
#    script started.
# $OUT gets at most 6 files: setup.txt, patch.txt, ab_results.json, ab_summary.md, logs.tgz
# (server logs, memory probe, bench_serving's JSONL per run), nvidia-smi.txt.
set -u
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
T_END=$(( $(date +%s) + ${DEADLINE_S:-560} ))
export GPU_WORK=${GPU_WORK:-/tmp/sgl_dl} MODEL_SHAPE=${MODEL_SHAPE:-8b} PYTHONUNBUFFERED=1
OUT=${OUT:-$REPO/benchmark/results/ab-$(date -u +%Y%m%dT%H%M%SZ)}
export OUT
mkdir -p "$OUT"
bash benchmark/gpu/run_on_h200.sh --setup-only || { echo "SETUP FAILED"; exit 1; }
for lib in .gpu/lib .gpu/recipe/lib; do
  if ! ldconfig -p 2>/dev/null | grep -q 'libnuma.so.1 ' && [ -f "$lib/libnuma.so.1" ]; then
    export LD_LIBRARY_PATH=$REPO/$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; break; fi
done
WORK_AB=$GPU_WORK/ab-$(date -u +%H%M%S)
echo "[ab] $(date -u +%T) setup done; ab_bench until $(date -u -d @$T_END +%T)"
python3 benchmark/gpu/ab_bench.py --models "$GPU_WORK/models$MODEL_SHAPE" --site "$GPU_WORK/site" \
  --patched "$GPU_WORK/patched" --out "$OUT" --work "$WORK_AB" --deadline-epoch "$T_END" "$@"
rc=$?
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
tar -czf "$OUT/logs.tgz" -C "$WORK_AB" . 2>/dev/null
echo "[ab] $(date -u +%T) done rc=$rc"
exit $rc
