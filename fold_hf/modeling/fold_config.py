"""`FoldConfig`: how a block-parallel drafter reads its context.

Every reading mode is a setting of the same attention code path, so baselines and FOLD are compared
on equal footing (docs/design.md §3):

==========  ===========================================================================================
mode        what the drafter reads
==========  ===========================================================================================
fold        exact positions inside the window, every older entry as a position-free far memory read at
            distance D + r (D = window + block), with its own softmax sharpened by ``alpha`` and an
            l_alpha mass; the two branches merged by mass
dflash      the drafter as released: every context entry at its true distance
window      FOLD's window only, older entries dropped
streaming   ``sinks`` first entries + the most recent ``budget - sinks`` (2,048 in all by default); kept
            entries renumbered
rerope      FOLD's window at true distances, every older entry at distance D from every block row, queries
            scaled by max(1, log(p + 1) / log 4096); one softmax over both
yarn        every entry at its true distance, rope scaled by
            max(1, ceil((P + G + Q) / 256) * 256 / train_length)
infllm      FOLD's window at true distances plus 128 initial entries, the 16 blocks of 128 (out of the older
            entries) whose representative keys best match the block queries, and the not yet grouped entries,
            all at distance D - 1; one softmax (full-attention layers only)
cmr         SpecExtend's cross-model retrieval: ``budget`` / 32 chunks of 32 entries chosen from the target's
            attention every 8 rounds (first round: the most recent ones), renumbered; every layer
==========  ===========================================================================================

Budgets as the paper's Appendix B.3: ``streaming`` and ``cmr`` read ``budget`` entries (2,048 when not set);
``fold``, ``rerope`` and ``infllm`` read the window W. Details of the baselines: ``docs/baselines.md``.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MODES = ("fold", "dflash", "window", "streaming", "rerope", "yarn", "infllm", "cmr")
DEFAULT_BUDGET = 2048  # StreamingLLM's and CMR's budget for every model in the paper (B.3)
LAYER_SCOPES = ("all", "full")
FOLD_CONFIG_NAME = "fold_config.json"


@dataclass
class FoldConfig:
    """Reading mode of a FOLD drafter.

    Args:
        mode: one of ``fold``, ``dflash``, ``window``, ``streaming``, ``rerope``, ``yarn``, ``infllm``, ``cmr``.
        window: W, the number of most recent context entries every block row reads at exact positions.
        alpha: concentration factor of the far memory (``fold`` only), ``alpha >= 1``; ``math.inf``
            gives a hard top-1 read.
        sinks: attention-sink entries kept by ``streaming``.
        budget: total entries kept by ``streaming`` (sinks included) and ``cmr`` (a multiple of its 32-entry
            chunk); ``None`` means 2,048, the paper's budget for both.
        train_length: the drafter's training length R (``yarn``'s reference length; ReRoPE's log base is 4096
            for every model, as in the paper).
        layers: ``all`` applies ``fold``/``rerope`` to every layer, a sliding-window layer keeping its native
            window as the local branch and also reading the older entries at the shared distant position;
            ``full`` leaves sliding-window layers exactly as released (no far memory, no query scaling).
            ``dflash``, ``window``, ``streaming``, ``yarn`` and ``infllm`` never change a sliding layer; ``cmr``
            changes every layer (all read the selection).
        extra: free-form settings; ``infllm_block``, ``infllm_init``, ``infllm_topk``, ``infllm_repr``, ``cmr_chunk``,
            ``cmr_refresh`` override the paper's InfLLM (128, 128, 16, 4) and CMR (32, 8) settings.
        target_model: optional id of the target this setting was tuned for (informational).
        drafter_model: optional id of the drafter this setting was tuned for (informational).
    """

    mode: str = "fold"
    window: int = 2048
    alpha: float = 2.0
    sinks: int = 4
    budget: int | None = None
    train_length: int = 4096
    layers: str = "all"
    target_model: str | None = None
    drafter_model: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"FoldConfig.mode must be one of {MODES}, got {self.mode!r}")
        if not isinstance(self.window, int) or isinstance(self.window, bool) or self.window < 1:
            raise ValueError(f"FoldConfig.window must be an integer >= 1, got {self.window!r}")
        try:
            alpha = float(self.alpha)
        except (TypeError, ValueError):
            raise ValueError(f"FoldConfig.alpha must be a number >= 1, got {self.alpha!r}") from None
        if math.isnan(alpha) or alpha < 1.0:
            raise ValueError(f"FoldConfig.alpha must be >= 1 (got {self.alpha!r}); alpha < 1 flattens the far memory")
        self.alpha = alpha
        if not isinstance(self.sinks, int) or self.sinks < 0:
            raise ValueError(f"FoldConfig.sinks must be an integer >= 0, got {self.sinks!r}")
        if self.budget is not None and (not isinstance(self.budget, int) or self.budget <= self.sinks):
            raise ValueError(f"FoldConfig.budget must be an integer > sinks ({self.sinks}), got {self.budget!r}")
        for key in ("infllm_block", "infllm_init", "infllm_topk", "infllm_repr", "cmr_chunk", "cmr_refresh"):
            value = (self.extra or {}).get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"FoldConfig.extra[{key!r}] must be an integer >= 1, got {value!r}")
        if self.mode == "cmr":
            chunk = int((self.extra or {}).get("cmr_chunk", 32))
            if self.retrieval_budget % chunk:
                raise ValueError(f"FoldConfig.budget for cmr must be a multiple of its {chunk}-entry chunk, "
                                 f"got {self.retrieval_budget}")
        if not isinstance(self.train_length, int) or self.train_length < 2:
            raise ValueError(f"FoldConfig.train_length must be an integer >= 2, got {self.train_length!r}")
        if self.layers not in LAYER_SCOPES:
            raise ValueError(f"FoldConfig.layers must be one of {LAYER_SCOPES}, got {self.layers!r}")

    @property
    def streaming_budget(self) -> int:
        return self.budget if self.budget is not None else DEFAULT_BUDGET

    @property
    def retrieval_budget(self) -> int:
        """Entries CMR selects (``budget``, 2,048 by default)."""
        return self.budget if self.budget is not None else DEFAULT_BUDGET

    def replace(self, **changes: Any) -> "FoldConfig":
        """A copy with some fields changed (validated)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if math.isinf(out["alpha"]):
            out["alpha"] = "inf"
        if not out["extra"]:
            out.pop("extra")
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "FoldConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown FoldConfig field(s) {unknown}; known fields: {sorted(known)}")
        data = dict(data)
        if isinstance(data.get("alpha"), str):
            data["alpha"] = float(data["alpha"])
        return cls(**data)

    def save_pretrained(self, save_directory: str | os.PathLike) -> Path:
        """Write ``fold_config.json`` into ``save_directory`` (created if needed); returns the file path."""
        directory = Path(save_directory)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / FOLD_CONFIG_NAME
        path.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")
        return path

    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike, **overrides: Any) -> "FoldConfig":
        """Read ``fold_config.json`` from a directory, a file path, a hub repo id, or a preset short name
        (``llama3.1-8b-dflash``, ``qwen3.5-9b-dflash``, ``gemma4-12b-dflash``, ``qwen3-8b-dflash``, their
        ``-dspark`` variants, ``smollm2-135m-dflash``; see :mod:`fold_hf.modeling.presets`).

        Keyword overrides replace fields after loading.
        """
        from .presets import PRESETS

        path = Path(name_or_path)
        if str(name_or_path) in PRESETS and not path.exists():
            return cls(**{"mode": "fold", **PRESETS[str(name_or_path)], **overrides})
        if path.is_file():
            file = path
        elif path.is_dir():
            file = path / FOLD_CONFIG_NAME
            if not file.is_file():
                raise FileNotFoundError(f"no {FOLD_CONFIG_NAME} in directory {path}")
        elif _looks_like_repo_id(str(name_or_path)):
            file = Path(_download_from_hub(str(name_or_path), FOLD_CONFIG_NAME))
        else:
            raise FileNotFoundError(_unknown_name_message(str(name_or_path), sorted(PRESETS)))
        data = read_json_object(file)
        data.update(overrides)
        return cls.from_dict(data)


