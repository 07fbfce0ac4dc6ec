#!/usr/bin/env bash
# Issue 39, Qwen3.5 and Gemma-4 decode against the memory floor with Llama in the same run, one device call on one
# H200 (H100 works too: say which card), about 8-9 minutes:
#   1. the GPU tests of the merged / skinny projections (graphs engine vs cuBLAS and vs separate projections, HF
#      greedy; the skinny GEMMs at the 9B / 12B merged widths);
#   2. benchmarks/hybrid_bench.py at 32K: Qwen3.5-9B and Llama-3.1-8B shapes, AR step, SD rounds (dflash, fold), the
#      floor, and --separate-row (the fused AR step with every projection its own cuBLAS GEMM: before issue 39);
#   3. benchmarks/gemma_bench.py at 32K: the Gemma-4-12B-like shape, the same rows;
#   4. families_decode.json: the issue's numbers (qwen35_9b_ar_over_floor_32k, gemma4_ar_over_floor_32k,
#      qwen35_9b_sd_fold_over_ar_32k, llama31_8b_ar_over_floor_32k, ...) and the A/B ratios.
# Goals: AR <= 1.25x the floor for both families, Qwen3.5's fold round <= 1.30x its AR step, Llama unchanged (1.20).
#
#   bash benchmarks/gpu/families_decode.sh [OUT_DIR]
#     -> OUT_DIR/{tests.log, families_decode.json, hybrid/{bench.log,hybrid.csv,hybrid.json},
#                 gemma/{bench.log,gemma.json}}   (7 files)
#   SKIP_TESTS=1, SKIP_QWEN=1, SKIP_GEMMA=1; HYBRID_ARGS / GEMMA_ARGS are added to each bench command
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
out=${1:-${OUT:-/tmp}}
mkdir -p "$out/hybrid" "$out/gemma"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
if [ -z "$SKIP_TESTS" ]; then
  timeout ${TEST_TIMEOUT:-130} python -m pytest -q -m gpu -p no:cacheprovider -n 8 \
    tests/targets/test_family_projections.py tests/kernels/test_skinny_gemm.py > "$out/tests.log" 2>&1
  echo "gpu tests rc=$?"; grep -E "passed|failed|Error" "$out/tests.log" | tail -8
fi
if [ -z "$SKIP_QWEN" ]; then
  timeout ${HYBRID_TIMEOUT:-230} python benchmarks/hybrid_bench.py --pairs qwen35_9b,llama31_8b --contexts 32768 \
    --rounds 24 --repeats 2 --separate-row --out "$out/hybrid" $HYBRID_ARGS > "$out/hybrid/bench.log" 2>&1
  echo "hybrid_bench rc=$?"; grep -E "p50|Error|FAILED" "$out/hybrid/bench.log" | cut -c10- | tail -16
fi
if [ -z "$SKIP_GEMMA" ]; then
  timeout ${GEMMA_TIMEOUT:-200} python benchmarks/gemma_bench.py --contexts 32768 --rounds 16 --repeats 2 \
    --separate-row --out "$out/gemma" $GEMMA_ARGS > "$out/gemma/bench.log" 2>&1
  echo "gemma_bench rc=$?"; grep -E " @ |Error|FAILED" "$out/gemma/bench.log" | cut -c10- | tail -10
fi
python - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
result = {}
hybrid, gemma = out / "hybrid" / "hybrid.json", out / "gemma" / "gemma.json"
if hybrid.exists():
    head = json.loads(hybrid.read_text())["headline"]
    for pair in ("qwen35_9b", "llama31_8b"):
        for key in ("ar_over_floor", "ar_separate_over_floor", "sd_fold_over_ar", "sd_dflash_over_ar"):
            result[f"{pair}_{key}_32k"] = head.get(f"{pair}_{key}_32768")
if gemma.exists():
    ratios = json.loads(gemma.read_text())["ratios"]
    for key in ("ar_over_floor", "ar_separate_over_floor", "sd_fold_over_ar", "sd_dflash_over_ar"):
        result[f"gemma4_{key}_32k"] = ratios.get(f"{key}_32768")
(out / "families_decode.json").write_text(json.dumps(result, indent=1))
print(json.dumps(result, indent=1))
PY
