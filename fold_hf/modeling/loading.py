"""Read and write drafters in the z-lab DFlash and DeepSpec checkpoint layouts (no code from a checkpoint ever runs).

DeepSpec's layout and checks live in :mod:`fold_hf.modeling.families.deepspec`; the rest of this docstring is z-lab's.

Layout: ``config.json`` (see :mod:`fold_hf.modeling.drafter_config`), weights in ``model.safetensors``
or shards listed by ``model.safetensors.index.json``, optional ``fold_config.json``. Weight names:
``fc.weight``, ``hidden_norm.weight``, ``norm.weight`` and ``layers.{i}.self_attn.{q,k,v,o}_proj.weight``,
``layers.{i}.self_attn.{q,k}_norm.weight``, ``layers.{i}.mlp.{gate,up,down}_proj.weight``,
``layers.{i}.{input,post_attention}_layernorm.weight``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from .draft_vocab import FILE_NAME as DRAFT_VOCAB_NAME, DraftVocab
from .drafter_config import FoldDrafterConfig
from .families import deepspec
from .fold_config import FOLD_CONFIG_NAME, FoldConfig, read_json_object

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
_STRIPPED_PREFIXES = ("model.", "drafter.")


def resolve_checkpoint_dir(name_or_path: str | os.PathLike) -> Path:
    path = Path(name_or_path)
    if path.is_dir():
        return path
    if path.exists():
        raise ValueError(f"{path} is a file; pass the checkpoint directory")
    try:
        from huggingface_hub import snapshot_download
    except ImportError as err:  # pragma: no cover
        raise FileNotFoundError(f"{name_or_path!r} is not a local directory") from err
    try:
        return Path(snapshot_download(str(name_or_path),
                                      allow_patterns=["*.json", "*.safetensors"]))
    except Exception as err:
        raise FileNotFoundError(
            f"{name_or_path!r} is not a local directory and could not be fetched from the Hub "
            f"({type(err).__name__}: {err}). Pass a local directory when offline."
        ) from err


def read_drafter_config(directory: Path) -> FoldDrafterConfig:
    file = directory / CONFIG_NAME
    if not file.is_file():
        raise FileNotFoundError(f"no {CONFIG_NAME} in {directory}")
    raw = read_json_object(file)
    if deepspec.is_deepspec_dict(raw):
        return deepspec.config_from_dict(raw, source=str(file))
    archs = raw.get("architectures") or []
    if archs and not any("DFlash" in a for a in archs):
        raise ValueError(f"{file}: architectures {archs} is not a DFlash drafter (expected 'DFlashDraftModel' "
                         f"(z-lab) or one of {list(deepspec.ARCHITECTURES)} (DeepSpec))")
    # fields whose transformers default would load silently and draft wrongly (shape checks catch the rest)
    if "vocab_size" not in raw:
        raise ValueError(f"{file}: missing 'vocab_size' (the target's vocabulary the drafter predicts over)")
    if "rope_theta" not in raw and not raw.get("rope_parameters"):
        raise ValueError(f"{file}: missing 'rope_theta' (or 'rope_parameters'): the drafter's rope base")
    config = FoldDrafterConfig.from_zlab_dict(raw, source=str(file))
    if config.mask_token_id is None:
        raise ValueError(f"{file}: missing 'dflash_config.mask_token_id' (the token filling block slots 1..B-1)")
    if config.block_size < 2:
        raise ValueError(f"{file}: DFlash 'block_size' must be >= 2, got {config.block_size}")
    if not config.target_layer_ids:
        raise ValueError(f"{file}: 'dflash_config.target_layer_ids' is empty")
    return config


def _weight_files(directory: Path) -> list[Path]:
    single = directory / WEIGHTS_NAME
    if single.is_file():
        return [single]
    index = directory / WEIGHTS_INDEX_NAME
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as err:
            raise ValueError(f"{index} is not a safetensors index ({err})") from None
        files = sorted({directory / name for name in weight_map.values()})
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"{index} lists missing shard(s): {missing}")
        return files
    others = sorted(directory.glob("*.safetensors"))
    if others:
        return others
    pickles = sorted(p.name for pattern in ("*.bin", "*.pt", "*.pth", "*.ckpt") for p in directory.glob(pattern))
    if pickles:
        raise ValueError(
            f"{directory} holds only pickle weights {pickles}; FoldDrafter loads safetensors only (unpickling can run "
            f"code, so these files are never opened): convert them to {WEIGHTS_NAME}"
        )
    raise FileNotFoundError(f"no {WEIGHTS_NAME} (or shards) in {directory}")


def read_state_dict(directory: Path) -> tuple[dict[str, torch.Tensor], dict[str, Path]]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    origin: dict[str, Path] = {}
    for file in _weight_files(directory):
        try:
            part = load_file(str(file))
        except (SafetensorError, OSError, ValueError) as err:
            raise ValueError(f"cannot read weights file {file}: {err} (truncated or not safetensors?)") from None
        for key, tensor in part.items():
            for prefix in _STRIPPED_PREFIXES:
                if key.startswith(prefix):
                    key = key[len(prefix):]
            state[key] = tensor
            origin[key] = file
    return state, origin


def load_drafter(cls, name_or_path, fold_config: FoldConfig | None = None, dtype=None, device=None):
    directory = resolve_checkpoint_dir(name_or_path)
    config = read_drafter_config(directory)
    if fold_config is None:
        fold_file = directory / FOLD_CONFIG_NAME
        fold_config = FoldConfig.from_pretrained(fold_file) if fold_file.is_file() else FoldConfig()
    state, origin = read_state_dict(directory)
    if deepspec.is_deepspec(config):
        deepspec.check_weights(config, state, origin, directory)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype) if dtype != "auto" else None
    if dtype is None:
        dtype = state["fc.weight"].dtype if "fc.weight" in state else torch.float32
    with torch.device("meta"):
        model = cls(config, fold_config=fold_config)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ValueError(f"weights in {directory} lack {len(missing)} tensor(s) the config needs, e.g. {missing[:5]}")
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        raise ValueError(f"weights in {directory} hold tensor(s) a DFlash drafter does not have: {unexpected[:5]}")
    for key, param in expected.items():
        if tuple(state[key].shape) != tuple(param.shape):
            raise ValueError(
                f"{origin[key]}: tensor {key!r} has shape {tuple(state[key].shape)} but config.json implies "
                f"{tuple(param.shape)}"
            )
    target_device = torch.device(device) if device is not None else torch.device("cpu")
    state = {k: v.to(device=target_device, dtype=dtype) for k, v in state.items()}
    model.load_state_dict(state, assign=True, strict=True)
    model.eval()
    model.name_or_path = str(name_or_path)
    if (directory / DRAFT_VOCAB_NAME).is_file():  # written by save_pretrained while a draft vocabulary was in use
        model.use_draft_vocab(DraftVocab.load(directory / DRAFT_VOCAB_NAME))
    return model


def save_drafter(model, save_directory) -> None:
    from safetensors.torch import save_file

    directory = Path(save_directory)
    directory.mkdir(parents=True, exist_ok=True)
    if deepspec.is_deepspec(model.config):  # DeepSpec layout: the config.json it was read from
        data = dict(model.config.deepspec_source)
    else:
        data = model.config.to_zlab_dict()
    data["torch_dtype"] = str(model.fc.weight.dtype).replace("torch.", "")
    (directory / CONFIG_NAME).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    # copies: the fast loop's fused projections make parameters views of one buffer, which safetensors refuses
    state = {k: v.detach().to('cpu', copy=True).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(directory / WEIGHTS_NAME), metadata={"format": "pt"})
    model.fold_config.save_pretrained(directory)
    vocab_file = directory / DRAFT_VOCAB_NAME
    if model.draft_vocab is not None:
        model.draft_vocab.save(directory)
    elif vocab_file.is_file():  # saving over a folder whose drafter had one: the folder must load as this drafter
        vocab_file.unlink()
