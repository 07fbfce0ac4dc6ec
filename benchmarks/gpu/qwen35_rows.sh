#!/usr/bin/env bash
# Issue 35, the Qwen3.5 batched verify keeping each row's writes (fold_hf/targets/qwen35_rows.py), one device call
# (no real weights), ~4 min:
#   1. GPU tests: the rows verify on the Triton kernels (tests/targets/test_qwen35_rows.py), the Gated DeltaNet
#      kernels (tests/kernels/test_hybrid_kernels.py, the commit into strided row views among them);
#   2. benchmarks/qwen35_rows_bench.py at the Qwen3.5-9B shape: forward_rows + accept of B rows of 16 tokens at 32K,
#      keeping writes (now) against keeping every position's state (before), in one process.
#   bash benchmarks/gpu/qwen35_rows.sh [OUT_DIR]  -> OUT_DIR/qwen35_rows/{tests.log, bench.log, qwen35_rows.csv/.json}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
out=${1:-${OUT:-/tmp}}/qwen35_rows
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
timeout ${TEST_TIMEOUT:-150} python -m pytest -q -m gpu -p no:cacheprovider -rf -n 4 \
  tests/kernels/test_hybrid_kernels.py tests/targets/test_qwen35_rows.py > "$out/tests.log" 2>&1
echo "gpu tests rc=$?"; tail -6 "$out/tests.log"
timeout ${BENCH_TIMEOUT:-200} python benchmarks/qwen35_rows_bench.py --context ${CONTEXT:-32768} --rows ${ROWS:-1,2,4,8} \
  --width 16 --out "$out" > "$out/bench.log" 2>&1
echo "qwen35_rows_bench rc=$?"; grep -E "ctx|Error" "$out/bench.log" | cut -c1-300
