"""The FOLD read given as numbers and the target's verify attention.

* :mod:`.naive`: the pure-torch twins (``fold_read_geometry_reference``, ``decode_attention_reference``, the grouped
  products and ``rotate_by_tables`` the rest of the package shares);
* :mod:`.triton`: the Triton kernels (``fold_read_triton``, ``decode_attention_triton``: one split kernel and one
  merge); imported only through :func:`fold_hf.kernels.import_triton_module`, never on the CPU path.
"""
