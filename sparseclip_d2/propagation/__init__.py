"""Graphs for label propagation (generic; the propagation stage itself is LPOSS's,
``sparseclip_d2/methods/lposs/``).

- :mod:`.graph`: the graphs (kNN patch graph with a geometric affinity, Lab-colour pixel graph),
  their normalisation and the batched conjugate-gradient solve (numpy / scipy / faiss).

See docs/architecture.md ("Label propagation").
"""
from .graph import (conjugate_gradient, knn_affinity, knn_search, normalized_affinity, patch_centres,
                    pixel_affinity, propagation_operator, rgb_to_lab)

__all__ = [
    "knn_search", "patch_centres", "knn_affinity", "normalized_affinity", "propagation_operator",
    "conjugate_gradient", "rgb_to_lab", "pixel_affinity",
]
