"""`fold_hf.generate`: speculative decoding of any causal LM through its own ``forward`` (one prompt at a time: a
batch's rows are decoded one after another, :mod:`.batch`).

The round loop is :mod:`fold_hf.generation.rounds` (the one the fast loop's eager engine runs); here the
target is run by :class:`ForwardRunner`: the model's ``forward`` with a ``DynamicCache`` (rollback crops it)
and forward hooks for the drafter's tapped layers. With ``drafter=None`` the same loop verifies an empty block,
which is plain autoregressive decoding (DFlash's "block 1"). Only accepted positions reach the drafter's cache,
so a rejection costs the target cache a rewind and the drafter nothing. Hybrid targets (Qwen3.5's linear-attention
layers) cannot rewind their recurrent state: the runner snapshots their linear states before each verify and, after
a rejection, restores them and replays the accepted tokens (:mod:`fold_hf.targets.rollback`).
"""

from __future__ import annotations

import functools
import inspect

import torch
from transformers import DynamicCache

from ..compat import activate_linear_recording, native_linear_rollback
from ..modeling.drafter import FoldDrafter
from ..modeling.retrieval import target_attention_probe
from ..targets.gemma import slices_before_taps
from ..targets.registry import prepare_text_request
from ..targets.rollback import LinearStateRollback, crop_attention_layers, has_linear_state
from ..targets.taps import HiddenTaps, _unwrap
from .batch import decode_rows, needs_rows
from .request import GenerationRequest, drafter_for_call, takes_request, warn_past_context
from .rounds import decode, eager_rounds, num_proposals
from .sampling import TokenChoice
from .stats import GenerationResult


def _record_past(cache) -> bool:
    """Make ``cache`` able to roll back past a sliding window (transformers' own mechanism); True when it did.

    A ``DynamicSlidingWindowLayer`` keeps only its last ``window - 1`` entries, so once the window is reached a
    rejected draft could not be removed (``crop`` raises). ``activate_past_recording`` (transformers 5.17 and
    5.24) makes each update keep the new entries until the next ``crop``, which removes the rejected ones and
    trims the layer back to its window; so with recording on, a ``crop`` follows every forward before the next
    one (``crop(0)`` when nothing is rejected). Full-attention layers ignore it. A cache without sliding layers is
    left as is.
    """
    activate = getattr(cache, "activate_past_recording", None)
    if activate is None or has_linear_state(cache):  # linear-attention targets roll back by snapshots (rollback.py)
        return False
    layers = getattr(cache, "layers", None)
    if layers is not None and not any(getattr(layer, "is_sliding", False) for layer in layers):
        return False
    activate()
    return True


def _forward_parameters(target) -> set[str]:
    try:
        return set(inspect.signature(_unwrap(target).forward).parameters)
    except (TypeError, ValueError):
        return set()


class ForwardRunner:
    """A runner (:mod:`~fold_hf.generation.rounds`) over ``target``'s own forward and a ``DynamicCache``."""

    def __init__(self, target, tap_layer_ids=(), taps_device=None) -> None:
        self.target = target
        prepare_text_request(target)  # a multimodal wrapper's state from an earlier image request (its family says)
        self.taps = HiddenTaps(target, tap_layer_ids, device=taps_device) if tap_layer_ids else None
        self.cache = DynamicCache(config=getattr(target, "config", None))
        self.recording = _record_past(self.cache)  # sliding layers (Gemma): crop after every forward
        params = _forward_parameters(target)
        self.cache_name = "cache" if "cache" in params else "past_key_values"
        # Gemma-4's KV-shared layers see only the kept positions: a tap there needs them all
        keep_one = "logits_to_keep" in params and not slices_before_taps(_unwrap(target), tap_layer_ids)
        self.prefill_extra = {"logits_to_keep": 1} if keep_one else {}
        self.rollback = None  # linear-attention targets (rollback.py), set at the first verify
        # linear-attention targets on a transformers that rolls their state back itself (5.25): crop after each verify
        self.native_linear = has_linear_state(self.cache) and native_linear_rollback()
        self.cache_recording = False
        self._verified = None  # (position, ids) of the last verify that took a snapshot

    def _run(self, ids: torch.Tensor, extra: dict):
        kw = {self.cache_name: self.cache, "use_cache": True, **extra}
        if self.taps is None:
            return self.target(input_ids=ids, **kw).logits[0], None
        with self.taps:
            logits = self.target(input_ids=ids, **kw).logits[0]
        return logits, self.taps.features()

    def prefill(self, input_ids: torch.Tensor, chunk=None, on_taps=None):
        logits, features = self._run(input_ids, self.prefill_extra)
        if self.recording:
            self.cache.crop(0)  # a recording sliding layer trims back to its window only when cropped
        return logits[-1], features

    def verify(self, ids: torch.Tensor, position: int):
        if self.native_linear:
            length = self.cache.get_seq_length()
            if length > position or self.cache_recording:
                self.cache.crop(min(position - length, 0))  # crop(0) also trims the recorded conv inputs
            # record the state after every position of this block (transformers rolls back to it at the next crop)
            activate_linear_recording(self.cache, ids.shape[1])
            self.cache_recording = True
            logits, features = self._run(ids, {})
            return logits[-ids.shape[1]:], features
        if self.rollback is None and has_linear_state(self.cache):
            self.rollback = LinearStateRollback(self.cache)
        length = self.cache.get_seq_length()
        if self.rollback is not None:
            self._roll_back(length, position)
        elif length > position or self.recording:
            # rollback: the last round's rejected rows (recording sliding layers: crop(0) trims to the window)
            self.cache.crop(min(position - length, 0))
        if self.rollback is not None and ids.shape[1] > 1:  # a block that may be partly rejected
            self.rollback.snapshot()
            self._verified = (position, ids)
        logits, features = self._run(ids, {})
        return logits[-ids.shape[1]:], features

    def _roll_back(self, length: int, position: int) -> None:
        """Linear-attention targets: undo the last verify's rejected rows (restore its snapshot, replay the accepted
        ones, without taps), or drop the snapshot when every row was kept."""
        verified, self._verified = self._verified, None
        if length <= position:
            self.rollback.discard()
            return
        if verified is None:
            raise RuntimeError(f"the cache holds {length} tokens, past position {position}, with no snapshot to "
                               "roll its linear-attention state back to")
        start, ids = verified
        crop_attention_layers(self.cache, length - start)
        self.rollback.restore()
        kept = ids[:, : position - start]
        if kept.shape[1]:
            self.target(input_ids=kept, **{self.cache_name: self.cache}, use_cache=True, **self.prefill_extra)


