#!/usr/bin/env bash
# Retrain the Gemma-3-270M pair's DFlash drafter on the broad data mix (issue #38) over consecutive device calls on
# one warm machine; resumable. Gemma Terms of Use (ai.google.dev/gemma/terms): the drafter is a Model Derivative.
#
#   bash benchmarks/gpu/train_mix.sh [OUT_DIR]      (repo root, GPU machine; settings below, MINUTES per call)
#
# Staging (docs/training.md, "GPU commands", has the whole sequence): on the CPU machine
#   python -m fold_hf.data.mix export --out .stage/gmix/mix.jsonl.gz --eval-max-chars 1000000
#   bash benchmarks/gpu/slim.sh out && bash benchmarks/gpu/stage-gemma3.sh
# then calls carrying .stage/gtok .whl | .stage/gdata .stage/gmix | .stage/g0 | ... | .stage/g{N-1}; env.sh keeps
# the mix in /root/cache/mix.jsonl.gz. Before the training calls: bash benchmarks/gpu/slim.sh out gemma3-270m-dflash
# (the committed Gemma drafter is the warm start; it must be in the tree). Until the GGUF is whole a call only
# stages its part and stops.
#
# Recipe: windows of BOS + 767 real tokens drawn from the mix's training side (kinds weighted by MIX_WEIGHTS, default
# the mix's: python 1, c 1, code-other 0.5, markup 1, structured 0.75, logs 0.75, prose 1.5) + 256 tokens Gemma
# generates greedily (1,024 tokens in all); SEQUENCES continuations (default 32,768) split over the GPUs (GPU g draws
# windows with seed 1000 g + SEED); loss = DFlash CE + KL x KL(Gemma || drafter) per block slot (KL default 0.5);
# warm start from INIT (default the committed fold_hf/assets/gemma3-270m-dflash: 4 layers x MLP 512, block 8, 24.3 MB;
# INIT=none trains a fresh drafter of LAYERS / INTERMEDIATE / BLOCK, for the shape sweep); lr LR (default 3e-4 warm,
# 6e-4 fresh), WARMUP, STEPS (default 8000), batch 16 x 32 anchors (the pair's defaults). A run that finishes measures
# held-out τ on the mix's evaluation side and is copied to OUT/drafter-$RUN with its model card, the weights in 15 MB
# parts (cat model.safetensors.part-* > model.safetensors; check the sha256 printed).
# RUN (default A) names the run (/root/g3mix/$RUN), so shape-sweep runs live side by side; data is shared.
# TIME_BUDGET (minutes, optional): fit the step count (at most STEPS) into that much training over all calls.
# Dry run on a CPU (checks the commands, runs nothing): DRY=1 bash benchmarks/gpu/train_mix.sh /tmp/x
source benchmarks/gpu/train_lib.sh
mix=${MIX:-/root/cache/mix.jsonl.gz}
[ "${DRY:-0}" = 1 ] || [ -f "$mix" ] || {
  echo "no data mix at $mix: carry .stage/gmix (python -m fold_hf.data.mix export) first"; exit 1; }
out=${1:-${OUT:-/tmp}}
run=${RUN:-A}
init=${INIT:-fold_hf/assets/gemma3-270m-dflash}
started=$(date +%s)
minutes=${MINUTES:-8.8}
mkdir -p /root/g3mix
mixargs=(--sources mix --mix-file "$mix" ${MIX_WEIGHTS:+--mix-weights $MIX_WEIGHTS})
if [ "$init" = none ]; then
  shape=(--layers ${LAYERS:-4} --intermediate ${INTERMEDIATE:-512} --block-size ${BLOCK:-8}); lr=${LR:-6e-4}
else
  [ "${DRY:-0}" = 1 ] || [ -f "$init/model.safetensors" ] || {
    echo "INIT $init has no weights: run benchmarks/gpu/slim.sh out gemma3-270m-dflash before this call"; exit 1; }
  shape=(--init-from "$init"); lr=${LR:-3e-4}
fi

# 1. data, one shard per GPU (skipped once every shard exists)
generate_shards /root/g3mixdata /root/g3mix ${SEED:-0} "${mixargs[@]}"
echo "data: ${shards[*]} ($(( $(date +%s) - started )) s)"

# 2. training until MINUTES after this script started
left=$(python3 -c "print(max(0.5, $minutes - ($(date +%s) - $started) / 60))")
CUDA_VISIBLE_DEVICES=0 run_cmd python -m fold_hf.cli train-drafter --pair gemma3-270m --out /root/g3mix/$run \
  --device ${DEVICE:-cuda} "${mixargs[@]}" "${shape[@]}" --data "${shards[@]}" --kl ${KL:-0.5} \
  --steps ${STEPS:-8000} --lr $lr --warmup ${WARMUP:-300} --seed ${SEED:-0} --max-minutes $left \
  ${TIME_BUDGET:+--time-budget $TIME_BUDGET} 2>&1 | log /root/g3mix/train-$run.log
[ "${DRY:-0}" = 1 ] && exit 0

finish_training_call /root/g3mix/$run $out $run /root/g3mix/train-$run.log "$generated" /root/g3mix/data-*.log
echo "call took $(( $(date +%s) - started )) s"
