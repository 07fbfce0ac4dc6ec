"""The fused elementwise ops of the fast loop's layers (residual add + RMSNorm, rope + KV-cache write,
``silu(gate) * up``, head rotation): torch twins in :mod:`.naive`, Triton kernels in :mod:`.triton` (imported only
through :func:`fold_hf.kernels.default_layer_ops`, never on the CPU path)."""
