"""The fast loop's entry point: :func:`fast_generate` checks the request, resolves its engine and settings, takes
the target's session and decodes (prefill, then rounds, :func:`decode_request`; a batch row by row,
:mod:`..batch`); :func:`fast_unsupported` says why a request cannot run here (the routing asks it)."""

from __future__ import annotations

import functools

import torch

from ...modeling.drafter import FoldDrafter
from ...modeling.fold_config import FoldConfig
from ...targets.base import UnsupportedTarget
from ...targets.registry import check_target
from ..batch import decode_rows, needs_rows
from ..request import GenerationRequest, drafter_for_call, takes_request, warn_past_context
from ..rounds import decode, num_proposals
from ..sampling import Sampling, TokenChoice
from ..static_drafter import commit_context
from ..stats import GenerationResult
from ..tracker import Tracker
from .batched import batched_unsupported, decode_batched
from .engine import StaticRunner, run_rounds
from .session import Session, session_for
from .settings import (
    check_exact_settings,
    fused_drafter_enabled,
    resolve_fused_drafter,
    resolve_fused_layers,
    resolve_target_attention,
)

ENGINES = ("eager", "static", "graphs")


def fast_unsupported(target, drafter=None, *, capacity: int | None = None) -> str | None:
    """Why :func:`fast_generate` cannot run this request (``capacity``: a row's prompt + new tokens, when known), or
    None when it can (used by the routing)."""
    if drafter is not None and not isinstance(drafter, FoldDrafter):
        return f"assistant {type(drafter).__name__} is not a FoldDrafter"
    placed = {str(d) for d in (getattr(target, "hf_device_map", None) or {}).values()}
    if len(placed) > 1:
        return (f"a target dispatched over {', '.join(sorted(placed))} (device_map): the fast loop keeps the whole "
                "target on one device")
    try:
        check_target(target, capacity)
    except UnsupportedTarget as err:
        return str(err)
    return None


@takes_request
@torch.no_grad()
def fast_generate(target, drafter: FoldDrafter | None = None, input_ids: torch.Tensor | None = None,
                  attention_mask: torch.Tensor | None = None, *, engine: str | None = None,
                  prefill_chunk: int | None = None, target_attention: str | None = None,
                  fused_layers: bool | None = None, request: GenerationRequest | None = None, **settings):
    """Speculative decoding (greedy or sampled) of ``target`` with ``drafter`` (AR when None) on the fast machinery
    (docs/fast-loop.md).

    Same arguments and result as :func:`fold_hf.generate` (the settings of a
    :class:`~fold_hf.generation.request.GenerationRequest`); a batch ``[B, L]`` (left-padded, ``attention_mask``) runs
    in batched rounds (:mod:`~fold_hf.generation.fast.batched`, the Llama, Qwen3.5 and Gemma families), anything
    else row by row, saying once why. Plus:

    Args:
        engine: ``"eager"``, ``"static"`` or ``"graphs"`` (docs/fast-loop.md); default ``graphs`` on CUDA,
            ``eager`` otherwise, and ``eager`` for a batch that batched rounds take.
        prefill_chunk: prompt tokens per prefill forward (bounds the prefill's activation memory); default the
            target runner's (:meth:`~fold_hf.targets.base.StaticTarget.prefill_chunk`: 8,192, or up to 65,536 where
            the fused prefill runs a narrow target, whose launches would otherwise outlast its kernels).
        target_attention: the verify step's attention in the static and graphs engines, ``"bucket"`` or
            ``"triton"``; default ``$FOLD_HF_TARGET_ATTENTION``, else ``"triton"`` on CUDA with Triton and
            ``"bucket"`` elsewhere.
        fused_layers: run the target's elementwise work as fused kernels; default on with
            ``target_attention="triton"`` on CUDA where the target allows it.

    ``exact=True`` (docs/exact-mode.md): a token's logits have the same bits in an AR step and in a verify block,
    so greedy speculative output equals ``exact=True`` AR output bit for bit. It runs the static and graphs engines
    (default ``static`` off CUDA; a batch's batched rounds on any engine) with ``target_attention="triton"`` and the
    fused layers of a Llama-family target on CUDA (or a CPU under ``TRITON_INTERPRET=1``); anything else raises
    ValueError (``ExactUnavailable`` for the device or the target) naming why.

    Sampling (``do_sample=True``, with temperature, top-k, top-p, min-p) and the repetition penalty and
    ``min_new_tokens`` run on the device inside the round (:mod:`~fold_hf.generation.sampling`), captured in the
    graphs engine; ``generator`` seeds them (the same seed gives the same tokens on every engine).

    Returns:
        ``[1, P + N]`` sequences (a batch: ``[B, L + N]``), or a :class:`GenerationResult` (a batch:
        :class:`BatchGenerationResult`) with ``return_stats=True``.

    Raises:
        ValueError: right padding, an unsupported target architecture (the message says which).
    """
    request = GenerationRequest.of("fast_generate", request, settings)
    budget = request.check(input_ids, attention_mask)
    reason = fast_unsupported(target, drafter)
    if reason is not None:
        raise ValueError(f"fast_generate cannot run this request: {reason}")
    device = input_ids.device
    several = needs_rows(input_ids, attention_mask) and input_ids.shape[0] > 1
    why_rows = batched_unsupported(target, drafter, request) if several else None  # None: batched rounds take it
    batch_rounds = several and why_rows is None
    if batch_rounds and engine is None and device.type != "cuda":
        engine = "eager"  # off CUDA a batch's verify runs host-length (the fused layers' twins are slower there)
    if engine is None:
        engine = "graphs" if device.type == "cuda" else "static" if request.exact else "eager"
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if engine == "graphs" and device.type != "cuda":
        raise ValueError("engine='graphs' needs CUDA tensors; use engine='eager' or 'static' on CPU")
    target_attention = resolve_target_attention(target_attention, device, request.exact)
    if request.exact:
        check_exact_settings(engine, target_attention, fused_layers, batched=batch_rounds)
    row = functools.partial(_fast_row, target, drafter, engine=engine, prefill_chunk=prefill_chunk,
                            target_attention=target_attention, fused_layers=fused_layers)
    if batch_rounds:
        return decode_batched(target, drafter, input_ids, attention_mask, request, budget, prefill_chunk, engine,
                              fused_layers)
    if needs_rows(input_ids, attention_mask):
        return decode_rows(row, target, input_ids, attention_mask, request, budget, why=why_rows or "one padded prompt")
    result = row(input_ids, request.for_row(0, budget))
    return result if request.return_stats else result.sequences


