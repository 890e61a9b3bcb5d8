#!/bin/bash
# The GPU test that `apply --gpu-test` writes into a fork (fork_templates/registered_gpu), run as
# the fork's CI runs it: from the checkout's test/ folder, `python3 run_suite.py --hw cuda --suite
# SUITE` (the fork's own collect_tests, validate_all_suites and filter_tests pick it, then
# run_unittest_files runs it as `python3 FILE -f`). Two fork checkouts are laid out under
# $GPU_WORK/forkci: patched (python/sglang patched by `apply`, the tests written there by
# `apply --gpu-test`, SUITE read from the written file) and unpatched (the same test files and
# run_suite.py, python/sglang as it was). The patched one must pass; the unpatched one must fail
# (flashinfer CUDA graphs, topk 8 / 5 steps: a batch of 8 near-context prompts dropped the
# accept length to 3.6 there on 0.5.12).
#
# SGLang 0.5.12 (the default): after `bash benchmark/gpu/run_on_h200.sh --setup-only` (0.5.12 in
# $GPU_WORK/site, the patched copy in $GPU_WORK/patched); test/run_suite.py is the v0.5.12-era
# fixture (test/fork_ci/fixtures/run_suite/v0.5.12.py). From the repository root:
#
#   OUT=FOLDER bash benchmark/gpu/run_fork_gpu_test.sh
#
# A fork of your own: FORK=/path/to/checkout (its python/sglang, and its test/run_suite.py when
# it has one), laid over the same 0.5.12 dependencies ($GPU_WORK/site after --setup-only);
# python/sglang is copied, never written in place:
#
#   FORK=/path/to/checkout OUT=FOLDER bash benchmark/gpu/run_fork_gpu_test.sh
#
# Output under $OUT: test_draft_layout_exact.py (the written file), suite.txt, apply.txt,
# patched.log and unpatched.log (run_suite.py's output with unittest's; a failure names
# configuration, request and accept length, a server that did not start shows its log's tail),
# summary.md. Exit 0 only if the patched run passed and the unpatched run failed in
# test_flashinfer_cg_k8s5 on an output or an accept length.
# Knobs: GPU_WORK (/tmp/sgl_dl), TREE_TIMEOUT_S (420, each tree: run_suite.py imports SGLang before the test starts), SGLANG_DRAFT_LAYOUT_CONFIGS
# (comma-separated configuration names, read by the test), FORK.
set -u
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
. benchmark/gpu/patch_copy.sh
OUT=${OUT:-$REPO/benchmark/results/forktest-$(date -u +%Y%m%dT%H%M%SZ)}
WORK=${GPU_WORK:-/tmp/sgl_dl}
SITE=$WORK/site
PATCHED=$WORK/patched
FORKCI=$WORK/forkci
mkdir -p "$OUT"
[ -d "$SITE/sglang" ] || { echo "no $SITE/sglang: run benchmark/gpu/run_on_h200.sh --setup-only first"; exit 1; }
for lib in .gpu/lib .gpu/recipe/lib; do
  if ! ldconfig -p 2>/dev/null | grep -q 'libnuma.so.1 ' && [ -f "$lib/libnuma.so.1" ]; then
    export LD_LIBRARY_PATH=$REPO/$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; break; fi
done
# stand-ins where the machine lacks them: `datasets` (test_utils imports it) and `tabulate`
# (run_suite.py prints its table with it); neither is used by what runs here
STANDIN=""
python3 -c "import datasets" 2>/dev/null || STANDIN=$REPO/benchmark/gpu/standin
PYTHONPATH=$SITE python3 -c "import tabulate" 2>/dev/null || STANDIN=${STANDIN:+$STANDIN:}$REPO/benchmark/gpu/standin_ci
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

# the package's own `apply`, from the .gpu/dl_head snapshot when carried
DLSRC=$REPO/python
[ -d .gpu/dl_head/python/sglang_draft_layout ] && DLSRC=$REPO/.gpu/dl_head/python

# the two checkouts: python/sglang (unpatched: as it is; patched: by the project's apply) and test/
rm -rf "$FORKCI"; mkdir -p "$FORKCI/unpatched/python" "$FORKCI/patched"
if [ -n "${FORK:-}" ]; then
  [ -d "$FORK/python/sglang" ] || { echo "FORK=$FORK: no python/sglang there"; exit 1; }
  SOURCE=$FORK/python
  make_patched_copy "$SOURCE" "$FORKCI/patched/python" "$DLSRC" || { echo "apply on a copy of $FORK failed"; exit 1; }
else
  SOURCE=$SITE
  make_patched_copy "$SITE" "$PATCHED" "$DLSRC" || exit 1   # a no-op where --setup-only made it
  ln -s "$PATCHED" "$FORKCI/patched/python"
