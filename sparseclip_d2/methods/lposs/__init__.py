"""LPOSS / LPOSS+ (vladan-stojnic/LPOSS): label propagation over a VFM patch graph (and a Lab pixel
graph) as a windows stage any method can use (:mod:`.stage`); the propagation and its settings in
:mod:`.propagation` (the graphs are generic: ``propagation/graph.py``), the keys in :mod:`.keys`."""
from .propagation import (PROPAGATION_KINDS, PROPAGATION_STAGE_REGISTRY, LabelPropagation, LabelPropagationSettings,
                          check_label_propagation_settings, propagate_patches, propagate_pixels)
from .stage import LabelPropagationStage
from . import keys  # noqa: F401  (registers the family and its config sections)
from . import upstream  # noqa: F401  (registers its upstream benchmark entry)

#: the families this one is built on (it may name them; tests/project/test_source_rules.py): upstream LPOSS
#: propagates MaskCLIP's predictions, and its benchmark entry runs upstream's MaskCLIP model files
BUILDS_ON = ("maskclip",)

__all__ = ["PROPAGATION_KINDS", "PROPAGATION_STAGE_REGISTRY", "LabelPropagation", "LabelPropagationSettings",
           "check_label_propagation_settings", "propagate_patches", "propagate_pixels", "LabelPropagationStage"]
