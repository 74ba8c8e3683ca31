#!/usr/bin/env bash
# After tests/gpu/run.sh on the GPU machine (same WORK): the drafter bench of `make bench`
# (tests/gpu/bench_gpu.py: same cells, interleaved passes, report schema and plot) with the llama-server that
# run.sh built, fully offloaded: the tiny Gemma 4 pair on draft-mtp, then the tiny target drafting for itself
# (draft-simple, where greedy acceptance must be ~1). Reports, plots and server logs: $OUT/bench.tar.gz.
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-$REPO/.artifacts/gpu-out}
WORK=${WORK:-/tmp/rigkit-gpu}
DEVICE_DIR=${DEVICE_DIR:-$REPO/.device}
PYTHON=${PYTHON:-python3}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-150}
EXTRA=${BENCH_EXTRA_ARGS:--ngl all -fa on}
mkdir -p "$OUT" "$WORK/bench"
bin=$(cat "$WORK/server-bin" 2>/dev/null) || { echo "run_bench: no llama-server from run.sh ($WORK/server-bin)"; exit 1; }
# shellcheck disable=SC1091
[ ! -f "$WORK/runtime.env" ] || source "$WORK/runtime.env"
[ ! -d "$WORK/site" ] || export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
target="$DEVICE_DIR/models/tiny-gemma4.gguf"
rc=0
run_one() { # NAME DRAFTER SPEC_TYPE
  echo "=== bench $1 ($3) start $(date -u +%T)"
  timeout "$BENCH_TIMEOUT" "$PYTHON" "$REPO/tests/gpu/bench_gpu.py" --server-bin "$bin" --target "$target" \
    --drafter "$2" --spec-type "$3" --draft-max "${DRAFT_MAX:-3}" --passes "${PASSES:-2}" \
    --n-predict "${N_PREDICT:-64}" --concurrency-max "${CONCURRENCY_MAX:-2}" --kinds "${KINDS:-code,prose,chat,structured}" \
    --extra-args "$EXTRA" --host-name "gpu-$1" --out "$WORK/bench/$1.json" --log "$WORK/bench/$1-server.log" \
    2>&1 | tee "$WORK/bench/$1.out"
  local status=${PIPESTATUS[0]}
  echo "=== bench $1 exit $status at $(date -u +%T)"
  [ "$status" = 0 ] || rc=1
}
run_one tiny-mtp "$DEVICE_DIR/models/tiny-gemma4-assistant.gguf" draft-mtp
run_one tiny-self "$target" draft-simple
tar -czf "$OUT/bench.tar.gz" -C "$WORK" bench
exit "$rc"