fi
ln -s "$SOURCE/sglang" "$FORKCI/unpatched/python/sglang"
RUN_SUITE=$REPO/test/fork_ci/fixtures/run_suite/v0.5.12.py
[ -n "${FORK:-}" ] && [ -f "$FORK/test/run_suite.py" ] && RUN_SUITE=$FORK/test/run_suite.py
for tree in patched unpatched; do
  mkdir -p "$FORKCI/$tree/test/registered"
  cp "$RUN_SUITE" "$FORKCI/$tree/test/run_suite.py"
done
{ echo "\$ $DL apply --gpu-test $FORKCI/patched"; PYTHONPATH=$DLPATH $DL apply --gpu-test "$FORKCI/patched" 2>&1
  echo "rc=$?"; } > "$OUT/apply.txt"
grep -q "^rc=0" "$OUT/apply.txt" || { cat "$OUT/apply.txt"; echo "apply --gpu-test failed"; exit 1; }
WRITTEN=$FORKCI/patched/test/registered/spec/eagle/test_draft_layout_exact.py
[ -f "$WRITTEN" ] || { cat "$OUT/apply.txt"; echo "apply wrote no GPU test (no CUDA suite in $RUN_SUITE?)"; exit 1; }
cp -r "$FORKCI/patched/test/registered" "$FORKCI/unpatched/test/"
cp "$WRITTEN" "$OUT/test_draft_layout_exact.py"
SUITE=$(sed -n 's/^register_cuda_ci(.*suite="\([^"]*\)".*/\1/p' "$WRITTEN")
[ -n "$SUITE" ] || SUITE=$(tr -d '\n ' < "$WRITTEN" | sed -n 's/.*register_cuda_ci(est_time=[0-9]*,suite="\([^"]*\)".*/\1/p')
echo "$SUITE" > "$OUT/suite.txt"
echo "[forkci] run_suite.py: $RUN_SUITE; CUDA suite of the written test: $SUITE"

run_tree() {  # run_tree NAME: the fork's CI command in that checkout, bounded; servers die with it
  local start=$(date +%s) pp=$FORKCI/$1/python:$SITE${STANDIN:+:$STANDIN}
  # timeout signals its whole process group: run_suite.py, the test, its servers and schedulers
  (cd "$FORKCI/$1/test" && PYTHONPATH=$pp timeout -k 20 "${TREE_TIMEOUT_S:-420}" \
     python3 run_suite.py --hw cuda --suite "$SUITE" > "$OUT/$1.log" 2>&1)
  local rc=$?
  local result=$(grep -E '^(OK|FAILED)' "$OUT/$1.log" | tail -1)
  local failed=$(grep -oE '^(FAIL|ERROR): test_[a-z0-9_]+' "$OUT/$1.log" | sed 's/.*: //' | sort -u | tr '\n' ' ')
  echo "| $1 | $pp | $rc | $(( $(date +%s) - start )) | ${result:-no result (timeout?)} | ${failed:--} |" >> "$OUT/summary.md"
  echo "[$1] rc=$rc ${result:-no result} failed: ${failed:--}"
  return $rc
}

{
  echo "fork checkouts under $FORKCI, sglang from ${FORK:-$SITE}, run_suite.py $RUN_SUITE, suite $SUITE"
  echo
  echo "| tree | PYTHONPATH | rc | seconds | unittest | failed tests |"
  echo "| --- | --- | --- | --- | --- | --- |"
} > "$OUT/summary.md"
run_tree patched
patched_rc=$?
run_tree unpatched
unpatched_rc=$?
# what the unpatched tree's failures say (configuration, request, accept length)
{ echo; echo "unpatched failures:"; grep -E '^[a-z]+_(no)?cg_k[0-9]+s[0-9]+ [a-z_0-9]+\[[0-9]+\]: ' "$OUT/unpatched.log" | head -40; } >> "$OUT/summary.md"
cat "$OUT/summary.md"

selected() { grep -q "test_draft_layout_exact.py" "$OUT/$1.log"; }
expected=$(grep -cE '^flashinfer_cg_k8s5 [a-z_0-9]+\[[0-9]+\]: (accept length|output differs)' "$OUT/unpatched.log")
if [ "$patched_rc" = 0 ] && grep -q '^OK' "$OUT/patched.log" && selected patched && selected unpatched \
   && [ "$unpatched_rc" != 0 ] && grep -qE '^(FAIL|ERROR): test_flashinfer_cg_k8s5' "$OUT/unpatched.log" \
   && [ "$expected" -gt 0 ]; then
  echo "VERDICT: as expected (suite $SUITE; patched passed; unpatched failed in flashinfer_cg_k8s5, $expected requests)"
  exit 0
fi
echo "VERDICT: NOT as expected (suite $SUITE; patched rc=$patched_rc, unpatched rc=$unpatched_rc, flashinfer_cg_k8s5 requests failed: $expected)"
exit 1
