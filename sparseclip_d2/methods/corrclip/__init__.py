"""CorrCLIP (zdk258/CorrCLIP): region-restricted proxy attention (:mod:`.encoder`, with the region
masks' helpers), the region-mask side input and the region mode vote (:mod:`.parts`)."""
from .encoder import (REGION_RESTRICTION_REGISTRY, CorrCLIPEncoder, CorrCLIPSettings, check_corrclip_settings,
                      load_region_mask, merge_regions, region_mode_labels, restrict_to_regions, write_region_mask)
from .parts import RegionMaskInput, RegionVoteStage, region_mask_of
from . import keys  # noqa: F401  (registers the family and its config sections)
from . import upstream  # noqa: F401  (registers its upstream benchmark entry)

#: the families this one is built on (it may name them; tests/project/test_source_rules.py)
BUILDS_ON = ("proxyclip",)

__all__ = ["REGION_RESTRICTION_REGISTRY", "CorrCLIPEncoder", "CorrCLIPSettings", "check_corrclip_settings",
           "load_region_mask", "merge_regions", "region_mode_labels", "restrict_to_regions", "write_region_mask",
           "RegionMaskInput", "RegionVoteStage", "region_mask_of"]
