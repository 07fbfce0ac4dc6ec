"""`fast_generate`: the foundation loop (:func:`fold_hf.generate`) rebuilt for speed, same results: a preallocated
target KV cache (:class:`~fold_hf.targets.base.StaticTarget`) and drafter cache, token choice on the
device, engines ``eager`` / ``static`` / ``graphs`` (CUDA graphs). How it works, its engines, attention and fused
layers, the targets it runs and its sessions: docs/fast-loop.md.

Modules: :mod:`.api` (:func:`fast_generate`, :func:`fast_unsupported`), :mod:`.settings` (the ``$FOLD_HF_*`` knobs and
the fallback warnings), :mod:`.session` (what a target keeps between calls), :mod:`.engine` (one request's rounds),
:mod:`.device_rounds` (the static and graphs engines' rounds), :mod:`.batched` (a batch's rows in batched rounds),
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
