"""`FoldDrafter`: a DFlash block-parallel drafter whose context read is set by a `FoldConfig`.

Forward semantics of z-lab DFlash (docs/design.md §4):

* context feature ``c_j = hidden_norm(fc(concat_l h_l[j]))``, ``h_l`` = output of target layer ``l``;
* every layer derives context keys/values ``k_norm(k_proj(c))``, ``v_proj(c)`` (no input layernorm on
  ``c``) and block queries/keys/values from its normed block hidden;
* the block (slot 0 = embedding of the last committed token, slots 1.. = mask token) attends to
  itself bidirectionally and to the context;
* output: final norm, then the target's ``lm_head`` on slots ``1 .. B-1``.

A z-lab drafter holds no embedding or ``lm_head`` of its own: :meth:`FoldDrafter.bind_target` borrows
the target's. DeepSpec drafters (DFlash / DSpark, :mod:`fold_hf.modeling.families.deepspec`) bring their own,
predict at every slot ``0 .. B-1`` and may carry a Markov head; the loops ask any drafter for its proposals through
:meth:`FoldDrafter.propose`, so verification and rollback do not depend on the family.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput

from ..kernels.gemm.cpu import linear_module
from .attention import FOLD_ATTENTION, drafter_read
from .cache import FoldCache
from .drafter_config import FoldDrafterConfig
from .drafter_layer import DrafterAttention, DrafterLayer, RMSNorm
from .draft_vocab import DraftVocab
from .drafter_rows import propose_rows
from .families import deepspec
from .fold_config import FoldConfig
from .read_plan import LayerRead, ReadGeometry, plan_layer_read, read_geometry
from .retrieval import (RETRIEVAL_MODES, RetrievalParams, cmr_select_entries, plan_cmr_read, plan_infllm_read,
                        retrieval_state)
from .rope import RotaryTables, yarn_factor, yarn_rope_parameters


def execution_device(module: nn.Module) -> torch.device:
    """Device a target module computes on: accelerate's execution device when the module is dispatched (its weights
    may then sit on ``meta``, offloaded to CPU or disk), else the device of its first parameter."""
    hook = getattr(module, "_hf_hook", None)
    device = getattr(hook, "execution_device", None)
    if device is not None:
        return torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    return next(module.parameters()).device


def _store_entries(cache, idx: int, k_new, v_new, k_blk: torch.Tensor, v_blk: torch.Tensor):
    """Layer ``idx``'s context after storing its new entries ``k_new`` / ``v_new [b, Hkv, n, D]`` (None: nothing new):
    ``(keys, values [b, Hkv, T, D], rotated keys or None)``. A :class:`FoldCache` keeps the context only;
    transformers' native DFlash cache keeps the context then the block ``k_blk`` / ``v_blk [b, Hkv, Lq, D]`` (its
    generator crops the block later), so the block is cut off the answer."""
    if not isinstance(cache, FoldCache):
        k_app = k_blk if k_new is None else torch.cat((k_new, k_blk), dim=2)
        v_app = v_blk if v_new is None else torch.cat((v_new, v_blk), dim=2)
        keys, values = cache.update(k_app, v_app, idx)
        Lq = k_blk.shape[2]
        return keys[:, :, :-Lq], values[:, :, :-Lq], None
    layer = cache.layers[idx]
    if k_new is not None:
        keys, values = layer.update(k_new, v_new)
    elif layer.is_initialized:
        keys, values = layer.context()
    else:
        return k_blk[:, :, :0], v_blk[:, :, :0], None
    return keys, values, layer.rotated_context()


def _planned_read(attn: DrafterAttention, q, k_ctx, v_ctx, k_ctx_rotated, k_blk, v_blk, read: LayerRead):
    """``attn``'s read ``[b, Lq, Hq, D]`` of its context ``k_ctx`` / ``v_ctx [b, Hkv, T, D]`` (and the rotated copy
    of the keys, or None) and the block through the drafter's attention implementation, as ``read`` plans it."""
    if read.gather is not None:  # a compact context (InfLLM): the read's indices refer to it
        k_ctx, v_ctx = k_ctx.index_select(2, read.gather), v_ctx.index_select(2, read.gather)
        k_ctx_rotated = None if k_ctx_rotated is None else k_ctx_rotated.index_select(2, read.gather)
    if k_ctx_rotated is not None and not (read.true_positions and read.rope is attn.rope):
        k_ctx_rotated = None  # the rotated copy holds true positions under the base rope only
    out = drafter_read(attn, q, k_ctx, v_ctx, k_blk, v_blk, read, attn.scaling, k_ctx_rotated)
    if read.on_read is not None:
        read.on_read(attn, q, k_ctx, k_blk)
    return out


