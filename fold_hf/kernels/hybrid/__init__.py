"""The fused ops Qwen3.5 and Gemma target layers share: residual norms (fp32-weighted, zero-centred, sandwich, with
``layer_scalar``), per-head norm + partial rope + (ring) cache write, and Qwen3.5's sigmoid output gate; the
Triton helpers the other target-layer kernels share. Gemma-only ops: :mod:`fold_hf.kernels.gemma`; the gated delta
rule and its output norm: :mod:`fold_hf.kernels.gated_delta`. Torch twins in :mod:`.naive`, Triton kernels in
:mod:`.triton` (imported only through :func:`fold_hf.kernels.default_hybrid_ops`, never on the CPU path)."""
