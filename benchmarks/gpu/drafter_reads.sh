#!/usr/bin/env bash
# Issues 39 and 35: the drafter's FOLD read at many packed rows, per launch configuration, and where a Qwen3.5 round's
# time goes (one device call, random tensors and weights, no staging; ~6 min on an H100):
#   1. benchmarks/read_splits_bench.py sweeps (block_m x block_n x warps x stages, every config checked against the
#      float64 read): the Qwen3.5-9B drafter's read (16 / 4 heads of 256, a 16-row block, W 4096: 64 packed rows a
#      KV head), the Llama-3.1-8B drafter's (32 / 8 heads of 128, 16 rows), the Gemma-3-270M pair's batched draft
#      (8 rows of a batch in one launch, 4 / 1 heads of 256, an 8-row block, W 512);
#   2. benchmarks/hybrid_bench.py --profile at the Qwen3.5-9B shape, 32K, FOLD with and without a 32,768-row draft
#      vocabulary: per-kernel device time of the AR step and the rounds.
#   bash benchmarks/gpu/drafter_reads.sh [OUT_DIR]   -> OUT_DIR/drafter-reads.tar.gz (one file: a call brings back 8)
# PART=waves (~3 min; the next step after the 2026-12-07 run, benchmarks/results/2026-12-07-nvidia-h100-drafter-reads
# §1): the same reads with program counts that fill whole waves of 132 SMs (far splits x window programs, e.g. 4 x 27 +
# 4 x 4 = 124 for the Qwen drafter, against the plan's 172), then the Gated DeltaNet verify warm and "cold" (24 layers,
# L2 flushed between: benchmarks/gdn_quick.py), then the Qwen3.5-9B FOLD round (hybrid_bench, 32K, with the
# 32,768-row draft vocabulary) with the default window programs and with $FOLD_HF_WINDOW_SPLITS=4 (one wave)
# -> OUT_DIR/drafter-waves.tar.gz
# Dry run on a CPU (prints the commands): DRY=1 [PART=waves] bash benchmarks/gpu/drafter_reads.sh /tmp/x
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
out=${1:-${OUT:-/tmp}}
run=(); [ "${DRY:-0}" = 1 ] && run=(echo +)
d=$(mktemp -d)
if [ "${PART:-tiles}" = waves ]; then
  for w in 2048 4096; do
    "${run[@]}" timeout 100 python benchmarks/read_splits_bench.py --out $d/qwen35-w$w --kinds fold --hq 16 --hkv 4 \
      --lq 16 --window $w --layers 6 --splits default,24,27,29,31 --window-splits 2,4,6,8,16 > $d/qwen35-w$w.log 2>&1
  done
  "${run[@]}" timeout 100 python benchmarks/read_splits_bench.py --out $d/gemma-b8 --kinds fold --rows 8 --hq 4 \
    --hkv 1 --lq 8 --window 512 --layers 4 --splits default,8,16,24,33 --window-splits 1,2,4,8,16 > $d/gemma-b8.log 2>&1
  "${run[@]}" timeout 100 python benchmarks/read_splits_bench.py --out $d/llama --kinds fold --hq 32 --hkv 8 --lq 16 \
    --head-dim 128 --window 2048 --layers 5 --splits default,8,12,14 --window-splits 2,4,8,16 > $d/llama.log 2>&1
  "${run[@]}" timeout 120 python benchmarks/gdn_quick.py 16 1 > $d/gdn_quick.log 2>&1
  # the round itself with the window's programs cut to one wave's worth (Qwen's drafter: 4 x 27 + 4 x 4 = 124
  # programs) against the default (172), each round over its own process's AR step
  for ws in "" 4; do  # "": the default
    FOLD_HF_WINDOW_SPLITS=$ws "${run[@]}" timeout 100 python benchmarks/hybrid_bench.py --pairs qwen35_9b \
      --contexts 32768 --rounds 24 --repeats 3 --sd-modes fold --draft-vocab-size 32768 \
      --out $d/hybrid-ws${ws:-default} > $d/hybrid-ws${ws:-default}.log 2>&1
  done
  if [ "${DRY:-0}" = 1 ]; then cat $d/*.log; rm -rf $d; exit 0; fi
  tar -czf "$out/drafter-waves.tar.gz" -C $d .
  cat $d/gdn_quick.log
  grep -H -E "p50|FAILED|Error" $d/hybrid-ws*.log
  python3 - $d <<'PY'
import json, sys
from pathlib import Path
for f in sorted(Path(sys.argv[1]).glob("*.log")):
    rows = [json.loads(l) for l in f.read_text().splitlines() if l.startswith("{")]
    rows = [r for r in rows if "us" in r and r.get("rel_err", 1) < 2e-2]
    if rows:
        default = [r for r in rows if r["splits"] == "default" and r.get("window_splits") == 16]
        print(f.stem, "default:", default[:1], "best:", *sorted(rows, key=lambda r: r["us"])[:4], sep="\n  ")
PY
  exit 0
fi
# each configuration prints one JSON line as it is timed (the summary reads the logs: a sweep cut by its timeout
# still counts); the plan's default (64 x 32 keys, 8 warps, 3 stages at 64 packed rows of 256) comes first
"${run[@]}" timeout ${SWEEP_TIMEOUT:-150} python benchmarks/read_splits_bench.py --out $d/qwen35 --kinds fold \
  --hq 16 --hkv 4 --lq 16 --window 4096 --layers 6 --splits default --block-m default,16,32 \
  --block-n default,16,64 --warps default,4 --stages default,2,4 > $d/qwen35.log 2>&1
"${run[@]}" timeout ${SWEEP_TIMEOUT:-150} python benchmarks/read_splits_bench.py --out $d/gemma-b8 --kinds fold \
  --rows 8 --hq 4 --hkv 1 --lq 8 --window 512 --layers 4 --splits default,16,66 --block-m default,16 \
  --block-n default,16,64 --warps default,2,8 --stages default,2 > $d/gemma-b8.log 2>&1
"${run[@]}" timeout ${SWEEP_TIMEOUT:-150} python benchmarks/read_splits_bench.py --out $d/llama --kinds fold \
  --hq 32 --hkv 8 --lq 16 --head-dim 128 --window 2048 --layers 5 --splits default --block-m default,32 \
  --block-n default,32 --warps default,8 --stages default,2,4 > $d/llama.log 2>&1
"${run[@]}" timeout ${HYBRID_TIMEOUT:-240} python benchmarks/hybrid_bench.py --pairs qwen35_9b --contexts 32768 \
  --rounds 24 --repeats 2 --sd-modes fold --draft-vocab-size 32768 --profile --out $d/hybrid > $d/hybrid.log 2>&1
if [ "${DRY:-0}" = 1 ]; then cat $d/*.log; rm -rf $d; exit 0; fi
tar -czf "$out/drafter-reads.tar.gz" -C $d .
python3 - $d <<'PY'
import json, sys
from pathlib import Path
d = Path(sys.argv[1])
for name in ("qwen35", "gemma-b8", "llama"):
    log = d / f"{name}.log"
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")] if log.is_file() else []
    rows = [r for r in rows if "us" in r and r.get("rel_err", 1) < 2e-2]
    if not rows:
        print(f"{name}: no timed row (see {name}.log)"); continue
    knobs = ("block_m", "block_n", "num_warps", "num_stages")
    default = [r for r in rows if not any(k in r for k in knobs) and r["splits"] == "default"]
    print(name, f"{len(rows)} configs; default:", *default[:1], "best:", *sorted(rows, key=lambda r: r["us"])[:5],
          sep="\n  ")
PY
grep -E "p50|FAILED" $d/hybrid.log | tail -8
for f in $d/hybrid/profile/*.txt; do [ -f "$f" ] && head -14 "$f"; done
