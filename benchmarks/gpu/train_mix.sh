#!/usr/bin/env bash
# Retrain a pair's committed DFlash drafter on the broad data mix (issue #38) over consecutive device calls on one
# warm machine; resumable. PAIR: gemma3-270m (default) or smollm2-135m.
# PAIR=gemma3-270m: Gemma Terms of Use (ai.google.dev/gemma/terms): the drafter is a Model Derivative of Gemma.
# PAIR=smollm2-135m: SmolLM2-135M-Instruct is Apache-2.0 (HuggingFaceTB).
#
#   [PAIR=...] bash benchmarks/gpu/train_mix.sh [OUT_DIR]    (repo root, GPU machine; settings below, MINUTES a call)
#
# Staging (docs/training.md, "GPU commands", has the whole sequence per pair): the mix from
#   python -m fold_hf.data.mix export --out .stage/gmix/mix.jsonl.gz --eval-max-chars 1000000
# lands in /root/cache/mix.jsonl.gz (env.sh copies .stage/gmix/*.gz and .stage/s2mix/*.gz there); the pair's GGUF
# is staged in parts (Gemma: stage-gemma3.sh, .stage/gK + .stage/gtok; SmolLM2: .stage/pK, part-K). Before the
# training calls: bash benchmarks/gpu/slim.sh out $PAIR-dflash (the committed drafter is the warm start; it must be
# in the tree). Until the pair's GGUF is whole a call only stages its part and stops.
#
# Recipe: windows of the pair's prompt length (Gemma: BOS + 767 real tokens; SmolLM2: 512, no BOS) drawn from the
# mix's training side (kinds weighted by MIX_WEIGHTS, default the mix's: python 1, c 1, code-other 0.5, markup 1,
# structured 0.75, logs 0.75, prose 1.5) + 256 tokens the target generates greedily; SEQUENCES continuations
# (default 32,768) split over the GPUs (GPU g draws windows with seed 1000 g + SEED); loss = DFlash CE +
# KL x KL(target || drafter) per block slot (KL default 0.5); warm start from INIT (default the pair's committed
# fold_hf/assets/$PAIR-dflash: Gemma 4 layers x MLP 512, SmolLM2 6 x 448, block 8; INIT=none trains a fresh drafter
# of LAYERS / INTERMEDIATE / BLOCK, each the pair's when unset, for the shape sweep); lr LR (default 3e-4 warm,
# 6e-4 fresh), WARMUP, STEPS (default 8000), BATCH and ANCHORS (default the pair's: Gemma 16 x 32, SmolLM2 32 x 48).
# A run that finishes measures held-out τ on the mix's evaluation side and is copied to OUT/drafter-$RUN with its
# model card, the weights in 15 MB parts (cat model.safetensors.part-* > model.safetensors; check the sha256 printed).
# RUN (default A) names the run (/root/g3mix/$RUN for Gemma, /root/s2mix/$RUN for SmolLM2), so shape-sweep runs
# live side by side; data is shared per pair (/root/g3mixdata, /root/s2mixdata).
# TIME_BUDGET (minutes, optional): fit the step count (at most STEPS) into that much training over all calls;
# TIME_BUDGET=call: into what this call leaves for training after the data (less half a minute for loading and the
# probe), so a one-call round's cosine schedule ends before the clock stops it (on 2026-12-07 a fixed 4 lost to a
# 126-151 s data phase twice).
# PROMPT_TOKENS / NEW_TOKENS (optional, both steps): the window's real tokens (BOS included) and the target's greedy
# continuation (the pair's: Gemma 768 + 256, SmolLM2 512 + 256); e.g. 960 + 64 keeps 1,024 tokens and generates the
# data 4x faster (the benchmarks decode 64 tokens).
# POSITION_SPAN (optional): spread each window's rope positions over that many (PoSE, --position-span): the drafter
# sees distances up to POSITION_SPAN - 1 while reading at most the window's 1,024 tokens.
# Dry run on a CPU (checks the commands, runs nothing): DRY=1 [PAIR=...] bash benchmarks/gpu/train_mix.sh /tmp/x
source benchmarks/gpu/train_lib.sh
mix=${MIX:-/root/cache/mix.jsonl.gz}
[ "${DRY:-0}" = 1 ] || [ -f "$mix" ] || {
  echo "no data mix at $mix: carry .stage/gmix or .stage/s2mix (python -m fold_hf.data.mix export) first"; exit 1; }
