"""fold_hf's integrations with other libraries: :mod:`fold_hf.integrations.transformers` (``install()``)."""
