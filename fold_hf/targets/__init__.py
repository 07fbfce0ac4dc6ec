"""Target mechanics: our own forward of the target over a static cache, one module per family, and what the other
loops need of a target (its hidden-state taps, the rollback of recurrent state, the weights laid out for decode).

* :mod:`.base`: :class:`~fold_hf.targets.base.StaticTarget` (the family-free runner), ``UnsupportedTarget``,
  ``bucket_length``, ``PREFILL_CHUNK``;
* families: :mod:`.llama` (Llama, Mistral, Qwen2, Qwen3), :mod:`.qwen35` (Qwen3.5 dense / MoE and their multimodal
  wrappers), :mod:`.gemma`, :mod:`.gemma_rows` and :mod:`.gemma_fused` (Gemma-3 / Gemma-4 and their wrappers);
  :mod:`.moe` (the family-free routed-experts step) and :mod:`.common` (pieces the families share);
* :mod:`.registry`: which family runs an architecture (an explicit table) and ``check_target`` /
  ``build_static_target`` / ``prepare_text_request``;
* :mod:`.taps`, :mod:`.rollback`, :mod:`.weight_layout`.

Layering: above ``modeling`` and ``kernels``, below ``generation`` (which runs the loops over these runners). Nothing
is imported here, so ``import fold_hf.targets.taps`` does not load every family.
"""
