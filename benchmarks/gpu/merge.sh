#!/usr/bin/env bash
# The attention merge and the norm warps (issue 19) in one device call on one H200, about 8 minutes:
#   1. the whole GPU suite (every read's merge changed: the early load and two programs a row; the norms 16 warps), the
#      200-case decode-kernel twin test deselected (the split pass did not change), ~4 minutes;
#   2. benchmarks/decode_attention_bench.py at L = 1 and 10 (8K, 32K), the merge sweep, 32 calls a graph;
#   3. benchmarks/last_mile_bench.py, every section, with the merge and norm variants and the default again.
#
#   bash benchmarks/gpu/merge.sh [OUT_DIR]   -> OUT_DIR/{gpu_tests.log, attention/, perf/}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
out=${1:-${OUT:-/tmp}}
mkdir -p "$out/perf" "$out/attention"
if [ -z "$SKIP_TESTS" ]; then
  timeout ${TEST_TIMEOUT:-250} python -m pytest -q -m gpu -p no:cacheprovider -n ${WORKERS:-12} tests/ \
    --deselect tests/targets/test_target_attention.py::test_kernel_matches_twin_on_gpu > "$out/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?"; grep -E "passed|failed|Error" "$out/gpu_tests.log" | tail -15
fi
timeout ${ATTN_TIMEOUT:-80} python benchmarks/decode_attention_bench.py --out "$out/attention" --contexts 8192,32768 \
  --query-lengths 1,10 --no-sweep --merge-sweep --chain 32 > "$out/attention/bench.log" 2>&1
echo "decode_attention_bench rc=$?"; grep -E "triton|Error" "$out/attention/bench.log" | head -40
timeout ${BENCH_TIMEOUT:-300} python benchmarks/last_mile_bench.py --out "$out/perf" $BENCH_ARGS > "$out/perf/bench.log" 2>&1
echo "last_mile_bench rc=$?"
grep -v USDT "$out/perf/bench.log" | grep -E "@|prefill|profile|copy bandwidth|Error|error" | tail -60
