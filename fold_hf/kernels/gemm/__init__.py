"""The GEMMs of the fused target layers' decode steps.

* :mod:`.naive`: torch twins of the skinny GEMMs;
* :mod:`.triton`: the skinny Triton GEMMs (no split-K, SiLU in the gate|up product; the exact mode's fixed-plan
  variants ``exact_linear_triton`` / ``exact_gate_up_silu_triton``; imported only through
  :func:`fold_hf.kernels.default_layer_ops`, never on the CPU path);
* :mod:`.cpu`: several CPU rows through a packed GEMM (oneDNN's or MKL's).
"""
