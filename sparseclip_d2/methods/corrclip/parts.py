"""CorrCLIP's per-image parts (zdk258/CorrCLIP @ 103bc18 ``CorrCLIPv1/corrclip_segmentor.py``): the
region mask as a side input (``predict`` reads the mask of the original image, ``generate_mask``,
and resizes it to the input by nearest neighbour; ``forward_slide`` cuts it into the windows with
the image and pads it with 10000) and the mode label of each region as a labels stage
(``postprocess_result``, ``MODE_VOTE``). The encoder is ``methods/corrclip/encoder.py``."""
from typing import Dict, Tuple

import torch
import torch.nn.functional as F

from .encoder import PAD_LABEL, load_region_mask, mask_file_for, region_mode_labels
from ..registry import SIDE_INPUTS, STAGES, SideInput, Stage

__all__ = ["RegionMaskInput", "RegionVoteStage", "region_mask_of"]

KEY = "MODEL.SPARSECLIP.PROXY.CORRCLIP"
MASK_KEY = f"{KEY}.MASK_DIR"


def region_mask_of(x: Dict, mask_dir: str, out_hw) -> torch.Tensor:
    """The ``(H, W)`` int64 region mask of input ``x``: ``x["region_mask"]`` when given, else
    ``<mask_dir>/<stem of x["file_name"]>.npz``; it must have the output (original image) size.

    Raises:
        ValueError: neither ``region_mask`` nor ``file_name`` in ``x``; a mask of another size.
        FileNotFoundError: no mask file (naming the key and the path).
    """
    if "region_mask" in x:
        m = torch.as_tensor(x["region_mask"])
        if m.dim() != 2 or m.is_floating_point() or tuple(m.shape) != tuple(out_hw):
            raise ValueError(f"input 'region_mask' must be an ({out_hw[0]}, {out_hw[1]}) integer map (the image's "
                             f"original size), got a {m.dtype} tensor of shape {tuple(m.shape)}")
        return m.long()
    if "file_name" not in x:
        raise ValueError(f"CorrCLIP ({MASK_KEY}) reads one region mask per image by its file name; this input has "
                         "neither 'file_name' nor 'region_mask' (an (H, W) integer map)")
    return load_region_mask(mask_file_for(mask_dir, x["file_name"]), MASK_KEY, image_hw=tuple(out_hw))


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
        from .keys import corrclip_settings_from_config

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
