#!/usr/bin/env bash
# Issue 19 (performance, the last mile) in one device call on one H200, about 4-5 minutes:
#   1. the GPU tests of this change (concatenated target projections under the graphs engine, the rope kernel reading
#      heads in place, the graphs engine with one queued step per round vs the foundation loop), ~1-2 minutes;
#   2. benchmarks/last_mile_bench.py (AR step / SD round vs the memory floor, prefill vs the compute floor, peak
#      memory at 128K, A/B rows, profile), ~3 minutes.
#
#   bash benchmarks/gpu/last_mile.sh [OUT_DIR]     -> OUT_DIR/perf/{tests.log, bench.log, last_mile.json, last_mile.csv}
#   SKIP_TESTS=1 bash benchmarks/gpu/last_mile.sh   the benchmark only
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
out=${1:-${OUT:-/tmp}}/perf
mkdir -p "$out"
if [ -z "$SKIP_TESTS" ]; then
  timeout 170 python -m pytest -q -m gpu -p no:cacheprovider -n 6 tests/kernels/test_fused_layers.py tests/generation/test_fast_loop.py \
    -k "concatenated or kernels_match or graph_engine" > "$out/tests.log" 2>&1
  echo "gpu tests rc=$?"; tail -3 "$out/tests.log"
fi
timeout 360 python benchmarks/last_mile_bench.py --out "$out" > "$out/bench.log" 2>&1
echo "last_mile_bench rc=$?"
grep -v USDT "$out/bench.log" | grep -E "@|prefill|profile|copy bandwidth" | tail -30
python - "$out/last_mile.json" <<'PY'
import json, sys
print(json.dumps(json.load(open(sys.argv[1]))["headline"], indent=1))
PY
