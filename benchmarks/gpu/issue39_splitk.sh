#!/usr/bin/env bash
# Issue 39, one device call (random tensors and weights, no staging; ~4 min on an H100): the split-K plan of a verify
# block's plain projections ($FOLD_HF_SKINNY_SPLIT_K=1, fold_hf/kernels/gemm/triton.py split_k_plan) against cuBLAS
# and today's plan, most telling first (the tar is rewritten after each step):
#   1. benchmarks/skinny_gemm_bench.py --split-k at the Qwen3.5-9B shapes (16 rows): cuBLAS, today's plans, the
#      library's split plan ("split auto") and forced split counts;
#   2. the Qwen3.5-9B FOLD round (hybrid_bench, 32K, 32,768-row draft vocabulary) with the split plan (its own AR
#      step in the same process; drafter_reads.sh PART=waves runs the round with the defaults);
#   3. the split plan's GPU tests (float64 oracle, bf16 and fp32, the verify block's shapes);
#   4. the same sweep at the Llama-3.1-8B shapes (10 and 16 rows); 5. the round with the split plan and
#      $FOLD_HF_WINDOW_SPLITS=4.
#   bash benchmarks/gpu/issue39_splitk.sh [OUT_DIR]   -> OUT_DIR/issue39-splitk.tar.gz (one file)
# Dry run on a CPU (prints the commands): DRY=1 bash benchmarks/gpu/issue39_splitk.sh /tmp/x
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
out=${1:-${OUT:-/tmp}}
run=(); [ "${DRY:-0}" = 1 ] && run=(echo +)
d=$(mktemp -d)
pack() { [ "${DRY:-0}" = 1 ] || tar -czf "$out/issue39-splitk.tar.gz" -C $d .; }  # after each step: a call cut
# short by its time limit still brings back what ran
"${run[@]}" timeout 150 python benchmarks/skinny_gemm_bench.py --out $d/gemm-qwen35 --shapes qwen35_9b --rows 16 \
  --split-k > $d/gemm-qwen35.log 2>&1
pack
FOLD_HF_SKINNY_SPLIT_K=1 "${run[@]}" timeout 100 python benchmarks/hybrid_bench.py --pairs qwen35_9b \
  --contexts 32768 --rounds 24 --repeats 3 --sd-modes fold --draft-vocab-size 32768 \
  --out $d/hybrid-splitk-wsdefault > $d/hybrid-splitk-wsdefault.log 2>&1
pack
"${run[@]}" timeout ${TEST_TIMEOUT:-150} python -m pytest -q -m gpu -p no:cacheprovider -rf \
  tests/kernels/test_skinny_gemm.py -k "float64_product_on_gpu" > $d/gpu_tests.log 2>&1
echo "gpu tests rc=$? $(tail -1 $d/gpu_tests.log)"
pack
"${run[@]}" timeout 150 python benchmarks/skinny_gemm_bench.py --out $d/gemm-llama --shapes llama31_8b --rows 10,16 \
  --split-k > $d/gemm-llama.log 2>&1
pack
FOLD_HF_SKINNY_SPLIT_K=1 FOLD_HF_WINDOW_SPLITS=4 "${run[@]}" timeout 100 python benchmarks/hybrid_bench.py \
  --pairs qwen35_9b --contexts 32768 --rounds 24 --repeats 3 --sd-modes fold --draft-vocab-size 32768 \
  --out $d/hybrid-splitk-ws4 > $d/hybrid-splitk-ws4.log 2>&1
if [ "${DRY:-0}" = 1 ]; then cat $d/*.log; rm -rf $d; exit 0; fi
pack
grep -h "best" $d/gemm-*.log
grep -H -E "p50|FAILED|Error" $d/hybrid-*.log
