#!/usr/bin/env bash
# Issue #21's GPU check, one part per device call (each about 3 minutes on one H200):
#
#   bash benchmarks/gpu/front_door.sh 8b  $OUT/sampling    the Llama-3.1-8B-shape table (random bf16, block 16):
#        the sampling gpu tests, then greedy + sampled (T 0.6, top-p 0.9, top-k 50) per call path, the round
#        ratios (sampled / greedy at 8K, default generate / fast_generate) and the token-choice ops breakdown
#   bash benchmarks/gpu/front_door.sh smollm2 $OUT/sampling   the real pair's "what users get" table (held-out
#        code requests of 1K and 4K tokens): plain generate, generate + drafter, fold_hf.generate, fast_generate
#
# Each writes front_door.json / front_door.csv and a log under OUT/<part>; the lines to read start with RATIO
# and the markdown tables at the end of the log.
set -u
part=${1:?8b or smollm2}
out=${2:-${OUT:-/tmp}}
source benchmarks/gpu/env.sh > /dev/null
mkdir -p "$out/$part"
if [ "$part" = 8b ]; then
  timeout -s INT 150 python -m pytest -q -m gpu -p no:cacheprovider -rA tests/generation/test_sampling.py \
    tests/integrations/test_front_door.py > "$out/$part/gpu_tests.log" 2>&1
  tail -3 "$out/$part/gpu_tests.log"
  python benchmarks/front_door_bench.py --pair random8b --out "$out/$part" --max-minutes 2.5 2>&1 \
    | tee "$out/$part/front_door.log" | tail -45
else
  python benchmarks/front_door_bench.py --pair smollm2 --out "$out/$part" --max-minutes 2.4 2>&1 \
    | tee "$out/$part/front_door.log" | tail -45
fi
