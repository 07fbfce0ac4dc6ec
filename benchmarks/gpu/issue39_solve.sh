#!/usr/bin/env bash
# Issue 39, one device call (random tensors and weights, no staging; ~6 min on an H100): where the Qwen3.5-9B SD FOLD
# round loses time beyond its floor (benchmarks/results/2026-12-07-nvidia-h100-drafter-reads: the 16-row Gated
# DeltaNet verify, the drafter's reads), two changes measured against the defaults in one call:
#   1. the chunked verify's triangular solve by blocks ($FOLD_HF_GDN_SOLVE=blocks: 7 dependent dots for 16 rows
#      instead of 15): its GPU tests (float64 oracle, nearly repeating keys, 16 and 64 rows), then the verify alone
#      at 16 and 64 rows (benchmarks/gdn_quick.py) with each solve;
#   2. the drafter's FOLD read split differently: $FOLD_HF_WINDOW_SPLITS (programs for the window region) x
#      $FOLD_HF_SPLIT_KV_RATIO (fewest bytes a far split reads over its partials), at the drafter's two windows
#      (2,048 for its five sliding layers, W 4,096 for its full one) and for the Gemma pair's batched draft;
#   3. benchmarks/hybrid_bench.py at 32K (FOLD, with and without a 32,768-row draft vocabulary) three times: the
#      defaults, the solve by blocks, the solve by blocks with the reads' best setting (picked from 2.).
#   bash benchmarks/gpu/issue39_solve.sh [OUT_DIR]   -> OUT_DIR/issue39-solve.tar.gz (one file)
# Dry run on a CPU (prints the commands): DRY=1 bash benchmarks/gpu/issue39_solve.sh /tmp/x
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
out=${1:-${OUT:-/tmp}}
run=(); [ "${DRY:-0}" = 1 ] && run=(echo +)
d=$(mktemp -d)
"${run[@]}" timeout ${TEST_TIMEOUT:-200} python -m pytest -q -m gpu -p no:cacheprovider -rf \
  tests/kernels/test_hybrid_kernels.py -k "hybrid_kernels_on_gpu" > $d/gpu_tests.log 2>&1
echo "gpu tests rc=$? $(tail -1 $d/gpu_tests.log)"
for s in rows blocks; do
  echo "solve=$s"; FOLD_HF_GDN_SOLVE=$s "${run[@]}" timeout 90 python benchmarks/gdn_quick.py 16 64
done > $d/gdn_quick.log 2>&1
cat $d/gdn_quick.log
reads="--kinds fold --layers 6 --splits default --window-splits 16,32,64 --split-kv-ratio default,4,2,0"
for w in 2048 4096; do
  "${run[@]}" timeout 120 python benchmarks/read_splits_bench.py --out $d/qwen35-w$w --hq 16 --hkv 4 --lq 16 \
    --window $w $reads > $d/qwen35-w$w.log 2>&1
done
"${run[@]}" timeout 90 python benchmarks/read_splits_bench.py --out $d/gemma-b8 --rows 8 --hq 4 --hkv 1 --lq 8 \
  --window 512 $reads > $d/gemma-b8.log 2>&1
# the best (window splits, ratio) for the Qwen3.5 drafter's six reads: five at 2,048, one at 4,096
best=$(python3 - $d <<'PY'
import json, sys
from pathlib import Path
d = Path(sys.argv[1])
def rows(name):
    f = d / f"{name}.log"
    out = {}
    for line in (f.read_text().splitlines() if f.is_file() else []):
        if line.startswith("{"):
            r = json.loads(line)
            if "us" in r and r.get("rel_err", 1) < 2e-2:
                out[(r.get("window_splits", 16), r.get("split_kv_ratio", 8.0))] = r["us"]
    return out
a, b = rows("qwen35-w2048"), rows("qwen35-w4096")
cost = {k: 5 * a[k] + b[k] for k in a if k in b}
if not cost:
    print("16 8"); sys.exit()
k = min(cost, key=cost.get)
print(k[0], k[1])
print(f"reads: default {cost.get((16, 8.0))} us, best {k} {cost[k]} us (5 x W 2048 + W 4096)", file=sys.stderr)
PY
)
read ws ratio <<< "$best"
echo "reads' best: FOLD_HF_WINDOW_SPLITS=$ws FOLD_HF_SPLIT_KV_RATIO=$ratio"
hb="python benchmarks/hybrid_bench.py --pairs qwen35_9b --contexts 32768 --rounds 24 --repeats 2 --sd-modes fold \
--draft-vocab-size 32768"
"${run[@]}" timeout 150 $hb --out $d/hybrid-default > $d/hybrid-default.log 2>&1
FOLD_HF_GDN_SOLVE=blocks "${run[@]}" timeout 150 $hb --out $d/hybrid-blocks > $d/hybrid-blocks.log 2>&1
FOLD_HF_GDN_SOLVE=blocks FOLD_HF_WINDOW_SPLITS=$ws FOLD_HF_SPLIT_KV_RATIO=$ratio "${run[@]}" timeout 150 $hb \
  --out $d/hybrid-blocks-reads > $d/hybrid-blocks-reads.log 2>&1
if [ "${DRY:-0}" = 1 ]; then cat $d/*.log; rm -rf $d; exit 0; fi
tar -czf "$out/issue39-solve.tar.gz" -C $d .
for v in default blocks blocks-reads; do
  echo "== $v"; grep -E "p50" $d/hybrid-$v.log | cut -c12-
  python3 -c "import json,sys; h=json.load(open(sys.argv[1]))['headline']; print({k: round(v, 4) for k, v in h.items() if v})" \
    $d/hybrid-$v/hybrid.json 2>/dev/null
done
