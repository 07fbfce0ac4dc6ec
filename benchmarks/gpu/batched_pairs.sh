#!/usr/bin/env bash
# Issue 35, both real pairs batched in one device call (~4 minutes; both GGUFs staged: SmolLM2 in two parts, see
# smollm2_session.sh, and Gemma-3, see batched_modes.sh; the full tree with both drafters):
#   1. the batched rounds' and rows step's GPU tests;
#   2. batched_suite.sh, SmolLM2 at its 8K tier and Gemma-3 at its 32K tier, B = 1 and 8, default mode.
#
#   S2=.gpu/s2req/requests.jsonl.gz G3=.gpu/g3req/requests.jsonl.gz bash benchmarks/gpu/batched_pairs.sh [OUT_DIR]
set -uo pipefail
source benchmarks/gpu/env.sh > /dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
out=${1:-${OUT:-/tmp}}
mkdir -p "$out"
timeout ${TEST_TIMEOUT:-150} python -m pytest -q -m gpu -p no:cacheprovider -rf -n 4 \
  tests/generation/test_batched_drafter.py tests/generation/test_batched_rounds.py > "$out/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; tail -3 "$out/gpu_tests.log"
for spec in "smollm2-135m 8192 ${S2:?} s2" "gemma3-270m 32704 ${G3:?} g3"; do
  set -- $spec
  SUITE_TIMEOUT=${SUITE_TIMEOUT:-170} PAIR=$1 TIER=$2 REQUESTS=$3 SUB=suite-$4 bash benchmarks/gpu/batched_suite.sh "$out" \
    | grep "suite B=\|_b8 \|rc=" | cut -c12-
done
