"""Decode / verify attention of the exact mode (issue 37, ``docs/exact-mode.md``): each row's keys are split at fixed
key positions and merged in a fixed order, so a row's output does not depend on how many rows share the call.

* :mod:`.naive`: the torch statement (``exact_decode_attention_reference``);
* :mod:`.triton`: the Triton kernels (``exact_decode_attention_triton``: one split kernel, one merge); imported
  only through :func:`fold_hf.kernels.import_triton_module`, never on the CPU path.
"""
