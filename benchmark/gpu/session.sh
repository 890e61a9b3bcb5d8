#!/bin/bash
# One H200 session of GPU work in few device calls: the runs go on in the background between calls
# (setsid), one lane per GPU, so that a 2-GPU machine does two lanes at once. From the repository root:
#
#   call 1, carry [".gpu/sitepack", ".gpu/dsv4b", ".gpu/lib"]:  bash benchmark/gpu/session.sh unpack
#   call 2, carry [".gpu/dsv4a", ".whl", ".gpu/lib"]:           bash benchmark/gpu/session.sh start
#   later calls (within the machine's 30 s warm window):       bash benchmark/gpu/session.sh wait SECONDS
#
# start: unpacks the DeepSeek-V4 pack left, patches a copy with this checkout's `apply` and builds
# the Llama models (run_on_h200.sh --setup-only), then starts the lanes and returns.
# wait: waits until every lane has finished or SECONDS have passed, then packs each lane's output
# into $OUT (lane0.tgz, lane1.tgz, status.txt); call it again while a lane runs.
# Lanes (LANES overrides, e.g. LANES="0" for one GPU: every job then runs on GPU 0, one after another):
#   lane 0: the key set (flashinfer CUDA graphs topk 4 / 3 steps, both trees), then the generated fork GPU
#           test (run_fork_gpu_test.sh) on both trees
#   lane 1: the interleaved A/B (ab_bench.py), DeepSeek-V4 dsv4_nocg, then the page-16 leak reproduction
set -u
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
WORK=${GPU_WORK:-/tmp/sgl_dl}
R=$WORK/session
mkdir -p "$R"
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)

jobs_of_lane() {
  case $1 in
    0) echo key forktest ;;
    1) echo ab dsv4 leak ;;
  esac
}

run_job() {  # run_job NAME: one job, its output under $R/NAME
  local out=$R/$1
  mkdir -p "$out"
  echo "[$(date -u +%T)] start $1 on GPU ${CUDA_VISIBLE_DEVICES:-all}" >> "$R/status.txt"
  case $1 in
    key) OUT=$out DEADLINE_S=480 bash benchmark/gpu/run_on_h200.sh key ;;
    forktest) OUT=$out bash benchmark/gpu/run_fork_gpu_test.sh ;;
    ab) python3 benchmark/gpu/ab_bench.py --models "$WORK/models" --site "$WORK/site" --patched "$WORK/patched" \
          --out "$out" --max-seconds "${AB_SECONDS:-480}" ;;
    dsv4) OUT=$out DSV4_LAYOUTS=mixed STRESS=1 MEM_FRACTION=0.5 DEADLINE_S=480 \
            bash benchmark/gpu/run_deepseek_on_h200.sh dsv4_nocg ;;
    leak) OUT=$out STRESS=1 DEADLINE_S=400 EXTRA_ARGS="--page-size 16 --disable-radix-cache" \
            bash benchmark/gpu/run_on_h200.sh flashinfer_cg_k4s4_unpatched flashinfer_cg_k4s4_patched ;;
  esac > "$out/console.txt" 2>&1
  echo "[$(date -u +%T)] end $1 rc=$?" >> "$R/status.txt"
}

lane() {  # lane N: its jobs in order, on GPU N (or on the only GPU)
  export CUDA_VISIBLE_DEVICES=$(( NGPU > 1 ? $1 : 0 ))
  local job
  for job in $(jobs_of_lane "$1"); do run_job "$job"; done
  touch "$R/lane$1.done"
}

case ${1:-} in
  unpack)
    OUT=$R/unpack bash benchmark/gpu/run_deepseek_on_h200.sh --unpack-only ;;
  start)
    OUT=$R/unpack bash benchmark/gpu/run_deepseek_on_h200.sh --unpack-only || exit 1
    OUT=$R/setup bash benchmark/gpu/run_on_h200.sh --setup-only || { cat "$R/setup/setup.txt"; exit 1; }
    cat "$R/setup/setup.txt" "$R/setup/patch.txt"
    lanes=${LANES:-$([ "$NGPU" -gt 1 ] && echo "0 1" || echo "01")}
    for l in $lanes; do
      if [ "$l" = 01 ]; then  # one GPU: lane 1's jobs after lane 0's
        setsid nohup bash "$0" lanes-in-order > "$R/lane01.txt" 2>&1 < /dev/null &
      else
        setsid nohup bash "$0" lane "$l" > "$R/lane$l.txt" 2>&1 < /dev/null &
      fi
    done
    sleep 2; echo "started lanes: $lanes on $NGPU GPU(s)"; cat "$R/status.txt" ;;
  lane) lane "$2" ;;
  job)  # job NAME GPU: one more job in the background on that GPU
    CUDA_VISIBLE_DEVICES=$3 setsid nohup bash "$0" run-job "$2" > "$R/job_$2.txt" 2>&1 < /dev/null &
    sleep 1; cat "$R/status.txt" ;;
  run-job) run_job "$2" ;;
  lanes-in-order) lane 0; lane 1 ;;
  wait)
    end=$(( $(date +%s) + ${2:-500} ))
    while [ "$(date +%s)" -lt "$end" ] && ! { [ -f "$R/lane1.done" ] && [ -f "$R/lane0.done" ]; }; do sleep 10; done
    cat "$R/status.txt"
    for l in 0 1; do
      dirs=""
      for job in $(jobs_of_lane $l); do [ -d "$R/$job" ] && dirs="$dirs $job"; done
      [ -n "$dirs" ] && tar -czf "$OUT/lane$l.tgz" -C "$R" $dirs
    done
    cp "$R/status.txt" "$OUT/" ;;
  *) sed -n 2,20p "$0"; exit 2 ;;
esac
