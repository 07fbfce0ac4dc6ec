#!/usr/bin/env bash
# Skinny decode GEMMs and the self-merging decode attention (issue 19) in one device call on one H200, ~6 minutes:
#   1. their GPU tests (kernels vs float64 / the twin, CUDA-graph replays, the graphs engine vs cuBLAS and HF greedy);
#   2. benchmarks/skinny_gemm_bench.py (every projection of the 8B step: cuBLAS vs a sweep of tiles);
#   3. benchmarks/last_mile_bench.py (the headline, with [cublas] and [merge_pass] A/B rows).
#
#   bash benchmarks/gpu/skinny.sh [OUT_DIR]   -> OUT_DIR/{tests.log, gemm/, perf/}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
out=${1:-${OUT:-/tmp}}
mkdir -p "$out/gemm"
if [ -z "$SKIP_TESTS" ]; then
  timeout 200 python -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/kernels/test_skinny_gemm.py \
    tests/targets/test_target_attention.py tests/kernels/test_fused_layers.py -k "${TEST_FILTER:-not nothing}" > "$out/tests.log" 2>&1
  echo "gpu tests rc=$?"; grep -E "passed|failed|Error" "$out/tests.log" | tail -8
fi
if [ -z "$SKIP_GEMM" ]; then
  timeout 200 python benchmarks/skinny_gemm_bench.py --out "$out/gemm" > "$out/gemm/bench.log" 2>&1
  echo "gemm bench rc=$?"; grep -v USDT "$out/gemm/bench.log" | grep -E "best|Error" | cut -c10-
fi
SKIP_TESTS=1 bash benchmarks/gpu/last_mile.sh "$out"
