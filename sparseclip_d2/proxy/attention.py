"""Proxy attention parts (pure torch): the last CLIP block's scores taken from a second
backbone's features, and CLIP's values resampled to that backbone's grid.

- :func:`proxy_cosine_scores`: ProxyCLIP's score source (mc-lan/ProxyCLIP @ e7b767f
  ``open_clip/transformer.py`` ``custom_attn``): cosine similarity ``S`` of the proxy's patch
  features, shared by all heads, rescaled ``(S - beta * mean(S)) * gamma`` and every negative
  entry set to ``-inf``; any normaliser of :data:`~sparseclip_d2.attention.NORMALIZER_REGISTRY`
  then turns the rows into weights (upstream: softmax).
- :func:`resample_grid`: a ``(B, ..., h*w, d)`` token grid resized bilinearly
  (``align_corners=False``) to another grid (upstream: ``F.interpolate(v, size=(H, W),
  mode='bilinear', align_corners=False)`` on CLIP's values without CLS).
"""
from typing import Tuple

import torch
import torch.nn.functional as F

__all__ = ["proxy_cosine_scores", "resample_grid", "check_beta_gamma"]


def check_beta_gamma(beta: float, gamma: float, key: str = "MODEL.SPARSECLIP.PROXY") -> Tuple[float, float]:
    """``(beta, gamma)`` as floats; ``ValueError`` naming the key unless beta is finite and gamma > 0."""
    import math

    out = []
    for name, value in (("BETA", beta), ("GAMMA", gamma)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
            raise ValueError(f"{key}.{name} = {value!r} is invalid; valid: a finite number")
        out.append(float(value))
    if not out[1] > 0:
        raise ValueError(f"{key}.GAMMA = {gamma!r} is invalid; valid: a number > 0 (it scales the shifted "
                         "similarity; negatives are masked)")
    return out[0], out[1]


def proxy_cosine_scores(feats: torch.Tensor, beta: float = 1.2, gamma: float = 3.0) -> torch.Tensor:
    """ProxyCLIP's proxy scores of each image.

    Args:
        feats: ``(B, C, h, w)`` proxy features.
        beta, gamma: shift (in units of the mean similarity) and scale; upstream 1.2 and 3
            (``proxyclip_segmentor.py`` ``__init__`` defaults).
    Returns:
        ``(B, h*w, h*w)`` float32: ``(S - beta * mean(S)) * gamma`` with ``S`` the cosine
        similarity of the L2-normalised feature vectors (row-major patches), the mean taken
        over each image's whole ``S`` (upstream takes it over the batch of one window), and
        negative entries ``-inf``.
    Raises:
        ValueError: a row would be entirely ``-inf`` (every similarity of a patch below
            ``beta * mean``; only possible when ``beta * mean(S) > 1``), which no normaliser
            can turn into weights.
    """
    if feats.dim() != 4:
        raise ValueError(f"proxy features must be (B, C, h, w), got shape {tuple(feats.shape)}")
    f = F.normalize(feats.float().flatten(2), dim=1)  # (B, C, N)
    s = torch.einsum("bcm,bcn->bmn", f, f)
    s = (s - s.mean(dim=(1, 2), keepdim=True) * beta) * gamma
    s = s.masked_fill(s < 0, float("-inf"))
    if bool(torch.isneginf(s).all(dim=-1).any()):
        raise ValueError(f"proxy scores: a patch has no similarity above beta x mean (beta={beta:g}, mean similarity "
                         f"{float(torch.einsum('bcm,bcn->bmn', f, f).mean()):.3f}); every weight of its row would "
                         "be undefined: lower MODEL.SPARSECLIP.PROXY.BETA")
    return s


def resample_grid(x: torch.Tensor, src: Tuple[int, int], dst: Tuple[int, int]) -> torch.Tensor:
    """Resize row-major grid tokens bilinearly (``align_corners=False``, float32).

    Args:
        x: ``(..., h*w, d)``.
        src, dst: ``(h, w)`` and the target ``(h', w')``.
    Returns:
        ``(..., h'*w', d)`` in ``x.dtype``; ``x`` itself when the grids are equal.
    """
    if tuple(src) == tuple(dst):
        return x
    *lead, n, d = x.shape
    h, w = src
    if n != h * w:
        raise ValueError(f"{n} tokens do not form a {h}x{w} grid")
    g = x.float().reshape(-1, h, w, d).permute(0, 3, 1, 2)
    g = F.interpolate(g, size=tuple(dst), mode="bilinear", align_corners=False)
    return g.permute(0, 2, 3, 1).reshape(*lead, dst[0] * dst[1], d).to(x.dtype)
