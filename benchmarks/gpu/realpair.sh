#!/usr/bin/env bash
# `fold-hf bench` on the real pair (SmolLM2-135M + the committed drafter) on every GPU, fast engine, resumable.
#
#   MINUTES=8 bash benchmarks/gpu/realpair.sh [OUT_DIR]      (repo root, GPU machine; needs the staged GGUF)
#
# Staging as in train.sh (calls 1-3 carry .stage/p0 with .gpu/cache/shakespeare, .stage/p1, .stage/p2; the
# script only stages until the GGUF is whole; the next call carries .stage/p3 and .whl and starts the bench).
# One bench process per GPU (shard g of n): timings are taken alone on their GPU, unlike the 2026-11-30 run
# of the earlier drafter, whose 8 processes shared one GPU. Every shard appends whole requests to its
# runs.jsonl under /root/realpair, so a later call on the same warm machine resumes where the last stopped;
# each call stops starting requests after MINUTES and then summarizes everything so far into $OUT (summary
# json/csv, the two plots, machine.json and the merged runs: 6 files, under the 8 a call returns).
# Environment: MINUTES, REQUESTS (a requests file built on the CPU machine, so both machines time the same
# requests), REALPAIR_DIR, BENCH_ARGS (e.g. "--dtype float32"), DEVICE, ENGINE.
source benchmarks/gpu/env.sh > /dev/null
out=${1:-${OUT:-/tmp}}
stop_until_gguf_whole
R=${REALPAIR_DIR:-/root/realpair}  # one folder per dtype: shards of one folder must share engine and dtype
mkdir -p $R
# REQUESTS: a requests file built elsewhere (`fold-hf bench --build-only`), carried in; else built here
if [ ! -f $R/requests.jsonl ] && [ -n "${REQUESTS:-}" ]; then cp "$REQUESTS" $R/requests.jsonl; fi
[ -f $R/requests.jsonl ] || python -m fold_hf.cli bench --out $R --build-only ${BENCH_ARGS:-} > $R/build.log 2>&1
gpus=$(nvidia-smi -L | wc -l)
for g in $(seq 0 $((gpus - 1))); do
  CUDA_VISIBLE_DEVICES=$g python -m fold_hf.cli bench --out $R --device ${DEVICE:-cuda} --engine ${ENGINE:-fast} --shard $g/$gpus \
    --max-minutes ${MINUTES:-8} ${BENCH_ARGS:-} 2>&1 | tr '\r' '\n' | grep -v "req/s" >> $R/bench-gpu$g.log &
done
wait
python -m fold_hf.cli summarize $R > $R/summary.txt 2>&1
cat $R/shard*/runs.jsonl > $out/runs.jsonl
cp $R/summary.json $R/summary.csv $R/tau_by_length.png $R/speedup_by_length.png $out/ 2>/dev/null
cp $(ls $R/shard*/machine.json | head -n 1) $out/machine.json
echo "requests done: $(cut -d'"' -f4 $out/runs.jsonl | sort -u | wc -l) of $(wc -l < $R/requests.jsonl)"
tail -n 30 $R/summary.txt