def _fast_row(target, drafter, input_ids: torch.Tensor, request: GenerationRequest, *, engine: str,
              prefill_chunk: int | None, target_attention: str, fused_layers: bool | None) -> GenerationResult:
    """One unpadded prompt ``input_ids`` ``[1, P]`` on the fast loop, ``request.max_new_tokens`` new tokens at
    most."""
    max_new_tokens = request.max_new_tokens
    prompt_len = input_ids.shape[1]
    warn_past_context(target, prompt_len, max_new_tokens, stacklevel=4)
    with drafter_for_call(target, drafter, request.fold_config):
        rows = num_proposals(drafter) + 1
        capacity = prompt_len + max_new_tokens + rows
        taps = tuple(drafter.config.target_layer_ids) if drafter is not None else ()
        session = session_for(target, capacity, taps, engine, request.exact)
        fused = resolve_fused_layers(True if request.exact else fused_layers, target_attention, session.runner, engine)
        return decode_request(session, drafter, input_ids.to(session.device), max_new_tokens,
                              request.tracker(target), request.sampling(), request.generator, prefill_chunk,
                              target_attention, fused,
                              resolve_fused_drafter(fused, fused_layers, target_attention, session.runner, engine))


def decode_request(session: Session, drafter, input_ids, budget: int, out: Tracker, sampling: Sampling, generator,
                   prefill_chunk: int | None, target_attention: str = "bucket", fused: bool = False,
                   drafter_fused: bool | None = None) -> GenerationResult:
    """One request on ``session``: the prompt ``input_ids`` ``[1, P]`` prefilled (the drafter's context committed
    chunk by chunk), then up to ``budget`` tokens decoded into ``out`` by the engine's rounds."""
    prompt_len = input_ids.shape[1]
    slots = num_proposals(drafter)
    dcache = static_drafter = None
    on_taps = None
    if drafter is not None:
        if drafter_fused is None:
            drafter_fused = fused and fused_drafter_enabled()
        dcache, static_drafter = session.drafter_slot(drafter, prompt_len + budget, fused=drafter_fused)

        def on_taps(features, start):
            commit_context(drafter, dcache, features)

    taps = session.buffers(slots + 1)[1] if drafter is not None else None
    runner = StaticRunner(session.runner, taps)

    def make_choice(logits):
        return TokenChoice(sampling, generator, logits.shape[-1], session.device, input_ids, out.eos, slots,
                           buffers=session.choice_buffers(slots))

    def rounds(last, position, pending, choice):
        run_rounds(session, runner, drafter, dcache, static_drafter, last, position, pending, budget, out, choice,
                   target_attention, fused)

    return decode(runner, drafter, input_ids, out, make_choice, rounds, prefill_chunk, on_taps, session.device)

