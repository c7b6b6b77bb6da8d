"""Low-level helpers importable with the standard library (and torch) only: a bounded
cache (:mod:`.cache`), atomic file writes (:mod:`.io`), and the segmentation figures of
the tools (:mod:`.visualize`, detectron2). Imported explicitly, not by ``sparseclip_d2``."""
