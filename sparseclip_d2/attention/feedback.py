"""Semantic feedback: a score prior built from a first segmentation, blended into the last
block's scores in a second pass (ResCLIP's SFR, "semantic feedback refinement").

Three steps, each usable by any method:

1. :func:`patch_labels`: per-pixel class probabilities of the first pass -> one label per
   patch (argmax, pixels whose top probability is below ``threshold`` set to label 0, then
   the most frequent label of each ``p x p`` patch, ties to the smallest label);
2. :func:`feedback_prior`: patch labels -> a ``(B, P + N, P + N)`` prior: 1 for patch pairs of
   one label; with ``connectivity`` a pair whose straight path (as sampled by
   :func:`path_connected`) leaves the label is decayed by ``exp(-steps / max_steps)``
   (``steps`` = the Chebyshev distance); each row then smoothed by a zero-padded 1-D gaussian
   over the flattened patch index, clamped at 0 and normalised to sum 1; prefix (CLS) rows
   and columns 0;
3. :func:`blend_feedback`: scores ``S`` -> ``scale * ((1 - weight) * S + weight * P / max P)``,
   the prior optionally rounded to float16 first (``precision``).

Upstream (yvhangyang/ResCLIP @ 0e085f7 ``clip/model.py``): ``create_patch_matrix``,
``check_path``, ``generate_attention_sfr`` and the ``attn_sfr`` blend in ``custom_attn``,
which casts ``attn_sfr`` to float16 in every run (``attn_sfr.to(torch.float16)``) so that
``weight * P`` is a float16 product: ``precision="float16"`` reproduces that, ``float32``
keeps the prior in float32. Pure torch; batched (one prior per image).
"""
import math
from typing import Tuple

import torch
import torch.nn.functional as F

__all__ = ["FEEDBACK_PRECISIONS", "check_feedback_precision", "patch_labels", "path_connected",
           "feedback_prior", "blend_feedback"]

#: How the prior enters the blend: ``float32``, or ``float16`` (ResCLIP's ``attn_sfr`` cast).
FEEDBACK_PRECISIONS = ("float32", "float16")

# Rows of start patches whose path samples are built at a time (bounds the memory of
# path_connected to about chunk * N * max(h, w) samples).
_PATH_CHUNK = 64


def check_feedback_precision(precision) -> str:
    """``precision`` lower-cased when it is one of :data:`FEEDBACK_PRECISIONS`; ValueError otherwise."""
    p = str(precision).strip().lower() if isinstance(precision, str) else precision
    if p not in FEEDBACK_PRECISIONS:
        raise ValueError(f"unknown feedback precision {precision!r}; valid: {', '.join(FEEDBACK_PRECISIONS)}")
    return p


def patch_labels(probs: torch.Tensor, patch: int, threshold: float = 0.0) -> torch.Tensor:
    """One label per patch from per-pixel class probabilities.

    Args:
        probs: ``(B, S, H, W)`` probabilities (or any scores) of ``S`` labels per pixel.
        patch: patch side ``p`` in pixels; only the top-left ``floor(H / p) x floor(W / p)``
            patches are labelled (as ``Tensor.unfold`` does upstream).
        threshold: pixels whose largest value is below it get label 0 (ResCLIP's
            ``temp_thd``); 0 disables.
    Returns:
        ``(B, H // p, W // p)`` long: the most frequent pixel label of each patch, ties to the
        smallest label (``torch.mode``).
    Raises:
        ValueError: a bad shape or a patch larger than the image.
    """
    if probs.dim() != 4:
        raise ValueError(f"probs must be (B, S, H, W), got shape {tuple(probs.shape)}")
    p = int(patch)
    B, _, H, W = probs.shape
    if p < 1 or H < p or W < p:
        raise ValueError(f"patch size {patch!r} does not fit a {H}x{W} probability map")
    top, pred = probs.max(dim=1)
    if threshold:
        pred = torch.where(top < threshold, torch.zeros_like(pred), pred)
    h, w = H // p, W // p
    blocks = pred[:, : h * p, : w * p].reshape(B, h, p, w, p).permute(0, 1, 3, 2, 4).reshape(B, h, w, p * p)
    return torch.mode(blocks, dim=-1).values


def _grid_coords(grid: Tuple[int, int], device) -> torch.Tensor:
    h, w = grid
    n = torch.arange(h * w, device=device)
    return torch.stack((torch.div(n, w, rounding_mode="floor"), n % w), dim=-1)  # (N, 2) (row, col)


def path_connected(labels: torch.Tensor) -> torch.Tensor:
    """Whether each patch pair is joined by a straight path of its start label.

    For start ``a`` and end ``b`` (row, column) on the grid, ``steps = max |b - a|`` and
    ``M`` = the largest ``steps`` over all pairs of the grid. The path is sampled at
    ``round(a * (1 - t_k) + b * t_k)`` for ``t = linspace(0, 1, M + 1)`` (float32, ties to
    even), ``k = 0 .. steps``: with ``steps < M`` only the first ``steps / M`` of the segment
    is visited (ResCLIP's ``check_path`` samples the same points). The pair is connected
    when every sample carries ``labels[a]``.

    Args:
        labels: ``(B, h, w)`` integer patch labels.
    Returns:
        ``(B, N, N)`` bool, ``N = h * w`` (row-major patches), start index first.
    """
    if labels.dim() != 3:
        raise ValueError(f"labels must be (B, h, w), got shape {tuple(labels.shape)}")
    B, h, w = labels.shape
    N = h * w
    device = labels.device
    coords = _grid_coords((h, w), device)
    flat = labels.reshape(B, N)
    out = torch.ones(B, N, N, dtype=torch.bool, device=device)
    max_steps = max(h, w) - 1
    if max_steps == 0:
        return out
    t = torch.linspace(0, 1, steps=max_steps + 1, device=device).view(1, 1, -1, 1)  # float32
    k = torch.arange(max_steps + 1, device=device)
    end = coords.view(1, N, 1, 2).float()
    for s0 in range(0, N, _PATH_CHUNK):
        start = coords[s0:s0 + _PATH_CHUNK]
        n = start.shape[0]
        steps = (coords.view(1, N, 2) - start.view(n, 1, 2)).abs().amax(dim=-1)  # (n, N)
        pts = (start.view(n, 1, 1, 2).float() * (1 - t) + end * t).round().long()  # (n, N, T, 2)
        idx = pts[..., 0] * w + pts[..., 1]  # (n, N, T)
        visited = k.view(1, 1, -1) <= steps.unsqueeze(-1)
        same = flat[:, idx] == flat[:, s0:s0 + n].view(B, n, 1, 1)  # (B, n, N, T)
        out[:, s0:s0 + n] = (same | ~visited).all(dim=-1)
    return out


