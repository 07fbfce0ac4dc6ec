#!/usr/bin/env bash
# Issue #16 speed work (fused Qwen3.5 / Gemma layers): GPU checks + a 32K re-measure of both targets on an H200,
# about 3 minutes (each part has its own timeout, 4m15s in all; every row and table is logged as it completes).
#   bash benchmarks/hybridperf_gpu.sh $OUT/hybridperf
# Writes under the folder: gpu_tests.log (the gpu-marked tests of the fused kernels and of both families' captured
# loops: fp32 greedy equality with the model's own generate), hybrid/ (Qwen3.5-9B at 32K: fused AR, module AR, SD
# rounds, profile/ top-kernel tables, kernel_sweep.json), gemma/ (Gemma-4-like at 32K: the same rows and tables),
# *.log, timing.log and SUMMARY.md (everything above in one page). Each part runs even if an earlier one failed.
set -u
OUT_DIR=${1:?usage: hybridperf_gpu.sh OUT_DIR}
mkdir -p "$OUT_DIR"
export PYTHONPATH=$PWD
start=$(date +%s)
stamp() { echo "$1: $(( $(date +%s) - start )) s" | tee -a "$OUT_DIR/timing.log"; }
timeout 75 python -m pytest -q -m gpu -n 6 -rf tests/kernels/test_hybrid_kernels.py \
    "tests/targets/test_qwen35.py::test_graph_engine_matches_the_foundation_loop_on_gpu[fold]" \
    "tests/targets/test_gemma_targets.py::test_graphs_engine_on_gpu[gemma4]" > "$OUT_DIR/gpu_tests.log" 2>&1
echo "pytest rc=$?" >> "$OUT_DIR/gpu_tests.log"; tail -4 "$OUT_DIR/gpu_tests.log"; stamp tests
timeout 80 python benchmarks/gemma_bench.py --contexts 32768 --rounds 16 --repeats 2 --modules-row --profile \
    --out "$OUT_DIR/gemma" > "$OUT_DIR/gemma.log" 2>&1
echo "rc=$?" >> "$OUT_DIR/gemma.log"; grep -E "our_|floor|launches|rc=|Error" "$OUT_DIR/gemma.log" | tail -12; stamp gemma
timeout 100 python benchmarks/hybrid_bench.py --pairs qwen35_9b --contexts 32768 --rounds 16 --repeats 2 \
    --modules-row --profile --kernel-sweep --out "$OUT_DIR/hybrid" > "$OUT_DIR/hybrid.log" 2>&1
echo "rc=$?" >> "$OUT_DIR/hybrid.log"; grep -E "our_|floor|launches|sweep|rc=|Error" "$OUT_DIR/hybrid.log" | tail -20
stamp hybrid
python benchmarks/hybridperf_summary.py "$OUT_DIR" > "$OUT_DIR/SUMMARY.md" 2>&1; cat "$OUT_DIR/SUMMARY.md"
