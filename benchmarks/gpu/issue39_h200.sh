#!/usr/bin/env bash
# Issue #39's goals name one H200, and most device calls get an H100. Add this to the first call of any session (a
# staging call is fine): on an H200 it runs the issue's two benches at 32K (~2.5 minutes) and packs them into ONE file,
# OUT/issue39-h200.tar.gz (a call brings back at most 8); on any other card it says which and returns at once.
#
#   bash benchmarks/gpu/issue39_h200.sh [OUT_DIR]          (repo root, GPU machine)
#
# The keys (qwen35_9b_ar_over_floor_32768, qwen35_9b_sd_fold_over_ar_32768, llama31_8b_ar_over_floor_32768 in
# hybrid/hybrid.json's "headline"; ar_over_floor / sd_fold_over_ar at 32768 in gemma/gemma.json's "ratios") are
# printed at the end.
# Dry run on a CPU (prints the commands): DRY=1 GPU_NAME="NVIDIA H200" bash benchmarks/gpu/issue39_h200.sh /tmp/x
set -uo pipefail
out=${1:-${OUT:-/tmp}}
gpu=${GPU_NAME:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)}
case "$gpu" in
  *H200*) ;;
  *) echo "issue 39: the card is '${gpu:-none}', not an H200: nothing run"; exit 0 ;;
esac
run=(); [ "${DRY:-0}" = 1 ] && run=(echo +)
d=$(mktemp -d)
"${run[@]}" python benchmarks/hybrid_bench.py --pairs qwen35_9b,llama31_8b --contexts 32768 --rounds 24 --repeats 2 \
  --out $d/hybrid > $d/hybrid.log 2>&1
"${run[@]}" python benchmarks/gemma_bench.py --contexts 32768 --rounds 16 --repeats 2 --profile --out $d/gemma \
  > $d/gemma.log 2>&1
if [ "${DRY:-0}" = 1 ]; then cat $d/hybrid.log $d/gemma.log; rm -rf $d; exit 0; fi
tar -czf "$out/issue39-h200.tar.gz" -C $d .
python3 - $d <<'PY'
import json, sys
from pathlib import Path
d = Path(sys.argv[1])
for name in ("hybrid/hybrid.json", "gemma/gemma.json"):
    f = d / name
    if not f.is_file():
        print(f"{name}: missing (see its log in issue39-h200.tar.gz)")
        continue
    data = json.loads(f.read_text())
    flat = data.get("ratios") or data.get("headline") or {}  # gemma_bench's ratios, hybrid_bench's headline keys
    print(name, {k: v for k, v in flat.items() if isinstance(v, (int, float)) and "32768" in k}
          if isinstance(flat, dict) else flat)
PY
rm -rf $d