def read_json_object(file: Path) -> dict[str, Any]:
    """A JSON object from ``file``; ValueError naming the file when it is not valid JSON or not an object."""
    try:
        data = json.loads(Path(file).read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{file} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{file} must hold a JSON object, got {type(data).__name__}")
    return data


def _looks_like_repo_id(name: str) -> bool:
    """``owner/name`` with the Hub's characters: the only strings worth a Hub request (a bare word is a preset name
    or a typo of one, a path with more parts is a missing local file)."""
    return re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*", name) is not None and \
        not name.startswith((".", "/")) and ".." not in name


def _unknown_name_message(name: str, presets: list[str]) -> str:
    close = difflib.get_close_matches(name, presets, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return (f"{name!r} is not a preset, a local directory or file, or a Hub repo id (owner/name){hint}; "
            f"presets: {', '.join(presets)}")


def _download_from_hub(repo_id: str, filename: str) -> str:
    """Fetch one file of a hub repo, with an error that says what was looked for when offline."""
    try:
        from huggingface_hub import hf_hub_download
    except ImportError as err:  # pragma: no cover - huggingface_hub ships with transformers
        raise FileNotFoundError(f"{repo_id!r} is not a local path and huggingface_hub is unavailable") from err
    try:
        return hf_hub_download(repo_id, filename)
    except Exception as err:  # the hub raises many types: offline, missing repo, missing file
        raise FileNotFoundError(
            f"{repo_id!r} is not a local path and {filename} could not be fetched from the Hub "
            f"({type(err).__name__}: {err}). Pass a local directory when offline."
        ) from err
