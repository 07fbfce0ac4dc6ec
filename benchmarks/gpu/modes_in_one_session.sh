#!/usr/bin/env bash
# Issue 35: the Gemma-3 pair's suite at B = 8 (and 1) with several methods in one process after the fix of the rows
# step's proposals read past the shared graph pool (every method after the first had accepted nothing on the graphs
# engine), plus the GPU tests of the batched drafter. The pair staged as for batched_suite.sh.
#   REQUESTS=.stage/gdata/requests.jsonl.gz bash benchmarks/gpu/modes_in_one_session.sh OUT_DIR
#     -> OUT_DIR/{gpu_tests.log, new64/*, new256/*}
set -uo pipefail
out=${1:?OUT_DIR}
mkdir -p "$out"
source benchmarks/gpu/env.sh > /dev/null
timeout 150 python -m pytest -q -m gpu -p no:cacheprovider -rf -n 4 tests/generation/test_batched_drafter.py \
  > "$out/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; tail -3 "$out/gpu_tests.log"
export PAIR=gemma3-270m TIER=32704 REQUESTS=${REQUESTS:?}
NEW=64 BATCHES=1,8 METHODS=fold-a2,dflash,window SUITE_TIMEOUT=230 SUB=new64 bash benchmarks/gpu/batched_suite.sh "$out" \
  2>&1 | grep "suite B\|over_ar\|rc="
NEW=256 BATCHES=8 METHODS=window,fold-a2 SUITE_TIMEOUT=120 SUB=new256 bash benchmarks/gpu/batched_suite.sh "$out" \
  2>&1 | grep "suite B\|over_ar\|rc="
