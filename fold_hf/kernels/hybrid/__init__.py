"""The fused ops of Qwen3.5 and Gemma target layers other than the gated delta rule
(:mod:`fold_hf.kernels.gated_delta`): residual / gated norms, per-head norm + partial rope + (ring) cache write, ring attention, GELU-tanh and sigmoid
products. Torch twins in :mod:`.naive`, Triton kernels in :mod:`.triton` (imported only through
:func:`fold_hf.kernels.default_hybrid_ops`, never on the CPU path)."""
