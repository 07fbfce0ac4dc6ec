#!/usr/bin/env bash
# `fold-hf bench --pair gemma3-270m` (issue #18) on every GPU, fast engine, resumable over calls; then the window
# sweep at 32K. Gemma Terms of Use (ai.google.dev/gemma/terms).
#
#   MINUTES=8 DRAFTER=DIR bash benchmarks/gpu/bench_gemma3.sh [OUT_DIR]      (repo root, GPU machine)
#
# Needs the staged GGUF and tokenizer (benchmarks/gpu/stage-gemma3.sh) and a trained drafter (DRAFTER, e.g.
# /root/g3train/A/drafter on the machine that trained it, or fold_hf/assets/gemma3-270m-dflash once committed).
# Requests: REQUESTS (a .jsonl or .jsonl.gz file built on the CPU machine with `fold-hf bench --pair gemma3-270m --build-only`,
# carried in), else built here (needs .gpu/cache/shakespeare): code + books, nested tiers 1K/4K/8K/16K/32K
# (32,704 prompt tokens + 64 new = the 32,768-token context), 8 texts per suite, BOS first.
# PHASE=main (default): every method on every request, one shard per GPU, until MINUTES; each call resumes.
# PHASE=sweep: FOLD α=2 and window-only at W ∈ {256, 512, 1024, 2048} on the 32K requests (the same texts).
# HEADLINE=gemma3 (optional): also the headline keys of issue #38 in summary.json (docs/training.md).
# Each call summarizes everything so far into $OUT (summary json/csv, paired.csv, plots, runs, machine.json).
# Dry run on a CPU (prints the commands): DRY=1 bash benchmarks/gpu/bench_gemma3.sh /tmp/x
if [ "${DRY:-0}" = 1 ]; then
  exec 3>&1
  run_cmd() { echo "+ CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-} $*" >&3; }
  gpus=${GPUS:-2}
  R=${G3BENCH_DIR:-/tmp/g3bench}
else
  source benchmarks/gpu/env.sh > /dev/null
  stop_until_gemma3_whole
  run_cmd() { "$@"; }
  gpus=$(nvidia-smi -L | wc -l)
  R=${G3BENCH_DIR:-/root/g3bench}
fi
out=${1:-${OUT:-/tmp}}
drafter=${DRAFTER:?set DRAFTER to the trained drafter directory}
phase=${PHASE:-main}
mkdir -p $R/main $R/sweep
if [ ! -f $R/requests.jsonl ] && [ -n "${REQUESTS:-}" ]; then
  case "$REQUESTS" in *.gz) gunzip -c "$REQUESTS" > $R/requests.jsonl ;; *) cp "$REQUESTS" $R/requests.jsonl ;; esac
fi
[ -f $R/requests.jsonl ] || run_cmd python -m fold_hf.cli bench --pair gemma3-270m --out $R/main \
  --requests $R/requests.jsonl --build-only
# the sweep reads the 32K tier of the same requests
[ -f $R/requests-32k.jsonl ] || [ "${DRY:-0}" = 1 ] || grep '"tier": 32704' $R/requests.jsonl > $R/requests-32k.jsonl
if [ "$phase" = sweep ]; then
  dir=$R/sweep; args=(--requests $R/requests-32k.jsonl --window-sweep 256 512 1024 2048)
else
  dir=$R/main; args=(--requests $R/requests.jsonl)
fi
for g in $(seq 0 $((gpus - 1))); do
  CUDA_VISIBLE_DEVICES=$g run_cmd python -m fold_hf.cli bench --pair gemma3-270m --out $dir --drafter $drafter \
    --device ${DEVICE:-cuda} --engine ${ENGINE:-fast} --shard $g/$gpus --max-minutes ${MINUTES:-8} "${args[@]}" \
    ${BENCH_ARGS:-} 2>&1 | tr '\r' '\n' | grep -v "req/s" >> $dir/bench-gpu$g.log &
done
wait
[ "${DRY:-0}" = 1 ] && exit 0
focus=$([ "$phase" = sweep ] && echo fold-a2-w512 || echo fold-a2)
python -m fold_hf.cli summarize $dir --focus $focus --title "Gemma-3-270M + DFlash drafter ($phase)" > $dir/summary.txt 2>&1
# HEADLINE=gemma3: the issue-#38 keys (fold_hf.bench.summary.headline_keys) added to summary.json once the 4K and 32K
# tiers have the methods they need (until then this second pass says why in summary.txt and the first pass stands)
if [ -n "${HEADLINE:-}" ] && [ "$phase" = main ]; then
  python -m fold_hf.cli summarize $dir --focus $focus --headline $HEADLINE \
    --title "Gemma-3-270M + DFlash drafter ($phase)" >> $dir/summary.txt 2>&1 || echo "headline keys not computed yet"
fi
cat $dir/shard*/runs.jsonl > $out/runs-$phase.jsonl
for f in summary.json summary.csv paired.csv tau_by_length.png speedup_by_length.png; do
  [ -f $dir/$f ] && cp $dir/$f $out/$phase-$f
done
cp $(ls $dir/shard*/machine.json | head -n 1) $out/machine.json
echo "requests done ($phase): $(cut -d'"' -f4 $out/runs-$phase.jsonl | sort -u | wc -l)"
tail -n 40 $dir/summary.txt
