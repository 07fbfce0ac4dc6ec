"""Build a draft vocabulary (``fold_hf.DraftVocab``, FR-Spec's frequency-ranked subset) from the data mix's training
side, and say how much of other text it covers.

Counts every token the pair's tokenizer gives the mix's training documents (``python -m fold_hf.data.mix export``;
documents whose name or source mentions ``--exclude`` are left out, by default ``transformers``: the demo's input is
transformers' source), keeps the ``--sizes`` most frequent ids (plus the tokenizer's end-of-sequence ids) and writes
``OUT/draft_vocab-<size>.json`` for each size, with ``coverage.csv``: for each size the share of the tokens of the mix's
evaluation side (per kind) and of the demo's pinned input that lie in the subset. A drafter proposes only from the
subset (``drafter.use_draft_vocab(path)``), so coverage bounds how often the drafter *could* propose the right token.

    python benchmarks/build_draft_vocab.py --mix .stage/s2mix/mix.jsonl.gz --sizes 4096 8192 16384 --out /tmp/dv
          (the embedded SmolLM2 tokenizer; a few minutes on 2 cores)
    python benchmarks/build_draft_vocab.py --mix MIX --tokenizer DIR ...   (another pair's saved tokenizer)
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fold_hf.modeling.draft_vocab import DraftVocab, eos_ids, token_counts  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mix", required=True, help="the data mix (python -m fold_hf.data.mix export)")
    parser.add_argument("--tokenizer", help="a saved tokenizer folder (default: the embedded SmolLM2 pair's)")
    parser.add_argument("--vocab-size", type=int, help="the target's lm_head rows (default: len(tokenizer))")
    parser.add_argument("--sizes", type=int, nargs="+", default=[8192])
    parser.add_argument("--exclude", default="transformers", help="leave out documents naming this ('' for none)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    from tqdm.auto import tqdm
    from transformers import AutoTokenizer

    from fold_hf.data.mix import load_mix
    from fold_hf.demo import demo_text

    if args.tokenizer:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    else:
        from fold_hf.embedded import load_embedded_pair

        _, tokenizer, _ = load_embedded_pair()
    V = args.vocab_size or len(tokenizer)
    mix = load_mix(args.mix)

    def kept(d) -> bool:
        return not args.exclude or args.exclude not in f"{d.name} {d.source} {d.group}"

    train = [d for d in mix.side("train") if kept(d)]
    left_out = len(mix.side("train")) - len(train)
    with tqdm(total=len(train), desc="counting the training side", unit="doc") as bar:
        counts = token_counts(tokenizer, (d.text for d in train), V, bar)
    evaluation = {}
    for d in mix.side("eval"):
        evaluation.setdefault(d.kind, []).append(d.text)
    eval_counts = {kind: token_counts(tokenizer, texts, V) for kind, texts in sorted(evaluation.items())}
    demo_counts = token_counts(tokenizer, [demo_text()], V)
    always = eos_ids(tokenizer)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for size in args.sizes:
        vocab = DraftVocab.from_counts(counts, size, always=always,
                                       source=f"top {size} of {int(counts.sum()):,} tokens of the mix's training side "
                                              f"({len(train)} documents" + (f", {left_out} naming {args.exclude!r} left "
                                                                            "out)" if args.exclude else ")"))
        path = vocab.save(out)
        path.rename(out / f"draft_vocab-{size}.json")
        row = {"size": len(vocab), "of": V, "train": vocab.coverage(counts), "demo_input": vocab.coverage(demo_counts)}
        row.update({f"eval_{kind}": vocab.coverage(c) for kind, c in eval_counts.items()})
        rows.append(row)
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}))
    with (out / "coverage.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {', '.join(f'draft_vocab-{s}.json' for s in args.sizes)} and coverage.csv under {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
