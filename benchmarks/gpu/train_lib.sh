# Shared by the Gemma-3 training scripts (train_gemma3.sh, train_mix.sh), sourced first: DRY=1 prints the commands
# (run_cmd) instead of running them; otherwise env.sh is sourced (staged files, the GGUF joined) and the call stops
# here until the Gemma-3 GGUF is whole. Sets run_cmd, ngpu (GPUS caps it) and log.
if [ "${DRY:-0}" = 1 ]; then
  exec 3>&1
  run_cmd() { echo "+ CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-} $*" >&3; }
  ngpu=${GPUS:-2}
  mkdir() { :; }
else
  source benchmarks/gpu/env.sh > /dev/null
  stop_until_gemma3_whole
  run_cmd() { "$@"; }
  ngpu=$(nvidia-smi -L | wc -l)
  [ "${GPUS:-$ngpu}" -lt "$ngpu" ] && ngpu=$GPUS
fi
log() { tr '\r' '\n' | awk 'NR % 50 == 1 || !/(step|batch|req)\/s/' >> "$1"; }

# data, one shard per GPU, skipped once every shard exists: GPU g generates SEQUENCES / ngpu continuations of windows
# drawn with seed 1000 g + SEED0; sets the array shards and, when it generated anything, generated=1
#   generate_shards DATA_DIR LOG_DIR SEED0 [train-drafter options ...]
generate_shards() {
  local data=$1 logs=$2 seed0=$3 g
  shift 3
  shards=()
  local per_gpu=$(( ${SEQUENCES:-32768} / ngpu ))
  for g in $(seq 0 $((ngpu - 1))); do
    shards+=("$data/gpu$g/data.pt")
    if [ ! -f "$data/gpu$g/data.pt" ]; then
      generated=1
      CUDA_VISIBLE_DEVICES=$g run_cmd python -m fold_hf.cli train-drafter --pair gemma3-270m --generate-only "$@" \
        --out "$data/gpu$g" --device ${DEVICE:-cuda} --sequences $per_gpu --gen-batch ${GEN_BATCH:-256} \
        --seed $((1000 * g + seed0)) 2>&1 | log "$logs/data-gpu$g.log" &
    fi
  done
  wait
}

# the end of a training call (train_gemma3.sh, train_mix.sh): what comes back (at most 8 files a call): the training log
# and the data logs of a call that generated data in one logs-NAME.tar.gz, and the drafter as it stands with its card
# and training.json, the weights in 15 MB parts, whether finished or stopped at the call's time limit: the state file
# (optimizer, ~150 MB) stays on the machine, which a later device session does not get back, so a session that cannot
# finish resumes the next one from these weights (--init-from: the weights kept, a fresh optimizer)
#   finish_training_call RUN_DIR OUT NAME TRAIN_LOG GENERATED [DATA_LOG ...]
finish_training_call() {
  local d=$1 out=$2 name=$3 train_log=$4 generated=$5 logs
  shift 5
  logs=("$train_log")
  [ -n "$generated" ] && logs+=("$@")
  local tmp; tmp=$(mktemp -d)
  cp "${logs[@]}" "$tmp"/ 2>/dev/null
  tar -czf "$out/logs-$name.tar.gz" -C "$tmp" . && rm -rf "$tmp"
  if [ -f "$d"/drafter/model.safetensors ]; then
    mkdir -p "$out/drafter-$name"
    cp "$d"/drafter/*.json "$d"/drafter/README.md "$out/drafter-$name"/
    split -b 15000000 "$d"/drafter/model.safetensors "$out/drafter-$name"/model.safetensors.part-
    local sha; sha=$(sha256sum "$d"/drafter/model.safetensors | cut -c1-64)
    if grep -q '"finished": true' "$d"/drafter/training.json 2>/dev/null; then
      echo "finished: drafter in $out/drafter-$name, weights sha256 $sha"
    else
      echo "stopped (not finished): the drafter so far in $out/drafter-$name, weights sha256 $sha; a later session" \
        "continues it with INIT=<that folder, parts joined>"
    fi
  fi
  grep -v "^train drafter" "$train_log" | tail -n 4; grep "^train drafter" "$train_log" | tail -n 1
}
