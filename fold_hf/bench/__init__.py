"""`fold-hf bench`: τ and speedup of every reading mode against AR, by input length, on real long inputs.

Parts (each importable on its own; this package imports them on first use of a name, so reading the method or
suite names, e.g. for ``fold-hf bench --help``, imports neither torch nor transformers):

* :mod:`.methods`: the methods a run compares (AR, FOLD at each α, the baselines) and the decode engines.
* :mod:`.suites`: the request suites, built from evaluation sources only (:mod:`fold_hf.data`):

  - ``code``: an installed package's source arranged like Long Code Arena: other files first, files of the cut
    file's directory nearest, the cut file's prefix last; the target continues the file.
  - ``books``: spans of held-out Gutenberg plays; the target continues the text.
  - ``retrieval``: a span whose end restarts a passage from its first quarter, so the continuation copies
    content thousands of tokens back (where the far memory matters).
  - ``mixed``: six kinds of text from the evaluation side of the data mix (:mod:`fold_hf.data.mix`), nested,
    after the overlap check against the training side (:func:`.suites.build_mixed_suite`).

* :mod:`.run`: every request runs AR and every method in the same process, one after the other, so each method
  is paired with an AR run of the same request on the same machine. Results are appended per request to
  ``runs.jsonl`` (a run resumes where it stopped; runs from several jobs merge by request id).
* :mod:`.summary`: τ, speedup = mean over requests of TPOT_AR / TPOT_method with 95% bootstrap CIs (2,000
  paired resamples, fixed seed), the number of outputs differing from AR, paired comparisons and length
  retention; writes JSON and CSV, and the plots of :mod:`.plots`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..import_utils import lazy_attributes

# part -> the public names it defines
_EXPORTS = {
    ".methods": ("BENCH_ENGINES", "Method", "default_methods", "method_names", "window_sweep_methods"),
    ".plots": ("PLOT_METRICS", "plot_figure"),
    ".run": ("machine_info", "run_bench"),
    ".suites": ("DEFAULT_TIERS", "SUITES", "build_mixed_suite", "build_suite", "load_requests", "save_requests"),
    ".summary": ("headline_keys", "length_retention", "paired_comparison", "summarize"),
}

__all__ = sorted(name for names in _EXPORTS.values() for name in names)

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from .methods import BENCH_ENGINES, Method, default_methods, method_names, window_sweep_methods
    from .plots import PLOT_METRICS, plot_figure
    from .run import machine_info, run_bench
    from .suites import DEFAULT_TIERS, SUITES, build_mixed_suite, build_suite, load_requests, save_requests
    from .summary import headline_keys, length_retention, paired_comparison, summarize


__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS, globals())
