"""Cosine (L2-normalised) score sources with an inverse temperature and GEM's self-self
iteration loop: ``cosine_attention_weights``.

For a pair term ``ab`` (``qq``, ``kk``, ``vv``, ``qk``) the scores are
``S = cos(a_i, b_j) * s / temperature + prior`` where ``s`` is the inverse temperature:
a fixed number, or GEM's adaptive one, ``mean_i ||y_i||_2 * d**-0.5`` with ``y`` the block's
input tokens after its first norm (:func:`adaptive_inverse_temperature`). With ``iterations``
``n > 0`` every self term ``aa`` first refines its features ``n`` times,
``a <- N(cos(a, a) * s / T + prior) @ normalize(a)`` (GEM's ``ss_attn_iter``), and the
final weights come from the refined features. ``N`` is any registered normaliser (softmax,
entmax, ...), used both inside the loop and for the final weights. Terms combine with
:data:`~sparseclip_d2.attention.functional.SUM_MODES` as in ``attention_weights``.
"""
from typing import Optional, Union

import torch
import torch.nn.functional as F

from .functional import check_weight_inputs
from .sources import parse_source

__all__ = ["cosine_attention_weights", "adaptive_inverse_temperature", "check_cosine_source", "COSINE_TERMS", "QKV_NORMS"]

#: Pair terms a cosine source can use: term -> (index of a, index of b) in (q, k, v).
COSINE_TERMS = {"qk": (0, 1), "qq": (0, 0), "kk": (1, 1), "vv": (2, 2)}
#: How q / k / v are taken before scoring: ``none`` (scaled dot products, ``attention_weights``)
#: or ``l2`` (cosine similarities with an inverse temperature, :func:`cosine_attention_weights`).
QKV_NORMS = ("none", "l2")


def adaptive_inverse_temperature(y: torch.Tensor, head_dim: int) -> torch.Tensor:
    """GEM's adaptive inverse temperature: the mean L2 norm of the tokens times ``d**-0.5``.

    WalBouss/GEM @ 5fa677c ``gem/gem_utils.py`` ``SelfSelfAttention.forward``:
    ``torch.norm(x, dim=-1).mean(dim=-1) * self.scale`` with ``x`` the attention's input
    (the block's ``ln_1`` output) and ``scale = head_dim ** -0.5``.

    Args:
        y: ``(B, L, C)`` the block's normed input tokens (any float dtype).
        head_dim: ``d``, the per-head width.
    Returns:
        ``(B,)`` float32.
    """
    return y.float().norm(dim=-1).mean(dim=-1) * (float(head_dim) ** -0.5)


def check_cosine_source(source: str, iterations: int = 0):
    """The terms of ``source`` when cosine scores (and ``iterations`` self iterations) can use
    it; ``ValueError`` naming the bad terms and the valid ones otherwise."""
    terms = parse_source(source)
    bad = [t for t in terms if t not in COSINE_TERMS]
    if bad:
        raise ValueError(f"cosine (l2) scores take pair terms only; {bad} in {source!r} are not; valid terms: "
                         f"{', '.join(COSINE_TERMS)} and sums like qq+kk+vv")
    if iterations:
        cross = [t for t in terms if COSINE_TERMS[t][0] != COSINE_TERMS[t][1]]
        if cross:
            raise ValueError(f"self iterations refine a term's own features and need self terms (qq, kk, vv); "
                             f"{cross} in {source!r} compares two different projections")
    return terms


def cosine_attention_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    source: str = "qq+kk+vv",
    normalizer: str = "softmax",
    alpha: float = 1.2,
    inverse_temperature: Union[float, torch.Tensor] = 1.0,
    temperature: float = 1.0,
    iterations: int = 0,
    prior: Optional[torch.Tensor] = None,
    sum_mode: str = "normalize_then_mean",
    generator: Optional[torch.Generator] = None,
) -> torch.Tensor:
    """Attention weights from cosine similarities of L2-normalised q / k / v (GEM's scores).

    Args:
        q, k, v: ``(B, H, L, d)`` per-head projections (any float dtype).
        source: pair terms ``qq``, ``kk``, ``vv``, ``qk`` or sums like ``qq+kk+vv``.
        normalizer: a registered normaliser (``softmax``, ``entmax``, ...).
        alpha: entmax alpha.
        inverse_temperature: ``s``, a number or a ``(B,)`` tensor (one per image, e.g.
            :func:`adaptive_inverse_temperature`); must be > 0.
        temperature: the scores are also divided by it (> 0).
        iterations: GEM's self-self loop count (>= 0; > 0 needs self terms only).
        prior: optional additive score bias ending in ``(L, L)``.
        sum_mode: one of :data:`SUM_MODES` (GEM averages: ``normalize_then_mean``).
        generator: for ``random_matched``.
    Returns:
        ``(B, H, L, L)`` float32 weights.
    """
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 0:
        raise ValueError(f"iterations must be an integer >= 0, got {iterations!r}")
    terms = check_cosine_source(source, iterations)
    norm, alpha, prior = check_weight_inputs(q, k, v, normalizer, alpha, sum_mode, temperature, prior)
    B, H, L, _ = q.shape
    s = torch.as_tensor(inverse_temperature, dtype=torch.float32, device=q.device)
    if s.dim() == 1:
        if s.shape[0] != B:
            raise ValueError(f"inverse_temperature has {s.shape[0]} values for a batch of {B}")
        s = s.view(B, 1, 1, 1)
    elif s.dim() != 0:
        raise ValueError(f"inverse_temperature must be a number or a (B,) tensor, got shape {tuple(s.shape)}")
    if not bool((s > 0).all()):
        raise ValueError(f"inverse_temperature must be > 0, got {inverse_temperature!r}")
    s = s / float(temperature)

    def scores(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b.transpose(-1, -2)) * s

    def finish(x: torch.Tensor) -> torch.Tensor:
        return x if prior is None else x + prior

    proj = (q.float(), k.float(), v.float())
    raw = []
    for t in terms:
        ia, ib = COSINE_TERMS[t]
        a = proj[ia]
        for _ in range(iterations):  # GEM's ss_attn_iter loop (self terms only)
            a = F.normalize(a, dim=-1)
            a = torch.matmul(norm(finish(scores(a, a)), alpha=alpha, generator=generator), a)
        a = F.normalize(a, dim=-1)
        b = a if ia == ib else F.normalize(proj[ib], dim=-1)
        raw.append(scores(a, b))
    if sum_mode == "sum_then_normalize" and len(raw) > 1:
        total = raw[0]
        for r in raw[1:]:
            total = total + r
        return norm(finish(total), alpha=alpha, generator=generator).float()
    out = None
    for r in raw:
        w = norm(finish(r), alpha=alpha, generator=generator)
        out = w if out is None else out + w
    if sum_mode == "normalize_then_mean":
        out = out / len(raw)
    return out.float()
