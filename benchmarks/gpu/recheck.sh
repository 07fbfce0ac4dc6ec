#!/usr/bin/env bash
# The GPU checks of this session's fixes in one device call on one H200, about 6-8 minutes:
#   1. gpu-marked tests: exact kernels' row invariance (bf16, 8B widths; the exact ring at head dims 256 / 512),
#      batched rounds on CUDA (graphs default, more verify rows than one skinny GEMM takes; the captured rows
#      drafting step), exact mode in a bf16 batch and on Gemma targets, the prefill attention's efficient variant
#      (head dims cuDNN cannot run), ~2-3 minutes;
#   2. benchmarks/batched_bench.py --shape (issue 35's keys; benchmarks/gpu/batched.sh with SKIP_PAIR=1), ~2 minutes;
#   3. benchmarks/family_prefill_bench.py on the Gemma-4-12B shape (8K, 32K; issue 36), ~1 minute;
#   4. benchmarks/exact_mode_bench.py --quick (exact mode's pieces, issue 37), ~1-2 minutes.
#
#   bash benchmarks/gpu/recheck.sh [OUT_DIR]  -> OUT_DIR/{t/tests.log, b/shape/*, g/*, x/*} (8 files at most)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
out=${1:-${OUT:-/tmp}}
mkdir -p "$out/t" "$out/g" "$out/x"
timeout ${TESTS_TIMEOUT:-200} python -m pytest -q -m gpu -p no:cacheprovider -rA -n 6 tests/kernels/test_exact_kernels.py \
  tests/generation/test_batched_rounds.py tests/generation/test_batched_drafter.py tests/generation/test_exact_mode.py \
  tests/kernels/test_prefill_attention.py -k "exact or batched or rows or efficient or gpu_variants" \
  > "$out/t/tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "^(FAILED|ERROR)|^E  " "$out/t/tests.log" | cut -c1-200 | head -20; tail -1 "$out/t/tests.log"
SKIP_PAIR=1 SHAPE_TIMEOUT=${SHAPE_TIMEOUT:-200} bash benchmarks/gpu/batched.sh "$out/b"
rm -rf "$out/b/pair" "$out/b/shape/batched.csv"  # the rows are in batched.json: 8 files come back
timeout ${FAMILY_TIMEOUT:-150} python benchmarks/family_prefill_bench.py --out "$out/g" --families gemma4_12b \
  --prompts 8192,32768 --repeats 3,2 > "$out/g/bench.log" 2>&1
echo "family_prefill_bench rc=$?"; grep -E "ours|hf|warning|Error" "$out/g/bench.log" | cut -c10-200 | tail -8
rm -f "$out/g/family_prefill.csv"
timeout ${EXACT_TIMEOUT:-120} python benchmarks/exact_mode_bench.py --out "$out/x" --quick > "$out/x/bench.log" 2>&1
echo "exact_mode_bench rc=$?"; tail -20 "$out/x/bench.log" | cut -c1-200
