"""Greedy token selection on logits rows: the torch path and twins in :mod:`.naive`, the two-launch Triton kernels in
:mod:`.triton` (imported only through :func:`fold_hf.kernels.greedy_select_ops`, never on the CPU path)."""
