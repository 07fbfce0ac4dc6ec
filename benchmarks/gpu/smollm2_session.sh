#!/usr/bin/env bash
# Issues 35 and 37 on the SmolLM2-135M pair (one device call, ~5-7 minutes, after staging its GGUF in two parts of
# 47 MB: .stage/p0/part-0 and .stage/p1/part-1, `split -n 2 -d -a 1` of the GGUF, one part per call with .whl):
#   1. exact_suites.sh: the whole 96-request suite, FOLD and AR in exact mode, bf16: outputs that differ (promise: 0);
#   2. batched_suite.sh at the 8K tier, B = 1 and 8, default mode: FOLD / dflash / window against batched AR;
#   3. the same in exact mode (FOLD only): every batched row against AR of its request alone (promise: 0).
#
#   REQUESTS=.gpu/s2req/requests.jsonl.gz bash benchmarks/gpu/smollm2_session.sh [OUT_DIR]
set -uo pipefail
out=${1:-${OUT:-/tmp}}
export PAIR=smollm2-135m
MINUTES=${MINUTES:-4} bash benchmarks/gpu/exact_suites.sh "$out"
SUITE_TIMEOUT=${SUITE_TIMEOUT:-170} TIER=8192 bash benchmarks/gpu/batched_suite.sh "$out" | grep -v "Converting\|Loading weights"
SUITE_TIMEOUT=${EXACT_TIMEOUT:-120} TIER=8192 EXACT=1 SUB=suite-exact METHODS=fold-a2 \
  bash benchmarks/gpu/batched_suite.sh "$out" | grep -v "Converting\|Loading weights"
