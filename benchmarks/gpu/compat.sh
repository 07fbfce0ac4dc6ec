#!/usr/bin/env bash
# Issue 33 in one device call on one H200 (~6 minutes):
#   1. the GPU tests of the code this issue touched (the norm epsilons of the fused Gemma / Qwen3.5 layers, the
#      Triton modules now imported through fold_hf.kernels.import_triton_module, PDL's capability check), ~4 min;
#   2. benchmarks/front_door_overhead.py: a whole target.generate(assistant_model=drafter) call against
#      fast_generate on the Gemma-3-270M shape, with host profiles of both.
#
#   bash benchmarks/gpu/compat.sh [OUT_DIR]    -> OUT_DIR/compat/{tests.log, overhead.log, front_door_overhead.json, profile_*.txt}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
out=${1:-${OUT:-/tmp}}/compat
mkdir -p "$out"
timeout 260 python -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/kernels/test_fused_layers.py tests/targets/test_gemma_targets.py \
  tests/targets/test_qwen35.py tests/kernels/test_pdl.py tests/kernels/test_prefill_attention.py tests/integrations/test_upstream_compat.py > "$out/tests.log" 2>&1
echo "gpu tests rc=$?"; tail -4 "$out/tests.log"
timeout 240 python benchmarks/front_door_overhead.py --out "$out" > "$out/overhead.log" 2>&1
echo "front_door_overhead rc=$?"; grep -v Warning "$out/overhead.log" | tail -8
