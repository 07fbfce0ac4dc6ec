#!/usr/bin/env bash
# Programmatic dependent launch (issue 19) in one device call on one H200, ~3 minutes (the whole GPU suite: ~7):
#   1. the GPU tests of the PDL chain (a CUDA graph of dependent PDL kernels against the chain without PDL; the graphs
#      engine with and without PDL against HF greedy) and of the kernels it touches;
#   2. benchmarks/pdl_chain_bench.py (the decode chain alone in one graph, each PDL mode), ~1 minute;
#   3. benchmarks/last_mile_bench.py with its [no_pdl] rows.
#
#   bash benchmarks/gpu/pdl.sh [OUT_DIR]   -> OUT_DIR/{tests.log, chain/, perf/}
#   SKIP_TESTS=1, SKIP_CHAIN=1; TEST_FILES="tests/ --deselect ..." WORKERS=12 for the whole suite;
#   BENCH_ARGS="--contexts 8192,32768 --prefill 8192 --skip-hf" for a shorter benchmark
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
out=${1:-${OUT:-/tmp}}
mkdir -p "$out/perf"
python -c "import triton, torch; from triton.backends.nvidia.compiler import CUDAOptions as O; \
print('triton', triton.__version__, 'torch', torch.__version__, 'launch_pdl' in O.__dataclass_fields__)"
if [ -z "$SKIP_TESTS" ]; then
  timeout ${TEST_TIMEOUT:-200} python -m pytest -q -m gpu -p no:cacheprovider -n ${WORKERS:-8} \
    ${TEST_FILES:-tests/kernels/test_pdl.py tests/kernels/test_skinny_gemm.py tests/kernels/test_fused_layers.py} -k "${TEST_FILTER:-not nothing}" > "$out/tests.log" 2>&1
  echo "gpu tests rc=$?"; grep -E "passed|failed|Error|error" "$out/tests.log" | tail -12
fi
if [ -z "$SKIP_CHAIN" ]; then
  mkdir -p "$out/chain"
  timeout 150 python benchmarks/pdl_chain_bench.py --out "$out/chain" --context 32768 > "$out/chain/bench.log" 2>&1
  echo "pdl_chain_bench rc=$?"; grep -v USDT "$out/chain/bench.log" | grep -E "graph|Error" | cut -c10-
fi
timeout ${BENCH_TIMEOUT:-330} python benchmarks/last_mile_bench.py --out "$out/perf" $BENCH_ARGS \
  > "$out/perf/bench.log" 2>&1
echo "last_mile_bench rc=$?"
grep -v USDT "$out/perf/bench.log" | grep -E "@|prefill|profile|copy bandwidth|Error|error" | tail -40
