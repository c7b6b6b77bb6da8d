"""Outlier-token repair: find anomalous patch tokens and replace them by the mean of their
neighbours on the patch grid (SC-CLIP's anomaly-token resolution, SFP's purification).

- detectors are registered in :data:`OUTLIER_DETECTOR_REGISTRY`; each is
  ``fn(patches (B, N, C), *, neighbors, contamination) -> (B, N) bool`` and works per image,
  so a batch of windows gives each window its own outliers;
- :func:`lof_scores`: the local outlier factor as SC-CLIP writes it (SuleBai/SC-CLIP @ 0417ba9
  ``clip/model.py`` ``lof_pytorch``): squared Euclidean distances, the ``k`` nearest other
  tokens, the reachability distance ``max(d(p, o), kdist(p))`` taken with the token's **own**
  k-distance (so every reachability distance of ``p`` is ``kdist(p)``), the local reachability
  density ``lrd(p) = k / mean_o reach(p, o)`` and ``LOF(p) = mean_{o in kNN(p)} lrd(o) / lrd(p)``;
- ``lof``: tokens whose LOF is above the ``1 - contamination`` quantile of their image
  (linear interpolation, ``torch.quantile``);
- ``l2``: the ``count`` tokens of largest L2 norm (Kimsure/SFP @ 2804f5b ``SFP_ICCV/clip/model.py``
  ``pm == 'L2'``: ``torch.norm`` of the patch tokens, sorted, the first 10);
- ``som``: SFP's default (``pm == 'SOM'``): from the attention of the block that produced the
  tokens, averaged over heads with the CLS row's patch entries scaled by ``cls_scale``
  (``attn_map[:,:,0,1:] *= self.res_cls * self.res_scale`` = 0.3 x 5.0), the patches whose CLS
  attention exceeds their self-attention (the diagonal), at most ``count`` of them with the
  largest CLS attention;
- :func:`repair_outliers`: each outlier replaced by the mean of its non-outlier 3 x 3
  neighbours (zero padding at the border; an outlier without such a neighbour is kept), as
  SC-CLIP's ``mean_interpolation`` does (SuleBai/SC-CLIP @ 0417ba9 ``clip/model.py``:
  ``update_mask = top_indices_mask * valid_neighbor_mask``). SFP's (Kimsure/SFP @ 2804f5b
  ``SFP_ICCV/clip/model.py``) has no such guard and sets that outlier to the zero vector, whose
  cosine is then 0 / 0 (its NaN windows, docs/upstream_agreement.md); this rule is used for SFP too.

Pure torch; no open_clip or detectron2 import.
"""
import math
from typing import Tuple

import torch
import torch.nn.functional as F
from fvcore.common.registry import Registry

__all__ = ["OUTLIER_DETECTOR_REGISTRY", "OUTLIER_DETECTORS", "check_outlier_detector", "lof_scores",
           "detect_outliers", "repair_outliers", "check_neighbors", "check_contamination", "needs_attention",
           "check_count", "check_cls_scale"]

OUTLIER_DETECTOR_REGISTRY = Registry("OUTLIER_DETECTOR")
OUTLIER_DETECTOR_REGISTRY.__doc__ = """
Registry of outlier-token detectors ``fn(patches (B, N, C), *, neighbors, contamination, count,
cls_scale, attention, num_prefix_tokens) -> (B, N) bool`` (True = outlier), computed per image;
each reads the keywords it needs. ``attention`` is ``(B, heads, P + N, P + N)``, the softmax
weights of the block whose output the patches are; a detector that reads it has the attribute
``needs_attention = True``.
"""

# Elements of the (rows, N, C) difference tensor built at a time by lof_scores: 16 MiB in float32
# whatever the grid. Each row's distances are computed alone, so the values do not depend on the
# chunking (tests/clip/test_calibrated.py). 2 ** 22 rather than 2 ** 25 (128 MiB): the distances of
# SC-CLIP's 6 windows of 196 tokens took 0.33 s a 448 x 336 image in one torch thread, 0.10 s
# in chunks of this size (torch.profiler, aten::sub + linalg_vector_norm; scratch benchmark, 2 cores).
_DIFF_ELEMENTS = 1 << 22


