#!/usr/bin/env bash
# Greedy selection kernels (issue 19) in one device call on one H200, about 8 minutes:
#   1. the whole GPU suite (the selection kernels run in every greedy graphs-engine test; the round's state update
#      changed too), the 200-case decode-kernel twin test deselected (its kernel did not change), ~4 minutes;
#   2. benchmarks/last_mile_bench.py, every section, with its [torch_select] rows (the torch path before the kernels);
#   3. benchmarks/decode_attention_bench.py for the AR step's attention (L = 1 at 8K and 32K), the config sweep.
#
#   bash benchmarks/gpu/select.sh [OUT_DIR]   -> OUT_DIR/{gpu_tests.log, perf/, attention/}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
out=${1:-${OUT:-/tmp}}
mkdir -p "$out/perf" "$out/attention"
if [ -z "$SKIP_TESTS" ]; then
  timeout ${TEST_TIMEOUT:-250} python -m pytest -q -m gpu -p no:cacheprovider -n ${WORKERS:-12} tests/ \
    --deselect tests/targets/test_target_attention.py::test_kernel_matches_twin_on_gpu > "$out/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?"; grep -E "passed|failed|Error" "$out/gpu_tests.log" | tail -15
fi
timeout ${BENCH_TIMEOUT:-220} python benchmarks/last_mile_bench.py --out "$out/perf" $BENCH_ARGS > "$out/perf/bench.log" 2>&1
echo "last_mile_bench rc=$?"
grep -v USDT "$out/perf/bench.log" | grep -E "@|prefill|profile|copy bandwidth|Error|error" | tail -45
timeout ${ATTN_TIMEOUT:-60} python benchmarks/decode_attention_bench.py --out "$out/attention" --contexts 8192,32768 \
  --query-lengths 1 > "$out/attention/bench.log" 2>&1
echo "decode_attention_bench rc=$?"; grep -A40 "best triton" "$out/attention/bench.log" | head -30
