"""Helpers of the command-line tools: attention-spec strings (:mod:`.specs`) and
segmentation figures (:mod:`.visualize`). Imported explicitly, not by ``sparseclip_d2``."""
