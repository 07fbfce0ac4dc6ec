#!/usr/bin/env bash
# Issue 35, the kernels with a row axis (fold_read_rows_triton, decode_attention_rows_triton,
# ring_attention_rows_triton, rope_write_rows_triton, head_norm_rope_write_rows_triton) on the GPU, one device call
# per part (no real weights):
#   PART=tests  their GPU tests (bf16 / fp32 against the oracles) and every batched test that runs them: the rows
#               drafting step (rows and per-row reads, captured), the batched rounds (Llama and Gemma verify on the
#               graphs engine), the Gemma rows and targets, exact mode's batched rows (which keep per-row kernels);
#               ~4 min
#   PART=shape  benchmarks/batched_bench.py --shape at 32K, B = 1, 2, 4, 8: batched AR step against its floor, the
#               round against the AR step, the rows' drafts (now one launch pair per layer); ~3 min
#
#   PART=tests bash benchmarks/gpu/rows_kernels.sh [OUT_DIR]   -> OUT_DIR/rows/{gpu_tests.log}
#   PART=shape bash benchmarks/gpu/rows_kernels.sh [OUT_DIR]   -> OUT_DIR/shape/{bench.log, batched.json, batched.csv}
# Then, with both pairs staged (smollm2_session.sh, batched_modes.sh): batched_pairs.sh and
#   python benchmarks/batched_anatomy.py --pair gemma3-270m --suite ... --tier 32704 --batch 8 --group 1 --profile \
#     --rows-kernels 1,0     (the row-axis kernels against the one-row kernels row by row, one process)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
out=${1:-${OUT:-/tmp}}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
case ${PART:-tests} in
  tests)
    mkdir -p "$out/rows"
    timeout ${TEST_TIMEOUT:-420} python -m pytest -q -m gpu -p no:cacheprovider -rf -n ${WORKERS:-6} \
      tests/kernels/test_triton_kernel.py::test_rows_read_is_each_reads_own_on_gpu \
      tests/targets/test_target_attention.py::test_rows_kernel_is_each_rows_own_attention_on_gpu \
      tests/generation/test_batched_drafter.py tests/generation/test_batched_rounds.py \
      tests/targets/test_gemma_rows.py tests/targets/test_gemma_targets.py \
      tests/generation/test_exact_mode.py > "$out/rows/gpu_tests.log" 2>&1
    echo "gpu tests rc=$?"; tail -15 "$out/rows/gpu_tests.log";;
  shape)
    mkdir -p "$out/shape"
    timeout ${SHAPE_TIMEOUT:-400} python benchmarks/batched_bench.py --out "$out/shape" --shape --batches 1,2,4,8 \
      --contexts ${CONTEXTS:-32768} > "$out/shape/bench.log" 2>&1
    echo "batched_bench --shape rc=$?"
    grep -E "B=|Error|= " "$out/shape/bench.log" | cut -c12- | tail -40;;
  *) echo "PART: tests or shape"; exit 2;;
esac
