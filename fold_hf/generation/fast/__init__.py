"""`fast_generate`: the foundation loop (:func:`fold_hf.generate`) rebuilt for speed, same results.

What changes against :mod:`fold_hf.generation.loop` (which runs any causal LM through its own ``forward``):

* the target runs through its family's :class:`~fold_hf.targets.base.StaticTarget`: our forward over the
  model's own modules with a preallocated KV cache; rollback rewinds a length;
* the drafter's :class:`~fold_hf.modeling.cache.FoldCache` is preallocated for the whole request (nothing
  reallocates) and the prompt's context is committed chunk by chunk during the prefill;
* token choice is on the device (:mod:`~fold_hf.generation.sampling`: greedy match count or speculative sampling
  with temperature, top-k, top-p, min-p, the repetition penalty and ``min_new_tokens``); each round reads one
  small tensor back (the accepted count with the round's tokens) and nothing else;
* engines:

  ``eager``   host-side lengths, exact-length attention (flash decoding for one query), the drafter through
              :meth:`FoldDrafter.draft_logits` exactly as the foundation loop calls it. Default on CPU.
  ``static``  every length lives in a device state tensor and every step has fixed shapes (what ``graphs``
              captures), run without capture: the graph path's logic, testable on CPU.
  ``graphs``  ``static`` with each step captured once in a CUDA graph and replayed. A round (the drafter's
              static step, the verify, the acceptance and the state update) is one step, with one graph per
              (query length, attention bucket, drafter variant): the bucket grows with the context (length
              dispatch), so a short context does not read the whole capacity. The drafter's part is captured
              when the FOLD Triton kernel (``fold_hf.kernels.fold_read.triton``) imports, in every reading mode
              (the baselines too, :mod:`~fold_hf.generation.static_drafter`; cmr's phases each a variant),
              with a window-only variant until the context exceeds W; sliding-window drafter layers included,
              the window-only variant runs until some layer's far memory is non-empty (a sliding layer's: past
              sliding_window - B entries). The next round is queued before the previous one's result is read
              whenever its variant does not depend on that result (:func:`static_rounds`). Default on CUDA.

* ``target_attention`` (static and graphs engines): ``"triton"`` (default on CUDA with Triton) runs the verify
  step's attention through the decode kernel :func:`fold_hf.kernels.fold_read.triton.decode_attention_triton` (its
  torch twin off CUDA), which reads the lengths from the device state; ``"bucket"`` (default elsewhere) attends
  over the length bucket with two matmuls and a masked fp32 softmax (far slower at long contexts: measured in
  docs/fast-path.md). The environment variable ``FOLD_HF_TARGET_ATTENTION`` sets the
  default. The eager engine always uses SDPA over the exact prefix.

* ``fused_layers`` (static and graphs engines, with ``target_attention="triton"``): the target's norms with
  their residual adds, the rope with the cache write and the MLP's ``silu(gate) * up`` run as three fused
  kernels per layer (:mod:`fold_hf.kernels.layer.triton`; torch twins off CUDA) instead of ~30 small module
  kernels. Default: on when the attention is ``"triton"`` on CUDA and the target's layers allow it
  (:meth:`StaticTarget.fused_unsupported`); ``$FOLD_HF_FUSED_LAYERS`` (``0``/``1``) overrides. Qwen3.5 and Gemma
  targets have their own fused layers (:mod:`fold_hf.kernels.hybrid.triton`, in their family modules).

* ``drafter=None`` is autoregressive decoding on the same machinery (block size 1), so AR and speculative
  timings compare like with like.

Targets: the families of :data:`fold_hf.targets.registry.FAMILIES`: the Llama family (:mod:`fold_hf.targets.llama`;
its architectures are :data:`SUPPORTED_ARCHITECTURES`), Gemma-3 / Gemma-4 text (:mod:`fold_hf.targets.gemma`, with ring
caches for sliding layers), Qwen3.5 (:mod:`fold_hf.targets.qwen35`, whose verify keeps the linear-attention state
of every block position (fused layers: the block's inputs) and ``accept(n)`` selects (re-runs) the accepted one on the device, inside the captured verify); batch 1; anything else raises a ValueError saying why (use
:func:`fold_hf.generate` for those). The round loop of the eager engine is
:func:`fold_hf.generation.rounds.eager_rounds`, the one :func:`fold_hf.generate` runs; EOS, stop strings, streamers
and the returned :class:`GenerationResult` come from :class:`~fold_hf.generation.tracker.Tracker`.

Sessions: the KV cache, drafter cache and captured graphs are kept on the target between calls (capture costs
once) and rebuilt when a request needs more room; :func:`release_fast_state` frees them.

Modules: :mod:`.api` (:func:`fast_generate`, :func:`fast_unsupported`), :mod:`.settings` (the ``$FOLD_HF_*``
knobs and the fallback warnings), :mod:`.session` (what a target keeps between calls), :mod:`.engine` (one
request's rounds: host-length or device-length), :mod:`.device_rounds` (the static and graphs engines' rounds),
:mod:`.timing` (:func:`time_rounds`).
"""

from __future__ import annotations

from ...targets.llama import ARCHITECTURES as SUPPORTED_ARCHITECTURES
from .api import ENGINES, fast_generate, fast_unsupported
from .device_rounds import Launched
from .session import KEPT_DRAFT_MODES, SESSION_ATTR, drafter_cache_of, release_fast_state, session_for
from .settings import _WARNED, resolve_fused_layers
from .timing import time_rounds

# names tests and benchmarks read here from before this module became a package; a name the package's code looks up
# (EagerStep, resolve_fused_drafter, decode_request) is not re-exported, so patching it here fails loudly: patch it
# in the module that uses it
_SESSION_ATTR = SESSION_ATTR
_session = session_for
_Launched = Launched

__all__ = ["ENGINES", "SUPPORTED_ARCHITECTURES", "drafter_cache_of", "fast_generate", "fast_unsupported",
           "release_fast_state", "time_rounds"]