out=${1:-${OUT:-/tmp}}
run=${RUN:-A}
init=${INIT:-fold_hf/assets/$drafter}
runs=/root/${tag}mix
started=$(date +%s)
minutes=${MINUTES:-8.8}
mkdir -p $runs
mixargs=(--sources mix --mix-file "$mix" ${MIX_WEIGHTS:+--mix-weights $MIX_WEIGHTS}
  ${PROMPT_TOKENS:+--prompt-tokens $PROMPT_TOKENS} ${NEW_TOKENS:+--new-tokens $NEW_TOKENS})
if [ "$init" = none ]; then
  # the pair's shape unless given (Gemma 4 x 512, SmolLM2 6 x 448, block 8: fold_hf/pairs.py, the parser's defaults)
  shape=(${LAYERS:+--layers $LAYERS} ${INTERMEDIATE:+--intermediate $INTERMEDIATE} ${BLOCK:+--block-size $BLOCK})
  lr=${LR:-6e-4}
else
  [ "${DRY:-0}" = 1 ] || [ -f "$init/model.safetensors" ] || {
    echo "INIT $init has no weights: run benchmarks/gpu/slim.sh out $drafter before this call"; exit 1; }
  shape=(--init-from "$init"); lr=${LR:-3e-4}
fi

# 1. data, one shard per GPU (skipped once every shard exists)
generate_shards /root/${tag}mixdata $runs ${SEED:-0} "${mixargs[@]}"
echo "data: ${shards[*]} ($(( $(date +%s) - started )) s)"

# 2. training until MINUTES after this script started, and at most until 60 s before CALL_SECONDS (default 560): the
# held-out read after the last step takes minutes, so the command gets SIGINT at CALL_SECONDS and what was trained is
# copied out below before the device call's limit (train-drafter writes the drafter before that read; the training
# itself, stopped by --max-minutes, never meets the signal)
call_seconds=${CALL_SECONDS:-560}
left=$(python3 -c "print(max(0.5, min($minutes * 60, $call_seconds - 60) / 60 - ($(date +%s) - $started) / 60))")
if [ "${TIME_BUDGET:-}" = call ]; then
  budget=$(python3 -c "print(round(max(0.5, $left - 0.5), 2))")
  echo "TIME_BUDGET=call: a schedule of $budget minutes (this call leaves $left for training)"
else
  budget=${TIME_BUDGET:-}
fi
until_limit=$(( call_seconds - ($(date +%s) - started) ))
[ "$until_limit" -gt 60 ] || until_limit=60
CUDA_VISIBLE_DEVICES=0 run_cmd timeout -s INT $until_limit python -m fold_hf.cli train-drafter --pair $pair --out $runs/$run \
  --device ${DEVICE:-cuda} "${mixargs[@]}" "${shape[@]}" --data "${shards[@]}" --kl ${KL:-0.5} \
  --steps ${STEPS:-8000} --lr $lr --warmup ${WARMUP:-300} --seed ${SEED:-0} --max-minutes $left \
  ${budget:+--time-budget $budget} ${POSITION_SPAN:+--position-span $POSITION_SPAN} ${BATCH:+--batch $BATCH} ${ANCHORS:+--anchors $ANCHORS} 2>&1 \
  | log $runs/train-$run.log
rc=${PIPESTATUS[0]}
[ "${DRY:-0}" = 1 ] && exit 0
[ "$rc" = 0 ] || echo "train-drafter exited with $rc (137: killed, e.g. out of memory: try a smaller BATCH / ANCHORS)"

finish_training_call $runs/$run $out $run $runs/train-$run.log "$generated" $runs/data-*.log
echo "call took $(( $(date +%s) - started )) s"
