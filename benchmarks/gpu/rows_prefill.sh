#!/usr/bin/env bash
# Issues 35 / 36: the batched rows step and the Gemma fused prefill on the GPU, one device call each part
# (no real weights; env.sh not needed):
#   PART=tests    the GPU tests of the batched rounds, the batched drafter, move_row and the Gemma rows / targets
#                 (fused prefill against the module path), then the prefill attention kernels' efficient test; ~4 min
#   PART=prefill  benchmarks/family_prefill_bench.py for the Gemma-3-270M and Gemma-4-12B shapes at 8K / 32K:
#                 ours (fused prefill) / ours_module ($FOLD_HF_FUSED_PREFILL=0) / transformers' generate; ~3 min
#
#   PART=tests bash benchmarks/gpu/rows_prefill.sh [OUT_DIR]   -> OUT_DIR/t/{gpu_tests,prefill_attention}.log
#   PART=prefill bash benchmarks/gpu/rows_prefill.sh [OUT_DIR] -> OUT_DIR/p/{bench.log, family_prefill.{json,csv}}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
out=${1:-${OUT:-/tmp}}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
case ${PART:-tests} in
  tests)
    mkdir -p "$out/t"
    timeout ${TEST_TIMEOUT:-330} python -m pytest -q -m gpu -p no:cacheprovider -rf -n ${WORKERS:-4} \
      tests/generation/test_batched_rounds.py tests/generation/test_batched_drafter.py tests/targets/test_move_row.py \
      tests/targets/test_gemma_rows.py tests/targets/test_gemma_targets.py > "$out/t/gpu_tests.log" 2>&1
    echo "gpu tests rc=$?"; tail -15 "$out/t/gpu_tests.log"
    timeout ${ATTN_TIMEOUT:-150} python -m pytest -q -m gpu -p no:cacheprovider -rf \
      tests/kernels/test_prefill_attention.py -k efficient > "$out/t/prefill_attention.log" 2>&1
    echo "prefill attention rc=$?"; tail -5 "$out/t/prefill_attention.log";;
  prefill)
    mkdir -p "$out/p"
    timeout ${PREFILL_TIMEOUT:-420} python benchmarks/family_prefill_bench.py --out "$out/p" --module-prefill \
      --families ${FAMILIES:-gemma3_270m,gemma4_12b} --prompts ${PROMPTS:-8192,32768} --repeats ${REPEATS:-3,3} \
      > "$out/p/bench.log" 2>&1
    echo "family_prefill_bench rc=$?"
    grep -E "^\[|Error" "$out/p/bench.log" | grep -v headline | cut -c10- | tail -24
    python -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['headline'], indent=1))" \
      "$out/p/family_prefill.json";;
  *) echo "PART: tests or prefill"; exit 2;;
esac
