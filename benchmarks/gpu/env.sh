# Source on the GPU machine (no registries there): joins the staged GGUF parts, installs the carried gguf wheel,
# points fold_hf at the GGUF and at a cache holding the carried Shakespeare texts.
# Parts arrive one per call (../shared/tools/stage-smollm2.sh makes them); each call copies its part first.
mkdir -p /root/stage /root/cache
for p in .stage/p*; do [ -d "$p" ] && cp "$p"/part-* /root/stage/; done
[ -d .gpu/cache/shakespeare ] && cp -r .gpu/cache/shakespeare /root/cache/
if [ -d .whl ] && [ ! -d /tmp/site/gguf ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
fi
if [ -f /root/stage/part-3 ] && [ ! -f /root/stage/SmolLM2-135M-Instruct.Q4_1.gguf ]; then
  cat /root/stage/part-* > /root/stage/SmolLM2-135M-Instruct.Q4_1.gguf
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export FOLD_HF_SMOLLM2_GGUF=/root/stage/SmolLM2-135M-Instruct.Q4_1.gguf FOLD_HF_CACHE=/root/cache
ls /root/stage
