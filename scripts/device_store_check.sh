#!/usr/bin/env bash
# The store's CUDA data plane on a lent device machine, in one short run (under 5 minutes):
# the CUDA store tests (same-host IPC columns included), then bench_store.py --device cuda
# with the same-host plane and with RAYLESS_STORE_LOCAL=0 (the socket path: CUDA IPC of each
# message's tensors), each beside a device-to-device copy of the same bytes measured in that
# run (goal: CUDA unit put and get on one host >= 0.5x of that copy).
#
#   here, with network:  bash scripts/device_check.sh prepare       (the wheels, into .whl/)
#   there (device tool): bash scripts/device_store_check.sh          (carry: [".whl"])
#
# Every log and figure goes under $OUT (or the first argument); summary.txt has each step's
# exit code. scripts/device_check.sh runs the same tests and benchmark among its other steps.
set -u
cd "$(dirname "$0")/.."

out="${1:-${OUT:-/tmp/device_store_check}}"
mkdir -p "$out"
summary="$out/summary.txt"
: > "$summary"
export PYTHONUNBUFFERED=1

step() {  # step NAME TIMEOUT_S LOGFILE COMMAND...: run, log, record the exit code
  local name=$1 limit=$2 log=$3
  shift 3
  local t0=$SECONDS
  echo "== $name" | tee -a "$log"
  timeout "$limit" "$@" >> "$log" 2>&1
  local rc=$?
  echo "$name: rc=$rc ($((SECONDS - t0)) s)" | tee -a "$summary"
  return 0
}

dev="$out/device.txt"
{ nvidia-smi -L; python3 -c "import torch; print('torch', torch.__version__, torch.cuda.is_available())"; } > "$dev" 2>&1

if [ ! -x /tmp/rl-venv/bin/python ]; then
  step install 180 "$dev" bash scripts/device_install.sh  # into /tmp/rl-venv
fi
export PATH=/tmp/rl-venv/bin:$PATH

step store-cuda-tests 150 "$out/store_cuda_tests.txt" \
  python -m pytest tests/cuda/test_store_cuda.py tests/cuda/test_store_shard_cuda.py \
  -q -p no:cacheprovider -rA

step bench-store-cuda-local 100 "$out/bench_store_cuda_local.txt" \
  python scripts/bench_store.py --device cuda --quick --json "$out/bench_store_cuda_local.json"

step bench-store-cuda-socket 100 "$out/bench_store_cuda_socket.txt" \
  env RAYLESS_STORE_LOCAL=0 python scripts/bench_store.py --device cuda --quick \
  --json "$out/bench_store_cuda_socket.json"

cat "$summary"
grep -h "vs the device copy\|IPC\|put 16 MiB\|get 16 MiB" "$out"/bench_store_cuda_*.txt || true
! grep -q 'rc=[1-9]' "$summary"
