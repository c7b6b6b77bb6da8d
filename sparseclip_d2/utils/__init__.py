"""Helpers of the command-line tools: segmentation figures (:mod:`.overlays`). Imported
explicitly, not by ``sparseclip_d2``."""
