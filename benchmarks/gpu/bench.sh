#!/usr/bin/env bash
# The #4 benchmarks in one call (~4 minutes on two H200s, ~7 on one), results tarred into $OUT/bench.tgz.
#
#   bash benchmarks/gpu/bench.sh [OUT_DIR]
#
# With two or more GPUs: the 2-GPU device_map check first (alone), then kernel + end-to-end benchmarks on GPU 0
# and the verify-attention sweep + profile on GPU 1, each pinned to its own cores. With one GPU, in sequence.
source benchmarks/gpu/env.sh > /dev/null
out=${1:-${OUT:-/tmp}}
R=/root/bench; rm -rf $R; mkdir -p $R
gpus=$(nvidia-smi -L | wc -l)
if [ "$gpus" -gt 1 ]; then
  timeout 200 python benchmarks/multi_gpu_check.py --out $R/multi_gpu > $R/multi_gpu_stdout.log 2>&1
  echo "multi_gpu_check rc=$?"
fi
first() {
  taskset -c 0-7 python benchmarks/kernel_bench.py --out $R/kernel --reps 20 > $R/kernel.log 2>&1; echo "kernel_bench rc=$?"
  taskset -c 0-7 timeout 280 python benchmarks/e2e_bench.py --out $R/e2e --target-paths ${E2E_PATHS:-bucket,fused} \
    --hf-assisted-contexts '' > $R/e2e.log 2>&1; echo "e2e_bench rc=$?"
}
second() {
  taskset -c 8-15 timeout 100 python benchmarks/gemm_bench.py --out $R/gemm > $R/gemm.log 2>&1; echo "gemm_bench rc=$?"
  taskset -c 8-15 timeout 200 python benchmarks/decode_attention_bench.py --out $R/decode > $R/decode.log 2>&1
  echo "decode_attention_bench rc=$?"
  taskset -c 8-15 timeout 150 python benchmarks/profile_step.py --out $R/profile --paths ${PROFILE_PATHS:-default,fused} \
    > $R/profile.log 2>&1; echo "profile_step rc=$?"
}
if [ "$gpus" -gt 1 ]; then
  (CUDA_VISIBLE_DEVICES=0 first) & (CUDA_VISIBLE_DEVICES=1 second) & wait
else
  first; second
fi
tar czf $out/bench.tgz -C $R .
grep -h "fraction_of_floor\|rel_err" $R/kernel.log | tail -n 8
grep -h "headline" -A 12 $R/e2e.log | head -n 14
grep -h "best triton" -A 3 $R/decode.log | head -n 4
tail -n 4 $R/profile.log
grep -h "layer_gemm_us" -A 8 $R/gemm.log
