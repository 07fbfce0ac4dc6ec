"""The fused ops of Gemma target layers that Qwen3.5's do not share: the GELU-tanh MLP product and the sliding
layers' ring attention. Torch twins in :mod:`.naive`, Triton kernels in :mod:`.triton` (imported only through
:func:`fold_hf.kernels.default_hybrid_ops`, never on the CPU path)."""
