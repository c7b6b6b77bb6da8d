"""Attention score sources: which pair of projections is compared in the last block.

A score source maps the per-head projections ``q, k, v`` of shape ``(B, H, L, d)`` to
float32 scores ``(B, H, L, L)`` *before* temperature, prior and normalisation. Pair
sources compute ``(a @ b^T) * d**-0.5``; ``identity`` gives scores that are 0 on the
diagonal and ``-inf`` elsewhere, so that every normaliser returns the identity matrix
(the value-only path of MaskCLIP / the paper's ``v-only`` row).

Sources are registered in :data:`SCORE_SOURCE_REGISTRY` (fvcore ``Registry``); a new
source is one registered function ``fn(q, k, v, **options) -> (B, H, L, L) float32`` whose
``__name__`` is its config name; a source with options (``procrustes``) takes them as keywords,
passed by ``attention_weights(source_options={name: {...}})``. Sum sources such as ``qq+kk`` are
parsed by :func:`parse_source`.
"""
from typing import Tuple

import torch
from fvcore.common.registry import Registry

from .procrustes import procrustes_scores

__all__ = [
    "SCORE_SOURCE_REGISTRY",
    "SOURCE_ALIASES",
    "paper_source_name",
    "get_score_source",
    "parse_source",
    "canonical_source",
    "pair_scores",
]

SCORE_SOURCE_REGISTRY = Registry("SCORE_SOURCE")
SCORE_SOURCE_REGISTRY.__doc__ = """
Registry of attention score sources. Each entry is ``fn(q, k, v) -> scores`` with
q, k, v of shape (B, H, L, d) and float32 scores of shape (B, H, L, L).
"""

# The paper's name of each single source (value path is always V): the one table of names.
_PAPER_NAMES = {"qk": "qkv", "qq": "qqv", "kk": "kkv", "vv": "vvv", "identity": "v-only"}
#: Accepted aliases -> registered source: the paper's names, plus "v" for the value path.
SOURCE_ALIASES = {**{paper: name for name, paper in _PAPER_NAMES.items()}, "v": "identity"}


def pair_scores(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Scaled dot-product scores ``(a @ b^T) * d**-0.5`` in float32.

    Args:
        a, b: ``(B, H, L, d)`` (any float dtype).
    Returns:
        ``(B, H, L, L)`` float32.
    """
    d = a.shape[-1]
    return torch.matmul(a.float(), b.float().transpose(-1, -2)) * (d ** -0.5)


@SCORE_SOURCE_REGISTRY.register()
def qk(q, k, v):
    """Standard attention scores ``Q K^T / sqrt(d)``: (B, H, L, d) x3 -> (B, H, L, L) float32."""
    return pair_scores(q, k)


@SCORE_SOURCE_REGISTRY.register()
def qq(q, k, v):
    """Query self-correlation ``Q Q^T / sqrt(d)`` (ClearCLIP, SCLIP term): -> (B, H, L, L) float32."""
    return pair_scores(q, q)


@SCORE_SOURCE_REGISTRY.register()
def kk(q, k, v):
    """Key self-correlation ``K K^T / sqrt(d)`` (NACLIP, SCLIP term): -> (B, H, L, L) float32."""
    return pair_scores(k, k)


@SCORE_SOURCE_REGISTRY.register()
def vv(q, k, v):
    """Value self-correlation ``V V^T / sqrt(d)``: -> (B, H, L, L) float32."""
    return pair_scores(v, v)


@SCORE_SOURCE_REGISTRY.register()
def identity(q, k, v):
    """Identity attention as scores: 0 on the diagonal, ``-inf`` elsewhere, (B, H, L, L) float32.

    Every normaliser maps these rows to one-hot rows, i.e. the block outputs its
    value projections (MaskCLIP's value path).
    """
    B, H, L, _ = q.shape
    eye = torch.eye(L, dtype=torch.bool, device=q.device)
    s = torch.full((L, L), float("-inf"), dtype=torch.float32, device=q.device)
    s = s.masked_fill(eye, 0.0)
    return s.expand(B, H, L, L)


@SCORE_SOURCE_REGISTRY.register()
def procrustes(q, k, v, *, kk_weight: float = 0.0, solver: str = "newton_schulz", iterations: int = 5,
               prefix_tokens: int = 0):
    """Procrustes-aligned scores ``q (k R)^T s + kk_weight k_c k_c^T s`` (``attention/procrustes.py``;
    PGSmall/PEARL @ c26062b ``pearl/attn.py`` ``pa_attn``): -> (B, H, L, L) float32.

    Options: ``kk_weight`` (the centred key term's weight), ``solver`` (``newton_schulz`` or
    ``svd``), ``iterations`` (Newton-Schulz steps), ``prefix_tokens`` (leading tokens weighted 0
    in the means: the CLS token).
    """
    return procrustes_scores(q, k, kk_weight=kk_weight, solver=solver, iterations=iterations,
                             prefix_tokens=prefix_tokens).float()


def _valid_sources_text() -> str:
    names = sorted(name for name, _ in SCORE_SOURCE_REGISTRY)
    return ", ".join(names) + ", or sums like qq+kk"


def canonical_source(source: str) -> str:
    """Normalise a source string: lower case, no spaces, paper aliases mapped (``qqv`` -> ``qq``).

    Raises:
        ValueError: for an unknown term, naming it and listing the valid sources.
    """
    return "+".join(parse_source(source))


def parse_source(source: str) -> Tuple[str, ...]:
    """Split a (possibly summed) source such as ``"qq+kk"`` into validated term names.

    Returns:
        tuple of registered source names, e.g. ``("qq", "kk")``.
    Raises:
        ValueError: unknown or empty term, with the valid names.
    """
    if not isinstance(source, str) or not source.strip():
        raise ValueError(f"attention source must be a non-empty string, got {source!r}; valid: {_valid_sources_text()}")
    terms = []
    for raw in source.lower().replace(" ", "").split("+"):
        name = SOURCE_ALIASES.get(raw, raw)
        if name not in SCORE_SOURCE_REGISTRY:
            raise ValueError(f"unknown attention source {raw!r} in {source!r}; valid: {_valid_sources_text()}")
        terms.append(name)
    return tuple(terms)


def paper_source_name(source: str) -> str:
    """The paper's name of a source: ``qk`` -> ``qkv``, ``identity`` -> ``v-only``; sums keep
    the short term names, as the paper writes them (``qqv+kkv`` -> ``qq+kk``).

    Raises:
        ValueError: an unknown term (see :func:`parse_source`).
    """
    terms = parse_source(source)
    if len(terms) == 1:
        return _PAPER_NAMES.get(terms[0], terms[0])
    return "+".join(terms)


def get_score_source(name: str):
    """The registered source function called ``name`` (aliases accepted).

    Raises:
        ValueError: unknown name, listing the valid ones.
    """
    terms = parse_source(name)
    if len(terms) != 1:
        raise ValueError(f"get_score_source takes a single source, got the sum {name!r}; use attention_weights")
    return SCORE_SOURCE_REGISTRY.get(terms[0])
