"""Helpers of the command-line tools: segmentation figures (:mod:`.visualize`). Imported
explicitly, not by ``sparseclip_d2``."""