def feedback_prior(labels: torch.Tensor, smooth_std: float = 5.0, connectivity: bool = True,
                   num_prefix_tokens: int = 1) -> torch.Tensor:
    """The feedback prior of patch labels (ResCLIP's ``generate_attention_sfr``).

    ``A[i, j] = 1`` when patches ``i`` and ``j`` share a label; with ``connectivity`` a pair
    that is not :func:`path_connected` keeps ``A[i, j] * exp(-steps_ij / M)``; then each row is
    convolved with the normalised gaussian ``g(x) = exp(-x^2 / (2 std^2))``, ``x = -r .. r``,
    of ``K = min(N, int(6 std + 1))`` taps (made odd, ``r = K // 2``) over the flattened patch
    index with zero padding, clamped at 0 and divided by its sum ``+ 1e-8``.

    Args:
        labels: ``(B, h, w)`` integer patch labels.
        smooth_std: gaussian std in (flattened) patches, > 0 (ResCLIP: its ``gaussian_std``).
        connectivity: decay the pairs of one label that no straight path joins
            (ResCLIP's ``delete_same_entity``).
        num_prefix_tokens: prefix (CLS) tokens placed first, their rows and columns 0.
    Returns:
        ``(B, P + N, P + N)`` float32.
    """
    if labels.dim() != 3:
        raise ValueError(f"labels must be (B, h, w), got shape {tuple(labels.shape)}")
    if not (isinstance(smooth_std, (int, float)) and not isinstance(smooth_std, bool) and smooth_std > 0
            and math.isfinite(smooth_std)):
        raise ValueError(f"feedback smooth_std must be a finite number > 0 (patches), got {smooth_std!r}")
    B, h, w = labels.shape
    N = h * w
    flat = labels.reshape(B, N)
    a = (flat.unsqueeze(2) == flat.unsqueeze(1)).float()  # (B, N, N)
    if connectivity and max(h, w) > 1:
        coords = _grid_coords((h, w), labels.device)
        steps = (coords.view(N, 1, 2) - coords.view(1, N, 2)).abs().amax(dim=-1)
        decay = torch.exp(-steps / (max(h, w) - 1))
        a = torch.where(path_connected(labels), a, a * decay)
    size = min(N, int(6 * smooth_std + 1))
    size = size if size % 2 == 1 else size + 1
    x = torch.arange(size, device=labels.device) - size // 2
    g = torch.exp(-(x ** 2) / (2 * smooth_std ** 2))
    g = g / g.sum()
    rows = F.conv1d(a.reshape(B * N, 1, N), g.view(1, 1, -1), padding=size // 2).reshape(B, N, N)
    rows = F.relu(rows)
    rows = rows / (rows.sum(dim=-1, keepdim=True) + 1e-8)
    P = int(num_prefix_tokens)
    out = torch.zeros(B, P + N, P + N, dtype=torch.float32, device=labels.device)
    out[:, P:, P:] = rows
    return out


def blend_feedback(scores: torch.Tensor, prior: torch.Tensor, weight: float, scale: float,
                   precision: str = "float32") -> torch.Tensor:
    """``scale * ((1 - weight) * scores + weight * prior / max(prior))`` per image.

    Args:
        scores: ``(B, H, L, L)`` float32 scores (before normalisation).
        prior: ``(B, L, L)`` feedback prior (:func:`feedback_prior`).
        weight: share of the prior, in [0, 1] (ResCLIP's SFR lambda).
        scale: factor on the blend, > 0 (ResCLIP's SFR tau).
        precision: ``float32``, or ``float16``: the max-normalised prior is rounded to float16
            and ``weight * prior`` computed in float16 before the float32 sum (ResCLIP).
    Returns:
        ``(B, H, L, L)`` float32.
    """
    precision = check_feedback_precision(precision)
    if prior.dim() != 3 or prior.shape[0] != scores.shape[0] or tuple(prior.shape[1:]) != tuple(scores.shape[-2:]):
        raise ValueError(f"feedback prior of shape {tuple(prior.shape)} does not match scores "
                         f"{tuple(scores.shape)}; expected (B, L, L)")
    p = prior.float()
    peak = p.flatten(1).amax(dim=1).view(-1, 1, 1)
    if bool((peak <= 0).any()):
        raise ValueError("feedback prior has an image whose prior is all zero (no patch tokens?)")
    p = (p / peak).unsqueeze(1)
    if precision == "float16":
        p = p.to(torch.float16)
    return scale * ((1 - weight) * scores.float() + weight * p)
