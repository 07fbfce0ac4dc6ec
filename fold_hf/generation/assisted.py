"""FOLD's candidate generator for transformers' assisted loop (``target.generate(..., assistant_model=<FoldDrafter>)``
when the request does not take the fast loop, or with ``fold_fast=False``).

transformers hard-codes its candidate generators (docs/design.md §5); :mod:`fold_hf.integrations.transformers`
makes ``GenerationMixin._get_candidate_generator`` return :class:`FoldCandidateGenerator` whenever the assistant is a
:class:`FoldDrafter` (unless ``speculation_type="dflash"`` asks for transformers' own DFlash generator).

Hybrid targets (Qwen3.5: linear-attention layers with recurrent state): on transformers 5.25 the cache records the
state after every verified position itself (``activate_past_recording(recurrent_states_to_keep=``
:attr:`FoldCandidateGenerator.num_drafting_tokens` ``)``, called by the assisted loop) and ``crop`` restores it; on
older releases the target's cache becomes a rolling-back cache (:func:`fold_hf.targets.rollback.make_rollback_cache`):
the generator snapshots the linear states before each verify, ``crop`` restores them, and the generator replays the
accepted tokens.

Hidden states come from forward hooks on the tapped target layers rather than ``output_hidden_states``: a long prompt
would otherwise keep every layer's states, and the index convention of ``output_hidden_states=[...]`` changed between
transformers 5.17 and 5.2x.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn
from transformers.generation.candidate_generator import CandidateGenerator

from ..modeling.drafter import FoldDrafter
from ..modeling.retrieval import TargetAttentionProbe, retrieval_state
from ..targets.gemma import slices_before_taps
from ..targets.taps import HiddenTaps, _unwrap

class FoldCandidateGenerator(CandidateGenerator):
    """Drafts a block per round with a :class:`FoldDrafter`; only accepted positions enter its cache."""

    requires_model_outputs = True
    model_kwargs_overrides: dict[str, Any] = {}

    def __init__(self, target: nn.Module, drafter: FoldDrafter, generation_config, logits_processor=None,
                 tokenizer=None) -> None:
        drafter.bind_target(target)
        self.drafter = drafter
        self.block_size = drafter.block_size
        self.max_length = generation_config.max_length
        self.do_sample = bool(generation_config.do_sample)
        self.logits_processor = logits_processor
        self.cache = drafter.new_cache(request_length=generation_config.max_length)
        self.taps = HiddenTaps(target, drafter.config.target_layer_ids, device=drafter.device).__enter__()
        self.probe = None
        if drafter.fold_config.mode == "cmr":  # its refreshes read the target's attention of the verifications
            self.probe = TargetAttentionProbe(target).__enter__()
            retrieval_state(self.cache).probe = self.probe
        self.acceptance_lengths: list[int] = []
        self.proposals: list[list[int]] = []
        eos = generation_config.eos_token_id
        self.eos = set([eos] if isinstance(eos, int) else list(eos or []))
        stops = generation_config.stop_strings
        self.stop_strings = [stops] if isinstance(stops, str) else list(stops or [])
        self.tokenizer = tokenizer
        self._prefill = True
        self._prefill_round = False
        if slices_before_taps(target, drafter.config.target_layer_ids):
            # the prefill must keep every position up to the tapped layers (Gemma-4 KV sharing cuts at logits_to_keep)
            self.model_kwargs_overrides = {"logits_to_keep": 0}
        drafter.last_acceptance_lengths = self.acceptance_lengths
        drafter.last_proposals = self.proposals
        self.target = target
        # hybrid targets: the cache rolls back its linear-attention state (rollback.py); set by the decoding wrapper
        self.rollback_cache = None
        try:
            params = set(inspect.signature(_unwrap(target).forward).parameters)
        except (TypeError, ValueError):
            params = set()
        self._cache_name = "cache" if "cache" in params else "past_key_values"
        self._replay_extra = {"logits_to_keep": 1} if "logits_to_keep" in params else {}

    @property
    def num_drafting_tokens(self) -> int:
        """How many positions of a verify forward a hybrid cache records the recurrent state after (transformers
        5.25's assisted loop passes it to ``activate_past_recording``): every verified position, the last committed
        token and the ``k`` drafts. With only ``k``, the first position runs in the chunked kernel, unrecorded, and a
        round that rejects every draft would roll back to the state before the whole block."""
        return int(self.drafter.num_proposals) + 1

    def close(self) -> None:
        self.taps.__exit__(None, None, None)
        if self.probe is not None:
            self.probe.__exit__(None, None, None)

    def get_candidates(self, input_ids: torch.LongTensor, model_kwargs=None, model_outputs=None,
                       is_first_iteration: bool = False, n_last_matches: int = 0, **kwargs):
        if is_first_iteration:
            self._prefill_round = True
            return input_ids, None  # let the target prefill and pick the first token
        features = self.taps.features()
        committed = input_ids.shape[1] - 1 if self._prefill else n_last_matches + 1
        context = features[:, :committed]
        self._prefill = False
        k = min(self.drafter.num_proposals, self.max_length - input_ids.shape[1] - 1)
        if k <= 0:
            self.proposals.append([])  # the round still verifies: the target's own token
            return input_ids, None
        processors = self.logits_processor if self.logits_processor is not None and len(self.logits_processor) else None
        chosen = [input_ids]

        def pick(logits: torch.Tensor, first_slot: int = 0):
            """Tokens ``[m]`` from the drafter's final logits ``[m, V]`` and the scores transformers verifies with."""
            scores = logits.to(input_ids.device, torch.float32)
            if processors is not None:  # processors see the ids drafted so far, one slot at a time
                rows = []
                for i in range(scores.shape[0]):
                    row = processors(torch.cat(chosen, -1), scores[i : i + 1])
                    token = (torch.multinomial(row.softmax(-1), 1) if self.do_sample else row.argmax(-1, keepdim=True))
                    chosen.append(token)
                    rows.append(row)
                return torch.cat(chosen[-len(rows):], -1)[0], torch.cat(rows)
            tokens = torch.multinomial(scores.softmax(-1), 1)[:, 0] if self.do_sample else scores.argmax(-1)
            chosen.append(tokens[None])
            return tokens, scores

        drafts, logits = self.drafter.propose(input_ids[0, -1:], context, self.cache,
                                              block_start=input_ids.shape[1] - 1, count=k, pick=pick)
        drafts, logits = drafts[None].to(input_ids.device), logits[None]
        keep = self._draft_length_before_stop(input_ids, drafts[0].tolist())
        self.proposals.append(drafts[0, :keep].tolist())
        if self.rollback_cache is not None and keep > 0:
            self.rollback_cache.fold_snapshot()  # the state before this verify, restored on a rejection
        return torch.cat((input_ids, drafts[:, :keep]), dim=-1), logits[:, :keep]

    def _draft_length_before_stop(self, input_ids: torch.LongTensor, drafts: list[int]) -> int:
        """Drafts kept so that no draft ends generation: an EOS or a stop string can then only be completed by the
        target's own token, which is always last in a round, where every transformers version checks for it."""
        for i, token in enumerate(drafts):
            if token in self.eos:
                return i
        if not self.stop_strings or self.tokenizer is None:
            return len(drafts)
        longest = max(len(s) for s in self.stop_strings)
        tail = input_ids[0, -(longest + 2):].tolist()
        before = self.tokenizer.decode(tail)
        counts = [before.count(s) for s in self.stop_strings]
        for i in range(len(drafts)):
            text = self.tokenizer.decode(tail + drafts[: i + 1])
            if any(text.count(s) > c for s, c in zip(self.stop_strings, counts)):
                return i
        return len(drafts)

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int):
        if self._prefill_round:  # the prefill is no verification round
            self._prefill_round = False
            return
        self.acceptance_lengths.append(int(num_matches) + 1)
        if self.rollback_cache is not None:
            # replay the accepted tokens after a rejection, without the taps (they hold this verify's features)
            self.taps.__exit__(None, None, None)
            try:
                self.rollback_cache.fold_replay(self.target, input_ids, self._cache_name, self._replay_extra)
            finally:
                self.taps.__enter__()
