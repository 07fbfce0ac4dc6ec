#!/usr/bin/env bash
# Issue 39, the chunked Gated DeltaNet verify (fold_hf/kernels/gated_delta/triton.py) on the GPU, one device call
# (no real weights), ~8 min (the kernel sweep alone ~200 s):
#   1. its GPU tests: the kernels at the Qwen3.5-9B shape against the twins and a float64 oracle (16 and 64 rows of
#      nearly repeating keys), the bf16 fused step against the module step, the Qwen3.5 graphs engine;
#   2. hybrid_bench.py --kernel-sweep: verify (1, 16, 64 rows) and commit (24 layers) over BV / warps / dot
#      precision, beside the token-by-token verify it replaced (benchmarks/gdn_before.py), in one process;
#   2b. round_anatomy_bench.py's FOLD-read sweep at the Qwen3.5 and Llama drafter shapes (32K), unless
#      SKIP_FOLD_SWEEP=1;
#   3. hybrid_bench.py at 32K, Qwen3.5-9B and Llama-3.1-8B shapes: AR step, SD rounds, floor (families_decode.sh's
#      step 2), unless SKIP_BENCH=1; HYBRID_ARGS (e.g. --profile) are added to it.
#   bash benchmarks/gpu/gdn_chunk.sh [OUT_DIR]  -> OUT_DIR/gdn/{tests.log, kernel_sweep.json, sweep.log, fold_read.log,
#                                                 fold_read/anatomy.json,
#                                                 hybrid/{bench.log, hybrid.json, hybrid.csv}}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
out=${1:-${OUT:-/tmp}}/gdn
mkdir -p "$out/hybrid"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
timeout ${TEST_TIMEOUT:-150} python -m pytest -q -m gpu -p no:cacheprovider -rf -n 4 \
  tests/kernels/test_hybrid_kernels.py tests/targets/test_qwen35.py > "$out/tests.log" 2>&1
echo "gpu tests rc=$?"; tail -6 "$out/tests.log"
timeout ${SWEEP_TIMEOUT:-220} python benchmarks/hybrid_bench.py --kernel-sweep --sweep-only --out "$out" > "$out/sweep.log" 2>&1
echo "kernel sweep rc=$?"; grep -E "^.*sweep " "$out/sweep.log" | cut -c10- | cut -c1-220
if [ -z "$SKIP_FOLD_SWEEP" ]; then  # the drafters' FOLD reads (Qwen3.5 and Llama drafter shapes) over launch plans
  timeout ${FOLD_SWEEP_TIMEOUT:-200} python benchmarks/round_anatomy_bench.py --sections attention \
    --attention-shapes "qwen3.5 drafter,llama drafter" --out "$out/fold_read" > "$out/fold_read.log" 2>&1
  echo "fold-read sweep rc=$?"; grep "attention " "$out/fold_read.log" | cut -c1-400
fi
if [ -z "$SKIP_BENCH" ]; then
  timeout ${HYBRID_TIMEOUT:-230} python benchmarks/hybrid_bench.py --pairs qwen35_9b,llama31_8b --contexts 32768 \
    --rounds 24 --repeats 2 --out "$out/hybrid" $HYBRID_ARGS > "$out/hybrid/bench.log" 2>&1
  echo "hybrid_bench rc=$?"; grep -E "p50|Error|FAILED|over_" "$out/hybrid/bench.log" | cut -c10- | tail -16
fi
