# Source on the GPU machine (no registries there): joins the staged GGUF parts, installs the carried gguf wheel,
# points fold_hf at the GGUF and at a cache holding the carried Shakespeare texts. The scripts beside this file
# (tests.sh, bench.sh, soak.sh) source it and are what one device call runs.
# Parts arrive one per call (../shared/tools/stage-smollm2.sh N makes N of them; 4 parts of 24.6 MB fit beside
# the 28 MB tree and the 12.4 MB Shakespeare cache); each call copies its part first.
mkdir -p /root/stage /root/cache
for p in .stage/p*; do [ -d "$p" ] && cp "$p"/part-* /root/stage/; done
[ -d .gpu/cache/shakespeare ] && cp -r .gpu/cache/shakespeare /root/cache/
# the same texts packed (5.0 MB instead of 12.4: benchmarks/gpu/stage-gemma3.sh writes it)
[ -f .stage/gdata/shakespeare.tar.gz ] && tar -xzf .stage/gdata/shakespeare.tar.gz -C /root/cache
# the data mix of issue #38 and the mixed suite's requests (benchmarks/gpu/train_mix.sh's header): kept in /root/cache
for f in .stage/gmix/*.gz; do if [ -f "$f" ]; then cp "$f" /root/cache/; fi; done
# the SmolLM2 pair's (.stage/s2mix: the same mix.jsonl.gz, its own mixed requests): requests-mixed*.gz arrive as
# requests-mixed-smollm2*.gz, beside Gemma's
for f in .stage/s2mix/*.gz; do
  if [ -f "$f" ]; then n=$(basename "$f"); cp "$f" "/root/cache/${n/requests-mixed/requests-mixed-smollm2}"; fi
done
if [ -d .whl ] && [ ! -d /tmp/site/gguf ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
fi
# join once every part is there (any number of parts: ../shared/tools/stage-smollm2.sh N), checked by sha256
GGUF=/root/stage/SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [ ! -f $GGUF ] && ls /root/stage/part-* > /dev/null 2>&1; then
  if [ "$(cat /root/stage/part-* | sha256sum | cut -c1-64)" = "$GGUF_SHA" ]; then
    cat /root/stage/part-* > $GGUF
  fi
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export FOLD_HF_SMOLLM2_GGUF=/root/stage/SmolLM2-135M-Instruct.Q4_1.gguf FOLD_HF_CACHE=/root/cache
ls /root/stage
# Gemma-3-270M (opt-in pair, benchmarks/gpu/stage-gemma3.sh N; Gemma Terms of Use): parts gemma3-part-NN arrive
# one per call from .stage/gK, the saved tokenizer from .stage/gtok (transformers 5.17 builds a wrong one from the
# GGUF); joined once every part is there, checked by sha256
mkdir -p /root/stage-gemma3
for p in .stage/g[0-9]*; do [ -d "$p" ] && cp "$p"/gemma3-part-* /root/stage-gemma3/; done
if [ -f .stage/gtok/gemma3-tokenizer.tar.gz ] && [ ! -d /root/stage-gemma3/tokenizer ]; then
  tar -xzf .stage/gtok/gemma3-tokenizer.tar.gz -C /root/stage-gemma3
fi
GEMMA3_SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
if [ ! -f /root/stage-gemma3/gemma-3-270m-q4_k_m.gguf ] && ls /root/stage-gemma3/gemma3-part-* > /dev/null 2>&1; then
  if [ "$(cat /root/stage-gemma3/gemma3-part-* | sha256sum | cut -c1-64)" = "$GEMMA3_SHA" ]; then
    cat /root/stage-gemma3/gemma3-part-* > /root/stage-gemma3/gemma-3-270m-q4_k_m.gguf
  fi
fi
export FOLD_HF_GEMMA3_GGUF=/root/stage-gemma3/gemma-3-270m-q4_k_m.gguf
export FOLD_HF_GEMMA3_TOKENIZER=/root/stage-gemma3/tokenizer
# the Gemma-3 scripts call this instead of stop_until_gguf_whole
stop_until_gemma3_whole() {
  if [ ! -f "$FOLD_HF_GEMMA3_GGUF" ] || [ ! -d "$FOLD_HF_GEMMA3_TOKENIZER" ]; then
    echo "Gemma-3 GGUF or tokenizer not staged yet (have: $(ls /root/stage-gemma3 | tr '\n' ' ')); carry the next part"
    exit 0
  fi
}
# scripts that need the SmolLM2 GGUF call this (train_lib.sh for PAIR=smollm2-135m): it ends the calls that only
# stage a part (nothing else to do yet)
stop_until_gguf_whole() {
  if [ ! -f "$FOLD_HF_SMOLLM2_GGUF" ]; then
    echo "GGUF not whole yet (staged: $(ls /root/stage | tr '\n' ' ')); carry the next part"
    exit 0
  fi
}
