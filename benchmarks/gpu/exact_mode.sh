#!/usr/bin/env bash
# Issue 37 (and the GPU test of issue 35's batched rounds) in one device call on one H200, about 5 minutes:
#   1. the gpu-marked tests of exact mode (bf16: a verify block's logits = the AR steps' bits, greedy SD = exact AR
#      on the static and graphs engines, every exact kernel invariant across row counts at the 8B widths) and the
#      batched rounds' graphs test, ~1.5 minutes;
#   2. benchmarks/e2e_bench.py at the Llama-3.1-8B shape, 32K, default path against exact mode in one process:
#      exact_ar_over_default_8b_32k and exact_sd_round_over_default_8b_32k, ~2-3 minutes.
#
#   bash benchmarks/gpu/exact_mode.sh [OUT_DIR]   -> OUT_DIR/exact/{tests.log, e2e.log, e2e.json, e2e.csv}
#   TESTS_TIMEOUT (150 s), E2E_TIMEOUT (220 s); SKIP_TESTS=1, SKIP_E2E=1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
out=${1:-${OUT:-/tmp}}/exact
mkdir -p "$out"
if [ -z "$SKIP_TESTS" ]; then
  timeout ${TESTS_TIMEOUT:-150} python -m pytest -q -m gpu -p no:cacheprovider -rA -n 4 tests/generation/test_exact_mode.py \
    tests/kernels/test_exact_kernels.py tests/generation/test_batched_rounds.py > "$out/tests.log" 2>&1
  echo "exact/batched gpu tests rc=$?"; grep -E "^(PASSED|FAILED|ERROR)" "$out/tests.log" | cut -c1-150; tail -2 "$out/tests.log"
fi
if [ -z "$SKIP_E2E" ]; then
  timeout ${E2E_TIMEOUT:-220} python benchmarks/e2e_bench.py --out "$out" --contexts 32768 --target-paths exact \
    --skip-hf --rounds 16 --repeats 3 > "$out/e2e.log" 2>&1
  echo "e2e_bench (exact) rc=$?"; grep -E "p50|Error" "$out/e2e.log" | cut -c1-150 | tail -12
  python - "$out/e2e.json" <<'PY'
import json, sys
print(json.dumps({k: v for k, v in json.load(open(sys.argv[1]))["headline"].items() if "exact" in k or "8b_32k" in k}, indent=1))
PY
fi
