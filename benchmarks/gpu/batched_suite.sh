#!/usr/bin/env bash
# Issue 35, the real pairs at B = 8 on our suites (one device call, ~4-8 minutes): benchmarks/batched_bench.py's suite
# section, every request of one tier in groups of B = 1 and 8, FOLD (α = 2), the drafter as trained (dflash), window
# only, and batched AR, whole calls on the graphs engine, 64 new tokens, EOS off; per-row τ, tokens/s, the rows that
# differ from batched AR, and whether the speedup over AR at B = 8 is above the one at B = 1.
#
#   PAIR=gemma3-270m TIER=32704 REQUESTS=.stage/gdata/requests.jsonl.gz bash benchmarks/gpu/batched_suite.sh [OUT_DIR]
#   PAIR=smollm2-135m TIER=8192 REQUESTS=... bash benchmarks/gpu/batched_suite.sh [OUT_DIR]
#   EXACT=1 SUB=suite-exact ...   exact mode (issue 37): every row's output against AR of its request alone
#
# Needs the pair's staged GGUF (benchmarks/gpu/stage-gemma3.sh / ../shared/tools/stage-smollm2.sh, env.sh joins the
# parts) and the suite's requests (`fold-hf bench --pair PAIR --build-only --requests FILE` on the CPU machine,
# gzipped and carried: the GPU machine has no model hub for the tokenizer's first build of the sources). The Gemma-3
# suite's 32K tier is 32,704 prompt tokens (+ 64 new = 32,768). -> OUT_DIR/suite/{bench.log, batched.json, batched.csv}
set -uo pipefail
source benchmarks/gpu/env.sh > /dev/null
pair=${PAIR:-gemma3-270m}
if [ "$pair" = gemma3-270m ]; then stop_until_gemma3_whole; else stop_until_gguf_whole; fi
out=${1:-${OUT:-/tmp}}/${SUB:-suite}
mkdir -p "$out"
requests=${REQUESTS:?set REQUESTS to the suite requests (.jsonl or .jsonl.gz)}
case "$requests" in *.gz) gunzip -c "$requests" > /tmp/suite-requests.jsonl ;; *) cp "$requests" /tmp/suite-requests.jsonl ;; esac
timeout ${SUITE_TIMEOUT:-480} python benchmarks/batched_bench.py --out "$out" --pair "$pair" \
  --suite /tmp/suite-requests.jsonl --tier ${TIER:-32704} --batches ${BATCHES:-1,8} --new ${NEW:-64} \
  --methods ${METHODS:-fold-a2,dflash,window} ${EXACT:+--exact} 2>&1 | tee "$out/bench.log" | tail -n 40
echo "batched_bench (suite) rc=${PIPESTATUS[0]}"
