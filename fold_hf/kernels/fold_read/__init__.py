"""The FOLD read given as numbers and the target's verify attention.

* :mod:`.naive`: the pure-torch statements (``fold_read_masked``, the read's math from key sets and masks;
  ``fold_read_geometry_reference`` and ``decode_attention_reference``, the kernels' twins; the grouped products and
  ``rotate_by_tables`` the rest of the package shares);
* :mod:`.triton`: the Triton reads (``fold_read_triton``, ``decode_attention_triton``: the split kernel and its
  launches) and :mod:`.triton_merge` (the merge pass); imported only through
  :func:`fold_hf.kernels.import_triton_module`, never on the CPU path;
* :mod:`.launch`: their launch geometry (tiles, splits, merge tiles, partial buffers) in plain torch.
"""
