#!/usr/bin/env bash
# Every GPU path of rayless in one run on a lent device machine (an H100 or H200; its python3,
# a venv of Python 3.12 with a CUDA torch 2.11; no network there). Two steps:
#
#   here, with network:  bash scripts/device_check.sh prepare
#       downloads the wheels the device lacks (pyzmq, tensordict, pyvers, pytest-asyncio) for
#       CPython 3.12 into .whl/ (git-ignored through .git/info/exclude)
#   there (device tool): bash scripts/device_check.sh            (carry: [".whl"])
#       installs rayless into a venv over the system's CUDA torch, then runs
#       - NVML discovery and a 1 GiB device-to-device copy (the bandwidth the goals compare to);
#       - tests/cuda: CUDA codec, discovery, the store's CUDA TensorDicts and IPC columns, CUDA
#         IPC weight buckets, delta publishes on that path (and its refusal of verified
#         pulls), a 2-process NCCL weight group (two GPUs; on one GPU, that NCCL's refusal
#         of two ranks on one GPU is an error, not a hang);
#       - the CUDA store benchmark (batches, and verl's pattern: a new partition per step)
#         beside a device-to-device copy of the same bytes;
#       - the CUDA weight-sync benchmark: 256 MiB and 1 GiB bf16 state dicts to 4 subscribers
#         over CUDA IPC, against the copy bandwidth, and full against delta publishes;
#       - short GPU runs of the PPO and the GRPO demos.
#       Every figure and log goes under $OUT (or the first argument). Within 9 minutes in all
#       (BUDGET below); each step has its own timeout and the run goes on after a failed
#       step. summary.txt lists each step's exit code.
set -u
cd "$(dirname "$0")/.."

WHEELS=(pyzmq==27.3.0 tensordict==0.15.3 pyvers==0.2.3 pytest-asyncio==1.5.0)

if [ "${1:-}" = "prepare" ]; then
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
  mkdir -p .whl
  for w in "${WHEELS[@]}"; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
      --platform manylinux_2_26_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
      -d .whl "$w" || { echo "could not download $w" >&2; exit 1; }
  done
  ls -l .whl
  du -sh .whl
  exit 0
fi

out="${1:-${OUT:-/tmp/device_check}}"
mkdir -p "$out"
summary="$out/summary.txt"
: > "$summary"
export PYTHONUNBUFFERED=1

# The whole run ends within BUDGET seconds (a device call may run 600 s at most): a step gets
# its own timeout or what is left of the budget, whichever is less; none starts with under
# 15 s left (summary.txt says it was skipped).
BUDGET=${DEVICE_CHECK_BUDGET:-540}

step() {  # step NAME TIMEOUT_S LOGFILE COMMAND...: run, log, record the exit code
  local name=$1 limit=$2 log=$3
  shift 3
  local left=$((BUDGET - SECONDS))
  if [ "$left" -lt 15 ]; then
    echo "$name: skipped (the run's budget of $BUDGET s is spent)" | tee -a "$summary"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0=$SECONDS
  echo "== $name" | tee -a "$log"
  timeout "$limit" "$@" >> "$log" 2>&1
  local rc=$?
  echo "$name: rc=$rc ($((SECONDS - t0)) s)" | tee -a "$summary"
  return 0
}

dev="$out/device.txt"
{ nvidia-smi -L; python3 --version; python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.cuda.is_available())"; } > "$dev" 2>&1

step install 180 "$dev" bash scripts/device_install.sh  # into /tmp/rl-venv
export PATH=/tmp/rl-venv/bin:$PATH

step nvml 60 "$dev" python -c '
from rayless.placement import discover_node
n = discover_node()
print(n)
for g in n.gpus:
    print(g)
'

step d2d 60 "$dev" python -c '
import torch, time
n = 1 << 30
a = torch.empty(n, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(10): b.copy_(a)
torch.cuda.synchronize(); dt = (time.perf_counter() - t) / 10
print(f"device-to-device copy 1 GiB: {n / dt / 1e9:.1f} GB/s (bytes copied per second)")
'

step cuda-tests 240 "$out/cuda_tests.txt" \
  python -m pytest tests/cuda -q -p no:cacheprovider -rA

step bench-store-cuda 150 "$out/bench_store_cuda.txt" \
  python scripts/bench_store.py --device cuda --quick --json "$out/bench_store_cuda.json"

if [ -f scripts/bench_weights.py ]; then
  step bench-weights-cuda 170 "$out/bench_weights_cuda.txt" \
    python scripts/bench_weights.py --device cuda --quick --dtype bfloat16 --extras \
    --json "$out/bench_weights_cuda.json"
else
  echo "bench-weights-cuda: absent (scripts/bench_weights.py not built yet)" >> "$summary"
fi

step demo-ppo-gpu 120 "$out/demo_ppo.txt" \
  rayless demo --config rayless/configs/gpu_1.yaml --iterations 30 --time-limit 75 \
  --output-dir /tmp/demo_ppo
cp /tmp/demo_ppo/metrics.json "$out/demo_ppo_metrics.json" 2>/dev/null || true

if [ -f rayless/configs/grpo_gpu.yaml ]; then
  step demo-grpo-gpu 120 "$out/demo_grpo.txt" \
    rayless demo --config rayless/configs/grpo_gpu.yaml --time-limit 75 --output-dir /tmp/demo_grpo
else
  echo "demo-grpo-gpu: absent (the GRPO demo is not built yet)" >> "$summary"
fi

cat "$summary"
! grep -q 'rc=[1-9]' "$summary"
