"""The per-image region mask of an input (CorrCLIP's side input, ``methods/corrclip.py``): given in
the input dict or read from ``<MASK_DIR>/<stem>.npz``; the window loop cuts it into the windows
beside the image and the region vote corrects the label map by each region's mode label.

zdk258/CorrCLIP @ 103bc18 ``CorrCLIPv1/corrclip_segmentor.py``: ``predict`` reads the mask of the
original image (``generate_mask``), resizes it to the input by nearest neighbour
(``F.interpolate(..., size=inputs.shape[2:], mode='nearest')``); ``forward_slide`` cuts it into
the windows with the image and pads it with 10000; ``postprocess_result`` gives each region of the
original-size mask (all but the minimum value) its mode label.
"""
from typing import Dict, Tuple

import torch

from ..proxy.corrclip import load_region_mask, mask_file_for

__all__ = ["region_mask_of"]

KEY = "MODEL.SPARSECLIP.PROXY.CORRCLIP.MASK_DIR"


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
        raise ValueError(f"CorrCLIP ({KEY}) reads one region mask per image by its file name; this input has "
                         "neither 'file_name' nor 'region_mask' (an (H, W) integer map)")
    return load_region_mask(mask_file_for(mask_dir, x["file_name"]), KEY, image_hw=tuple(out_hw))
