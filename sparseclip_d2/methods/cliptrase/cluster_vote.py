"""CLIPtrase's post-processing as parts any method can use: the DBSCAN cluster vote (with its
median filter) and the CLS-logit product.

Cluster vote (``MODEL.SPARSECLIP.CLUSTER_VOTE.*``), per image, whole-image inference:

1. the patch self-correlation map of block ``LAYER`` (``attention.self_correlation``: head mean
   of the Q-Q / K-K / V-V cosine maps, CLS row subtracted, clamped at 0), ``(N, N)``;
2. DBSCAN (scikit-learn, euclidean, ``eps = EPS``, ``min_samples = MIN_SAMPLES``) over its
   rows; when every patch is noise nothing changes;
3. per cluster (noise excluded) the mean of its rows, a ``(h, w)`` map; bilinearly upsampled to
   ``UPSAMPLE * (h, w)``, each map median-filtered (scipy, ``MEDIAN_SIZE`` square, mode
   ``reflect``), bilinearly resized to the output size; each pixel takes the cluster of its
   largest map;
4. every pixel of a cluster takes the cluster's most frequent label (ties: the lower label).

leaves162/CLIPtrase @ 2b7de61 ``clip_self_correlation.py`` ``self_clip``: ``DBSCAN(eps=eps,
min_samples=min)``, ``ratio = 4``, ``median_filter(..., size=ratio*2-1)``, ``F.interpolate(...,
mode='bilinear', align_corners=False)``, the vote ``unique_val[counts.argmax()]``. DBSCAN is
deterministic given its input; a distance within float noise of ``eps`` can still flip a point.

CLS-logit product (``MODEL.SPARSECLIP.CLS_LOGIT_PRODUCT``): each window's patch logits are
multiplied, per synonym, by the window's CLS logits ``LOGIT_SCALE * cos(CLS embedding, text)``
(CLIPtrase's VOC20 rule: ``patch_logits*cls_logits``).
"""
import dataclasses
import logging
from typing import Callable, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from ...common.activity import report
from ...common.keys import Key, Section, key_field
from ..registry import CONFIG_SECTIONS

