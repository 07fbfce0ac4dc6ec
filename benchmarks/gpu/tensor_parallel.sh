#!/usr/bin/env bash
# Issue 41 on a two-GPU machine (nvidia-h200-x2), one device call, about 7-9 minutes: a random Llama-3.1-8B-shape
# target and the DFlash-shape drafter saved once (~16 GB, bf16), then benchmarks/tensor_parallel_bench.py on one rank
# and on two (tp_plan="auto", NCCL): AR step and fold round at 8K and 32K on the graphs engine (a step it cannot
# capture is retried on the static engine, the reason kept), and the comparison keys (docs/tensor-parallel.md).
#
#   bash benchmarks/gpu/tensor_parallel.sh [OUT_DIR]   -> OUT_DIR/{tp1,tp2}/tensor_parallel.json, OUT_DIR/compare.json
#   SHAPE=llama70b-layers LAYERS=8 MODEL_DIR=/tmp/tp70b bash benchmarks/gpu/tensor_parallel.sh OUT_DIR/70b
#     (8 layers of the Llama-3.1-70B shape, ~18 GB bf16, and a two-layer drafter of its width)
# Each rank times the fused layers (column / row-parallel projections on the rank's weights) and the module path
# (BENCH_ARGS's --fused, default 1,0 on CUDA).
#   then: python -m pytest -q tests/targets/test_tensor_parallel.py (the CPU gloo checks, also valid there)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
out=${1:-${OUT:-/tmp}}
model=${MODEL_DIR:-/tmp/tp8b}
shape=${SHAPE:-llama31-8b}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
[ -d "$model/target" ] || python benchmarks/tensor_parallel_bench.py --make "$model" --shape "$shape" \
  --layers "${LAYERS:-8}" 2>&1 | tail -2
for n in 1 2; do
  timeout ${RANK_TIMEOUT:-240} torchrun --nproc_per_node $n benchmarks/tensor_parallel_bench.py --model "$model" \
    --out "$out/tp$n" ${BENCH_ARGS:---contexts 8192,32768 --rounds 16} > "$out/tp$n.log" 2>&1
  echo "tp$n rc=$?"; grep -E "N=|note|Error" "$out/tp$n.log" | tail -12
done
python benchmarks/tensor_parallel_bench.py --compare "$out/tp1" "$out/tp2" --out "$out"
