#!/usr/bin/env bash
# Issue 36, time to first token, in one device call on one H200, about 4-5 minutes (no GGUF: env.sh not needed):
#   1. benchmarks/last_mile_bench.py's prefill section alone at 8K / 32K / 128K on the Llama-3.1-8B shape: per length
#      and system (ours, transformers' generate) a timed first call and the median of 3 / 3 / 1 more calls, peak
#      memory at 128K (every call of ours frees the session first), the 32K prefill's kernel profile; ~1.5-2 minutes
#      (32K: ~1.3 s a call, 128K: ~11 s, 8 + 8 + 4 calls);
#   2. benchmarks/family_prefill_bench.py: the same protocol at 8K / 32K for the Qwen3.5-9B and Gemma-4-12B shapes
#      (3 / 2 calls after the first), ~2-2.5 minutes with the builds and the first calls' kernel compiles.
#
#   bash benchmarks/gpu/prefill_families.sh [OUT_DIR]   -> OUT_DIR/{perf,family}/{bench.log, *.json, *.csv}
#   SKIP_LLAMA=1, SKIP_FAMILIES=1; LLAMA_ARGS / FAMILY_ARGS are added to each command (e.g. FAMILY_ARGS="--families
#   gemma4_12b"); LLAMA_TIMEOUT (220 s) and FAMILY_TIMEOUT (300 s) bound each part
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
out=${1:-${OUT:-/tmp}}
mkdir -p "$out/perf" "$out/family"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
if [ -z "$SKIP_LLAMA" ]; then
  timeout ${LLAMA_TIMEOUT:-220} python benchmarks/last_mile_bench.py --out "$out/perf" --prefill-only --chunks '' \
    --prefill 8192,32768,131072 --prefill-repeats 3,3,1 $LLAMA_ARGS > "$out/perf/bench.log" 2>&1
  echo "last_mile_bench rc=$?"
  grep -E "^\[.*\] (prefill |profile |copy bandwidth)|Error" "$out/perf/bench.log" | cut -c10- | tail -20
  python - "$out/perf/last_mile.json" <<'PY'
import json, sys
head = json.load(open(sys.argv[1]))["headline"]
print(json.dumps({k: v for k, v in head.items() if "prefill" in k or "peak_gib" in k}, indent=1))
PY
fi
if [ -z "$SKIP_FAMILIES" ]; then
  timeout ${FAMILY_TIMEOUT:-300} python benchmarks/family_prefill_bench.py --out "$out/family" \
    --prompts 8192,32768 --repeats 3,2 $FAMILY_ARGS > "$out/family/bench.log" 2>&1
  echo "family_prefill_bench rc=$?"
  grep -E "^\[|Error" "$out/family/bench.log" | grep -v "headline" | cut -c10- | tail -24
  python - "$out/family/family_prefill.json" <<'PY'
import json, sys
print(json.dumps(json.load(open(sys.argv[1]))["headline"], indent=1))
PY
fi
