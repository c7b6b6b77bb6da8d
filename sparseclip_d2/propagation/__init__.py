"""Label propagation as post-processing of any method (LPOSS, LPOSS+; issue 24).

- :mod:`.graph`: the graphs (kNN patch graph with a geometric affinity, Lab-colour pixel graph),
  their normalisation and the batched conjugate-gradient solve (numpy / scipy / faiss).
- :mod:`.lposs`: :class:`LabelPropagation` (the VFM and the stages, joint across windows),
  :class:`LabelPropagationSettings`, the stage registry.
- :mod:`.keys`: ``MODEL.SPARSECLIP.LABEL_PROPAGATION.*`` read and validated (no detectron2 import).

See docs/architecture.md ("Label propagation").
"""
from .graph import (conjugate_gradient, knn_affinity, knn_search, normalized_affinity, patch_centres,
                    pixel_affinity, propagation_operator, rgb_to_lab)
from .lposs import (PROPAGATION_KINDS, PROPAGATION_STAGE_REGISTRY, LabelPropagation, LabelPropagationSettings,
                    check_label_propagation_settings, propagate_patches, propagate_pixels)

__all__ = [
    "knn_search", "patch_centres", "knn_affinity", "normalized_affinity", "propagation_operator",
    "conjugate_gradient", "rgb_to_lab", "pixel_affinity",
    "PROPAGATION_KINDS", "PROPAGATION_STAGE_REGISTRY", "LabelPropagation", "LabelPropagationSettings",
    "check_label_propagation_settings", "propagate_patches", "propagate_pixels",
]
