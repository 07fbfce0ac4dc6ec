#!/usr/bin/env bash
# The GPU tests of the generation paths and the newer kernels in one call (~3 minutes on an H100, 7 workers): the files
# benchmarks/gpu/tests.sh does not run (exact mode, sampling, batched rounds, the Qwen3.5 / Gemma row steps, merged
# projections, hybrid / skinny-GEMM / PDL / greedy-select / exact kernels, DeepSpec, baselines, the front door) and
# two of its loop files (the fast loop, the fused layers); the FOLD read kernels stay with tests.sh.
#   bash benchmarks/gpu/tests_rest.sh [OUT_DIR]   -> OUT_DIR/t/gpu_tests_rest.log
source benchmarks/gpu/env.sh > /dev/null
out=${1:-${OUT:-/tmp}}/t
mkdir -p "$out"
files="tests/generation/test_exact_mode.py tests/generation/test_sampling.py tests/generation/test_batched_rounds.py
  tests/targets/test_qwen35.py tests/targets/test_qwen35_rows.py tests/targets/test_gemma_rows.py
  tests/targets/test_family_projections.py tests/kernels/test_hybrid_kernels.py tests/kernels/test_skinny_gemm.py
  tests/kernels/test_pdl.py tests/kernels/test_greedy_select.py tests/kernels/test_exact_kernels.py
  tests/modeling/test_deepspec.py tests/modeling/test_baselines.py tests/integrations/test_front_door.py
  tests/generation/test_fast_loop.py tests/kernels/test_fused_layers.py"
timeout -s INT ${LIMIT:-400} python -m pytest -q -m gpu -p no:benchmark -p no:cacheprovider -rfE -n ${WORKERS:-7} $files \
  > "$out/gpu_tests_rest.log" 2>&1
echo rc=$?; tail -n 25 "$out/gpu_tests_rest.log"
