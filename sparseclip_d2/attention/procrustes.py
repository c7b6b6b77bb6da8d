"""Procrustes-aligned attention scores: the keys rotated onto the queries before the dot product.

For one head with queries ``q`` and keys ``k`` (``L x d``):

1. token weights ``w_i = ||q_i||``, 0 on the ``prefix_tokens`` first tokens (the CLS token),
   normalised to sum to one (``w / (sum w + 1e-6)``);
2. weighted means ``mu_q = sum_i w_i q_i``, ``mu_k = sum_i w_i k_i`` and the centred
   ``q_c = q - mu_q``, ``k_c = k - mu_k``;
3. ``M = k_c^T q_c`` (``d x d``) and its orthogonal polar factor ``R = M (M^T M)^(-1/2)``: the
   rotation that best maps the centred keys onto the centred queries (orthogonal Procrustes),
   by ``iterations`` coupled Newton-Schulz steps (``newton_schulz``) or by an SVD
   (``svd``: ``R = U V^T`` of ``M = U S V^T``);
4. scores ``q (k R)^T d**-0.5 + kk_weight * k_c k_c^T d**-0.5``.

The normaliser (softmax, entmax, ...) is applied by the caller (``attention_weights``): this is a
score source (``SCORE_SOURCE_REGISTRY`` ``procrustes``, :mod:`.sources`).

Upstream: PGSmall/PEARL @ c26062b ``pearl/attn.py`` (``pa_attn`` and
``_polar_unitary_newton_schulz``; ``detach_cls=True`` zeroes the CLS weight, the eps 1e-6 of the
weights and of the Newton-Schulz normalisation, 5 iterations by default).
"""
import math
from typing import Tuple

import torch

__all__ = ["PROCRUSTES_SOLVERS", "PROCRUSTES_EPS", "polar_factor", "procrustes_scores", "check_procrustes_options"]

#: How the polar factor is computed: coupled Newton-Schulz steps (pearl/attn.py ``align_solver='polar'``)
#: or an SVD (``align_solver='svd'``).
PROCRUSTES_SOLVERS: Tuple[str, ...] = ("newton_schulz", "svd")
#: pearl/attn.py: ``w / (w.sum(...) + 1e-6)`` and ``_polar_unitary_newton_schulz(..., eps=1e-6)``.
PROCRUSTES_EPS = 1e-6


def check_procrustes_options(kk_weight, solver, iterations, prefix_tokens=0) -> Tuple[float, str, int, int]:
    """Validated ``(kk_weight, solver, iterations, prefix_tokens)``; ``ValueError`` naming the value
    and the valid choices otherwise."""
    if isinstance(kk_weight, bool) or not isinstance(kk_weight, (int, float)) or not math.isfinite(kk_weight):
        raise ValueError(f"procrustes kk_weight must be a finite number, got {kk_weight!r}")
    if not isinstance(solver, str) or solver.strip().lower() not in PROCRUSTES_SOLVERS:
        raise ValueError(f"unknown procrustes solver {solver!r}; valid: {', '.join(PROCRUSTES_SOLVERS)}")
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"procrustes iterations must be an integer >= 1, got {iterations!r}")
    if isinstance(prefix_tokens, bool) or not isinstance(prefix_tokens, int) or prefix_tokens < 0:
        raise ValueError(f"procrustes prefix_tokens must be an integer >= 0, got {prefix_tokens!r}")
    return float(kk_weight), solver.strip().lower(), iterations, prefix_tokens


def polar_factor(M: torch.Tensor, solver: str = "newton_schulz", iterations: int = 5,
                 eps: float = PROCRUSTES_EPS) -> torch.Tensor:
    """The orthogonal polar factor ``M (M^T M)^(-1/2)`` of each ``(..., d, d)`` matrix, in ``M``'s dtype.

    ``newton_schulz`` (pearl/attn.py ``_polar_unitary_newton_schulz``): ``A = M^T M``, ``n =
    max(||A||_F, eps)``, ``Y = A / n + eps I``, ``Z = I``; ``iterations`` times ``T = (3I - ZY) / 2``,
    ``Y = Y T``, ``Z = T Z``; then ``R = M Z / sqrt(n)``. ``Z`` tends to ``(A/n + eps I)^(-1/2)``; a
    few steps leave small singular values not yet converged, as upstream does.
    ``svd``: ``U V^T`` of ``M = U S V^T`` (``iterations`` unused).
    """
    if solver == "svd":
        U, _, Vh = torch.linalg.svd(M, full_matrices=False)
        return U @ Vh
    if solver != "newton_schulz":
        raise ValueError(f"unknown procrustes solver {solver!r}; valid: {', '.join(PROCRUSTES_SOLVERS)}")
    d = M.shape[-1]
    eye = torch.eye(d, device=M.device, dtype=M.dtype).expand(M.shape)
    A = M.transpose(-1, -2) @ M
    n = A.flatten(-2).norm(dim=-1).clamp_min(eps)[..., None, None]
    Y = A / n + eps * eye
    Z = eye.clone()
    for _ in range(int(iterations)):
        T = 0.5 * (3.0 * eye - Z @ Y)
        Y = Y @ T
        Z = T @ Z
    return M @ (Z / torch.sqrt(n))


def procrustes_scores(q: torch.Tensor, k: torch.Tensor, *, kk_weight: float = 0.0, solver: str = "newton_schulz",
                      iterations: int = 5, prefix_tokens: int = 0) -> torch.Tensor:
    """Procrustes-aligned scores (module docstring) of ``(..., L, d)`` queries and keys, computed in
    ``q``'s floating dtype (float32 for half inputs): ``(..., L, L)``."""
    dtype = q.dtype if q.dtype == torch.float64 else torch.float32
    q, k = q.to(dtype), k.to(dtype)
    d = q.shape[-1]
    scale = d ** -0.5
    w = q.norm(dim=-1, keepdim=True)
    if prefix_tokens:
        w = torch.cat([torch.zeros_like(w[..., :prefix_tokens, :]), w[..., prefix_tokens:, :]], dim=-2)
    w = w / (w.sum(dim=-2, keepdim=True) + PROCRUSTES_EPS)
    q_c = q - (w * q).sum(dim=-2, keepdim=True)
    k_c = k - (w * k).sum(dim=-2, keepdim=True)
    R = polar_factor(k_c.transpose(-1, -2) @ q_c, solver, iterations)
    scores = (q * scale) @ (k @ R).transpose(-1, -2)  # pearl/attn.py: bmm(q32 * scale, k_aligned^T)
    if kk_weight:
        scores = scores + kk_weight * ((k_c @ k_c.transpose(-1, -2)) * scale)
    return scores
