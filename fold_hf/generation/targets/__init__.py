"""Target families of the fast loop beyond the Llama family (one module each; registered lazily in
:data:`fold_hf.generation.static_target.TARGET_FAMILIES`)."""
