"""CorrCLIP's per-image path in the META_ARCH: the image's region mask read, cut into the
sliding windows beside the image, the windows encoded by :class:`~sparseclip_d2.proxy.corrclip.CorrCLIPEncoder`,
and the label map corrected by the mode label of each mask region.

zdk258/CorrCLIP @ 103bc18 ``CorrCLIPv1/corrclip_segmentor.py``: ``predict`` reads the mask of the
original image (``generate_mask``), resizes it to the input by nearest neighbour
(``F.interpolate(..., size=inputs.shape[2:], mode='nearest')``); ``forward_slide`` cuts it into
the windows with the image and pads it with 10000; ``postprocess_result`` gives each region of the
original-size mask (all but the minimum value) its mode label.
"""
from typing import Dict, Tuple

import torch
import torch.nn.functional as F

from ..proxy.corrclip import PAD_LABEL, load_region_mask, mask_file_for, region_mode_labels
from .postprocess import ScoreMaps
from .sliding_window import dense_logits

__all__ = ["region_mask_of", "corrclip_maps", "corrclip_labels"]

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


def corrclip_maps(model, x: Dict) -> Tuple[ScoreMaps, torch.Tensor]:
    """``(score maps, (height, width) long labels)`` of one input (``model``: the ``SparseCLIP``
    META_ARCH whose encoder is a ``CorrCLIPEncoder``): the windows' logits (as
    ``synonym_logits``, the window masks passed to the encoder), PAMR if configured, the score
    maps' rules (probability / area thresholds, background), then the mode label per mask
    region (``MODE_VOTE``; the score maps are those before it)."""
    enc = model.encoder
    settings = enc.settings
    vocabulary, background_index = model._vocabulary(x)
    emb, class_index = model.text_classifier_for(vocabulary, background_index=background_index)
    image = model.normalize_image(x["image"])
    out_h, out_w = int(x.get("height", image.shape[-2])), int(x.get("width", image.shape[-1]))
    mask = region_mask_of(x, settings.mask_dir, (out_h, out_w)).to(image.device)
    window_mask = F.interpolate(mask[None, None].double(), size=tuple(image.shape[-2:]), mode="nearest")[0, 0].long()

    def logits_fn(crops, masks):
        feats = F.normalize(enc(crops, region_masks=masks).float(), dim=1)
        return model.logit_scale * torch.einsum("ndhw,sd->nshw", feats, emb)

    logits = dense_logits(image, logits_fn, patch_size=int(enc.patch_size),
                          crop_size=model.crop_size if model.sliding_window else None,
                          stride=model.stride if model.sliding_window else None,
                          batch_size=model.window_batch_size, patch_remainder=model.patch_remainder,
                          side=window_mask, side_pad_value=PAD_LABEL)
    if model.prob_threshold > 0 and background_index is None:
        model._warn_threshold_ignored(x)
    if model.pamr_steps:
        logits = model.refine_pamr(image, logits, (out_h, out_w))
    maps = ScoreMaps(logits, class_index, len(vocabulary), prob_threshold=model.prob_threshold,
                     area_threshold=model.area_threshold, background_index=background_index, out_size=(out_h, out_w))
    labels = maps.labels()
    if settings.mode_vote:
        labels = region_mode_labels(labels, mask.to(labels.device))
    return maps, labels


def corrclip_labels(model, x: Dict) -> torch.Tensor:
    """The ``(height, width)`` long labels of :func:`corrclip_maps`."""
    return corrclip_maps(model, x)[1]
