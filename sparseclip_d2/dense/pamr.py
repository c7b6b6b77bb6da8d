"""PAMR: pixel-adaptive mask refinement (Araslanov & Roth, "Single-Stage Semantic
Segmentation from Image Labels", CVPR 2020), as a post-processing step of dense logits.

Pure torch. For every pixel ``i`` and every neighbour ``j`` at offset
``(dy, dx) in {-d, 0, d}^2 \\ {(0, 0)}`` for each dilation ``d`` (8 neighbours per
dilation, image borders replicated), the affinity is

    a_ij = mean_c( -|I_c(i) - I_c(j)| / (1e-8 + 0.1 * sigma_c(i)) ),
    alpha_ij = softmax_j(a_ij),

where ``sigma_c(i)`` is the unbiased standard deviation of channel ``c`` over the
``9 * len(dilations)`` values ``I_c(i + (dy, dx))`` with ``(dy, dx) in {-d, 0, d}^2`` of every
dilation (the centre counted once per dilation). The mask (logits) is then propagated
``steps`` times: ``m(i) <- sum_j alpha_ij m(j)`` (the centre itself is not a neighbour).
These are the definitions of the reference implementation that NACLIP and SCLIP ship
(``pamr.py``, from visinf/1-stage-wseg), written here without its ``(B, C, P, H, W)``
neighbour stacks: the propagation loops over the offsets, so the extra memory is two
copies of the mask instead of ``P = 8 * len(dilations)``.

NACLIP refines with ``steps=10, dilations=(8, 16)`` (sinahmr/NACLIP ``naclip.py``,
``pamr_steps`` / ``pamr_stride``); SCLIP's segmentor has the same option, off by default.
"""
from typing import List, Sequence, Tuple

import torch
import torch.nn.functional as F

__all__ = ["pamr", "pamr_offsets", "pamr_affinity", "PAMR"]


def pamr_offsets(dilations: Sequence[int], include_centre: bool = False) -> List[Tuple[int, int]]:
    """The neighbour offsets ``(dy, dx)`` in row-major order per dilation: 8 per dilation,
    or 9 with the centre ``(0, 0)`` when ``include_centre``."""
    out = []
    for d in dilations:
        for dy in (-d, 0, d):
            for dx in (-d, 0, d):
                if (dy, dx) != (0, 0) or include_centre:
                    out.append((dy, dx))
    return out


def _check_dilations(dilations: Sequence[int]) -> Tuple[int, ...]:
    try:
        dil = tuple(int(d) for d in dilations)
    except (TypeError, ValueError):
        raise ValueError(f"PAMR dilations must be positive integers, got {dilations!r}") from None
    if not dil or any(d < 1 for d in dil) or any(float(d) != float(x) for d, x in zip(dil, dilations)):
        raise ValueError(f"PAMR dilations must be a non-empty list of positive integers, got {list(dilations)!r}")
    return dil


def _shift(x: torch.Tensor, dy: int, dx: int) -> torch.Tensor:
    """``out[..., y, x] = x[..., clamp(y + dy), clamp(x + dx)]`` (replicated borders)."""
    H, W = x.shape[-2:]
    rows = (torch.arange(H, device=x.device) + dy).clamp(0, H - 1)
    cols = (torch.arange(W, device=x.device) + dx).clamp(0, W - 1)
    return x.index_select(-2, rows).index_select(-1, cols)


def pamr_affinity(image: torch.Tensor, dilations: Sequence[int]) -> torch.Tensor:
    """Neighbour weights ``alpha`` of PAMR.

    Args:
        image: ``(B, K, H, W)`` float image (any normalisation: the affinity is invariant to
            a per-channel affine change up to the ``1e-8`` guard).
        dilations: neighbourhood dilations.
    Returns:
        ``(B, P, H, W)`` float32, ``P = 8 * len(dilations)`` in :func:`pamr_offsets` order;
        sums to 1 over ``P``.
    """
    if image.dim() != 4:
        raise ValueError(f"PAMR image must be (B, K, H, W), got shape {tuple(image.shape)}")
    dil = _check_dilations(dilations)
    x = image.float()
    with_centre = [_shift(x, dy, dx) for dy, dx in pamr_offsets(dil, include_centre=True)]
    stack = torch.stack(with_centre, dim=2)  # (B, K, 9 * nd, H, W): small (K = 3)
    sigma = stack.std(dim=2, unbiased=True)  # (B, K, H, W)
    del stack, with_centre
    denom = 1e-8 + 0.1 * sigma
    aff = [(-(x - _shift(x, dy, dx)).abs() / denom).mean(dim=1) for dy, dx in pamr_offsets(dil)]
    return torch.stack(aff, dim=1).softmax(dim=1)


def pamr(image: torch.Tensor, mask: torch.Tensor, steps: int = 10, dilations: Sequence[int] = (8, 16)) -> torch.Tensor:
    """Refine ``mask`` with PAMR guided by ``image``.

    Args:
        image: ``(B, K, H, W)`` (e.g. the normalised RGB image at the output size).
        mask: ``(B, C, h, w)`` logits or scores; bilinearly resized to ``(H, W)`` with
            ``align_corners=True`` first when the sizes differ (as the reference does).
        steps: propagation steps (0 returns the resized mask).
        dilations: neighbourhood dilations.
    Returns:
        ``(B, C, H, W)`` in ``mask``'s dtype (computed in float32). PAMR is linear in the
        mask, so refining ``s * logits`` gives ``s *`` the refined logits.
    """
    if mask.dim() != 4 or image.dim() != 4 or mask.shape[0] != image.shape[0]:
        raise ValueError(f"PAMR needs image (B, K, H, W) and mask (B, C, h, w) with the same B, got "
                         f"{tuple(image.shape)} and {tuple(mask.shape)}")
    if int(steps) != steps or steps < 0:
        raise ValueError(f"PAMR steps must be a non-negative integer, got {steps!r}")
    dil = _check_dilations(dilations)
    dtype = mask.dtype
    m = mask.float()
    if tuple(m.shape[-2:]) != tuple(image.shape[-2:]):
        m = F.interpolate(m, size=image.shape[-2:], mode="bilinear", align_corners=True)
    if steps == 0:
        return m.to(dtype)
    alpha = pamr_affinity(image, dil)  # (B, P, H, W)
    offsets = pamr_offsets(dil)
    H, W = m.shape[-2:]
    for _ in range(int(steps)):
        out = torch.zeros_like(m)
        padded = {d: F.pad(m, [d] * 4, mode="replicate") for d in dil}  # = _shift's clamped borders
        for p, (dy, dx) in enumerate(offsets):
            d = max(abs(dy), abs(dx))
            view = padded[d][..., d + dy:d + dy + H, d + dx:d + dx + W]
            out.add_(view * alpha[:, p:p + 1])
        del padded
        m = out
    return m.to(dtype)


class PAMR(torch.nn.Module):
    """:func:`pamr` as a module: ``PAMR(steps, dilations)(image, mask)``."""

    def __init__(self, steps: int = 10, dilations: Sequence[int] = (8, 16)):
        super().__init__()
        if int(steps) != steps or steps < 0:
            raise ValueError(f"PAMR steps must be a non-negative integer, got {steps!r}")
        self.steps = int(steps)
        self.dilations = _check_dilations(dilations)

    def extra_repr(self) -> str:
        return f"steps={self.steps}, dilations={self.dilations}"

    def forward(self, image: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return pamr(image, mask, self.steps, self.dilations)
