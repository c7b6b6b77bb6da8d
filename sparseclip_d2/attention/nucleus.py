"""Top-p (nucleus) pruning of attention rows, and the ``top_p`` normaliser built on it.

FSA (chi-chi-zx/FSA @ dbd2da5 ``open_clip/transformer.py`` ``SparseAtten``): sort a row's scores
in descending order, take the softmax of the row, keep the leading entries whose cumulative
probability is ``<= p`` (the first entry always), and set the others to ``-inf``. The kept
entries are then normalised by any registered normaliser (:func:`nucleus_prune` composes with
softmax, entmax, sparsemax, ...); ``top_p`` in :data:`~.normalizers.NORMALIZER_REGISTRY` is
the pruning followed by a softmax at FSA's ``p = 0.45``.
"""
import math
from typing import Optional

import torch

from .normalizers import NORMALIZER_REGISTRY

__all__ = ["TOP_P_DEFAULT", "check_top_p", "nucleus_mask", "nucleus_prune", "top_p"]

#: FSA's nucleus mass (chi-chi-zx/FSA @ dbd2da5 open_clip/transformer.py: ``SparseAtten(sim, p=0.45)``).
TOP_P_DEFAULT = 0.45


def check_top_p(p, key: str = "top_p") -> float:
    """``p`` as a float; ``ValueError`` naming ``key`` unless ``0 < p <= 1``."""
    ok = isinstance(p, (int, float)) and not isinstance(p, bool) and math.isfinite(float(p)) and 0 < float(p) <= 1
    if not ok:
        raise ValueError(f"{key} = {p!r} is invalid; valid: a number in (0, 1] (the probability mass kept per row)")
    return float(p)


def nucleus_mask(scores: torch.Tensor, p: float = TOP_P_DEFAULT) -> torch.Tensor:
    """Which entries of each row the nucleus of mass ``p`` keeps.

    Args:
        scores: ``(..., L)`` float (``-inf`` allowed; it has probability 0).
        p: probability mass in (0, 1] (1 keeps every entry).
    Returns:
        ``(..., L)`` bool: entry ``j`` is kept when the softmax mass of the entries ranked
        before it (by descending score, stable for ties) plus its own is ``<= p``; the
        top-ranked entry is always kept.
    """
    p = check_top_p(p, "p")
    if p == 1.0:  # the whole row (no cumulative-sum rounding at the end of it)
        return torch.ones_like(scores, dtype=torch.bool)
    order = torch.sort(scores, dim=-1, descending=True, stable=True)
    cum = torch.softmax(order.values, dim=-1).cumsum(dim=-1)
    keep_sorted = cum <= p
    keep_sorted[..., 0] = True
    return torch.zeros_like(keep_sorted).scatter(-1, order.indices, keep_sorted)


def nucleus_prune(scores: torch.Tensor, p: float = TOP_P_DEFAULT) -> torch.Tensor:
    """``scores`` with the entries outside the nucleus of mass ``p`` set to ``-inf`` (same
    shape and dtype): the input of any normaliser."""
    return scores.masked_fill(~nucleus_mask(scores, p), float("-inf"))


@NORMALIZER_REGISTRY.register()
def top_p(scores: torch.Tensor, *, alpha: float = 1.2, generator: Optional[torch.Generator] = None,
          p: float = TOP_P_DEFAULT):
    """Nucleus pruning at ``p`` (FSA's 0.45), then a row softmax over the kept entries:
    ``(..., L)`` -> ``(..., L)`` float32 (``alpha``/``generator`` unused)."""
    return torch.softmax(nucleus_prune(scores.float(), p), dim=-1)
