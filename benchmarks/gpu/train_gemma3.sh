#!/usr/bin/env bash
# Train the Gemma-3-270M pair's DFlash drafter (issue #18) over consecutive device calls on one warm machine;
# resumable. Gemma Terms of Use (ai.google.dev/gemma/terms): the drafter is a Model Derivative of Gemma.
#
#   bash benchmarks/gpu/train_gemma3.sh [OUT_DIR]      (repo root, GPU machine; settings below, MINUTES per call)
#
# Staging: benchmarks/gpu/stage-gemma3.sh (12 parts, the saved tokenizer, the gguf wheel, the Shakespeare cache;
# its header lists what each call carries). Until the GGUF is whole a call only stages its part and stops.
# The call that completes it generates the data, then trains until MINUTES; later calls resume from
# /root/g3train/A/state.pt. Issue each call as soon as the last returns: the machine keeps /root only while warm.
#
# Recipe (the pair's train-drafter defaults, fold_hf/pairs.py): 4 layers x MLP 512 (12.1 M parameters, 24.3 MB
# bf16), block 8, <mask> (id 4) as mask token, sequences of 1,024 tokens = BOS + 767 real tokens (stdlib source,
# even-numbered plays) + 256 tokens Gemma generates greedily; batch 16 x 32 anchors (the 262K-vocabulary logits
# of 3,584 block slots per step, ~3.8 GB in fp32), lr 6e-4, 300 warm-up steps, cosine.
# Data: SEQUENCES continuations in all (default 32,768) split over the GPUs (GPU g draws windows with seed 1000 g).
# A run that finishes its STEPS measures held-out τ on 16 windows (the bar: τ >= 3.0) and is copied to
# OUT/drafter-A with its model card, the weights in 15 MB parts (cat model.safetensors.part-* > model.safetensors,
# check the sha256 printed).
# TIME_BUDGET (minutes, optional): fit the step count (at most STEPS) into that much training over all calls.
# Dry run on a CPU (checks the commands, runs nothing): DRY=1 bash benchmarks/gpu/train_gemma3.sh /tmp/x
PAIR=gemma3-270m  # this script is Gemma's only (train_lib.sh reads PAIR)
source benchmarks/gpu/train_lib.sh
out=${1:-${OUT:-/tmp}}
started=$(date +%s)
minutes=${MINUTES:-8.8}
mkdir -p /root/g3train

# 1. data, one shard per GPU (skipped once every shard exists)
generate_shards /root/g3data /root/g3train 0
echo "data: ${shards[*]} ($(( $(date +%s) - started )) s)"

# 2. training until MINUTES after this script started
left=$(python3 -c "print(max(0.5, $minutes - ($(date +%s) - $started) / 60))")
CUDA_VISIBLE_DEVICES=0 run_cmd python -m fold_hf.cli train-drafter --pair gemma3-270m --out /root/g3train/A \
  --device ${DEVICE:-cuda} --data "${shards[@]}" --steps ${STEPS:-8000} --lr ${LR:-6e-4} --warmup ${WARMUP:-300} \
  --seed ${SEED:-0} --max-minutes $left ${TIME_BUDGET:+--time-budget $TIME_BUDGET} 2>&1 | log /root/g3train/train-A.log
[ "${DRY:-0}" = 1 ] && exit 0

finish_training_call /root/g3train/A $out A /root/g3train/train-A.log "$generated" /root/g3train/data-*.log
echo "call took $(( $(date +%s) - started )) s"