__all__ = ["ClusterVoteSettings", "CLUSTER_VOTE_SECTION", "cluster_assignment", "majority_vote"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ClusterVoteSettings:
    """The cluster vote's values (``MODEL.SPARSECLIP.CLUSTER_VOTE.*``; defaults: CLIPtrase at 224 px).

    Fields:
        layer: block whose q / k / v give the self-correlation map (0-based, negative from the
            end; CLIPtrase: layer 11 of 12, ``attn_weights[-2]`` = -2).
        eps, min_samples: DBSCAN's (CLIPtrase ``self_clip_test``: 0.7 / 3 at 224, 1.1 / 7 at 336).
        upsample: the cluster maps' upsampling factor before the median filter (``ratio = 4``).
        median_size: the median filter's side (``ratio*2-1`` = 7).
    """

    layer: int = key_field(-2, "LAYER", "Block of the self-correlation map, 0-based, negative from the end "
                           "(CLIPtrase: -2 = layer 11 of 12).")
    eps: float = key_field(0.7, "EPS", "DBSCAN eps (leaves162/CLIPtrase clip_self_correlation.py: 0.7 at 224, "
                           "1.1 at 336).")
    min_samples: int = key_field(3, "MIN_SAMPLES", "DBSCAN min_samples (CLIPtrase: 3 at 224, 7 at 336).")
    upsample: int = key_field(4, "UPSAMPLE", "Upsampling factor before the median filter (CLIPtrase: ratio 4).")
    median_size: int = key_field(7, "MEDIAN_SIZE", "The median filter's side (CLIPtrase: 2*4-1).")

    def __post_init__(self):
        for name in ("layer", "min_samples", "upsample", "median_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"MODEL.SPARSECLIP.CLUSTER_VOTE.{name.upper()} = {value!r} is invalid; valid: an integer")
        if not (isinstance(self.eps, (int, float)) and not isinstance(self.eps, bool) and np.isfinite(self.eps)
                and self.eps > 0):
            raise ValueError(f"MODEL.SPARSECLIP.CLUSTER_VOTE.EPS = {self.eps!r} is invalid; valid: a number > 0")
        if self.min_samples < 1:
            raise ValueError(f"MODEL.SPARSECLIP.CLUSTER_VOTE.MIN_SAMPLES = {self.min_samples!r} is invalid; valid: an "
                             "integer >= 1")
        if self.upsample < 1:
            raise ValueError(f"MODEL.SPARSECLIP.CLUSTER_VOTE.UPSAMPLE = {self.upsample!r} is invalid; valid: an integer "
                             ">= 1")
        if self.median_size < 1:
            raise ValueError(f"MODEL.SPARSECLIP.CLUSTER_VOTE.MEDIAN_SIZE = {self.median_size!r} is invalid; valid: an "
                             "integer >= 1 (1 = no median filter)")

    @classmethod
    def from_config(cls, cfg) -> Optional["ClusterVoteSettings"]:
        """The settings of ``cfg``, or None when ``CLUSTER_VOTE.ENABLED`` is False (the keys are
        checked by ``methods/cliptrase/parts.py``, what they cannot join by ``methods.check_parts``)."""
        c = cfg.MODEL.SPARSECLIP.CLUSTER_VOTE
        if not c.ENABLED:
            return None
        return cls(layer=c.LAYER, eps=float(c.EPS), min_samples=c.MIN_SAMPLES, upsample=c.UPSAMPLE,
                   median_size=c.MEDIAN_SIZE)


#: ``MODEL.SPARSECLIP.CLUSTER_VOTE``: ``ENABLED`` then :class:`ClusterVoteSettings`' keys.
CLUSTER_VOTE_SECTION = CONFIG_SECTIONS.register("MODEL.SPARSECLIP.CLUSTER_VOTE")(Section(
    ClusterVoteSettings, switch="ENABLED", before=(Key("ENABLED", False),)))


def _median_filter(maps: np.ndarray, size: int) -> np.ndarray:
    from scipy.ndimage import median_filter

    out = np.empty_like(maps)
    for i in range(maps.shape[0]):
        out[i] = median_filter(maps[i], size=size)  # mode 'reflect', scipy's default
    return out


def cluster_assignment(corr: torch.Tensor, grid: Tuple[int, int], settings: ClusterVoteSettings,
                       out_size: Tuple[int, int], pad: Tuple[int, int, int, int] = (0, 0, 0, 0),
                       patch_size: int = 16) -> Optional[torch.Tensor]:
    """The cluster of every output pixel, or None when DBSCAN finds no cluster.

    Args:
        corr: ``(N, N)`` the CLS-denoised self-correlation of the ``N = h*w`` patches.
        grid: ``(h, w)``.
        settings: eps, min_samples, upsample, median_size.
        out_size: ``(H_out, W_out)`` output size.
        pad: ``(left, right, top, bottom)`` pixels the encoded image was padded by (symmetric
            padding of ``PATCH_REMAINDER pad_crop``); the cluster maps are then resized to the
            padded image, cropped, and resized to ``out_size`` when it differs.
        patch_size: pixels per patch side (with ``pad``).
    Returns:
        ``(H_out, W_out)`` long cluster indices ``0..n-1`` on ``corr``'s device, or None.
    """
    from sklearn.cluster import DBSCAN

    h, w = int(grid[0]), int(grid[1])
    if corr.dim() != 2 or corr.shape != (h * w, h * w):
        raise ValueError(f"corr must be ({h * w}, {h * w}) for a {h}x{w} grid, got {tuple(corr.shape)}")
    rows = corr.detach().float()
    labels = DBSCAN(eps=float(settings.eps), min_samples=int(settings.min_samples)).fit_predict(rows.cpu().numpy())
    clusters = sorted(int(c) for c in np.unique(labels) if c >= 0)
    report("clusters", len(clusters) > 1, clusters=len(clusters))  # the stage-activity record
    if not clusters:
        return None
    labels_t = torch.from_numpy(labels).to(rows.device)
    maps = torch.stack([rows[labels_t == c].mean(dim=0) for c in clusters]).reshape(1, len(clusters), h, w)
    r = int(settings.upsample)
    maps = F.interpolate(maps, size=(r * h, r * w), mode="bilinear", align_corners=False)[0]
    if settings.median_size > 1:
        maps = torch.from_numpy(_median_filter(maps.cpu().numpy(), int(settings.median_size))).to(rows.device)
    left, right, top, bottom = (int(p) for p in pad)
    out_size = (int(out_size[0]), int(out_size[1]))
    if not any(pad):
        maps = F.interpolate(maps[None], size=out_size, mode="bilinear", align_corners=False)[0]
    else:
        ph, pw = h * patch_size, w * patch_size
        maps = F.interpolate(maps[None], size=(ph, pw), mode="bilinear", align_corners=False)
        maps = maps[:, :, top:ph - bottom, left:pw - right]
        if tuple(maps.shape[-2:]) != out_size:
            maps = F.interpolate(maps, size=out_size, mode="bilinear", align_corners=False)
        maps = maps[0]
    return maps.argmax(dim=0)


def majority_vote(labels: torch.Tensor, assignment: torch.Tensor) -> torch.Tensor:
    """Every pixel of each cluster takes the cluster's most frequent label (ties: the lower label).

    Args:
        labels: ``(H, W)`` long labels (>= 0).
        assignment: ``(H, W)`` long cluster indices.
    Returns:
        ``(H, W)`` long.
    """
    if labels.shape != assignment.shape:
        raise ValueError(f"labels {tuple(labels.shape)} and cluster assignment {tuple(assignment.shape)} differ in size")
    out = labels.clone()
    flat, where = labels.reshape(-1), assignment.reshape(-1)
    minlength = int(flat.max()) + 1 if flat.numel() else 1
    for c in torch.unique(where).tolist():
        mask = where == c
        counts = torch.bincount(flat[mask], minlength=minlength)
        out.reshape(-1)[mask] = int(counts.argmax())  # argmax: the first (lowest) label among ties
    return out
