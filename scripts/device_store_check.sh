#!/usr/bin/env bash
# The store's GPU check, a few minutes on one GPU: the CUDA tests, then a quick put/get benchmark.
#   bash scripts/device_store_check.sh [OUT_DIR]
set -u
cd "$(dirname "$0")/.."
out="${1:-${OUT:-/tmp}}"
mkdir -p "$out"
[ -f .venv/bin/activate ] && source .venv/bin/activate
nvidia-smi -L || true
rc=0
timeout 300 python -m pytest tests/cuda -q -p no:cacheprovider -x 2>&1 | tee "$out/store_cuda_tests.txt" || rc=1
timeout 240 python scripts/bench_store.py --device cuda --quick --json "$out/bench_store_cuda.json" 2>&1 \
  | grep -v "is_fx_tracing" | tee "$out/bench_store_cuda.txt" || rc=1
exit $rc
