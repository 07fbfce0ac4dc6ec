#!/usr/bin/env bash
# Issues 16 and 19, one device call on one H200 (about 5 minutes): the GPU tests of the decode kernel's launch
# plans, the warm-up fix and the rounds queued ahead, then the SD round against our AR step at 32K for Gemma-4-like,
# Qwen3.5-9B and Llama-3.1-8B shapes (random bf16 weights, graphs engine), all on the same code.
#
#   bash benchmarks/gpu/targets_round.sh OUT_DIR     -> OUT_DIR/{gpu_tests.log, gemma/, hybrid/, *.log, timing.log}
set -u
OUT_DIR=${1:?usage: targets_round.sh OUT_DIR}
mkdir -p "$OUT_DIR"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
start=$(date +%s)
stamp() { echo "$1: $(( $(date +%s) - start )) s" | tee -a "$OUT_DIR/timing.log"; }
timeout 170 python -m pytest -q -m gpu -p no:cacheprovider -n 12 -rf tests/targets/test_target_attention.py \
    tests/targets/test_gemma_targets.py tests/targets/test_qwen35.py tests/generation/test_fast_loop.py tests/kernels/test_hybrid_kernels.py \
    > "$OUT_DIR/gpu_tests.log" 2>&1
echo "pytest rc=$?" >> "$OUT_DIR/gpu_tests.log"; tail -4 "$OUT_DIR/gpu_tests.log"; stamp tests
timeout 90 python benchmarks/gemma_bench.py --contexts 32768 --rounds 16 --repeats 2 \
    --out "$OUT_DIR/gemma" > "$OUT_DIR/gemma.log" 2>&1
echo "rc=$?" >> "$OUT_DIR/gemma.log"; grep -E "our_|floor|rc=|Error" "$OUT_DIR/gemma.log" | tail -8; stamp gemma
timeout 150 python benchmarks/hybrid_bench.py --pairs qwen35_9b,llama31_8b --contexts 32768 --rounds 16 --repeats 2 \
    --out "$OUT_DIR/hybrid" > "$OUT_DIR/hybrid.log" 2>&1
echo "rc=$?" >> "$OUT_DIR/hybrid.log"; grep -E "our_|floor|rc=|Error" "$OUT_DIR/hybrid.log" | tail -14; stamp hybrid
