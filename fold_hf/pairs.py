"""The real target–drafter pairs ``fold-hf`` runs, one description each (``--pair``; default ``smollm2-135m``).

A :class:`Pair` names its target (a :class:`~fold_hf.modeling.gguf_target.GGUFTarget`: where the GGUF comes from,
its sha256 and licence), where its drafter lives, and the settings the CLI commands default to for it
(``train-drafter``: drafter shape and recipe; ``bench``: window, training length, budget, tiers). Everything
else (training and evaluation sources, the DFlash recipe, the reading modes) is shared.

* ``smollm2-135m`` (default, embedded): SmolLM2-135M-Instruct (8K context) + the committed 6-layer drafter.
* ``gemma3-270m`` (opt-in): Gemma-3-270M (32K context, 5 sliding-window layers of 512 per full layer, 262K
  vocabulary) + a drafter trained by ``fold-hf train-drafter --pair gemma3-270m`` on sequences of 1,024 tokens
  (``docs/gemma3-pair.md``). Gemma is provided under and subject to the Gemma Terms of Use
  (ai.google.dev/gemma/terms); a drafter trained on its outputs is a Model Derivative under those terms.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

# nothing heavy is imported here: the CLI reads the pairs' names and defaults while building its parser
ASSETS = Path(__file__).parent / "assets"


@dataclass(frozen=True)
class Pair:
    """A real target and its drafter, with the CLI defaults that fit them.

    Attributes:
        key: the ``--pair`` name.
        target_key: the key of its :class:`~fold_hf.modeling.gguf_target.GGUFTarget` in ``GGUF_TARGETS``.
        drafter_dir: the drafter ``fold-hf`` uses when ``--drafter`` is not given (may not exist yet).
        bos: prompts and training windows start with the tokenizer's BOS token (Gemma is trained with one at
            the start of every sequence; SmolLM2 has none), which counts towards their length.
        cli_defaults: per sub-command, argparse destinations and their values for this pair.
    """

    key: str
    target_key: str
    drafter_dir: Path
    bos: bool
    cli_defaults: dict[str, dict] = field(default_factory=dict)

    @property
    def target(self):
        """The :class:`~fold_hf.modeling.gguf_target.GGUFTarget` (imported on first use)."""
        from .modeling.gguf_target import GGUF_TARGETS

        return GGUF_TARGETS[self.target_key]

    @property
    def title(self) -> str:
        return self.target.title

    def tokenizer(self):
        from .modeling.gguf_target import load_gguf_tokenizer

        return load_gguf_tokenizer(self.target)

    def load_target(self, device="cpu", dtype=None):
        """(model, tokenizer); fp32 on CPU, bf16 on GPU unless ``dtype`` (a ``torch.dtype``) is given."""
        from .modeling.gguf_target import load_gguf_target

        return load_gguf_target(self.target, device, dtype)

    def load(self, device="cpu", dtype=None, drafter_dir: str | Path | None = None):
        """``(target, tokenizer, drafter)`` with the drafter bound to the target, like
        :func:`fold_hf.load_embedded_pair` (``dtype``: None / ``"auto"``, a name or a ``torch.dtype``)."""
        import torch

        from .embedded import _resolve_dtype, require_demo_extra
        from .modeling import FoldDrafter

        device = torch.device(device)
        path = Path(drafter_dir) if drafter_dir else self.drafter_dir
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"no drafter at {path} (no config.json): pass a drafter directory or train one "
                                    f"with `fold-hf train-drafter --pair {self.key} --out DIR`")
        require_demo_extra()
        target, tokenizer = self.load_target(device, _resolve_dtype(dtype, device))
        drafter = FoldDrafter.from_pretrained(path, dtype=target.dtype, device=device)
        drafter.bind_target(target)
        return target, tokenizer, drafter

    def bos_token_id(self, tokenizer) -> int | None:
        if not self.bos:
            return None
        if tokenizer.bos_token_id is None:
            raise ValueError(f"pair {self.key}: prompts start with BOS but the tokenizer has no bos_token_id")
        return int(tokenizer.bos_token_id)


PAIRS: dict[str, Pair] = {
    "smollm2-135m": Pair(
        key="smollm2-135m", target_key="smollm2-135m", drafter_dir=ASSETS / "smollm2-135m-dflash", bos=False,
        # the parser's own defaults are this pair's: nothing to replace
        cli_defaults={},
    ),
    "gemma3-270m": Pair(
        key="gemma3-270m", target_key="gemma3-270m", drafter_dir=ASSETS / "gemma3-270m-dflash", bos=True,
        cli_defaults={
            # 4 layers x MLP 512 over hidden 640 (4 heads of 256, 1 KV head): 12.1 M parameters, 24.3 MB in bf16;
            # sequences of 768 real tokens (BOS first) + 256 the target generates = 1,024 tokens (the first rounds;
            # the committed drafter's last rounds took 960 + 64 at positions spread over 5,120: its training.json,
            # docs/training.md's commands)
            "train-drafter": dict(layers=4, intermediate=512, block_size=8, mask_token_id=4, prompt_tokens=768,
                                  new_tokens=256, batch=16, anchors=32),
            # 32K tier = 32,704 prompt tokens so prompt + 64 new tokens stay inside the 32,768-token context;
            # train_length R: the distances the committed drafter saw (its position span), YaRN's reference
            "bench": dict(window=512, train_length=5120, budget=512, tiers=[1024, 4096, 8192, 16384, 32704],
                          nested=True, suites=["code", "books", "retrieval"]),
        },
    ),
}
DEFAULT_PAIR = "smollm2-135m"


def get_pair(key: str) -> Pair:
    try:
        return PAIRS[key]
    except KeyError:
        raise ValueError(f"unknown pair {key!r}; known: {sorted(PAIRS)}") from None


def load_pair(key: str | None = None, device="cpu", dtype=None, drafter_dir: str | Path | None = None):
    """``(target, tokenizer, drafter)`` of the pair named ``key``: the embedded one
    (:func:`fold_hf.load_embedded_pair`) when ``key`` is None or ``DEFAULT_PAIR``, else :meth:`Pair.load`."""
    if key is None or key == DEFAULT_PAIR:
        from .embedded import load_embedded_pair

        return load_embedded_pair(device=device, dtype=dtype, drafter_dir=drafter_dir)
    return get_pair(key).load(device=device, dtype=dtype, drafter_dir=drafter_dir)
