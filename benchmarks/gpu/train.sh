#!/usr/bin/env bash
# Train the demo drafter (issue #3) over consecutive device calls on one warm machine; resumable.
#
#   bash benchmarks/gpu/train.sh [OUT_DIR]          (repo root, GPU machine; settings below, MINUTES per call)
#
# Needs the staged GGUF (env.sh) and the Shakespeare texts (carry .gpu/cache/shakespeare, 12.4 MB). With the
# 28 MB tree every call stays under 64 MiB with four ~24.6 MB parts (../shared/tools/stage-smollm2.sh 4):
#   call 1: carry .stage/p0 .gpu/cache/shakespeare   (65.1 MB)     bash benchmarks/gpu/train.sh $OUT
#   call 2: carry .stage/p1;  call 3: carry .stage/p2            (the script only stages until the GGUF is whole)
#   call 4: carry .stage/p3 .whl                                  data generation, then training until MINUTES
#   calls 5..: no carry                                           training resumes from /root/train/state.pt
# Each call stops training after MINUTES (default 8.5, leaving a 10-minute call room to save); the call that
# finishes the steps also measures held-out τ (~2 minutes: give it MINUTES=7) and copies the drafter (23 MB)
# and its training.json to $OUT. Every call copies the log and the progress so far.
#
# Recipe defaults (override by environment): 5 layers with MLP 640 (~11.5 M parameters, under the 25 MB cap),
# 16,384 sequences (512-token windows + 256 generated tokens), batch 32, 14,000 steps. Speed on an H200
# (benchmarks/train_step_bench.py): ~80 ms per step at batch 32, i.e. ~19 minutes of training.
source benchmarks/gpu/env.sh > /dev/null
out=${1:-${OUT:-/tmp}}
if [ ! -f "$FOLD_HF_SMOLLM2_GGUF" ]; then
  echo "GGUF not whole yet (staged: $(ls /root/stage | tr '\n' ' ')); carry the next part"
  exit 0
fi
mkdir -p /root/train
python -m fold_hf.cli train-drafter --out /root/train --device cuda \
  --layers ${LAYERS:-5} --intermediate ${INTERMEDIATE:-640} --block-size 8 \
  --sequences ${SEQUENCES:-16384} --gen-batch ${GEN_BATCH:-512} --steps ${STEPS:-14000} --batch ${BATCH:-32} \
  --anchors ${ANCHORS:-48} --lr ${LR:-6e-4} --warmup ${WARMUP:-300} --seed ${SEED:-0} \
  --max-minutes ${MINUTES:-8.5} 2>&1 | tr '\r' '\n' | awk 'NR % 50 == 1 || !/step\/s/' >> /root/train/train.log
cp /root/train/train.log $out/
if [ -f /root/train/drafter/model.safetensors ] && [ /root/train/drafter/model.safetensors -nt /root/train/state.pt ]; then
  cp -r /root/train/drafter $out/drafter
  echo "finished: drafter in $out/drafter"
fi
tail -n 25 /root/train/train.log
