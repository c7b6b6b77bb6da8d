"""Patch self-similarity of an intermediate layer as a part: the cosine map, feature
aggregation thresholded on it, and the map as an attention score term (SC-CLIP, SFP).

- :func:`cosine_similarity_map`: ``S = f f^T`` of the L2-normalised tokens of each image;
- :func:`similarity_aggregate`: ``x <- (S' / (rowsum S' + 1e-6)) x`` with ``S'`` = ``S`` whose
  entries below a threshold are 0 (SuleBai/SC-CLIP @ 0417ba9 ``clip/model.py``
  ``adaptively_aggregate``, the map thresholded at ``beta = 0.4`` before it);
- :func:`similarity_scores`: ``(S - mean S) * scale`` with every negative entry ``-inf``, the
  mean over each image's whole map (SC-CLIP's ``custom_attn``: ``(mid_simi -
  torch.mean(mid_simi)) * 3.0``, then ``mid_simi[mid_simi < 0.0] = float('-inf')``; upstream
  takes the mean over its batch of one window). Any registered normaliser turns these scores
  into weights (upstream: softmax). The diagonal, ``1 - mean S >= 0``, is never masked, so no
  row is entirely ``-inf``.

Pure torch; every map is ``(B, N, N)`` float32 (float64 in, float64 out).
"""
import math

import torch

__all__ = ["cosine_similarity_map", "similarity_aggregate", "similarity_scores", "check_similarity_threshold",
           "check_similarity_scale"]


def _float(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.float64 else x.float()


def cosine_similarity_map(tokens: torch.Tensor) -> torch.Tensor:
    """``(B, N, C)`` tokens -> ``(B, N, N)`` cosine similarities ``f_i . f_j`` with
    ``f = x / ||x||`` (float32, or float64 for float64 input)."""
    if tokens.dim() != 3:
        raise ValueError(f"tokens must be (B, N, C), got shape {tuple(tokens.shape)}")
    f = _float(tokens)
    f = f / f.norm(dim=-1, keepdim=True)
    return torch.matmul(f, f.transpose(1, 2))


def similarity_aggregate(x: torch.Tensor, sim: torch.Tensor, threshold: float) -> torch.Tensor:
    """Aggregate tokens with a thresholded similarity map.

    Args:
        x: ``(B, N, C)`` tokens.
        sim: ``(B, N, N)`` similarities (:func:`cosine_similarity_map`).
        threshold: entries of ``sim`` below it are set to 0 first.
    Returns:
        ``(B, N, C)`` (float32 or float64): ``(S' / (S'.sum(-1) + 1e-6)) @ x``.
    """
    if sim.dim() != 3 or x.dim() != 3 or sim.shape[0] != x.shape[0] or sim.shape[1:] != (x.shape[1], x.shape[1]):
        raise ValueError(f"similarity map {tuple(sim.shape)} does not match tokens {tuple(x.shape)}; expected "
                         "(B, N, N) for (B, N, C)")
    s = _float(sim)
    s = s.masked_fill(s < float(threshold), 0.0)
    s = s / (s.sum(dim=-1, keepdim=True) + 1e-6)
    return torch.matmul(s, _float(x))


def similarity_scores(sim: torch.Tensor, scale: float = 3.0) -> torch.Tensor:
    """A similarity map as attention scores shared by all heads.

    Args:
        sim: ``(B, N, N)`` similarities.
        scale: factor on the shifted map (> 0; SC-CLIP / SFP: 3).
    Returns:
        ``(B, 1, N, N)`` float32 (float64 for float64 input): ``(S - mean S) * scale`` per
        image, negative entries ``-inf``.
    """
    if sim.dim() != 3:
        raise ValueError(f"similarity map must be (B, N, N), got shape {tuple(sim.shape)}")
    s = _float(sim)
    # one full reduction per image (what upstream's torch.mean of its one-window map computes)
    mean = torch.stack([s[b].mean() for b in range(s.shape[0])]).view(-1, 1, 1)
    s = (s - mean) * float(scale)
    s = s.masked_fill(s < 0.0, float("-inf"))
    return s.unsqueeze(1)


def check_similarity_threshold(value) -> float:
    """``value`` as a finite float in [-1, 1] (a cosine); ``ValueError`` naming it otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)) \
            or not -1.0 <= float(value) <= 1.0:
        raise ValueError(f"similarity_threshold={value!r} is invalid; valid: a cosine in [-1, 1] (SC-CLIP: 0.4)")
    return float(value)


def check_similarity_scale(value) -> float:
    """``value`` as a finite float > 0; ``ValueError`` naming it otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)) \
            or not float(value) > 0:
        raise ValueError(f"similarity_scale={value!r} is invalid; valid: a finite number > 0 (SC-CLIP: 3)")
    return float(value)
