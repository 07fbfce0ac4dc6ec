"""Which loop ``target.generate(...)`` runs after ``import fold_hf`` (the rules are in docs/generate-paths.md).

``target.generate(..., assistant_model=<FoldDrafter>)`` decodes on the fast loop
(:func:`~fold_hf.generation.fast.fast_generate`) whenever the request allows it; ``fold_fast=True`` asks for it
without a drafter too (AR on the fast machinery); ``fold_fast=False`` keeps transformers' own loop; ``exact=True``
runs the fast loop in exact mode or raises (no fallback). A request
the fast loop cannot take runs transformers' loop with one warning naming the argument or setting that
prevented it (:func:`route_generate` returns that reason).

The request is read the way transformers reads it: ``model._prepare_generation_config`` merges the call's
settings over the model's generation config and the library defaults, so a model whose generation config
samples (``do_sample=True``, a temperature, top-p) gets sampling, and the settings transformers would apply by
default (top-k 50 when sampling) are applied too.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from transformers import GenerationConfig
from transformers.generation.utils import GenerateDecoderOnlyOutput

from ..modeling.drafter import FoldDrafter
from .request import warn_past_context

NOT_ROUTED = object()

# generation settings the fast loop applies, or that cannot change its output
APPLIED_SETTINGS = frozenset({
    "max_new_tokens", "max_length", "min_new_tokens", "min_length", "do_sample", "temperature", "top_k", "top_p",
    "min_p", "repetition_penalty", "eos_token_id", "pad_token_id", "bos_token_id", "stop_strings",
    "return_dict_in_generate", "use_cache", "num_beams", "num_return_sequences", "output_scores", "output_logits",
    "output_attentions", "output_hidden_states", "transformers_version", "_from_model_config",
    "decoder_start_token_id", "num_assistant_tokens", "num_assistant_tokens_schedule",
    "assistant_confidence_threshold", "cache_implementation", "cache_config", "compile_config", "disable_compile",
    "is_assistant", "max_cache_len", "speculation_type", "length_penalty", "early_stopping",
})
# generate() arguments the fast loop takes (other arguments are named in the warning)
GENERATE_ARGUMENTS = frozenset({"inputs", "input_ids", "attention_mask", "assistant_model", "streamer", "tokenizer",
                                "generation_config", "synced_gpus", "use_cache", "logits_processor",
                                "stopping_criteria"})


@dataclass
class FoldGenerateOutput(GenerateDecoderOnlyOutput):
    """``return_dict_in_generate=True`` from the fast loop: ``sequences`` plus the acceptance statistics.

    Attributes:
        acceptance_lengths: tokens committed per verification round (the target's own token included).
        tau: their mean.
        finish_reason: ``"length"``, ``"eos"`` or ``"stop_string"``.

    For a batch of ``B > 1`` prompts each of these is a list with one entry per row.
    """

    acceptance_lengths: list | None = None
    tau: float | list | None = None
    finish_reason: str | list | None = None


@functools.lru_cache(maxsize=None)
def _setting_names() -> frozenset:
    """The names of every generation setting (built once: a GenerationConfig's to_dict deep-copies)."""
    return frozenset(GenerationConfig().to_dict())


@functools.lru_cache(maxsize=8)
def _library_defaults(config_class) -> dict:
    """What every setting is when nobody sets it (transformers' library defaults), once per config class."""
    config = GenerationConfig()
    defaults = getattr(config_class, "_get_default_generation_params", None)
    if defaults is not None:
        config.update(**defaults(), defaults_only=True)
    return config.to_dict()


def _defaults(model) -> dict:
    return _library_defaults(type(model.generation_config))


def _inputs(args: tuple, kwargs: dict):
    if args:
        return args[0]
    return kwargs.get("inputs", kwargs.get("input_ids"))


def _reason_not_to_route(model, args: tuple, kwargs: dict, config) -> str | None:
    from .fast import fast_unsupported

    if len(args) > 1:
        return "positional arguments after the inputs"
    settings = _setting_names()
    extra = sorted(k for k, v in kwargs.items() if k not in GENERATE_ARGUMENTS and k not in settings
                   and v is not None)
    if extra:
        return f"argument(s) {', '.join(extra)} (the fast loop does not take them)"
    for name in ("logits_processor", "stopping_criteria"):
        if kwargs.get(name):
            return f"{name} (custom {name.replace('_', ' ')} run in transformers' loop only)"
    if kwargs.get("synced_gpus"):
        return "synced_gpus=True"
    if config.num_beams not in (None, 1):
        return f"num_beams={config.num_beams} (beam search)"
    if config.num_return_sequences not in (None, 1):
        return f"num_return_sequences={config.num_return_sequences}"
    for name in ("output_scores", "output_logits", "output_attentions", "output_hidden_states"):
        if getattr(config, name, False):
            return f"{name}=True (the fast loop returns sequences and acceptance statistics)"
    if getattr(config, "speculation_type", None) == "dflash":
        return "speculation_type='dflash' (transformers' own DFlash candidate generator was asked for)"
    defaults = _defaults(model)
    active = sorted(k for k, v in config.to_dict().items() if k not in APPLIED_SETTINGS and v != defaults.get(k))
    if active:
        shown = ", ".join(f"{k}={getattr(config, k)!r}" for k in active)
        return f"generation setting(s) {shown} (the fast loop does not apply them)"
    inputs = _inputs(args, kwargs)
    if not isinstance(inputs, torch.Tensor) or inputs.dim() != 2 or inputs.dtype not in (torch.long, torch.int):
        return "inputs that are not a [batch, length] tensor of token ids"
    assistant = kwargs.get("assistant_model")
    new = config.max_new_tokens if config.max_new_tokens is not None else (config.max_length or 20) - inputs.shape[1]
    block = getattr(assistant, "block_size", 1)
    return fast_unsupported(model, assistant, capacity=inputs.shape[1] + new + block)


def _request_config(model, kwargs: dict):
    """The generation config transformers builds for this call (the call's settings over the model's)."""
    names = _setting_names()
    settings = {k: v for k, v in kwargs.items() if k in names}
    config, _ = model._prepare_generation_config(kwargs.get("generation_config"), **settings)
    return config


def transformers_path(model, kwargs: dict) -> str:
    """What transformers' own ``generate`` runs for this call, as a phrase for the not-routed warning:
    its assisted loop with FOLD's candidate generator only when transformers' generation mode is assisted
    generation; otherwise the mode it runs, and that the drafter is not used (e.g. beam search)."""
    config = _request_config(model, kwargs)
    assistant = kwargs.get("assistant_model")
    mode = config.get_generation_mode(assistant)
    name = str(getattr(mode, "value", mode)).replace("_", " ")
    if assistant is None:
        return f"transformers' {name} loop"
    if name == "assisted generation":
        return "transformers' assisted loop with FOLD's candidate generator"
    return f"transformers' {name} without the assistant (that mode does not use one: the drafter is not used)"


def route_generate(model, args: tuple, kwargs: dict, exact: bool = False):
    """``model.generate(*args, **kwargs)`` on the fast loop when the request allows it (``exact``: in exact mode,
    docs/exact-mode.md; the wrapper refuses an exact request that is not routed).

    A batch (``[B, L]`` left-padded by ``attention_mask``) runs in the fast loop's batched rounds where they take it
    (:mod:`.fast.batched`), else row by row (:mod:`.batch`); its
    ``acceptance_lengths``, ``tau`` and ``finish_reason`` (and ``drafter.last_acceptance_lengths``) are per-row lists.

    Returns:
        (sequences ``[1, P + N]`` (a batch: ``[B, L + N]``) or a :class:`FoldGenerateOutput`, None) when routed, else
        (:data:`NOT_ROUTED`, the reason as a phrase).
    """
    from .fast import fast_generate

    config = _request_config(model, kwargs)
    reason = _reason_not_to_route(model, args, kwargs, config)
    inputs = _inputs(args, kwargs)
    if reason is not None:
        if isinstance(inputs, torch.Tensor) and inputs.dim() == 2:  # transformers' loop says nothing about it
            new = config.max_new_tokens if config.max_new_tokens is not None else \
                max((config.max_length or 20) - inputs.shape[1], 0)
            warn_past_context(model, inputs.shape[1], new, stacklevel=4)
        return NOT_ROUTED, reason
    prompt_len = inputs.shape[1]
    prepare = getattr(model, "_prepare_special_tokens", None)
    if prepare is not None:  # transformers' own pad/eos warnings, word for word
        prepare(config, "attention_mask" in kwargs, device=inputs.device, batch_size=inputs.shape[0])
    max_new_tokens = config.max_new_tokens
    if max_new_tokens is None:
        max_new_tokens = (config.max_length if config.max_length is not None else 20) - prompt_len
    min_new_tokens = max(config.min_new_tokens or 0, (config.min_length or 0) - prompt_len)
    drafter = kwargs.get("assistant_model")
    result = fast_generate(
        model, drafter, inputs, kwargs.get("attention_mask"), max_new_tokens=max_new_tokens,
        do_sample=bool(config.do_sample), temperature=config.temperature, top_k=config.top_k, top_p=config.top_p,
        min_p=config.min_p, repetition_penalty=config.repetition_penalty, min_new_tokens=min_new_tokens,
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, stop_strings=config.stop_strings,
        tokenizer=kwargs.get("tokenizer"),
        streamer=kwargs.get("streamer"), return_stats=True, exact=exact)
    if isinstance(drafter, FoldDrafter):
        drafter.last_acceptance_lengths = result.acceptance_lengths
        drafter.last_proposals = result.proposals
    if config.return_dict_in_generate:
        return FoldGenerateOutput(sequences=result.sequences, acceptance_lengths=result.acceptance_lengths,
                                  tau=result.tau, finish_reason=result.finish_reason), None
    return result.sequences, None
