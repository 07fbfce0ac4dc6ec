#!/usr/bin/env bash
# Issue 35, batched rounds on one H200, one device call, about 5-7 minutes (no GGUF needed for part 1):
#   1. benchmarks/batched_bench.py --shape: a random Llama-3.1-8B-shape target (bf16) with B = 1, 2, 4, 8, 16 cache rows
#      at 8K and 32K: the batched verify with 1 token a row (the batched AR step) and a block a row, host-length
#      (eager) and captured (graphs: the fused layers' step), against the memory floor (weights once + B rows' KV),
#      and the B rows' drafts in one drafter forward; ~3-4 minutes (the graphs are captured per B and T);
#   2. the pair section on the embedded SmolLM2 pair (needs env.sh's GGUF staged: SKIP_PAIR=1 without it): B = 1, 2,
#      4, 8 prompts of 1,024 tokens, 64 new tokens, whole calls: batched FOLD and AR (eager and graphs engines), the
#      rows one call each (eager and graphs), transformers' batched generate; ~3 minutes.
#
#   bash benchmarks/gpu/batched.sh [OUT_DIR]   -> OUT_DIR/{shape,pair}/{bench.log, batched.json, batched.csv}
#   SKIP_SHAPE=1, SKIP_PAIR=1; SHAPE_ARGS / PAIR_ARGS are added to each command; SHAPE_TIMEOUT (260 s) and
#   PAIR_TIMEOUT (260 s) bound each part
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
out=${1:-${OUT:-/tmp}}
mkdir -p "$out/shape" "$out/pair"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
if [ -z "$SKIP_SHAPE" ]; then
  timeout ${SHAPE_TIMEOUT:-260} python benchmarks/batched_bench.py --out "$out/shape" --shape --batches 1,2,4,8,16 \
    --contexts 8192,32768 $SHAPE_ARGS > "$out/shape/bench.log" 2>&1
  echo "batched_bench --shape rc=$?"
  grep -E "B=|Error|= " "$out/shape/bench.log" | cut -c12- | tail -40
fi
if [ -z "$SKIP_PAIR" ]; then
  [ -f benchmarks/gpu/env.sh ] && source benchmarks/gpu/env.sh > /dev/null
  timeout ${PAIR_TIMEOUT:-260} python benchmarks/batched_bench.py --out "$out/pair" --batches 1,2,4,8 \
    $PAIR_ARGS > "$out/pair/bench.log" 2>&1
  echo "batched_bench (pair) rc=$?"
  grep -E "B=|Error|= " "$out/pair/bench.log" | cut -c12- | tail -40
fi
