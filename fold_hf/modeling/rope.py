"""Rotary position embedding at arbitrary (possibly negative or virtual) positions.

The drafter never stores rotated keys: positions are applied when a branch is read, so one
unrotated cache serves the window (true positions), the far memory (no rotation on the key, the
query rotated by the virtual distance) and the baselines (renumbered or rescaled positions).
Partial rotary embedding rotates only the first ``rotary_dim`` channels of each head.
"""

from __future__ import annotations

import copy
import math

import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from ..kernels.common import compute_dtype, rotate_half

__all__ = ["RotaryTables", "compute_dtype", "yarn_factor", "yarn_rope_parameters"]


def _default_inv_freq(base: float, rotary_dim: int) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))


class RotaryTables:
    """Inverse frequencies of one rope setting, applied on demand.

    Args:
        inv_freq: ``[rotary_dim // 2]`` inverse frequencies (float64 is kept for exact angles).
        attention_scaling: factor multiplying cos and sin (YaRN's mscale; 1 otherwise).
        head_dim: channels per head; channels ``rotary_dim..head_dim`` pass through unrotated.
    """

    def __init__(self, inv_freq: torch.Tensor, attention_scaling: float, head_dim: int) -> None:
        self.inv_freq = inv_freq.detach().to(torch.float64).cpu()
        self.rotary_dim = 2 * self.inv_freq.numel()
        if self.rotary_dim > head_dim:
            raise ValueError(f"rotary dim {self.rotary_dim} exceeds head_dim {head_dim}")
        self.attention_scaling = float(attention_scaling)
        self.head_dim = head_dim
        self._device_cache: dict[torch.device, torch.Tensor] = {}

    @classmethod
    def from_config(cls, config, rope_parameters: dict | None = None) -> "RotaryTables":
        """Tables for a transformers config (``rope_parameters`` dict standardized by transformers).

        ``rope_parameters`` replaces the config's own (used for YaRN's per-request scaling). The tables are
        computed on the CPU whatever the default device (models are built on the meta device when loading).
        """
        with torch.device("cpu"):
            return cls._from_config(config, rope_parameters)

    @classmethod
    def _from_config(cls, config, rope_parameters: dict | None) -> "RotaryTables":
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        params = dict(rope_parameters if rope_parameters is not None else config.rope_parameters)
        rope_type = params.get("rope_type", params.get("type", "default"))
        partial = float(params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None) or 1.0))
        if rope_type == "default":
            rotary_dim = int(head_dim * partial)
            rotary_dim -= rotary_dim % 2
            return cls(_default_inv_freq(float(params["rope_theta"]), rotary_dim), 1.0, head_dim)
        if rope_type not in ROPE_INIT_FUNCTIONS:
            raise ValueError(f"unsupported rope_type {rope_type!r}; known: {sorted(ROPE_INIT_FUNCTIONS)}")
        cfg = copy.copy(config)
        cfg.rope_parameters = params
        if partial != 1.0:
            cfg.partial_rotary_factor = partial
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](cfg, torch.device("cpu"))
        return cls(inv_freq, scaling, head_dim)

    def _inv_freq_on(self, device: torch.device) -> torch.Tensor:
        table = self._device_cache.get(device)
        if table is None:
            # float64 where the device has it: angles of positions near 256K lose digits in fp32
            dtype = torch.float32 if device.type == "mps" else torch.float64
            table = self.inv_freq.to(device=device, dtype=dtype)
            self._device_cache[device] = table
        return table

    def cos_sin(self, positions: torch.Tensor, scale: float | None = None,
                dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of ``positions`` (any shape ``[...]``), each ``[..., rotary_dim]`` in ``dtype``."""
        inv = self._inv_freq_on(positions.device)
        angles = positions.to(inv.dtype)[..., None] * inv
        angles = torch.cat((angles, angles), dim=-1)
        s = self.attention_scaling if scale is None else scale
        return (angles.cos() * s).to(dtype), (angles.sin() * s).to(dtype)

    def rotate(self, x: torch.Tensor, positions: torch.Tensor, scale: float | None = None) -> torch.Tensor:
        """Rotate ``x [..., N, head_dim]`` by ``positions [N]`` (or broadcastable ``[..., N]``).

        Computes and returns fp32 (fp64 for fp64 inputs). ``scale`` multiplies cos and sin (defaults to the
        setting's attention scaling).
        """
        x = x.to(compute_dtype(x.dtype))
        cos, sin = self.cos_sin(positions, scale, x.dtype)
        rd = self.rotary_dim
        rot, rest = x[..., :rd], x[..., rd:]
        out = rot * cos + rotate_half(rot) * sin
        return torch.cat((out, rest), dim=-1) if rest.shape[-1] else out


def yarn_factor(total_length: int, block: int, train_length: int) -> float:
    """Per-request YaRN factor max(1, ceil((P + G + Q) / 256) * 256 / R) of the paper's Appendix B.3.

    ``total_length`` = P + G (input length plus generation limit), ``block`` = Q.
    """
    return max(1.0, math.ceil((total_length + block) / 256) * 256 / train_length)


def yarn_rope_parameters(base_parameters: dict, factor: float, train_length: int) -> dict:
    """rope parameters for YaRN with ``factor`` on top of a default rope (theta and partial factor kept)."""
    params = {
        "rope_type": "yarn",
        "rope_theta": base_parameters["rope_theta"],
        "factor": float(factor),
        "original_max_position_embeddings": int(train_length),
    }
    if "partial_rotary_factor" in base_parameters:
        params["partial_rotary_factor"] = base_parameters["partial_rotary_factor"]
    return params