def _argmax_pick(logits: torch.Tensor, first_slot: int = 0):
    return logits.argmax(-1), None


class FoldDrafter(PreTrainedModel):
    """DFlash drafter with FOLD context reading (any `FoldConfig` mode, one code path).

    Load a released z-lab checkpoint with :meth:`from_pretrained`, attach it to a target with
    :meth:`bind_target` (done for you by ``fold_hf.generate`` and ``target.generate(assistant_model=...)``).
    """

    config_class = FoldDrafterConfig
    base_model_prefix = "drafter"
    _no_split_modules = ["DrafterLayer"]
    _supports_sdpa = True
    _supports_attention_backend = True
    main_input_name = "noise_embeds"

    def __init__(self, config: FoldDrafterConfig, fold_config: FoldConfig | None = None) -> None:
        # a drafter exists, so target.generate(assistant_model=drafter) must draft with it: install the integration
        # (the "fold" attention, the assistant strategy; idempotent), whatever the caller imported
        from ..integrations.transformers import install

        install()
        requested = getattr(config, "_attn_implementation_internal", None)
        super().__init__(config)
        if requested is None:  # transformers picks sdpa by default; the drafter reads through "fold"
            self.config._attn_implementation = FOLD_ATTENTION
        n_taps = len(config.target_layer_ids)
        self.fc = nn.Linear(n_taps * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.layers = nn.ModuleList([DrafterLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.fold_config = fold_config if fold_config is not None else FoldConfig(mode="dflash")
        self.is_deepspec = deepspec.is_deepspec(config)
        if self.is_deepspec:  # own embedding and lm_head, Markov and confidence heads
            deepspec.build_modules(self, config)
        # proposals of a DeepSpec drafter stop at the first slot whose confidence is below this (0: never)
        self.confidence_threshold = 0.0
        self.rope = (deepspec.rotary_tables(config) if self.is_deepspec else None) or RotaryTables.from_config(config)
        for layer in self.layers:
            layer.self_attn.rope = self.rope
        self._yarn_tables: dict[float, RotaryTables] = {}
        self._target_parts: tuple[Any, ...] | None = None
        # proposals only from these token ids (None: the whole vocabulary): use_draft_vocab
        self.draft_vocab: DraftVocab | None = None
        self.post_init()

    # ------------------------------------------------------------------ configuration
    @property
    def block_size(self) -> int:
        return self.config.block_size

    def set_fold_config(self, fold_config: FoldConfig) -> "FoldDrafter":
        """Switch the reading mode in place (no weights change)."""
        if not isinstance(fold_config, FoldConfig):
            raise TypeError(f"fold_config must be a FoldConfig, got {type(fold_config).__name__}")
        fold_config.validate()
        self.fold_config = fold_config
        return self

    def _init_weights(self, module: nn.Module) -> None:
        std = getattr(self.config, "initializer_range", 0.02)
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, RMSNorm) and module.weight is not None:
            nn.init.ones_(module.weight)

    # ------------------------------------------------------------------ target binding
    def bind_target(self, target: nn.Module) -> "FoldDrafter":
        """Borrow the target's input embedding and lm_head after checking the pair fits (ValueError if not)."""
        from .validation import validate_pair

        validate_pair(self, target)
        self._target_parts = (target.get_input_embeddings(), target.get_output_embeddings(), id(target))
        self._warn_on_dtype_mismatch(target)
        if self.draft_vocab is not None:  # the head rows now, before any graph is captured
            self.draft_vocab.head_rows(self._draft_head().weight)
        return self

    def use_draft_vocab(self, vocab: "DraftVocab | str | None") -> "FoldDrafter":
        """Propose only from a subset of the vocabulary (:mod:`fold_hf.modeling.draft_vocab`): a
        :class:`DraftVocab`, a ``draft_vocab.json`` (or the folder holding one), or None for the whole vocabulary.
        Outputs are unchanged (greedy equals AR, sampling stays exact); a round reads ``V' / V`` of the lm_head for
        the proposals. Checked against the head the drafter reads (the target's, or a DeepSpec drafter's own)."""
        if vocab is not None and not isinstance(vocab, DraftVocab):
            vocab = DraftVocab.load(vocab)
        if vocab is not None and (self.is_deepspec or self._target_parts is not None):
            vocab.head_rows(self._draft_head().weight)  # checks the size; copies the rows once
        self.draft_vocab = vocab
        return self

    def _draft_head(self) -> nn.Module:
        """The linear head the proposals go through: a DeepSpec drafter's own, else the target's."""
        return self.lm_head if self.is_deepspec else self.target_lm_head

    def _warn_on_dtype_mismatch(self, target: nn.Module) -> None:
        """Warn once per drafter when its weights and the target's embedding differ in dtype (a bf16 checkpoint
        loaded beside an fp32 target drafts in bf16: legal, but rarely what was meant)."""
        embedding = target.get_input_embeddings()
        mine, theirs = self.fc.weight.dtype, getattr(getattr(embedding, "weight", None), "dtype", None)
        if theirs is None or mine == theirs or getattr(self, "_dtype_warned", False):
            return
        self._dtype_warned = True
        warnings.warn(f"the drafter is {mine} and the target {theirs}: the drafter computes in {mine}. For matched "
                      f"dtypes load it with FoldDrafter.from_pretrained(..., dtype={theirs}) (or use "
                      f"fold_hf.load_embedded_pair for the demo pair)", stacklevel=3)

    @property
    def target_embedding(self) -> nn.Module:
        if self._target_parts is None:
            raise RuntimeError("the drafter has no target: call drafter.bind_target(target) first")
        return self._target_parts[0]

    @property
    def target_lm_head(self) -> nn.Module:
        if self._target_parts is None:
            raise RuntimeError("the drafter has no target: call drafter.bind_target(target) first")
        return self._target_parts[1]

    def new_cache(self, request_length: int | None = None, keep_rotated_copy: bool = False) -> FoldCache:
        """An empty context cache for one request (``request_length`` = P + G, used by ``yarn``)."""
        cache = FoldCache(len(self.layers), keep_rotated_copy=keep_rotated_copy, rope=self.rope,
                          request_length=request_length)
        probe = self.__dict__.get("_target_probe")  # cmr: the target attention probe of the running generate
        if probe is not None:
            retrieval_state(cache).probe = probe
        return cache

    # ------------------------------------------------------------------ reading geometry
    def read_rope(self, geometry: ReadGeometry, request_length: int | None, query_length: int,
                  cfg: FoldConfig) -> RotaryTables:
        """The rope tables a layer of ``geometry`` reads with: the drafter's own, or YaRN's rescaled ones for the
        request (``request_length`` = P + G) when ``geometry.yarn``."""
        if not geometry.yarn:
            return self.rope
        factor = yarn_factor(request_length, query_length, cfg.train_length)
        if factor == 1.0:
            return self.rope
        tables = self._yarn_tables.get(factor)
        if tables is None:
            tables = deepspec.rotary_tables(self.config, (factor, cfg.train_length)) if self.is_deepspec else None
            if tables is None:
                params = yarn_rope_parameters(self.config.rope_parameters, factor, cfg.train_length)
                tables = RotaryTables.from_config(self.config, params)
            self._yarn_tables[factor] = tables
        return tables

    def read_geometry(self, layer_idx: int, fold_config: FoldConfig | None = None) -> ReadGeometry:
        """Layer ``layer_idx``'s :class:`~fold_hf.modeling.read_plan.ReadGeometry` under ``fold_config`` (default:
        the drafter's own)."""
        return read_geometry(fold_config or self.fold_config, self.config.block_size,
                             self.layers[layer_idx].self_attn.sliding_window)

    def plan_read(self, layer_idx: int, num_context: int, block_start: int, query_length: int,
                  device: torch.device | str = "cpu", cache=None, fold_config: FoldConfig | None = None,
                  selection: torch.Tensor | None = None) -> LayerRead:
        """The geometry layer ``layer_idx`` reads with under ``fold_config`` (default: the drafter's own).

        ``cmr`` needs ``selection``, this round's entries (:func:`fold_hf.modeling.retrieval.cmr_select_entries`);
        ``infllm``'s full-attention layers are planned inside the forward (their selection needs the layer's
        queries and keys), its sliding layers here (as released)."""
        cfg = fold_config or self.fold_config
        attn = self.layers[layer_idx].self_attn
        geometry = self.read_geometry(layer_idx, cfg)
        rope = self.read_rope(geometry, getattr(cache, "request_length", None) or block_start, query_length, cfg)
        if geometry.selection == "cmr":
            if selection is None:
                raise ValueError("mode 'cmr' reads a selection: pass selection= (cmr_select_entries)")
            return plan_cmr_read(selection, num_context=num_context, block_start=block_start,
                                 query_length=query_length, rope=rope, sliding_window=geometry.window,
                                 device=device)
        return plan_layer_read(
            cfg,
            num_context=num_context,
            block_start=block_start,
            query_length=query_length,
            block_size=self.config.block_size,
            rope=rope,
            sliding_window=attn.sliding_window,
            device=device,
        )

    # ------------------------------------------------------------------ forward
    def context_features(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """``[b, n, n_taps * H]`` concatenated target hidden states -> ``[b, n, H]`` context features."""
        expected = self.fc.in_features
        if target_hidden.shape[-1] != expected:
            raise ValueError(
                f"context hidden states have {target_hidden.shape[-1]} features; the drafter's fc expects "
                f"{expected} = {len(self.config.target_layer_ids)} taps x hidden {self.config.hidden_size}"
            )
        return self.hidden_norm(linear_module(self.fc, target_hidden.to(self.fc.weight.dtype)))

    def forward(
        self,
        noise_embeds: torch.Tensor,
        context_hidden_states: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache=None,
        *,
        block_start: int | None = None,
        past_key_values=None,
        **kwargs: Any,
    ) -> BaseModelOutput:
        """Draft one block.

        Args:
            noise_embeds: ``[b, Lq, H]`` block embeddings (slot 0: last committed token, then mask tokens).
            context_hidden_states: ``[b, n, n_taps * H]`` target hidden states of the ``n`` newly committed
                tokens (their taps concatenated), or None when nothing new was committed.
            position_ids: ``[b, n + Lq]`` positions of the new context entries then the block (transformers'
                native DFlash call); context entries must be contiguous from 0.
            attention_mask: ``[b, total]`` padding mask of the native call; only all-ones is supported (batch 1).
            cache: a :class:`FoldCache` (context only), or any transformers ``Cache`` (native DFlash path, which
                keeps the block in the cache and crops it before the next call).
            block_start: position of block slot 0; defaults to the end of the context.

        Returns:
            ``BaseModelOutput`` with ``last_hidden_state [b, Lq, H]`` after the final norm.
        """
        cache = cache if cache is not None else past_key_values
        if cache is None:
            raise ValueError("FoldDrafter.forward needs a cache (drafter.new_cache())")
        if attention_mask is not None and not bool(torch.all(attention_mask != 0)):
            raise ValueError("padded inputs are not supported by FoldDrafter (batch size 1 only)")
        hidden = noise_embeds.to(self.fc.weight.dtype)
        b, Lq, _ = hidden.shape
        context = None
        n_new = 0
        if context_hidden_states is not None and context_hidden_states.shape[1]:
            context = self.context_features(context_hidden_states.to(hidden.device))
            n_new = context.shape[1]
        native = not isinstance(cache, FoldCache)
        num_context = cache.get_seq_length() + n_new
        if position_ids is not None:
            start = int(position_ids.reshape(-1)[-Lq])
            if start < num_context:
                raise ValueError(f"block position {start} precedes the end of the context ({num_context})")
            block_start = start if block_start is None else block_start
        if block_start is None:
            block_start = num_context
        if self.fold_config.mode in RETRIEVAL_MODES and native:
            raise ValueError(f"mode {self.fold_config.mode!r} keeps per-request state in a FoldCache; transformers' "
                             "native DFlash cache cannot hold it (use fold_hf.generate or target.generate without "
                             "speculation_type='dflash')")
        read = self.reader(cache, num_context, block_start, Lq, hidden.device)
        for layer in self.layers:
            hidden = layer(hidden, context, read)
        return BaseModelOutput(last_hidden_state=self.norm(hidden))

    def reader(self, cache, num_context: int, block_start: int, Lq: int, device):
        """The eager read of one request's block of ``Lq`` slots at ``block_start`` over ``cache`` (which will hold
        ``num_context`` entries): ``read(attn, q, k_new, v_new, k_blk, v_blk) -> [1, Lq, Hq, D]`` stores the new
        entries, plans the layer's read (once per kind of layer; per layer for InfLLM) and reads through it."""
        plans: dict[tuple, LayerRead] = {}
        cmr_entries = None
        if self.fold_config.mode == "cmr":  # one selection per round, read by every layer
            cmr_entries = cmr_select_entries(retrieval_state(cache), num_context, block_start,
                                             RetrievalParams.of(self.fold_config))

        def read_for(attn: DrafterAttention, T: int, query=None, context_keys=None) -> LayerRead:
            geometry = self.read_geometry(attn.layer_idx)
            if geometry.selection == "infllm":  # per layer: its own keys and queries select
                return plan_infllm_read(retrieval_state(cache), attn.layer_idx, query=query, context_keys=context_keys,
                                        block_start=block_start, geometry=geometry, rope=self.rope,
                                        params=RetrievalParams.of(self.fold_config))
            # other layers differ in their read only through their sliding window: plan once per kind of layer
            key = (attn.sliding_window, T)
            if key not in plans:
                plans[key] = self.plan_read(attn.layer_idx, T, block_start, Lq, device=device, cache=cache,
                                            selection=cmr_entries)
            return plans[key]

        def read(attn: DrafterAttention, q, k_new, v_new, k_blk, v_blk) -> torch.Tensor:
            """The eager read (see :meth:`DrafterAttention.forward`): store, plan, read through "fold"."""
            k_ctx, v_ctx, k_ctx_rotated = _store_entries(cache, attn.layer_idx, k_new, v_new, k_blk, v_blk)
            plan = read_for(attn, k_ctx.shape[2], query=q, context_keys=k_ctx)
            return _planned_read(attn, q, k_ctx, v_ctx, k_ctx_rotated, k_blk, v_blk, plan)

        return read

    # ------------------------------------------------------------------ proposals (family-free interface)
    @property
    def family(self) -> str:
        """``"deepspec"`` (DeepSpec DFlash / DSpark) or ``"zlab"`` (z-lab DFlash)."""
        return deepspec.FAMILY if self.is_deepspec else "zlab"

    @property
    def first_proposal_slot(self) -> int:
        """Block slot of the first prediction: 1 for z-lab (slot 0 only carries the anchor), 0 for DeepSpec."""
        return 0 if self.is_deepspec else 1

    @property
    def num_proposals(self) -> int:
        """Tokens one round drafts at most: B - 1 (z-lab) or B (DeepSpec); a round verifies one more."""
        return self.config.block_size - self.first_proposal_slot

    def set_confidence_threshold(self, threshold: float) -> "FoldDrafter":
        """Cut DeepSpec proposals at the first slot whose confidence ``sigmoid(head)`` is below ``threshold``
        (0, the default, keeps the whole block; DeepSpec's default too). Errors without a confidence head."""
        threshold = float(threshold)
        if threshold > 0 and getattr(self, "confidence_head", None) is None:
            raise ValueError("this drafter has no confidence head (config.json 'enable_confidence_head' is false)")
        if not 0.0 <= threshold < 1.0:
            raise ValueError(f"confidence threshold must be in [0, 1), got {threshold}")
        self.confidence_threshold = threshold
        return self

    def embed_block(self, ids: torch.Tensor) -> torch.Tensor:
        """Block embeddings ``[b, B, H]`` of ``ids [b, B]``, on the drafter's device and dtype."""
        if self.is_deepspec:
            out = deepspec.embed(self, ids)
        else:
            embed = self.target_embedding
            out = embed(ids.to(execution_device(embed)))
        return out.to(self.fc.weight.device, self.fc.weight.dtype)

    def block_ids(self, last_token: torch.Tensor) -> torch.Tensor:
        """``[b, B]``: the anchor ``last_token [b]`` then mask tokens."""
        B = self.config.block_size
        ids = torch.full((last_token.shape[0], B), self.config.mask_token_id, dtype=torch.long,
                         device=last_token.device)
        ids[:, 0] = last_token
        return ids

    def proposal_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Base logits ``[..., V]`` of final-normed proposal slots ``hidden [..., H]`` (before any Markov bias); with a
        draft vocabulary (:meth:`use_draft_vocab`) the head's rows of that subset only, ``-inf`` elsewhere."""
        if self.draft_vocab is not None:
            cap = getattr(self.config, "final_logit_softcapping", None) if self.is_deepspec else None
            return self.draft_vocab.logits(self._draft_head().weight, hidden, softcap=cap)
        if self.is_deepspec:
            return deepspec.logits(self, hidden)
        head = self.target_lm_head  # B - 1 rows: on a CPU through a packed GEMM (kernels/gemm/cpu.py)
        return linear_module(head, hidden.to(execution_device(head), head.weight.dtype))

    def pick_proposals(self, base: torch.Tensor, last_token: torch.Tensor, pick=None):
        """Tokens of one block from its base logits ``[n, V]``.

        ``pick(logits [m, V], first_slot=0) -> (tokens [m], scores [m, V] or None)`` chooses tokens from the final
        logits of slots ``first_slot ..`` (default: argmax, no scores); a sampler returns the distribution it drew
        from as scores (q of speculative sampling; :meth:`fold_hf.generation.sampling.TokenChoice.picker`). Without
        a Markov head every slot is picked at once; with one (DSpark), slot by slot, each slot's logits biased by the
        token picked before it (``last_token [1]`` before slot 0). Device ops only.

        Returns:
            (tokens ``[n]`` long, scores ``[n, V]`` or None).
        """
        if pick is None:
            pick = _argmax_pick
        if getattr(self, "markov_head", None) is not None:
            return deepspec.markov_chain(self, base, last_token, pick)
        return pick(base)

    def draft_head(self, hidden: torch.Tensor, last_token: torch.Tensor, pick=None, base=None):
        """The draft head on the final-normed proposal slots ``hidden [n, H]`` (device ops only; the eager
        :meth:`propose`, the static step and batched drafting call it; ``base``: their base logits when the caller
        computed them for several requests at once).

        Returns:
            (tokens ``[n]`` long, scores ``[n, V]`` or None (see :meth:`pick_proposals`), kept: a long device tensor
            ``[1]`` of the leading proposals a DeepSpec confidence threshold keeps, or None when nothing cuts).
        """
        tokens, scores = self.pick_proposals(self.proposal_logits(hidden) if base is None else base, last_token, pick)
        kept = None
        if self.is_deepspec and self.confidence_threshold > 0:
            kept = deepspec.confident_length(self, hidden, tokens, last_token, self.confidence_threshold)
        return tokens, scores, kept

    @torch.no_grad()
    def propose(self, last_token: torch.Tensor, context_hidden_states: torch.Tensor | None, cache: FoldCache,
                block_start: int | None = None, count: int | None = None, pick=None):
        """Draft one round: the family-free call every loop makes.

        Args:
            last_token: ``[1]`` the last committed token (the block's anchor).
            context_hidden_states: ``[1, n, n_taps * H]`` taps of tokens committed since the last call, or None.
            cache: the request's :class:`FoldCache` (receives the new context).
            block_start: position of the anchor.
            count: propose at most this many tokens (default :attr:`num_proposals`).
            pick: token chooser (see :meth:`pick_proposals`); default greedy.

        Returns:
            (tokens ``[k]`` on the drafter's logits device, scores ``[k, V]`` or None) with ``k <= count``; fewer
            when the confidence threshold cuts the proposal.
        """
        if block_start is None:  # the end of the context, once the new entries are in
            new = 0 if context_hidden_states is None else context_hidden_states.shape[1]
            block_start = cache.get_seq_length() + new
        # one request is one row of propose_rows
        return propose_rows(self, [last_token], [context_hidden_states], [cache], [block_start],
                            [self.num_proposals if count is None else count], [pick])[0]

    @torch.no_grad()
    def draft_logits(self, last_token: torch.Tensor, context_hidden_states: torch.Tensor | None,
                     cache: FoldCache, block_start: int | None = None) -> torch.Tensor:
        """Base logits ``[b, n, V]`` of the proposal slots (z-lab: slots 1..B-1, DeepSpec: 0..B-1, before any
        Markov bias) given the last committed token ``[b]``."""
        noise = self.embed_block(self.block_ids(last_token))
        out = self(noise, context_hidden_states, cache=cache, block_start=block_start).last_hidden_state
        return self.proposal_logits(out[:, self.first_proposal_slot :])

    # ------------------------------------------------------------------ checkpoints
    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, fold_config: FoldConfig | None = None,
                        dtype: torch.dtype | str | None = None, device: torch.device | str | None = None,
                        **kwargs) -> "FoldDrafter":
        """Load a z-lab DFlash or a DeepSpec DFlash/DSpark checkpoint (local dir or hub id), recognised by its
        ``config.json``. No code from the checkpoint runs.

        A ``fold_config.json`` beside the weights is used when ``fold_config`` is not given.
        """
        from .loading import load_drafter

        if model_args:
            raise TypeError("FoldDrafter.from_pretrained takes no positional arguments beyond the path")
        dtype = kwargs.pop("torch_dtype", dtype)
        if kwargs:
            raise TypeError(f"unexpected keyword arguments: {sorted(kwargs)}")
        return load_drafter(cls, pretrained_model_name_or_path, fold_config=fold_config, dtype=dtype, device=device)

    def save_pretrained(self, save_directory, **kwargs) -> None:
        """Write the layout the drafter was read in (z-lab or DeepSpec): ``config.json``, ``model.safetensors`` and
        ``fold_config.json``; ``draft_vocab.json`` when a draft vocabulary is in use (:meth:`use_draft_vocab`), which
        :meth:`from_pretrained` reads back."""
        from .loading import save_drafter

        save_drafter(self, save_directory)

