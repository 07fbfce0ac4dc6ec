# Shared by the drafter scripts (train_gemma3.sh, train_mix.sh, bench_mix.sh), sourced first. PAIR (default
# gemma3-270m; also smollm2-135m) sets pair (the --pair option), drafter (its committed drafter's folder under
# fold_hf/assets) and tag (g3 / s2: the prefix of its folders under /root, so the pairs never share one).
# DRY=1 prints the commands (run_cmd) instead of running them; otherwise env.sh is sourced (staged files, the GGUF
# joined) and the call stops here until the pair's GGUF is whole. Sets run_cmd, ngpu (GPUS caps it) and log.
pair=${PAIR:-gemma3-270m}
case $pair in
  gemma3-270m) tag=g3; stop_until_whole=stop_until_gemma3_whole ;;
  smollm2-135m) tag=s2; stop_until_whole=stop_until_gguf_whole ;;
  *) echo "PAIR=$pair: unknown (gemma3-270m or smollm2-135m)" >&2; exit 2 ;;
esac
drafter=$pair-dflash
if [ "${DRY:-0}" = 1 ]; then
  exec 3>&1
  run_cmd() { echo "+ CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-} $*" >&3; }
  ngpu=${GPUS:-2}
  mkdir() { :; }
else
  source benchmarks/gpu/env.sh > /dev/null
  $stop_until_whole
  run_cmd() { "$@"; }
  ngpu=$(nvidia-smi -L | wc -l)
  [ "${GPUS:-$ngpu}" -lt "$ngpu" ] && ngpu=$GPUS
fi
if [ "${DRY:-0}" = 1 ]; then
  log() { cat > /dev/null; }
else
  # what a command prints, progress bars cut at their carriage returns (every 50th rate line kept), written to the
  # file as it comes (a call killed at its limit keeps the log up to then: through tr and awk, block-buffered, the
  # 2026-12-07 training's log stopped at 4 KiB)
  log() {
    python3 -c '
import os, re, sys
n, rest = 0, b""
with open(sys.argv[1], "ab") as out:
    while True:
        chunk = os.read(0, 65536)
        parts = re.split(rb"[\r\n]", rest + chunk)
        rest = parts.pop() if chunk else b""
        for part in parts if chunk else parts + [rest]:
            n += 1
            if part and (n % 50 == 1 or not re.search(rb"(step|batch|req)/s", part)):
                out.write(part + b"\n")
        out.flush()
        if not chunk:
            break
' "$1"
  }
fi

# data, one shard per GPU, skipped once every shard exists: GPU g generates SEQUENCES / ngpu continuations of windows
# drawn with seed 1000 g + SEED0, GEN_BATCH (default 512) at a time (Gemma: 256 a batch made 27 continuations/s on an
# H100 on 2026-12-06, 512 made 39/s on an H200 on 2026-12-01); sets the array shards and, when it generated
# anything, generated=1
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
      CUDA_VISIBLE_DEVICES=$g run_cmd python -m fold_hf.cli train-drafter --pair $pair --generate-only "$@" \
        --out "$data/gpu$g" --device ${DEVICE:-cuda} --sequences $per_gpu --gen-batch ${GEN_BATCH:-512} \
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
