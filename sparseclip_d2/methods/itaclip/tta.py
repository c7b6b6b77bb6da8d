"""Test-time augmentation of the patch logits (ITACLIP's "image engineering"), and the
label-map closing ITACLIP applies last; options any method's config can switch on.

``itaclip`` (m-arda-aydn/ITACLIP @ 521a33c ``itaclip_segmentor.py``, ``forward_feature`` with
``img_engineering=True``), for each window of normalised pixels ``x``:

- the dense features of ``x``, of its grayscale (``T.Grayscale()``: 0.2989 R + 0.587 G +
  0.114 B, repeated on 3 channels) and of its Gaussian blur (``T.GaussianBlur(kernel_size=11,
  sigma=5)``), each L2-normalised, are averaged (not re-normalised) and give the logits ``L``;
- the features of the vertically and the horizontally flipped window give logits that are
  flipped back and averaged: ``L_flip``;
- the window's logits are ``w * L + (1 - w) * L_flip`` (``img_eng_coefficient``, 0.7 or 0.75
  in its ``configs/cfg_*.py``).

Upstream flips back after the bilinear upsampling to the window size; the project's logits
are patch logits upsampled later, and flipping commutes with that upsampling
(``align_corners=False`` samples symmetric positions), so the flip-back happens on the patch
grid. The augmentations act on the normalised window as upstream's do (they run after the
data preprocessor).
"""
import logging
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
import torchvision.transforms.functional as TF

__all__ = ["TTA_MODES", "tta_logits", "close_labels", "check_tta_options", "check_label_closing"]

logger = logging.getLogger(__name__)

#: ``""`` = no augmentation; ``itaclip`` = the augmentation above.
TTA_MODES = ("", "itaclip")

# itaclip_segmentor.py __init__: T.GaussianBlur(kernel_size=11, sigma=5)
_ITACLIP_BLUR_KERNEL = 11
_ITACLIP_BLUR_SIGMA = 5.0


def _grayscale(x: torch.Tensor) -> torch.Tensor:
    return TF.rgb_to_grayscale(x, num_output_channels=1).expand(-1, 3, -1, -1)


def _blur(x: torch.Tensor) -> torch.Tensor:
    k = _ITACLIP_BLUR_KERNEL
    return TF.gaussian_blur(x, [k, k], [_ITACLIP_BLUR_SIGMA, _ITACLIP_BLUR_SIGMA])


def tta_logits(mode: str, features: Callable[[torch.Tensor], torch.Tensor], images: torch.Tensor,
               text_emb: torch.Tensor, logit_scale: float, weight: float) -> torch.Tensor:
    """Augmented patch logits of a batch of windows.

    Args:
        mode: one of :data:`TTA_MODES` (``""`` = the plain logits).
        features: ``(N, 3, h, w)`` normalised windows -> ``(N, D, h/p, w/p)`` dense features.
        images: ``(N, 3, h, w)`` normalised windows.
        text_emb: ``(S, D)`` synonym embeddings.
        logit_scale: factor on the cosine logits.
        weight: share of the unflipped average (``img_eng_coefficient``), in [0, 1].
    Returns:
        ``(N, S, h/p, w/p)`` float32 patch logits.
    Raises:
        ValueError: an unknown mode or a weight outside [0, 1].
    """
    if mode not in TTA_MODES:
        raise ValueError(f"unknown test-time augmentation {mode!r}; valid: {', '.join(repr(m) for m in TTA_MODES)}")

    def cosine(f: torch.Tensor) -> torch.Tensor:
        return torch.einsum("ndhw,sd->nshw", f, text_emb)

    def unit(x: torch.Tensor) -> torch.Tensor:
        return F.normalize(features(x).float(), dim=1)

    if mode == "":
        return logit_scale * cosine(unit(images))
    w = float(weight)
    if not 0.0 <= w <= 1.0:
        raise ValueError(f"test-time augmentation weight must be in [0, 1], got {weight!r}")
    # the order of upstream's reductions: stacked means, cosine logits mixed, then the scale
    mean = torch.stack([unit(images), unit(_grayscale(images)), unit(_blur(images))]).mean(dim=0)
    base = cosine(mean)
    flips = torch.stack([cosine(unit(images.flip(-2))).flip(-2), cosine(unit(images.flip(-1))).flip(-1)]).mean(dim=0)
    return logit_scale * (w * base + (1.0 - w) * flips)


def close_labels(labels: torch.Tensor, kernel: int) -> torch.Tensor:
    """Morphological closing of a label map (ITACLIP ``postprocess_result``:
    ``cv2.morphologyEx(pred.astype(np.uint8), cv2.MORPH_CLOSE, cv2.getStructuringElement(
    cv2.MORPH_RECT, (3, 3)))``): grey-level dilation then erosion of the label *values*.

    Args:
        labels: ``(H, W)`` long label map with values in [0, 255].
        kernel: side of the square structuring element (odd, >= 3); 0 returns ``labels``.
    Returns:
        ``(H, W)`` long on ``labels``' device.
    Raises:
        ValueError: a bad kernel, or labels outside [0, 255] (upstream's uint8 cast would wrap).
    """
    import cv2

    k = int(kernel)
    if k == 0:
        return labels
    if k < 3 or k % 2 == 0 or k != kernel:
        raise ValueError(f"label closing kernel must be 0 (off) or an odd integer >= 3, got {kernel!r}")
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) > 255):
        raise ValueError(f"label closing works on uint8 label maps; labels span {int(labels.min())}..{int(labels.max())}")
    se = cv2.getStructuringElement(cv2.MORPH_RECT, (k, k))
    out = cv2.morphologyEx(labels.cpu().numpy().astype(np.uint8), cv2.MORPH_CLOSE, se)
    return torch.from_numpy(out.astype(np.int64)).to(labels.device)


def check_tta_options(cfg) -> None:
    """Validate ``TEST.TTA.*`` before any model is built; ``ValueError`` naming the key, the value
    and the valid choices."""
    t = cfg.TEST.TTA
    if t.MODE not in TTA_MODES:
        raise ValueError(f"TEST.TTA.MODE = {t.MODE!r} is invalid; valid: {', '.join(repr(m) for m in TTA_MODES)}")
    w = t.WEIGHT
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.0 <= float(w) <= 1.0:
        raise ValueError(f"TEST.TTA.WEIGHT = {w!r} is invalid; valid: a number in [0, 1]")


def check_label_closing(cfg) -> int:
    """The validated ``MODEL.SPARSECLIP.LABEL_CLOSING`` kernel (0 = off)."""
    k = cfg.MODEL.SPARSECLIP.LABEL_CLOSING
    if isinstance(k, bool) or not isinstance(k, int) or (k != 0 and (k < 3 or k % 2 == 0)):
        raise ValueError(f"MODEL.SPARSECLIP.LABEL_CLOSING = {k!r} is invalid; valid: 0 (off) or an odd integer >= 3")
    return k
