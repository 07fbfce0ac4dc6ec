"""Launch geometry of the fused FOLD read and decode attention (:mod:`.triton`), in plain Python and torch.

Tile sizes and warps per launch (:func:`launch_plan`), the context split (:func:`default_num_splits`), the merge
pass's tiles (:func:`merge_tiles`), the fp32 split partials (:func:`partials`), and the checks and layouts of the
inputs (:func:`read_shapes`, :func:`inner_contiguous`, :func:`length_arguments`). Imports no Triton, so plans are
testable on any machine.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch

DEFAULT_WINDOW_SPLITS = 16  # programs per KV head for the window region of a read (fold_read_triton)
WINDOW_SPLITS_ENV = "FOLD_HF_WINDOW_SPLITS"  # overrides the default above (benchmarks' A/B timings)


def default_window_splits() -> int:
    """Programs per KV head for a FOLD read's window region: ``$FOLD_HF_WINDOW_SPLITS`` or
    :data:`DEFAULT_WINDOW_SPLITS`; a ValueError names anything but a non-negative integer."""
    value = os.environ.get(WINDOW_SPLITS_ENV)
    if not value:
        return DEFAULT_WINDOW_SPLITS
    if not value.isdigit():
        raise ValueError(f"{WINDOW_SPLITS_ENV} must be a non-negative integer, got {value!r}")
    return int(value)


def next_pow2(n: int, minimum: int = 16) -> int:
    return max(minimum, 1 << max(0, int(n) - 1).bit_length())


@functools.lru_cache(maxsize=None)
def _multiprocessor_count(device: torch.device) -> int:
    # asked once per device: an eager read's host time adds to its latency when the read itself is short
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def multiprocessor_count(device: torch.device | str) -> int:
    """SMs of ``device`` (a bare ``cuda`` meaning the current device), asked once per device; 4 off CUDA. The split
    counts of the reads (:func:`default_num_splits`) and of the split-K GEMMs (:mod:`fold_hf.kernels.gemm.triton`)
    size their grids from it."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return _multiprocessor_count(device)


SPLIT_KV_OVER_PARTIALS = 8  # a split reads at least this many times the bytes of fp32 partials it writes (and the
# merge reads back): see min_split_entries
SPLIT_KV_RATIO_ENV = "FOLD_HF_SPLIT_KV_RATIO"  # overrides SPLIT_KV_OVER_PARTIALS (benchmarks' A/B timings)


def split_kv_ratio() -> float:
    """``$FOLD_HF_SPLIT_KV_RATIO`` or :data:`SPLIT_KV_OVER_PARTIALS`; a ValueError names anything but a number >= 0."""
    value = os.environ.get(SPLIT_KV_RATIO_ENV)
    if not value:
        return SPLIT_KV_OVER_PARTIALS
    try:
        ratio = float(value)
    except ValueError:
        ratio = -1.0
    if not ratio >= 0:
        raise ValueError(f"{SPLIT_KV_RATIO_ENV} must be a number >= 0, got {value!r}")
    return ratio


SPLIT_RULE_ENV = "FOLD_HF_SPLIT_RULE"  # "flat": the split rule before 2026-12-06 (two programs per SM whatever the
# partials cost, and a window-only read's far programs kept), for A/B timings; default "partials"


def split_rule() -> str:
    """``$FOLD_HF_SPLIT_RULE``: ``"partials"`` (default) or ``"flat"``; a ValueError names anything else."""
    value = os.environ.get(SPLIT_RULE_ENV) or "partials"
    if value not in ("partials", "flat"):
        raise ValueError(f"{SPLIT_RULE_ENV} must be 'partials' or 'flat', got {value!r}")
    return value


def min_split_entries(num_rows: int, Dh: int, Dv: int, branches: int, dtype: torch.dtype) -> int:
    """Fewest context entries a split should read: each split writes ``branches x num_rows x (Dv + 2)`` fp32
    partials that the merge reads back, so a split of ``n`` entries moves ``n (Dh + Dv)`` cache elements for them.
    With few KV heads and many packed rows (Gemma-3-270M's drafter: 1 KV head, 4 x 8 rows of 256, two branches)
    two programs per SM make ~128-entry splits whose partials are as large as the keys and values they read;
    :data:`SPLIT_KV_OVER_PARTIALS` (or ``$FOLD_HF_SPLIT_KV_RATIO``) bounds that share. 0 under
    ``$FOLD_HF_SPLIT_RULE=flat``."""
    if split_rule() == "flat":
        return 0
    elem = torch.finfo(dtype).bits // 8
    partial_bytes = 4 * branches * num_rows * (Dv + 2)
    return math.ceil(split_kv_ratio() * partial_bytes / ((Dh + Dv) * elem))