@takes_request
@torch.no_grad()
def generate(target, drafter: FoldDrafter | None = None, input_ids: torch.Tensor | None = None,
             attention_mask: torch.Tensor | None = None, *, request: GenerationRequest | None = None, **settings):
    """Speculative decoding of ``target`` with a FOLD ``drafter`` (or plain AR when ``drafter`` is None).

    Args:
        target: a transformers causal LM.
        drafter: a :class:`FoldDrafter` for this target, or None for the autoregressive baseline.
        input_ids: ``[B, L]`` prompt(s); a batch's rows are decoded one after another (:mod:`.batch`).
        attention_mask: ``[B, L]``, left padding only (zeros before each row's prompt), or None.
        request, **settings: the call's settings, :class:`~fold_hf.generation.request.GenerationRequest`'s fields
            as keyword arguments (``max_new_tokens``, ``do_sample``, ``eos_token_id``, ``return_stats``, ...).

    Returns:
        ``[1, P + N]`` sequences for one unpadded prompt (a batch: ``[B, L + N]``, transformers' layout), or a
        :class:`GenerationResult` (a batch: :class:`BatchGenerationResult`) with ``return_stats=True``.
    """
    request = GenerationRequest.of("generate", request, settings)
    budget = request.check(input_ids, attention_mask)
    if request.exact:
        raise ValueError("exact=True runs on fold_hf.fast_generate's static and graphs engines (docs/exact-mode.md); "
                         "fold_hf.generate runs the model's own forward, whose kernels choose their reduction order "
                         "by the number of rows")
    if drafter is not None and not isinstance(drafter, FoldDrafter):
        raise ValueError(f"drafter must be a FoldDrafter, got {type(drafter).__name__}")
    if needs_rows(input_ids, attention_mask):
        return decode_rows(functools.partial(_generate_row, target, drafter), target, input_ids, attention_mask,
                           request, budget, why="fold_hf.generate runs the model's own forward a row at a time; "
                                                "fast_generate runs batched rounds")
    result = _generate_row(target, drafter, input_ids, request.for_row(0, budget))
    return result if request.return_stats else result.sequences


def _generate_row(target, drafter, input_ids: torch.Tensor, request: GenerationRequest) -> GenerationResult:
    """One unpadded prompt ``input_ids`` ``[1, P]``, ``request.max_new_tokens`` new tokens at most."""
    max_new_tokens = request.max_new_tokens
    prompt_len = input_ids.shape[1]
    warn_past_context(target, prompt_len, max_new_tokens, stacklevel=4)
    with drafter_for_call(target, drafter, request.fold_config):
        sampling = request.sampling()
        out = request.tracker(target)
        taps = tuple(drafter.config.target_layer_ids) if drafter is not None else ()
        runner = ForwardRunner(target, taps, taps_device=drafter.device if drafter is not None else None)
        with target_attention_probe(target, drafter):  # cmr only: the target's attention for its refreshes
            cache = drafter.new_cache(request_length=prompt_len + max_new_tokens) if drafter is not None else None

            def make_choice(logits: torch.Tensor) -> TokenChoice:
                return TokenChoice(sampling, request.generator, logits.shape[-1], logits.device, input_ids, out.eos,
                                   num_proposals(drafter))

            rounds = functools.partial(eager_rounds, runner, drafter, cache, max_new_tokens, out)
            return decode(runner, drafter, input_ids, out, make_choice, rounds, prefill_chunk=None)
