"""The fast loop's entry point: :func:`fast_generate` checks the request, resolves its engine and settings, takes
the target's session and decodes (prefill, then rounds, :func:`decode_request`); :func:`fast_unsupported` says why
a request cannot run here (the routing asks it)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ...modeling.drafter import FoldDrafter
from ...modeling.fold_config import FoldConfig
from ...targets.base import PREFILL_CHUNK, UnsupportedTarget
from ...targets.registry import check_target
from ..request import drafter_for_call, new_token_budget, warn_past_context
from ..rounds import decode, num_proposals
from ..sampling import Sampling, TokenChoice
from ..static_drafter import commit_context
from ..stats import GenerationResult
from ..tracker import StopStrings, Tracker, eos_ids
from .engine import StaticRunner, run_rounds
from .session import Session, session_for
from .settings import fused_drafter_enabled, resolve_fused_drafter, resolve_fused_layers, resolve_target_attention

ENGINES = ("eager", "static", "graphs")


def fast_unsupported(target, drafter=None, *, batch_size: int = 1, capacity: int | None = None) -> str | None:
    """Why :func:`fast_generate` cannot run this request (``capacity``: its prompt + new tokens, when known), or
    None when it can (used by the routing)."""
    if batch_size != 1:
        return f"batch size {batch_size}: the fast loop runs batch 1"
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


@torch.no_grad()
def fast_generate(
    target,
    drafter: FoldDrafter | None = None,
    input_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    *,
    max_new_tokens: int | None = 256,
    max_length: int | None = None,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float | None = None,
    min_new_tokens: int | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    stop_strings: Sequence[str] | str | None = None,
    tokenizer=None,
    streamer=None,
    generator: torch.Generator | None = None,
    fold_config: FoldConfig | None = None,
    return_stats: bool = False,
    engine: str | None = None,
    prefill_chunk: int = PREFILL_CHUNK,
    target_attention: str | None = None,
    fused_layers: bool | None = None,
):
    """Speculative decoding (greedy or sampled) of ``target`` with ``drafter`` (AR when None) on the fast machinery.

    Same arguments and result as :func:`fold_hf.generate`, plus:

    Args:
        engine: ``"eager"``, ``"static"`` or ``"graphs"`` (module docstring); default ``graphs`` on CUDA,
            ``eager`` otherwise.
        prefill_chunk: prompt tokens per prefill forward (bounds the prefill's activation memory).
        target_attention: the verify step's attention in the static and graphs engines, ``"bucket"`` or
            ``"triton"`` (module docstring); default ``$FOLD_HF_TARGET_ATTENTION``, else ``"triton"`` on CUDA
            with Triton and ``"bucket"`` elsewhere.
        fused_layers: run the target's elementwise work as fused kernels (module docstring); default on with
            ``target_attention="triton"`` on CUDA where the target allows it.

    Sampling (``do_sample=True``, with temperature, top-k, top-p, min-p) and the repetition penalty and
    ``min_new_tokens`` run on the device inside the round (:mod:`~fold_hf.generation.sampling`), captured in the
    graphs engine; ``generator`` seeds them (the same seed gives the same tokens on every engine).

    Returns:
        ``[1, P + N]`` sequences, or a :class:`GenerationResult` with ``return_stats=True``.

    Raises:
        ValueError: batch > 1, padding, an unsupported target architecture (the message says which).
    """
    max_new_tokens = new_token_budget(input_ids, attention_mask, max_new_tokens, max_length)
    reason = fast_unsupported(target, drafter)
    if reason is not None:
        raise ValueError(f"fast_generate cannot run this request: {reason}")
    prompt_len = input_ids.shape[1]
    warn_past_context(target, prompt_len, max_new_tokens)
    sampling = Sampling.from_settings(do_sample, temperature, top_k, top_p, min_p, repetition_penalty,
                                      min_new_tokens)
    device = input_ids.device
    if engine is None:
        engine = "graphs" if device.type == "cuda" else "eager"
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if engine == "graphs" and device.type != "cuda":
        raise ValueError("engine='graphs' needs CUDA tensors; use engine='eager' or 'static' on CPU")
    target_attention = resolve_target_attention(target_attention, device)
    with drafter_for_call(target, drafter, fold_config):
        rows = num_proposals(drafter) + 1
        capacity = prompt_len + max_new_tokens + rows
        taps = tuple(drafter.config.target_layer_ids) if drafter is not None else ()
        session = session_for(target, capacity, taps, engine)
        fused = resolve_fused_layers(fused_layers, target_attention, session.runner, engine)
        out = Tracker(eos_ids(target, eos_token_id), StopStrings(stop_strings, tokenizer), streamer)
        result = decode_request(session, drafter, input_ids.to(session.device), max_new_tokens, out, sampling,
                                generator, prefill_chunk, target_attention, fused,
                                resolve_fused_drafter(fused, fused_layers, target_attention, session.runner, engine))
        return result if return_stats else result.sequences



def decode_request(session: Session, drafter, input_ids, budget: int, out: Tracker, sampling: Sampling, generator,
                   prefill_chunk: int, target_attention: str = "bucket", fused: bool = False,
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

