#!/bin/bash
# The GPU test that `apply` writes into a fork (fork_templates/registered_gpu), run as the fork's
# CI runs it (`python3 FILE`), on the patched copy of SGLang 0.5.12 (it must pass) and then on the
# unpatched one (flashinfer CUDA graphs, topk 8 / 5 steps must fail: a batch of 8 near-context
# prompts dropped the accept length to 3.6 there). After `bash benchmark/gpu/run_on_h200.sh
# --setup-only` (0.5.12 in $GPU_WORK/site, the patched copy in $GPU_WORK/patched). From the
# repository root:
#
#   OUT=FOLDER bash benchmark/gpu/run_fork_gpu_test.sh
#
# Output under $OUT: test_draft_layout_exact.py (the rendered file), patched.log and unpatched.log
# (unittest's output; a failure names configuration, request and accept length, a server that did
# not start shows its log's tail), summary.md. Exit 0 only if the patched run passed and the
# unpatched run failed in test_flashinfer_cg_k8s5 on an output or an accept length.
# Knobs: GPU_WORK (/tmp/sgl_dl), TREE_TIMEOUT_S (300, each tree), SGLANG_DRAFT_LAYOUT_CONFIGS
# (comma-separated configuration names, read by the test).
set -u
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
OUT=${OUT:-$REPO/benchmark/results/forktest-$(date -u +%Y%m%dT%H%M%SZ)}
WORK=${GPU_WORK:-/tmp/sgl_dl}
SITE=$WORK/site
PATCHED=$WORK/patched
mkdir -p "$OUT"
[ -d "$SITE/sglang" ] && [ -d "$PATCHED/sglang" ] \
  || { echo "no $SITE/sglang or $PATCHED/sglang: run benchmark/gpu/run_on_h200.sh --setup-only first"; exit 1; }
for lib in .gpu/lib .gpu/recipe/lib; do
  if ! ldconfig -p 2>/dev/null | grep -q 'libnuma.so.1 ' && [ -f "$lib/libnuma.so.1" ]; then
    export LD_LIBRARY_PATH=$REPO/$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; break; fi
done
# a stand-in `datasets` (benchmark/gpu/standin) where the machine has none: test_utils imports it
python3 -c "import datasets" 2>/dev/null || STANDIN=$REPO/benchmark/gpu/standin
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

# the package's own rendering (no libcst needed), from the .gpu/dl_head snapshot when carried
GENERATED=$OUT/test_draft_layout_exact.py
DLSRC=$REPO/python
[ -d .gpu/dl_head/python/sglang_draft_layout ] && DLSRC=$REPO/.gpu/dl_head/python
PYTHONPATH=$DLSRC python3 -c "import sys; from sglang_draft_layout.fork_tests import render
sys.stdout.write(render('registered_gpu'))" > "$GENERATED" || { echo "render failed"; exit 1; }

run_tree() {  # run_tree NAME PYTHONPATH: the file under python3, bounded; servers die with it
  local start=$(date +%s)
  # timeout signals its whole process group: the test's servers and their schedulers too
  PYTHONPATH=$2${STANDIN:+:$STANDIN} timeout -k 20 "${TREE_TIMEOUT_S:-300}" python3 "$GENERATED" > "$OUT/$1.log" 2>&1
  local rc=$?
  local result=$(grep -E '^(OK|FAILED)' "$OUT/$1.log" | tail -1)
  local failed=$(grep -oE '^(FAIL|ERROR): test_[a-z0-9_]+' "$OUT/$1.log" | sed 's/.*: //' | sort -u | tr '\n' ' ')
  echo "| $1 | $2 | $rc | $(( $(date +%s) - start )) | ${result:-no result (timeout?)} | ${failed:--} |" >> "$OUT/summary.md"
  echo "[$1] rc=$rc ${result:-no result} failed: ${failed:--}"
  return $rc
}

{
  echo "| tree | PYTHONPATH | rc | seconds | unittest | failed tests |"
  echo "| --- | --- | --- | --- | --- | --- |"
} > "$OUT/summary.md"
run_tree patched "$PATCHED:$SITE"
patched_rc=$?
run_tree unpatched "$SITE"
unpatched_rc=$?
# what the unpatched tree's failures say (configuration, request, accept length)
{ echo; echo "unpatched failures:"; grep -E '^[a-z]+_(no)?cg_k[0-9]+s[0-9]+ [a-z_0-9]+\[[0-9]+\]: ' "$OUT/unpatched.log" | head -40; } >> "$OUT/summary.md"
cat "$OUT/summary.md"

expected=$(grep -cE '^flashinfer_cg_k8s5 [a-z_0-9]+\[[0-9]+\]: (accept length|output differs)' "$OUT/unpatched.log")
if [ "$patched_rc" = 0 ] && grep -q '^OK' "$OUT/patched.log" && [ "$unpatched_rc" != 0 ] \
   && grep -qE '^(FAIL|ERROR): test_flashinfer_cg_k8s5' "$OUT/unpatched.log" && [ "$expected" -gt 0 ]; then
  echo "VERDICT: as expected (patched passed; unpatched failed in flashinfer_cg_k8s5, $expected requests)"
  exit 0
fi
echo "VERDICT: NOT as expected (patched rc=$patched_rc, unpatched rc=$unpatched_rc, flashinfer_cg_k8s5 requests failed: $expected)"
exit 1