def lof_scores(patches: torch.Tensor, neighbors: int = 30) -> torch.Tensor:
    """SC-CLIP's local outlier factor of every token of each image.

    Args:
        patches: ``(B, N, C)`` tokens (any float dtype; computed in float32 or float64 if given).
        neighbors: ``k``, the number of nearest other tokens, ``1 <= k < N``.
    Returns:
        ``(B, N)`` LOF scores in the computation dtype (about 1 for inliers, larger for
        tokens far from their neighbours relative to those neighbours' own spread).
    Raises:
        ValueError: a bad shape or ``k`` not in ``[1, N)``.
    """
    if patches.dim() != 3:
        raise ValueError(f"patches must be (B, N, C), got shape {tuple(patches.shape)}")
    B, N, C = patches.shape
    k = int(neighbors)
    if not 1 <= k < N:
        raise ValueError(f"outlier_neighbors={neighbors!r} needs 1 <= k < N = {N} patch tokens (the window has "
                         f"only {N}); use fewer neighbours or larger windows")
    x = patches if patches.dtype == torch.float64 else patches.float()
    rows = max(1, _DIFF_ELEMENTS // max(1, N * C))
    out = []
    for b in range(B):
        xb = x[b]
        dist = torch.cat([torch.linalg.vector_norm(xb[r:r + rows, None] - xb[None], dim=2) ** 2
                          for r in range(0, N, rows)])  # (N, N) squared distances
        knn_d, knn_i = torch.topk(dist, k=k + 1, largest=False)
        knn_d, knn_i = knn_d[:, 1:], knn_i[:, 1:]  # drop the token itself (distance 0)
        reach = torch.max(knn_d, knn_d[:, -1:].expand_as(knn_d))
        lrd = k / torch.nan_to_num(reach.mean(dim=1), nan=1e-6)
        out.append((lrd[knn_i] / lrd.unsqueeze(1)).mean(dim=1))
    return torch.stack(out)


def check_contamination(contamination) -> float:
    """``contamination`` as a float in (0, 1); ``ValueError`` naming it otherwise."""
    if (isinstance(contamination, bool) or not isinstance(contamination, (int, float))
            or not 0.0 < float(contamination) < 1.0):
        raise ValueError(f"outlier_contamination={contamination!r} is invalid; valid: a share in (0, 1) "
                         "(SC-CLIP: 0.05)")
    return float(contamination)


@OUTLIER_DETECTOR_REGISTRY.register()
def lof(patches: torch.Tensor, *, neighbors: int = 30, contamination: float = 0.05, **_) -> torch.Tensor:
    """SC-CLIP's detector: tokens whose :func:`lof_scores` exceed the ``1 - contamination``
    quantile of their image (``torch.quantile``, linear interpolation, in float32 as upstream
    casts the scores). ``(B, N, C) -> (B, N)`` bool."""
    q = 1.0 - check_contamination(contamination)
    scores = lof_scores(patches, neighbors)
    threshold = torch.quantile(scores.float(), q, dim=1, keepdim=True)
    return scores > threshold


def _top(values: torch.Tensor, count: int) -> torch.Tensor:
    """(B, N) -> (B, N) bool: the ``count`` largest finite entries of each row."""
    k = min(int(count), values.shape[1])
    idx = torch.topk(values, k, dim=1).indices
    mask = torch.zeros_like(values, dtype=torch.bool).scatter_(1, idx, True)
    return mask & torch.isfinite(values)


@OUTLIER_DETECTOR_REGISTRY.register()
def l2(patches: torch.Tensor, *, count: int = 10, **_) -> torch.Tensor:
    """SFP's ``L2`` detector: the ``count`` tokens of largest L2 norm of each image. ``(B, N, C)
    -> (B, N)`` bool."""
    return _top(torch.linalg.vector_norm(patches.float() if patches.dtype != torch.float64 else patches, dim=-1),
                count)


@OUTLIER_DETECTOR_REGISTRY.register()
def som(patches: torch.Tensor, *, attention: torch.Tensor = None, num_prefix_tokens: int = 1, count: int = 10,
        cls_scale: float = 1.5, **_) -> torch.Tensor:
    """SFP's ``SOM`` detector from the producing block's attention ``(B, heads, P + N, P + N)``:
    ``c_j = mean_h cls_scale * A_h[0, P + j]``, ``s_j = mean_h A_h[P + j, P + j]``; the patches
    with ``c_j > s_j``, at most ``count`` of the largest ``c_j``. ``-> (B, N)`` bool."""
    P = int(num_prefix_tokens)
    if attention is None or P < 1:
        raise ValueError("outlier_detector 'som' reads the CLS token's attention of the block before the last; this "
                         "tower has no CLS token (or no attention was given); valid here: lof, l2")
    B, N = patches.shape[:2]
    if attention.dim() != 4 or tuple(attention.shape[-2:]) != (P + N, P + N) or attention.shape[0] != B:
        raise ValueError(f"som: attention of shape {tuple(attention.shape)} does not match {B} images of {P} + {N} "
                         "tokens")
    a = attention if attention.dtype == torch.float64 else attention.float()
    cls_row = (a[:, :, 0, P:] * float(cls_scale)).mean(dim=1)
    self_att = torch.diagonal(a[:, :, P:, P:], dim1=-2, dim2=-1).mean(dim=1)
    return _top(torch.where(cls_row > self_att, cls_row, torch.full_like(cls_row, float("-inf"))), count)


som.needs_attention = True


#: Registered detector names, plus ``none`` (no repair).
def _detector_names() -> Tuple[str, ...]:
    return ("none",) + tuple(sorted(name for name, _ in OUTLIER_DETECTOR_REGISTRY))


OUTLIER_DETECTORS = _detector_names()


def check_outlier_detector(name) -> str:
    """``name`` lower-cased when it is ``none`` or a registered detector; ``ValueError`` otherwise."""
    valid = _detector_names()
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in valid:
        raise ValueError(f"unknown outlier_detector {name!r}; valid: {', '.join(valid)}")
    return key


def detect_outliers(name: str, patches: torch.Tensor, *, neighbors: int = 30, contamination: float = 0.05,
                    count: int = 10, cls_scale: float = 1.5, attention: torch.Tensor = None,
                    num_prefix_tokens: int = 1) -> torch.Tensor:
    """The registered detector ``name`` on ``(B, N, C)`` patches -> ``(B, N)`` bool (the
    keywords are those of :data:`OUTLIER_DETECTOR_REGISTRY`)."""
    key = check_outlier_detector(name)
    if key == "none":
        return torch.zeros(patches.shape[:2], dtype=torch.bool, device=patches.device)
    return OUTLIER_DETECTOR_REGISTRY.get(key)(patches, neighbors=neighbors, contamination=contamination, count=count,
                                              cls_scale=cls_scale, attention=attention,
                                              num_prefix_tokens=num_prefix_tokens)


def needs_attention(name: str) -> bool:
    """Whether the detector ``name`` reads the producing block's attention (``som``)."""
    key = check_outlier_detector(name)
    return key != "none" and bool(getattr(OUTLIER_DETECTOR_REGISTRY.get(key), "needs_attention", False))


def repair_outliers(patches: torch.Tensor, outliers: torch.Tensor, grid: Tuple[int, int]) -> torch.Tensor:
    """Replace each outlier token by the mean of its non-outlier 3 x 3 grid neighbours.

    Args:
        patches: ``(B, N, C)`` row-major patch tokens of an ``(h, w)`` grid, ``N = h * w``.
        outliers: ``(B, N)`` bool.
        grid: ``(h, w)``.
    Returns:
        ``(B, N, C)`` in ``patches.dtype``: inliers unchanged; an outlier with at least one
        inlier among its (up to 8, zero-padded at the border) neighbours becomes their mean;
        an outlier whose neighbours are all outliers is kept.
    """
    if patches.dim() != 3 or outliers.shape != patches.shape[:2]:
        raise ValueError(f"patches (B, N, C) and outliers (B, N) do not match: {tuple(patches.shape)}, "
                         f"{tuple(outliers.shape)}")
    h, w = (int(g) for g in grid)
    B, N, C = patches.shape
    if h * w != N:
        raise ValueError(f"{N} patch tokens do not form a {h}x{w} grid")
    if not bool(outliers.any()):
        return patches
    dt = patches.dtype
    fmap = patches.transpose(1, 2).reshape(B, C, h, w)
    keep = (~outliers).to(dt).view(B, 1, h, w)
    kernel = torch.ones(1, 1, 3, 3, dtype=dt, device=patches.device)
    kernel[0, 0, 1, 1] = 0
    # neighbour sums of the inliers, one image at a time (a grouped convolution over channels)
    sums = F.conv2d(F.pad(fmap * keep, (1, 1, 1, 1)).reshape(1, B * C, h + 2, w + 2),
                    kernel.expand(B * C, 1, 3, 3), groups=B * C).view(B, C, h, w)
    count = F.conv2d(F.pad(keep, (1, 1, 1, 1)), kernel)
    mean = sums / torch.where(count == 0, torch.ones_like(count), count)
    update = outliers.view(B, 1, h, w).to(dt) * (count > 0).to(dt)
    out = fmap * (1 - update) + mean * update
    return out.reshape(B, C, N).transpose(1, 2)


def check_neighbors(neighbors) -> int:
    """``neighbors`` as an int >= 1; ``ValueError`` naming it otherwise."""
    if isinstance(neighbors, bool) or not isinstance(neighbors, (int, float)) or not float(neighbors).is_integer() \
            or neighbors < 1 or not math.isfinite(float(neighbors)):
        raise ValueError(f"outlier_neighbors={neighbors!r} is invalid; valid: an integer >= 1 (SC-CLIP: 30)")
    return int(neighbors)


def check_count(count) -> int:
    """``count`` as an int >= 1; ``ValueError`` naming it otherwise."""
    if isinstance(count, bool) or not isinstance(count, (int, float)) or not math.isfinite(float(count)) \
            or not float(count).is_integer() or count < 1:
        raise ValueError(f"outlier_count={count!r} is invalid; valid: an integer >= 1 (SFP: 10)")
    return int(count)


def check_cls_scale(scale) -> float:
    """``scale`` as a finite float > 0; ``ValueError`` naming it otherwise."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(float(scale)) \
            or not float(scale) > 0:
        raise ValueError(f"outlier_cls_scale={scale!r} is invalid; valid: a finite number > 0 (SFP: 0.3 x 5.0 = 1.5)")
    return float(scale)