def default_num_splits(span: int, num_kv_heads: int, block_n: int, device: torch.device,
                       min_entries: int = 0) -> int:
    """Splits along the context so that about two programs per SM exist (flash-decoding), each reading at least
    ``min_entries`` entries (:func:`min_split_entries`) and one key tile."""
    sms = multiprocessor_count(device)
    wanted = max(1, -(-2 * sms // max(num_kv_heads, 1)))
    splits = min(wanted, -(-max(span, 1) // block_n))
    if min_entries > 0:  # rounded down: every split's chunk (the span over the splits) holds min_entries or more
        splits = min(splits, max(span, 1) // int(min_entries))
    return max(1, splits)


def inner_contiguous(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` in ``dtype`` with a unit innermost stride (the kernels index the last dim with stride 1)."""
    x = x.to(dtype)
    return x if x.stride(-1) == 1 else x.contiguous()


def read_shapes(name: str, query: torch.Tensor, context_keys: torch.Tensor, context_values: torch.Tensor):
    """(Hq, Lq, Dh, Hkv, capacity, Dv) of a batch-1 read, or a ValueError naming ``name``."""
    b, Hq, Lq, Dh = query.shape
    _, Hkv, capacity, _ = context_keys.shape
    if b != 1 or context_keys.shape[0] != 1:
        raise ValueError(f"{name} reads batch 1")
    if Hq % Hkv:
        raise ValueError(f"query heads ({Hq}) must be a multiple of KV heads ({Hkv})")
    if query.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"unsupported dtype {query.dtype}")
    return Hq, Lq, Dh, Hkv, capacity, context_values.shape[-1]


@dataclass(frozen=True)
class LaunchPlan:
    """Tile sizes and the context split of one launch of ``_fold_split_kernel``."""

    num_rows: int
    row_blocks: int
    block_m: int
    block_n: int
    block_d: int
    block_dv: int
    num_warps: int
    num_stages: int
    num_splits: int
    chunk: int
    dot_precision: str



@dataclass(frozen=True)
class Tuning:
    """Tuning overrides of one read's two launches (benchmarks, tests), passed to ``fold_read_triton`` /
    ``decode_attention_triton`` as keywords; None = the plan's default.

    ``block_m`` (rows of the ``G * Lq`` packed rows per program), ``block_n``, ``num_warps``, ``num_stages``: the
    split pass (:func:`launch_plan`); ``window_splits``: the FOLD read's programs for the window region;
    ``merge_split_chunk`` (splits loaded at once), ``merge_dv_block``, ``merge_warps``, ``merge_early_acc``: the
    merge pass (:func:`merge_tiles`)."""

    block_m: int | None = None
    block_n: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    window_splits: int | None = None
    merge_split_chunk: int | None = None
    merge_dv_block: int | None = None
    merge_warps: int | None = None
    merge_early_acc: bool | None = None

    @property
    def split_pass(self) -> tuple:
        """``(block_m, block_n, num_warps, num_stages)``, as :func:`launch_plan` takes them."""
        return self.block_m, self.block_n, self.num_warps, self.num_stages

    @property
    def merge_pass(self) -> tuple:
        """``(split_chunk, dv_block, num_warps, early_acc)``, as :func:`merge_tiles` takes them."""
        return self.merge_split_chunk, self.merge_dv_block, self.merge_warps, self.merge_early_acc

WIDE_TILE_SMEM_BYTES = 128 * 1024  # estimated shared memory of a wide-head tile (the H200 allows 227 KB a block;
# Triton adds layout-conversion buffers beyond the estimate: at head dim 512 it asked for up to 1.5x of it)
DECODE_WIDE_TILE_SMEM_BYTES = 160 * 1024  # the same for the target's decode kernel (pre-rotated keys: no rope
# tiles); 32 x 512 queries with 2 stages of 32 keys (160 KB estimated) launched and ran fastest at Gemma-4's global
# shape on the H200 (benchmarks/results/2026-12-01-nvidia-h200-anatomy)


def wide_tile_smem_estimate(block_m: int, block_n: int, block_d: int, block_dv: int, num_stages: int,
                            dtype: torch.dtype) -> int:
    """Shared-memory bytes of one program's tiles: the query tile plus ``num_stages`` buffered key and value tiles
    (matches what Triton asked for at head dim 512 in bf16: 262,144 bytes for 64 x 512 queries, 3 x 32 keys)."""
    elem = torch.finfo(dtype).bits // 8
    return elem * (block_m * block_d + num_stages * block_n * (block_d + block_dv))


def fit_wide_tiles(block_m: int, block_n: int, block_d: int, block_dv: int, num_stages: int, dtype: torch.dtype,
                    fixed: tuple[bool, bool, bool], budget: int = WIDE_TILE_SMEM_BYTES) -> tuple[int, int, int]:
    """Shrink, in this order, the pipelining stages (to 2), the key tile (to 16), the row tile (to 16) and the
    stages (to 1) until :func:`wide_tile_smem_estimate` fits ``budget`` bytes; knobs the caller set
    (``fixed``: block_m, block_n, num_stages given) are kept."""
    m_fixed, n_fixed, stages_fixed = fixed

    def fits() -> bool:
        return wide_tile_smem_estimate(block_m, block_n, block_d, block_dv, num_stages, dtype) <= budget

    while not fits():
        if not stages_fixed and num_stages > 2:
            num_stages = 2
        elif not n_fixed and block_n > 16:
            block_n //= 2
        elif not m_fixed and block_m > 16:
            block_m //= 2
        elif not stages_fixed and num_stages > 1:
            num_stages = 1
        else:
            break
    return block_m, block_n, num_stages


def launch_plan(num_rows: int, Dh: int, Dv: int, Hkv: int, span: int, dtype: torch.dtype, device: torch.device,
                 num_splits: int | None, block_m: int | None, block_n: int | None, num_warps: int | None,
                 num_stages: int | None, decode: bool = False, branches: int = 1,
                 pipelined: bool = True) -> LaunchPlan:
    """Defaults for the tuning knobs left None, and the even split of ``span`` context entries (of at least
    :func:`min_split_entries` each where the split's key loop is ``pipelined``; ``branches``: 2 with a far memory).

    Tiles of up to 64 x 128 (``block_m x block_d``) run with 4 warps, larger ones with 8: both reads are bound by
    loading keys, and 4 warps measured faster for a 10-token block's packed rows (docs/design.md §6). ``decode``
    (the target's decode kernel, keys pre-rotated): wide heads (over 256) run 4 warps with 32-key tiles under
    :data:`DECODE_WIDE_TILE_SMEM_BYTES` (at Gemma-4's global shape, 16 / 4 heads of 512 over 32K keys, bf16, on
    the H200: 28 rows 97.7 us instead of 209.6 with 8 warps and 16-key tiles, 4 rows 79.8 instead of 91.6), and
    tiles over 64 x 128 run 4 warps with 32-key tiles in 2 stages (Qwen3.5-9B's 16-row verify, 64 packed rows of
    256: 59.4 us instead of 69.9 with 8 warps, 64 keys, 3 stages)."""
    given_m, given_n, given_stages = block_m is not None, block_n is not None, num_stages is not None
    block_m = block_m or min(next_pow2(num_rows), 128 if Dh <= 64 else 64)
    block_d, block_dv = next_pow2(Dh), next_pow2(Dv)
    if block_n is None:
        block_n = 64 if max(block_d, block_dv) <= 128 else 32
    wide = max(block_d, block_dv) > 256  # Gemma-4's global 512
    large = block_m * max(block_d, block_dv) > 64 * 128
    if num_warps is None:
        num_warps = 8 if large and not decode else 4
    if decode and large and not wide:  # Qwen3.5's full-attention verify: 64 packed rows of 256
        block_n = block_n if given_n else 32
        num_stages = num_stages if given_stages else 2
    if num_stages is None:
        num_stages = 3 if device.type == "cuda" else 1
    if wide:  # shrink the tiles the caller left open
        block_m, block_n, num_stages = fit_wide_tiles(
            block_m, block_n, block_d, block_dv, num_stages, dtype, fixed=(given_m, given_n, given_stages),
            budget=DECODE_WIDE_TILE_SMEM_BYTES if decode else WIDE_TILE_SMEM_BYTES)
    if num_splits is None:
        # a split's entries bounded below by its partials only where its key loop is software-pipelined (the
        # decode loop, a FOLD read's far-only loop): the rope-and-mask loop of a read without a window runs one
        # stage, and 16 splits of ~270 entries took Gemma-3-270M's dflash round at 4K from 1.21 to 1.30 ms
        min_entries = min_split_entries(num_rows, Dh, Dv, branches, dtype) if pipelined else 0
        num_splits = default_num_splits(span, Hkv, block_n, device, min_entries)
    num_splits = max(1, int(num_splits))
    chunk = -(-max(span, 1) // num_splits)
    chunk = -(-chunk // block_n) * block_n
    return LaunchPlan(num_rows, -(-num_rows // block_m), block_m, block_n, block_d, block_dv, num_warps, num_stages,
                       num_splits, chunk, "ieee" if dtype == torch.float32 else "tf32")


def read_splits(plan_splits: int, window: int | None, has_far: bool, window_splits: int | None) -> tuple[int, int]:
    """``(window programs, splits)`` per KV head of a FOLD read's split launch, from its plan's far-region split count:
    a read with a window adds ``window_splits`` programs for the window region (default
    :func:`default_window_splits`), and one with a window and no far memory launches those alone (the far-only
    region's programs would only write empty partials for the merge to read back; not under
    ``$FOLD_HF_SPLIT_RULE=flat``)."""
    if window is None:
        return 0, plan_splits
    extra = default_window_splits() if window_splits is None else max(0, int(window_splits))
    if extra and not has_far and split_rule() != "flat":
        return extra, extra
    return extra, plan_splits + extra


MERGE_TILE_ELEMENTS = 8192  # fp32 partial outputs one merge program loads at once ([splits, Dv]; 64 registers a thread)


MERGE_DV_ENV = "FOLD_HF_MERGE_DV"  # value dims per merge program (benchmarks)
# value dims per merge program: at the 8B decode shape (33 splits, Dv 128) two programs per row of 64 took the 32 merges
# of a 32K AR step from 95.7 to 63.4 us and the step 5.482 -> 5.443 ms, the fold round 7.368 -> 7.250
# (benchmarks/results/2026-12-02-nvidia-h200-merge); 32 per program measured between the two
DEFAULT_MERGE_DV_BLOCK = 64
MERGE_EARLY_ENV = "FOLD_HF_MERGE_EARLY"  # "0": load the partial outputs after the maxima (two load rounds)


@dataclass(frozen=True)
class MergePlan:
    """Launch shape of ``_fold_merge_kernel``: grid ``(Hkv, rows, dv_programs)``."""

    block_s: int
    split_chunk: int
    num_warps: int
    block_dv: int
    dv_programs: int
    early_acc: bool


def merge_tiles(num_splits: int, block_dv: int, split_chunk: int | None, dv_block: int | None = None,
                 num_warps: int | None = None, early_acc: bool | None = None) -> MergePlan:
    """The merge's tiles: every split in one load when the ``[BLOCK_S, dv_block]`` tile fits
    :data:`MERGE_TILE_ELEMENTS`, 8 warps when the tile is over half of that size.

    The merge is latency-bound (a few KB per row, read from L2 right after the split pass), so its cost is the
    number of dependent load rounds; loading all splits at once instead of 8 at a time cuts them from
    ``ceil(S / 8)`` to one for up to 64 splits at head_dim 128, and ``early_acc`` (default on, ``$FOLD_HF_MERGE_EARLY``)
    issues that load together with the maxima's. ``dv_block`` (default ``$FOLD_HF_MERGE_DV`` or
    :data:`DEFAULT_MERGE_DV_BLOCK`, at most ``block_dv``) spreads a row's value dims over several programs."""
    block_s = next_pow2(num_splits, 2)
    if dv_block is None:
        dv_block = int(os.environ.get(MERGE_DV_ENV) or 0) or DEFAULT_MERGE_DV_BLOCK
    dv_block = max(16, min(next_pow2(int(dv_block)), block_dv))
    if split_chunk is None:
        split_chunk = max(2, min(block_s, MERGE_TILE_ELEMENTS // dv_block))
    split_chunk = next_pow2(min(int(split_chunk), block_s), 2)
    if num_warps is None:
        num_warps = 4 if block_s * dv_block <= MERGE_TILE_ELEMENTS // 2 else 8
    if early_acc is None:
        early_acc = os.environ.get(MERGE_EARLY_ENV, "1") != "0"
    return MergePlan(block_s, split_chunk, int(num_warps), dv_block, block_dv // dv_block,
                      bool(early_acc) and split_chunk >= block_s)


def partials(branches: int, Hkv: int, num_splits: int, num_rows: int, Dv: int, device: torch.device):
    """fp32 split partials (running max, mass, unnormalized output) of every branch, KV head, split and row."""
    part_m = torch.empty(branches, Hkv, num_splits, num_rows, device=device, dtype=torch.float32)
    part_acc = torch.empty(branches, Hkv, num_splits, num_rows, Dv, device=device, dtype=torch.float32)
    return part_m, torch.empty_like(part_m), part_acc


def length_arguments(length, capacity: int, unused: torch.Tensor, max_length: int | None = None):
    """``(pointer, value, span)`` of the split kernel's context length, given as an int or a one-element tensor.

    A tensor is read on the device (``pointer``: int32 ``[1]``, ``value`` 0) and the splits cover ``capacity``
    entries, or ``max_length`` when given (a static bound); an int is passed by value (``pointer`` is ``unused``,
    never read) and must not exceed ``capacity``."""
    if isinstance(length, torch.Tensor):
        pointer = length.reshape(-1)[:1]
        if pointer.dtype != torch.int32:
            pointer = pointer.to(torch.int32)
        return pointer, 0, capacity if max_length is None else min(int(max_length), capacity)
    value = int(length)
    if value > capacity:
        raise ValueError(f"context_length {value} exceeds the buffer's {capacity} entries")
    return unused, value, value
