"""``attention_weights``: score source x normaliser x prior, computed in float32."""
from typing import Any, Callable, Mapping, Optional

import torch

from .entmax import check_alpha
from .normalizers import get_normalizer
from .sources import SCORE_SOURCE_REGISTRY, parse_source

__all__ = ["attention_weights", "apply_attention", "SUM_MODES"]

#: How sum sources combine. ``normalize_then_sum``: each term is normalised separately
#: and the weights are added (rows sum to the number of terms; SCLIP's convention).
#: ``sum_then_normalize``: the scores are added and normalised once (rows sum to 1).
#: ``normalize_then_mean``: each term normalised, the weights averaged (rows sum to 1; GEM's
#: ``(xs1 + xs2 + xs3) / 3``, WalBouss/GEM @ 5fa677c ``gem/gem_utils.py``).
SUM_MODES = ("normalize_then_sum", "sum_then_normalize", "normalize_then_mean")


def check_weight_inputs(q, k, v, normalizer: str, alpha, sum_mode: str, temperature, prior):
    """The argument checks shared by :func:`attention_weights` and
    :func:`~sparseclip_d2.attention.cosine.cosine_attention_weights`: a registered normaliser,
    a valid alpha, a known ``sum_mode``, ``temperature > 0``, one ``(B, H, L, d)`` shape for
    q, k, v and a prior ending in ``(L, L)``. Returns ``(normaliser function, alpha, prior as
    float32 on q's device or None)``."""
    norm = get_normalizer(normalizer)
    alpha = check_alpha(alpha)
    if sum_mode not in SUM_MODES:
        raise ValueError(f"unknown sum_mode {sum_mode!r}; valid: {', '.join(SUM_MODES)}")
    if not float(temperature) > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(
            f"q, k, v must share a (B, H, L, d) shape, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    L = q.shape[2]
    if prior is not None:
        if prior.dim() < 2 or tuple(prior.shape[-2:]) != (L, L):
            raise ValueError(f"prior must end in ({L}, {L}) to match the {L} tokens, got {tuple(prior.shape)}")
        prior = prior.to(device=q.device, dtype=torch.float32)
    return norm, alpha, prior


def attention_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    source: str = "qk",
    normalizer: str = "softmax",
    alpha: float = 1.2,
    temperature: float = 1.0,
    prior: Optional[torch.Tensor] = None,
    sum_mode: str = "normalize_then_sum",
    generator: Optional[torch.Generator] = None,
    score_hook: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
    source_options: Optional[Mapping[str, Mapping[str, Any]]] = None,
) -> torch.Tensor:
    """Attention weights of a (possibly summed) score source under a normaliser.

    For each term ``t`` of ``source`` (e.g. ``qq`` and ``kk`` of ``"qq+kk"``) the scores are
    ``S_t = (a @ b^T) * d**-0.5 / temperature + prior`` in float32. With one term, or
    ``sum_mode="normalize_then_sum"``, the result is ``sum_t normalizer(S_t)`` (rows sum to
    the number of terms); with ``"sum_then_normalize"`` it is
    ``normalizer(sum_t (a_t @ b_t^T) * d**-0.5 / temperature + prior)`` (rows sum to 1).
    ``identity`` alone gives the identity matrix whatever the normaliser.

    Args:
        q, k, v: ``(B, H, L, d)`` per-head projections (any float dtype).
        source: ``qk``, ``qq``, ``kk``, ``vv``, ``identity`` or sums like ``qq+kk``.
        normalizer: ``softmax``, ``entmax``, ``sparsemax`` or ``random_matched``.
        alpha: entmax alpha in [1, 2] (also the reference of ``random_matched``).
        temperature: scores are divided by it (> 0).
        prior: optional additive score bias, ``(L, L)`` or broadcastable to ``(B, H, L, L)``.
        sum_mode: one of :data:`SUM_MODES`.
        generator: ``torch.Generator`` for ``random_matched``.
        score_hook: optional ``(B, H, L, L) -> (B, H, L, L)`` applied to the raw scores of
            each term (the summed scores with ``sum_then_normalize``) before temperature and
            prior, e.g. the feedback blend (``attention.feedback.blend_feedback``).
        source_options: ``{term: {option: value}}`` keyword options of the source terms that take
            them (``procrustes``: ``kk_weight``, ``solver``, ``iterations``, ``prefix_tokens``;
            ``AttentionSpec.source_options`` builds them); terms not named get none.
    Returns:
        ``(B, H, L, L)`` float32 weights.
    """
    terms = parse_source(source)
    norm, alpha, prior = check_weight_inputs(q, k, v, normalizer, alpha, sum_mode, temperature, prior)
    B, H, L, _ = q.shape

    if terms == ("identity",):
        eye = torch.eye(L, dtype=torch.float32, device=q.device)
        return eye.expand(B, H, L, L).contiguous()

    temperature = float(temperature)

    def finish(s: torch.Tensor) -> torch.Tensor:
        if score_hook is not None:
            s = score_hook(s)
        if temperature != 1.0:
            s = s / temperature
        if prior is not None:
            s = s + prior
        return s

    options = source_options or {}
    raw = [SCORE_SOURCE_REGISTRY.get(t)(q, k, v, **options.get(t, {})) for t in terms]
    if len(terms) == 1 or sum_mode != "sum_then_normalize":
        out = None
        for s in raw:
            w = norm(finish(s), alpha=alpha, generator=generator)
            out = w if out is None else out + w
        if sum_mode == "normalize_then_mean":
            out = out / len(terms)
        return out.float()
    total = raw[0]
    for s in raw[1:]:
        total = total + s
    return norm(finish(total), alpha=alpha, generator=generator).float()


def apply_attention(weights: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Weighted sum of values in float32, cast back to ``v``'s dtype.

    Args:
        weights: ``(B, H, L, L)`` float32.
        v: ``(B, H, L, d)``.
    Returns:
        ``(B, H, L, d)`` in ``v.dtype``.
    """
    return torch.matmul(weights.float(), v.float()).to(v.dtype)
