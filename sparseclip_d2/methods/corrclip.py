"""CorrCLIP's per-image parts (zdk258/CorrCLIP @ 103bc18 ``CorrCLIPv1/corrclip_segmentor.py``): the
region mask as a side input (``predict`` reads the mask of the original image, ``generate_mask``,
and resizes it to the input by nearest neighbour; ``forward_slide`` cuts it into the windows with
the image and pads it with 10000) and the mode label of each region as a labels stage
(``postprocess_result``, ``MODE_VOTE``). The encoder is ``proxy/corrclip.py``."""
from typing import Dict, Tuple

import torch
import torch.nn.functional as F

from ..modeling.region_masks import region_mask_of
from ..proxy.corrclip import PAD_LABEL, region_mode_labels
from .registry import SIDE_INPUTS, STAGES, SideInput, Stage

__all__ = ["RegionMaskInput", "RegionVoteStage"]

KEY = "MODEL.SPARSECLIP.PROXY.CORRCLIP"


@SIDE_INPUTS.register("region_mask")
class RegionMaskInput(SideInput):
    """``input["region_mask"]`` (an ``(H, W)`` integer map at the original size), else
    ``<MASK_DIR>/<stem of file_name>.npz``."""

    name = "region_mask"
    encoder_keyword = "region_masks"
    pad_value = PAD_LABEL

    def __init__(self, cfg=None):
        super().__init__(cfg)
        self.mask_dir = cfg.MODEL.SPARSECLIP.PROXY.CORRCLIP.MASK_DIR if cfg is not None else ""

    def full(self, model, x: Dict, out_size: Tuple[int, int]) -> torch.Tensor:
        return region_mask_of(x, self.mask_dir, out_size)

    def working(self, full: torch.Tensor, image_size: Tuple[int, int]) -> torch.Tensor:
        return F.interpolate(full[None, None].double(), size=tuple(image_size), mode="nearest")[0, 0].long()


@STAGES.register("region_vote")
class RegionVoteStage(Stage):
    """Each region of the original-size mask (all but its minimum value) takes its mode label."""

    kind = "labels"
    key = f"{KEY}.MODE_VOTE"

    @classmethod
    def settings_from_config(cls, cfg):
        from ..proxy.config import corrclip_settings_from_config

        if not cfg.MODEL.SPARSECLIP.PROXY.NAME:
            return None
        s = corrclip_settings_from_config(cfg)
        return True if s is not None and s.mode_vote else None

    @classmethod
    def from_config(cls, cfg, clip):
        return cls() if cls.settings_from_config(cfg) else None

    def forward(self, model, inputs, labels):
        return region_mode_labels(labels, inputs.side_full["region_mask"].to(labels.device))

    def describe(self) -> str:
        return "mode label per region"
