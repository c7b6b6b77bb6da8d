"""Attention mixed across layers: the last block's weights blended with the mean of weights
tapped from earlier blocks of the same forward pass.

``mix_attention(final, taps, weight, scale) = scale * ((1 - weight) * final + weight * mean(taps))``

covers the two published forms:

- ResCLIP's RCS (yvhangyang/ResCLIP ``clip/model.py`` ``custom_attn``):
  ``tau * ((1 - lambda) * A + lambda * A_rcs)`` with ``A_rcs`` the per-head mean of the Q-K
  softmax maps of layers 6-9 and ``(tau, lambda) = (2.0, 0.3)`` (``configs/cfg_voc21.py``
  ``attn_rcs_weights``);
- ITACLIP (m-arda-aydn/ITACLIP ``clip/model.py`` ``VisionTransformer.forward``):
  ``0.5 * A + 0.5 * mean_l A_l`` over layers 7, 8, 10 with ``A_l = softmax(QQ) + softmax(KK)``.

Pure torch; every tensor is ``(B, H, L, L)`` float32.
"""
from typing import Sequence

import torch

__all__ = ["mix_attention", "check_mix_weight", "check_mix_scale"]


def check_mix_weight(weight) -> float:
    """``weight`` as a float in [0, 1]; ``ValueError`` naming it otherwise."""
    if isinstance(weight, bool):
        raise ValueError(f"mix_weight must be a number in [0, 1], got {weight!r}")
    try:
        w = float(weight)
    except (TypeError, ValueError):
        raise ValueError(f"mix_weight must be a number in [0, 1], got {weight!r}") from None
    if not 0.0 <= w <= 1.0:
        raise ValueError(f"mix_weight must be in [0, 1] (the share of the tapped layers' mean), got {weight!r}")
    return w


def check_mix_scale(scale) -> float:
    """``scale`` as a finite float > 0; ``ValueError`` naming it otherwise."""
    if isinstance(scale, bool):
        raise ValueError(f"mix_scale must be a number > 0, got {scale!r}")
    try:
        s = float(scale)
    except (TypeError, ValueError):
        raise ValueError(f"mix_scale must be a number > 0, got {scale!r}") from None
    if not (s > 0 and s < float("inf")):
        raise ValueError(f"mix_scale must be a finite number > 0 (ResCLIP's tau), got {scale!r}")
    return s


def mix_attention(final: torch.Tensor, taps: Sequence[torch.Tensor], weight: float, scale: float = 1.0
                  ) -> torch.Tensor:
    """Blend the last block's attention with the mean of tapped layers' attention.

    Args:
        final: ``(B, H, L, L)`` weights of the last block.
        taps: one or more ``(B, H, L, L)`` weights of earlier blocks (same shape as ``final``).
        weight: share of the taps' mean, in [0, 1].
        scale: factor on the blend (> 0; ResCLIP's tau).
    Returns:
        ``(B, H, L, L)`` float32 ``scale * ((1 - weight) * final + weight * mean(taps))``.
    Raises:
        ValueError: no taps, a shape mismatch, or an invalid ``weight`` / ``scale``.
    """
    weight = check_mix_weight(weight)
    scale = check_mix_scale(scale)
    taps = list(taps)
    if not taps:
        raise ValueError("mix_attention needs at least one tapped layer's attention")
    for i, t in enumerate(taps):
        if tuple(t.shape) != tuple(final.shape):
            raise ValueError(f"tapped attention {i} has shape {tuple(t.shape)}, the last block's is "
                             f"{tuple(final.shape)}")
    mean = torch.stack([t.float() for t in taps]).mean(dim=0)
    return scale * ((1.0 - weight) * final.float() + weight * mean)
