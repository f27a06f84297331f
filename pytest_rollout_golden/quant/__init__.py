"""Quantized weights between the trainer and the rollout engine: :mod:`.manifest` (which
precision each side uses, layer by layer) and :mod:`.sync` (what a weight sync delivered)."""
