#!/usr/bin/env bash
# The lossless soak on every GPU of the machine, resuming from the committed runs, until a deadline.
#
#   SOAK_SECONDS=420 bash benchmarks/gpu/soak.sh [OUT_DIR]      (needs the staged SmolLM2 GGUF: env.sh)
#
# Seeds /root/soak with the committed prompts and runs (SEED_FROM, default the 2026-11-30 x2 run), so only the
# prompts not yet run on a GPU are taken; one soak run per GPU shares the folder through claim files. Prompts are
# not started after SOAK_SECONDS (loading the pair takes ~20 s of it; a started prompt finishes, ~80 s). Writes
# $OUT/summary-float32.json and $OUT/runs-float32-merged.jsonl.
source benchmarks/gpu/env.sh > /dev/null
out=${1:-${OUT:-/tmp}}
seed=${SEED_FROM:-benchmarks/results/2026-11-30-nvidia-h200x2/soak}
mkdir -p /root/soak/runs-float32
[ -f /root/soak/prompts.jsonl ] || cp $seed/prompts.jsonl /root/soak/
[ -f /root/soak/runs-float32/shard-seed.jsonl ] || cp $seed/runs-float32-gpu.jsonl /root/soak/runs-float32/shard-seed.jsonl
gpus=$(nvidia-smi -L | wc -l)
minutes=$(python3 -c "print(${SOAK_SECONDS:-420} / 60)")
for g in $(seq 0 $((gpus - 1))); do
  CUDA_VISIBLE_DEVICES=$g python benchmarks/soak.py --out /root/soak --device cuda --workers ${WORKERS_PER_GPU:-12} \
    --max-minutes $minutes > /root/soak/run-gpu$g.log 2>&1 &
done
wait
python benchmarks/soak.py --out /root/soak --summarize-only | head -n 40
cp /root/soak/summary-float32.json /root/soak/runs-float32-merged.jsonl $out/
