#!/usr/bin/env bash
# Issue 37: exact mode's AR step against the default one at the Llama-3.1-8B shape, 32K, for several exact GEMM plans
# (tiles, warps, stages: $FOLD_HF_EXACT_GEMM_PLAN for q|k|v, o, down and the lm_head, $FOLD_HF_EXACT_GATE_UP_PLAN for
# gate|up; any plan keeps the rows invariant, fold_hf/kernels/gemm/triton.py::exact_plan). One benchmarks/e2e_bench.py
# run per plan (default path and exact mode in one process, the ratio within it), ~20 s each (eight by default), one device call:
#
#   bash benchmarks/gpu/exact_plans.sh [OUT_DIR]   -> OUT_DIR/exact-plans/{plans.csv, <plan>/e2e.{log,json}}
#   PLANS="linear;gate_up ..." (each "block_n,block_k,warps,stages" or "-" for the built-in plan); plans.csv writes a
#   plan's fields as block_n/block_k/warps/stages
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
out=${1:-${OUT:-/tmp}}/exact-plans
mkdir -p "$out"
PLANS=${PLANS:-"-;- 16,512,2,3;- 16,512,4,4;- 16,256,4,4;- 32,512,4,3;- 16,1024,4,2;- -;32,256,8,3 -;16,256,4,4"}
echo "linear_plan,gate_up_plan,our_ar_ms,exact_ar_ms,exact_ar_over_default,our_sd_fold_ms,exact_sd_fold_ms,exact_sd_round_over_default" > "$out/plans.csv"
for plan in $PLANS; do
  linear=${plan%;*}; gate_up=${plan#*;}
  dir="$out/$(echo "$linear-$gate_up" | tr ',;' '._')"
  mkdir -p "$dir"
  vars=()
  [ "$linear" != - ] && vars+=("FOLD_HF_EXACT_GEMM_PLAN=$linear")
  [ "$gate_up" != - ] && vars+=("FOLD_HF_EXACT_GATE_UP_PLAN=$gate_up")
  env "${vars[@]}" \
    timeout ${RUN_TIMEOUT:-90} python benchmarks/e2e_bench.py --out "$dir" --contexts 32768 --target-paths exact \
    --skip-hf --rounds 16 --repeats 3 > "$dir/e2e.log" 2>&1
  python - "$dir/e2e.json" "$linear" "$gate_up" >> "$out/plans.csv" <<'PY'
import json, sys
path, linear, gate_up = (arg.replace(",", "/") for arg in sys.argv[1:])  # a plan's fields: block_n/block_k/warps/stages
try:
    rows = {r["row"]: r["p50_ms"] for r in json.load(open(path))["rows"] if r["context"] == 32768}
except (OSError, ValueError, KeyError) as err:
    print(f"{linear},{gate_up},,,,,,  # failed: {err}")
    raise SystemExit(0)
ar, ex, fold, exf = rows.get("our_ar"), rows.get("our_ar[exact]"), rows.get("our_sd_fold"), rows.get("our_sd_fold[exact]")
print(f"{linear},{gate_up},{ar},{ex},{ex / ar if ar and ex else ''},{fold},{exf},{exf / fold if fold and exf else ''}")
PY
  tail -1 "$out/plans.csv"
done
