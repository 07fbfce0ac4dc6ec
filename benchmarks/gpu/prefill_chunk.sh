#!/usr/bin/env bash
# Issue 35: the fused prefill's default chunk (StaticTarget.prefill_chunk, bbfd31d) timed on the GPU at the
# Gemma-3-270M shape against the old 8,192-token chunks, in one session, plus the GPU tests of the rule.
#   bash benchmarks/gpu/prefill_chunk.sh OUT_DIR   -> OUT_DIR/{default,c8192,hf}/family_prefill.{csv,json}, tests.log
set -uo pipefail
out=${1:?OUT_DIR}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/gpu.txt"
python -c "import torch, transformers, triton; print(torch.__version__, transformers.__version__, triton.__version__)" >> "$out/gpu.txt"
# the longer default chunk first (warm-up inside), then 8,192 (the old rule), then the default again (order check)
python benchmarks/family_prefill_bench.py --out "$out/default" --families gemma3_270m --skip-hf --profile --repeats 3 2>&1 | tail -n 15
python benchmarks/family_prefill_bench.py --out "$out/c8192" --families gemma3_270m --skip-hf --repeats 3 --chunk 8192 2>&1 | tail -n 8
python benchmarks/family_prefill_bench.py --out "$out/default2" --families gemma3_270m --repeats 3 2>&1 | tail -n 8
python -m pytest -q -m gpu -p no:cacheprovider tests/targets/test_gemma_targets.py tests/kernels/test_prefill_attention.py \
  tests/targets/test_prefill_chunk.py 2>&1 | tail -n 15 | tee "$out/tests.log"
