#!/bin/bash
# Issue 19's A/B on the lent H200. From the repository root, carry .gpu/sitepack .gpu/lib .whl:
#
#   in one call:   set -o pipefail; DEADLINE_S=560 bash benchmark/gpu/ab_h200.sh [run] AB_ARGS... 2>&1 | tee $OUT/console.txt
#   over a whole session, the A/B going on in the background between calls (each next call
#   within the machine's 30 s warm window):
#     call 1:      DEADLINE_S=1550 WAIT_S=540 bash benchmark/gpu/ab_h200.sh start AB_ARGS...
#     later calls: [DEADLINE_IN=S] bash benchmark/gpu/ab_h200.sh wait SECONDS
#
# run / start: run_on_h200.sh --setup-only with MODEL_SHAPE=8b (SGLang 0.5.12 from the sitepack, the
#   patched copy by `apply` + `check`, the exact 8B-shaped models built on the GPU; all kept in
#   $GPU_WORK, /tmp/sgl_dl, for a warm next call), then ab_bench.py AB_ARGS, which ends cleanly by
#   the deadline: DEADLINE_S seconds after this script started, kept in $GPU_WORK/ab/deadline.
#   start returns after WAIT_S seconds (as wait does) and leaves the A/B running (setsid).
# wait: waits until the A/B has ended or SECONDS have passed; DEADLINE_IN=S first moves the
#   deadline to S seconds from now (to fit the device time that is really left).
# AB_ARGS for parity: --mode together --cpu-split (each tree's server and client on its own half of
#   the host's CPUs, the halves swapping trees pair by pair) --config-seconds S (pairs beyond --pairs
#   while a configuration's measured phase has run less than S s and a pair fits before the deadline),
#   e.g. start --mode together --cpu-split --config-seconds 500 --concurrencies 32 --configs flashinfer_cg_k1s3@1,8,32 triton_nocg_k4s3
#   (STEM@1,8,32: a configuration's own concurrencies)
#   (ab_bench.py's docstring). Keep setup + WAIT_S + packing under the 600 s of one call: WAIT_S <= 500.
# AB_PROGRAM=memory_cost.py runs benchmark/gpu/memory_cost.py instead of ab_bench.py, with the same
#   setup, deadline and background calls (its docstring; it writes memory_cost.json and memory_cost.md
#   where ab_bench writes ab_results.json and ab_summary.md).
# Either way $OUT gets at most 8 files: setup.txt, patch.txt, console.txt, ab_results.json,
# ab_summary.md (both rewritten after every measured round), logs.tgz (server logs, memory probe,
# bench_serving's JSONL per run, the GPU's clocks every 5 s in gpu_clocks.csv, the host's CPU
# times and load every 5 s in host.txt), nvidia-smi.txt and flashinfer_jit.tgz (the modules this
# machine JIT-compiled: copied into .gpu/fiaot/ as it is and carried, a next session's setup puts
# them in place, flashinfer_aot.sh).
set -u
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
export GPU_WORK=${GPU_WORK:-/tmp/sgl_dl} MODEL_SHAPE=${MODEL_SHAPE:-8b} PYTHONUNBUFFERED=1
OUT=${OUT:-$REPO/benchmark/results/ab-$(date -u +%Y%m%dT%H%M%SZ)}
AB=$GPU_WORK/ab
mkdir -p "$OUT" "$AB"
. benchmark/gpu/flashinfer_aot.sh

setup() {
  echo $(( $(date +%s) + ${DEADLINE_S:-560} )) > "$AB/deadline"
  OUT=$AB bash benchmark/gpu/run_on_h200.sh --setup-only || { echo "SETUP FAILED"; return 1; }
}

host_monitor() {  # the host every 5 s: does steal time (other VMs) or load explain a drift of tokens/s?
  echo "# epoch | /proc/stat line 1: cpu user nice system idle iowait irq softirq steal guest guest_nice" \
    "(USER_HZ ticks since boot) | /proc/loadavg"
  while :; do
    echo "$(date +%s) | $(head -n 1 /proc/stat) | $(cat /proc/loadavg)"
    sleep 5
  done
}

bench() {  # ab_bench.py until the deadline; $AB/done when it has ended
  for lib in .gpu/lib .gpu/recipe/lib; do
    if ! ldconfig -p 2>/dev/null | grep -q 'libnuma.so.1 ' && [ -f "$lib/libnuma.so.1" ]; then
      export LD_LIBRARY_PATH=$REPO/$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; break; fi
  done
  rm -f "$AB/done"
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,temperature.gpu,power.draw,utilization.gpu \
    --format=csv -l 5 > "$AB/work/gpu_clocks.csv" 2>&1 &
  local smi=$!
  host_monitor > "$AB/work/host.txt" 2>&1 &
  local host=$!
  echo "[ab] $(date -u +%T) ab_bench until $(date -u -d @"$(cat "$AB/deadline")" +%T) (or $AB/deadline when moved)"
  python3 "benchmark/gpu/${AB_PROGRAM:-ab_bench.py}" --models "$GPU_WORK/models$MODEL_SHAPE" --site "$GPU_WORK/site" \
    --patched "$GPU_WORK/patched" --out "$AB" --work "$AB/work" --deadline-file "$AB/deadline" "$@"
  local rc=$?
  kill $smi $host 2>/dev/null
  echo "[ab] $(date -u +%T) done rc=$rc"
  echo $rc > "$AB/done"
}

pack() {  # what there is so far, into $OUT
  cp "$AB"/setup.txt "$AB"/patch.txt "$AB"/console.txt "$AB"/ab_results.json "$AB"/ab_summary.md \
    "$AB"/memory_cost.json "$AB"/memory_cost.md "$OUT"/ 2>/dev/null
  nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
  tar -czf "$OUT/logs.tgz" -C "$AB/work" . 2>/dev/null
  pack_flashinfer_jit "$OUT/flashinfer_jit.tgz"
}

wait_for() {  # wait_for SECONDS: until the A/B has ended or SECONDS have passed
  local end=$(( $(date +%s) + $1 ))
  while [ ! -f "$AB/done" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
  tail -n 25 "$AB/console.txt"
}

cmd=run
case ${1:-} in run|start|wait|bench) cmd=$1; shift ;; esac
case $cmd in
  run)
    mkdir -p "$AB/work"
    { setup && bench "$@"; } 2>&1 | tee "$AB/console.txt"
    rc=$(cat "$AB/done" 2>/dev/null || echo 1)
    pack; exit "$rc" ;;
  start)
    rm -rf "$AB/work" "$AB/done" "$AB"/ab_results.json "$AB"/ab_summary.md "$AB"/memory_cost.*; mkdir -p "$AB/work"
    setup > "$AB/console.txt" 2>&1 || { cat "$AB/console.txt"; pack; exit 1; }
    setsid nohup bash "$0" bench "$@" >> "$AB/console.txt" 2>&1 < /dev/null &
    wait_for "${WAIT_S:-0}"; pack ;;
  wait)
    [ -n "${DEADLINE_IN:-}" ] && echo $(( $(date +%s) + DEADLINE_IN )) > "$AB/deadline"
    wait_for "${1:-500}"; pack ;;
  bench) bench "$@" ;;
esac
