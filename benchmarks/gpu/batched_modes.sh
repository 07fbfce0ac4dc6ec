#!/usr/bin/env bash
# Issue 35: the Gemma-3 pair batched, per reading mode, in one device call (~4-5 minutes; the pair staged as for
# batched_suite.sh):
#   1. benchmarks/batched_modes_check.py: one group of 8 requests of the 32K tier, 32 new tokens, on engines graphs /
#      static / eager: τ and the rows whose proposals equal the eager engine's (propose_rows), per mode;
#   2. batched_suite.sh at BATCHES (default 8): whole-call and decode-phase throughput against batched AR, with the
#      steps each system built while timed;
#   3. the rows step's GPU tests (tiny pairs, every mode the rows step takes).
#
#   REQUESTS=.gpu/g3req/requests.jsonl.gz bash benchmarks/gpu/batched_modes.sh [OUT_DIR]
#     -> OUT_DIR/{modes/modes_check.json, modes.log, suite/*, gpu_tests.log}
set -uo pipefail
source benchmarks/gpu/env.sh > /dev/null
stop_until_gemma3_whole
export PYTHONUNBUFFERED=1  # env.sh set PYTHONPATH (the carried gguf wheel in /tmp/site, then the tree)
out=${1:-${OUT:-/tmp}}
mkdir -p "$out/modes"
requests=${REQUESTS:?set REQUESTS to the suite requests (.jsonl.gz)}
gunzip -c "$requests" > /tmp/suite-requests.jsonl
timeout ${MODES_TIMEOUT:-150} python benchmarks/batched_modes_check.py --suite /tmp/suite-requests.jsonl \
  --tier ${TIER:-32704} --modes ${MODES:-window,fold} --out "$out/modes" > "$out/modes.log" 2>&1
echo "modes check rc=$?"; grep "^\[" "$out/modes.log" | tail -12
SUITE_TIMEOUT=${SUITE_TIMEOUT:-220} BATCHES=${BATCHES:-8} PAIR=gemma3-270m TIER=${TIER:-32704} REQUESTS=$requests \
  bash benchmarks/gpu/batched_suite.sh "$out" | grep -v "Converting\|Loading weights"
timeout ${TEST_TIMEOUT:-110} python -m pytest -q -m gpu -p no:cacheprovider -rf -n 4 \
  tests/generation/test_batched_drafter.py > "$out/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; tail -8 "$out/gpu_tests.log"
