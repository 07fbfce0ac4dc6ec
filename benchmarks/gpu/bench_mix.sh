#!/usr/bin/env bash
# The committed drafter (OLD) against the retrained one (NEW) on the mixed suite's longest tiers (issue #38), on
# one warm machine after train_mix.sh; resumable (run again: each bench goes on from its runs.jsonl).
# PAIR: gemma3-270m (default; Gemma Terms of Use, ai.google.dev/gemma/terms) or smollm2-135m (Apache-2.0).
#
#   [PAIR=...] [NEW=DIR] [OLD=DIR] [TIERS="A B"] [MINUTES=M] bash benchmarks/gpu/bench_mix.sh [OUT_DIR]
#
# Requests: REQUESTS (default the pair's mixed suite as env.sh keeps it: /root/cache/requests-mixed.jsonl.gz for
# Gemma, /root/cache/requests-mixed-smollm2.jsonl.gz for SmolLM2), cut once to TIERS (default: Gemma 4096 32704,
# the tiers of issue #38's keys; SmolLM2 2048 8192, the demo's length and the longest) and interleaved text by text
# (request k of every tier, then k + 1), so a run cut short holds every tier of the texts it reached;
# /root/<tag>mixcmp/requests.jsonl.
# NEW: default /root/<tag>mix/A/drafter (train_mix.sh's run A); OLD: default the committed fold_hf/assets/$PAIR-dflash
# (in the tree: benchmarks/gpu/slim.sh out $PAIR-dflash). Methods METHODS (below; + AR of each request), fast
# engine, bf16; with two GPUs OLD and NEW run at once (MINUTES each), with one one after the other (MINUTES / 2 each).
# Back in OUT: old/ and new/, each runs.jsonl + summary.json (python benchmarks/pick_drafter_shape.py
# new=OUT/new old=OUT/old --tiers A B compares them request by request).
# Dry run on a CPU (checks the commands, runs nothing): DRY=1 [PAIR=...] bash benchmarks/gpu/bench_mix.sh /tmp/x
source benchmarks/gpu/train_lib.sh
out=${1:-${OUT:-/tmp}}
dir=/root/${tag}mixcmp
new=${NEW:-/root/${tag}mix/A/drafter}
old=${OLD:-fold_hf/assets/$drafter}
case $pair in  # TIERS default: Gemma the tiers of issue #38's keys, SmolLM2 the demo's length and its longest
  gemma3-270m) requests=${REQUESTS:-/root/cache/requests-mixed.jsonl.gz}; tiers=${TIERS:-4096 32704} ;;
  smollm2-135m) requests=${REQUESTS:-/root/cache/requests-mixed-smollm2.jsonl.gz}; tiers=${TIERS:-2048 8192} ;;
esac
minutes=${MINUTES:-6}
mkdir -p $dir
# METHODS: the bench's methods (default dflash fold-a2 window; "all": every method of `fold-hf bench`);
# DRAFTERS: which of old / new run (default both; e.g. DRAFTERS=old with METHODS=all: every method on the committed
# drafter, the issue's full comparison on these tiers)
methods=${METHODS:-dflash fold-a2 window}
[ "$methods" = all ] && methodargs=() || methodargs=(--methods $methods)
# DRAFT_VOCAB=FILE (fold_hf.DraftVocab, e.g. fold_hf/assets/draft-vocab/gemma3-270m-32768.json): each drafter runs
# twice, NAME as it is and NAME-dv proposing from that draft vocabulary (`fold-hf bench --draft-vocab`), one after the
# other, each with its own AR per request
names=(${DRAFTERS:-old new})
for name in "${names[@]}"; do
  [ "$name" = old ] || [ "$name" = new ] || { echo "DRAFTERS: old and / or new, got $name" >&2; exit 2; }
done
if [ -n "${DRAFT_VOCAB:-}" ]; then
  [ -f "$DRAFT_VOCAB" ] || { echo "DRAFT_VOCAB: no file $DRAFT_VOCAB" >&2; exit 2; }
  names=($(for name in "${names[@]}"; do echo "$name $name-dv"; done))
fi
drafter_dir() { if [ "${1%-dv}" = new ]; then echo "$new"; else echo "$old"; fi; }  # the folder of old / new (-dv)
if [ "${DRY:-0}" != 1 ]; then
  for name in "${names[@]}"; do
    d=$(drafter_dir $name)
    [ -f "$d/model.safetensors" ] || { echo "no drafter weights in $d (NEW / OLD; slim.sh out $drafter)"; exit 1; }
  done
  [ -f $dir/requests.jsonl ] || python3 - "$requests" $dir/requests.jsonl $tiers <<'EOF' || exit 1
import gzip, json, sys
src, dst, *tiers = sys.argv[1:]
with (gzip.open(src, "rt") if src.endswith(".gz") else open(src)) as fh:
    rows = [json.loads(line) for line in fh if line.strip()]
keep = {int(t) for t in tiers}
missing = keep - {r["tier"] for r in rows}
if missing:
    sys.exit(f"{src} has no requests at tiers {sorted(missing)} (TIERS)")
rows = sorted((r for r in rows if r["tier"] in keep), key=lambda r: (int(r["id"].rsplit("-", 1)[1]), r["tier"]))
with open(dst, "w") as fh:
    fh.writelines(json.dumps(r) + "\n" for r in rows)
print(f"{len(rows)} requests of tiers {sorted(keep)} from {src}")
EOF
fi
[ "$ngpu" -ge 2 ] || [ ${#names[@]} = 1 ] && each=$minutes || each=$(python3 -c "print($minutes / ${#names[@]})")
bench() {  # bench NAME GPU
  local dv=(); [ "${1%-dv}" = "$1" ] || dv=(--draft-vocab "$DRAFT_VOCAB")
  CUDA_VISIBLE_DEVICES=$2 run_cmd python -m fold_hf.cli bench --pair $pair --out $dir/$1 --drafter "$(drafter_dir $1)" \
    --requests $dir/requests.jsonl --engine fast "${methodargs[@]}" "${dv[@]}" --max-minutes $each 2>&1 | log $dir/$1.log
}
if [ "$ngpu" -ge 2 ] && [ ${#names[@]} = 2 ]; then
  bench ${names[0]} 0 & bench ${names[1]} 1 & wait
else
  for name in "${names[@]}"; do bench $name 0; done
fi
[ "${DRY:-0}" = 1 ] && exit 0

for name in "${names[@]}"; do
  mkdir -p $out/$name
  cp $dir/$name/summary.json $dir/$name/run/runs.jsonl $out/$name/ 2>/dev/null
  echo "== $name ($(drafter_dir $name)): $(cat $dir/$name/run/runs.jsonl 2>/dev/null | wc -l) runs"
  grep -v "Converting\|Loading weights" $dir/$name.log | tail -n 12
done
