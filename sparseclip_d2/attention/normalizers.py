"""Row normalisers that turn attention scores into attention weights.

A normaliser is ``fn(scores, *, alpha, generator) -> weights`` with ``scores`` a float32
tensor ``(..., L)`` (temperature and prior already applied) and ``weights`` float32 of
the same shape, each row summing to 1 over the last dimension. Registered in
:data:`NORMALIZER_REGISTRY` under the function's ``__name__``:

- ``softmax``: the usual row softmax.
- ``entmax``: alpha-entmax with the given ``alpha`` (1 = softmax, 2 = sparsemax).
- ``sparsemax``: alpha-entmax at alpha = 2, whatever ``alpha`` says.
- ``random_matched``: the paper's control. Per row, keeps exactly as many entries as
  ``entmax`` at ``alpha`` keeps (its support size), chooses *which* entries uniformly at
  random with ``generator`` (only among finite scores), and renormalises a softmax over
  the kept entries. The random keys are drawn once for the trailing dimensions and
  shared along dim 0 (the batch), so an image's mask does not depend on the other
  images of the batch and a seeded generator makes the result reproducible.
"""
from typing import Optional

import torch
from fvcore.common.registry import Registry

from .entmax import alpha_entmax

__all__ = ["NORMALIZER_REGISTRY", "NORMALIZERS_WITHOUT_ALPHA", "get_normalizer", "support_size"]

#: Normalisers that ignore ``alpha``: softmax uses none, sparsemax is alpha-entmax at alpha = 2
#: whatever ``alpha`` says, ``top_p`` (``attention/nucleus.py``) keeps a share of the mass.
NORMALIZERS_WITHOUT_ALPHA = ("softmax", "sparsemax", "top_p")

NORMALIZER_REGISTRY = Registry("ATTENTION_NORMALIZER")
NORMALIZER_REGISTRY.__doc__ = """
Registry of attention row normalisers ``fn(scores (..., L) float32, *, alpha, generator)
-> weights (..., L) float32``.
"""


@NORMALIZER_REGISTRY.register()
def softmax(scores: torch.Tensor, *, alpha: float = 1.2, generator: Optional[torch.Generator] = None):
    """Row softmax: (..., L) float32 -> (..., L) float32 (``alpha``/``generator`` unused)."""
    return torch.softmax(scores.float(), dim=-1)


@NORMALIZER_REGISTRY.register()
def entmax(scores: torch.Tensor, *, alpha: float = 1.2, generator: Optional[torch.Generator] = None):
    """alpha-entmax of each row: (..., L) float32 -> (..., L) float32 with exact zeros."""
    return alpha_entmax(scores.float(), alpha, dim=-1).float()


@NORMALIZER_REGISTRY.register()
def sparsemax(scores: torch.Tensor, *, alpha: float = 1.2, generator: Optional[torch.Generator] = None):
    """Sparsemax (alpha-entmax at alpha = 2) of each row: (..., L) -> (..., L) float32."""
    return alpha_entmax(scores.float(), 2.0, dim=-1).float()


def support_size(weights: torch.Tensor) -> torch.Tensor:
    """Number of non-zero entries per row: (..., L) -> (...,) long."""
    return (weights > 0).sum(dim=-1)


@NORMALIZER_REGISTRY.register()
def random_matched(scores: torch.Tensor, *, alpha: float = 1.2, generator: Optional[torch.Generator] = None):
    """Random mask with the per-row support size of alpha-entmax, softmax over the kept entries.

    Args:
        scores: ``(..., L)`` float32 (at least 2-D; dim 0 is treated as the batch).
        alpha: the entmax alpha whose support size is matched.
        generator: seeded ``torch.Generator`` (any device); ``None`` uses a fresh generator
            seeded with 0, so the result is always reproducible.
    Returns:
        ``(..., L)`` float32; row r has exactly ``support_size(entmax(scores, alpha))[r]``
        non-zero entries.
    """
    scores = scores.float()
    k = support_size(alpha_entmax(scores, alpha, dim=-1))  # (...,)
    if generator is None:
        generator = torch.Generator(device=scores.device).manual_seed(0)
    key_shape = (1,) + tuple(scores.shape[1:]) if scores.dim() >= 2 else tuple(scores.shape)
    keys = torch.rand(key_shape, generator=generator, device=generator.device).to(scores.device)
    keys = keys.expand_as(scores)
    # never pick a masked (-inf) entry while a finite one is left
    keys = keys.masked_fill(torch.isneginf(scores), float("inf"))
    rank = keys.argsort(dim=-1).argsort(dim=-1)
    keep = rank < k.unsqueeze(-1)
    return torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)


def _valid_normalizers_text() -> str:
    return ", ".join(sorted(name for name, _ in NORMALIZER_REGISTRY))


def get_normalizer(name: str):
    """The registered normaliser called ``name``.

    Raises:
        ValueError: unknown name, listing the valid ones.
    """
    if not isinstance(name, str) or name not in NORMALIZER_REGISTRY:
        raise ValueError(f"unknown attention normalizer {name!r}; valid: {_valid_normalizers_text()}")
    return NORMALIZER_REGISTRY.get(name)
