#!/usr/bin/env bash
# Issue 37 on the real pairs: `fold-hf bench --exact` (AR and FOLD in exact mode, fast engine, bf16) over a pair's
# full suite, resumable over calls; the summary's differ_from_ar counts FOLD outputs that differ from exact AR
# (exact mode's guarantee: none). One device call per MINUTES; run again until every request is done.
#
#   PAIR=smollm2-135m REQUESTS=.stage/... MINUTES=8 bash benchmarks/gpu/exact_suites.sh [OUT_DIR]   (96 requests)
#   PAIR=gemma3-270m DRAFTER=fold_hf/assets/gemma3-270m-dflash REQUESTS=... bash benchmarks/gpu/exact_suites.sh
#
# Needs the pair's staged GGUF (env.sh joins the parts; the Gemma-3 pair also its tokenizer) and the suite's
# requests built on the CPU machine (`fold-hf bench --pair PAIR --build-only --requests FILE`, gzipped, carried).
# -> OUT_DIR/exact-suite/{bench.log, summary.json, summary.csv, runs.jsonl}
set -uo pipefail
source benchmarks/gpu/env.sh > /dev/null
pair=${PAIR:-smollm2-135m}
if [ "$pair" = gemma3-270m ]; then stop_until_gemma3_whole; else stop_until_gguf_whole; fi
out=${1:-${OUT:-/tmp}}/exact-suite
R=${EXACT_DIR:-/root/exact-$pair}
mkdir -p "$out" "$R"
if [ ! -f "$R/requests.jsonl" ]; then
  case "${REQUESTS:?set REQUESTS to the suite requests (.jsonl or .jsonl.gz)}" in
    *.gz) gunzip -c "$REQUESTS" > "$R/requests.jsonl" ;; *) cp "$REQUESTS" "$R/requests.jsonl" ;; esac
fi
python -m fold_hf.cli bench --pair "$pair" --exact --engine fast --device cuda --out "$R" \
  --requests "$R/requests.jsonl" --methods ${METHODS:-fold} --max-minutes ${MINUTES:-8} \
  ${DRAFTER:+--drafter "$DRAFTER"} 2>&1 | tr '\r' '\n' | grep -v "req/s" > "$out/bench.log"
echo "bench --exact rc=${PIPESTATUS[0]}"
cp "$R"/summary.json "$R"/summary.csv "$out"/ 2>/dev/null
cat "$R"/*/runs.jsonl > "$out/runs.jsonl" 2>/dev/null
echo "requests done: $(cut -d'"' -f4 "$out/runs.jsonl" | sort -u | wc -l) of $(wc -l < "$R/requests.jsonl")"
python - "$out/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print("exact:", s.get("exact"), "dtype:", s.get("dtype"))
for r in s["rows"]:
    print(f"{r['suite']:10s} {r['tier']:6d} {r['method']:8s} requests {r['requests']:3d}  differ_from_ar {r['differ_from_ar']}")
PY
