"""Fast exact alpha-entmax for attention rows.

Definition (Peters et al., 2019): for ``alpha`` in (1, 2],

    alpha_entmax(x)_i = [1 + (alpha - 1) (x_i - t)]_+ ** (1 / (alpha - 1))

where the threshold ``t`` (one per row) is the unique value with ``sum_i p_i = 1``;
``alpha = 1`` is the softmax (the limit of the formula) and ``alpha = 2`` sparsemax.
Writing ``r = 1 / (alpha - 1) >= 1`` and ``u_i(t) = [1 + (x_i - t) / r]_+``, the row sums
to one exactly when ``h(t) := (sum_i u_i(t) ** r) ** (1 / r) = 1``.

Algorithm (all of it vectorised over rows; no Python loop over rows):

1. **Bounds.** The largest entry has ``p_max = u_max ** r <= 1``, so ``t >= max(x)``;
   at ``t = max(x)`` the largest entry alone already gives ``p = 1``, so
   ``t_lo = max(x)`` is a lower bound with ``h(t_lo) >= 1``.
2. **Pruning.** An entry with ``x_i <= max(x) - r`` has ``u_i(t) <= u_i(t_lo) <= 0``: it
   can never be in the support and is exactly zero.  For attention rows at
   ``alpha >= 1.2`` most entries of a row are pruned (e.g. 7 % kept for randn*3 logits at
   alpha 1.2, 1 % at alpha 1.5).  Rows whose candidate count is at most ``L / 4`` are
   compacted (one ``nonzero``) into a padded ``(rows, K)`` float64 matrix, ``K`` the
   largest candidate count; the remaining ("dense") rows are solved on their full length,
   in float32 and in bounded chunks of rows.
3. **Safeguarded Newton on h.** ``h`` is convex and decreasing in ``t`` (``u_i`` is a
   convex function of ``t``, and a p-norm, ``p = r >= 1``, is convex and monotone on the
   non-negative orthant), so Newton's method started at ``t_lo`` (where ``h >= 1``)
   increases monotonically to the root and cannot overshoot; a bisection safeguard on the
   bracket ``[max(x), max(x) + r (1 - n ** (1 - alpha))]`` (``n`` = finite entries)
   guards against rounding.  Newton on ``h`` rather than on ``sum p`` matters: ``h`` is
   exactly linear in ``t`` while the support does not change (``h = n^(1/r) (1 + ...)``
   for equal entries), so it converges in a few steps where Newton on ``sum p`` (a
   degree-``r`` polynomial) crawls.  With ``f = sum u^r`` and ``S = sum u^(r-1)`` the
   step is ``expm1(ln(f) / r) / (f^(1/r - 1) S / r)``; ``expm1``/``log`` keep it accurate
   as ``alpha -> 1`` (where the first step becomes the log-sum-exp).
4. **Output.** ``p = u^r / f`` at the converged ``t`` (the final division makes rows sum
   to one to rounding), written into a zero tensor: pruned entries and ``-inf`` entries
   are exact zeros.

Why it is exact: pruning removes only entries that are provably zero, and on the
remaining entries the threshold is the root of the same equation, solved to float64
precision (compacted rows) or float32 precision (dense rows, followed by the exact
normalisation), so the result is the exact alpha-entmax up to floating-point rounding.

Cost: one ``amax`` pass, one comparison pass, one ``nonzero`` and a gather/scatter of the
candidates, plus a zero-filled output; the Newton iterations run on the small padded
matrix.  Only the dense rows (small alpha or very flat rows) pay full-length passes.
"""
import logging
import math

import torch

__all__ = ["alpha_entmax"]

logger = logging.getLogger(__name__)

# Rows with at most this fraction of their length as candidates take the compacted path.
_SPARSE_FRACTION = 0.25
# Dense rows are processed in chunks of about this many elements (bounds temporaries).
_DENSE_CHUNK_ELEMS = 1 << 20
_MAX_ITER = {torch.float64: 60, torch.float32: 40}


def _power(u: torch.Tensor, e: float) -> torch.Tensor:
    """``u ** e`` for ``u >= 0`` with the convention ``0 ** 0 == 0``.

    Small integer exponents use repeated multiplication (several times faster than
    ``torch.pow`` with a float exponent on CPU).
    """
    if e == 0.0:
        return (u > 0).to(u.dtype)
    if e == 1.0:
        return u
    if e == 2.0:
        return u * u
    n = int(e)
    if n == e and n <= 16:
        result = None
        base = u
        while n:
            if n & 1:
                result = base if result is None else result * base
            n >>= 1
            if n:
                base = base * base
        return result
    return u.pow(e)


def _u(v: torch.Tensor, t: torch.Tensor, am1: float) -> torch.Tensor:
    """``[1 + (alpha - 1) (v - t)]_+``; v: (R, K), t: (R,) -> (R, K)."""
    u = v - t.unsqueeze(-1)
    u.mul_(am1).add_(1.0).clamp_(min=0.0)
    return u


def _solve_threshold(v: torch.Tensor, vmax: torch.Tensor, alpha: float) -> torch.Tensor:
    """Threshold ``t`` with ``sum_i [1 + (alpha-1)(v_i - t)]_+^(1/(alpha-1)) = 1`` per row.

    Args:
        v: (R, K) scores (float32 or float64), ``-inf`` allowed (padding).
        vmax: (R,) row maxima of ``v`` (finite), same dtype.
        alpha: in (1, 2].

    Returns:
        (R,) thresholds, same dtype, to about the dtype's precision.
    """
    am1 = alpha - 1.0
    r = 1.0 / am1
    n_finite = torch.isfinite(v).sum(-1).to(v.dtype)
    lo = vmax.clone()
    # At t = hi every finite entry would give at most 1/n: sum <= 1.
    hi = vmax + r * (-torch.expm1(-am1 * torch.log(n_finite)))
    t = lo.clone()
    eps = torch.finfo(v.dtype).eps
    for it in range(_MAX_ITER[v.dtype]):
        u = _u(v, t, am1)
        g = _power(u, r - 1.0)  # u^(r-1), (R, K)
        s = g.sum(-1)
        f = torch.linalg.vecdot(g, u) if r != 1.0 else u.sum(-1)
        log_f = torch.log(f)
        # h(t) >= 1 (i.e. f >= 1) means t is at or left of the root.
        left = f >= 1.0
        lo = torch.where(left, t, lo)
        hi = torch.where(left, hi, t)
        # Newton step on h: (h - 1) / (-h'(t)) with h' = -f^(1/r - 1) S.
        step = torch.expm1(am1 * log_f) / (am1 * torch.exp((am1 - 1.0) * log_f) * s)
        # Left of the root the exact step is >= 0; a negative one is rounding at the root.
        step = torch.where(left, step.clamp(min=0.0), step)
        t_new = t + step
        bad = ~((t_new >= lo) & (t_new <= hi))  # also catches NaN
        t_new = torch.where(bad, 0.5 * (lo + hi), t_new)
        delta = (t_new - t).abs()
        t = t_new
        tol = 4.0 * eps * (1.0 + t.abs())
        if bool((delta <= tol).all()):
            break
    else:
        logger.debug("alpha_entmax: threshold iteration hit the cap (%d)", it + 1)
    return t


def _probs(v: torch.Tensor, t: torch.Tensor, alpha: float) -> torch.Tensor:
    """Normalised ``[1 + (alpha-1)(v - t)]_+^(1/(alpha-1))``; v: (R, K), t: (R,) -> (R, K)."""
    am1 = alpha - 1.0
    p = _power(_u(v, t, am1), 1.0 / am1)
    if p is v:  # cannot happen (_u allocates) but keep the function pure
        p = p.clone()
    return p.div_(p.sum(-1, keepdim=True))


def _check_rows(xmax: torch.Tensor) -> None:
    """Raise ValueError when a row is all -inf or holds NaN / +inf (would give NaN)."""
    finite = torch.isfinite(xmax)
    if bool(finite.all()):
        return
    if bool(torch.isneginf(xmax).any()):
        raise ValueError(
            "alpha_entmax: a row is entirely -inf (no finite score); alpha-entmax is "
            "undefined for it")
    raise ValueError("alpha_entmax: the input holds NaN or +inf scores; only finite "
                     "values and -inf are allowed")


def alpha_entmax(x: torch.Tensor, alpha: float, dim: int = -1) -> torch.Tensor:
    """Exact alpha-entmax of ``x`` along ``dim`` for ``alpha`` in [1, 2].

    ``alpha == 1`` is the softmax, ``alpha == 1.5`` equals ``entmax.entmax15``,
    ``alpha == 2`` equals ``entmax.sparsemax``.  See the module docstring for the
    algorithm and why it is exact.

    Args:
        x: scores of any shape, e.g. attention logits (B, H, L, L); float32, float64,
            float16 or bfloat16, any device.  ``-inf`` entries get exact zeros.
        alpha: float in [1, 2].
        dim: the dimension that sums to one.

    Returns:
        Tensor of ``x``'s shape and dtype (float16/bfloat16 are computed in float32 and
        cast back; float64 stays float64).

    Raises:
        ValueError: ``alpha`` outside [1, 2]; a row entirely ``-inf``; NaN or ``+inf``.
    """
    alpha = float(alpha)
    if not 1.0 <= alpha <= 2.0:
        raise ValueError(f"alpha_entmax: alpha must be in [1, 2], got {alpha}")
    if not torch.is_floating_point(x):
        raise ValueError(f"alpha_entmax: x must be a floating-point tensor, got {x.dtype}")
    out_dtype = x.dtype
    work_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    if x.numel() == 0:
        return torch.empty_like(x)
    xw = x.movedim(dim, -1)
    length = xw.shape[-1]
    x2 = xw.reshape(-1, length).to(work_dtype)  # view when possible
    xmax = x2.amax(-1)
    _check_rows(xmax)
    if alpha == 1.0:
        return torch.softmax(x.to(work_dtype), dim=dim).to(out_dtype)

    out2 = torch.zeros(x2.shape, dtype=out_dtype, device=x.device)  # (R, L)
    r = 1.0 / (alpha - 1.0)
    # Candidates: x > max - r.  Lower the cut by a relative margin so that rounding can
    # only add candidates (a spurious candidate just gets p = 0), never drop one.
    cut = xmax - r - (xmax.abs() + r) * (8 * torch.finfo(work_dtype).eps)
    mask = x2 > cut.unsqueeze(-1)
    counts = mask.sum(-1, dtype=torch.int64)
    sparse = counts <= max(1, int(_SPARSE_FRACTION * length))
    all_sparse = bool(sparse.all())
    if not all_sparse:
        dense_rows = (~sparse).nonzero().squeeze(-1)
        mask[dense_rows] = False
        _dense_rows(x2, xmax, alpha, dense_rows, out2)
        del dense_rows
    if all_sparse or bool(sparse.any()):
        _sparse_rows(x2, xmax, alpha, mask, counts, sparse, all_sparse, out2)
    out = out2.view(xw.shape)
    if out.dim() and (dim % out.dim()) != out.dim() - 1:
        out = out.movedim(-1, dim).contiguous()
    return out


def _sparse_rows(x2, xmax, alpha, mask, counts, sparse, all_sparse, out2) -> None:
    """Solve the rows whose candidates (``mask``) are few, on a padded float64 matrix.

    x2: (R, L) scores; xmax: (R,); mask: (R, L) bool candidates (False on dense rows);
    counts: (R,) candidates per row; sparse: (R,) bool; out2: (R, L) output, written.
    """
    rows, cols = mask.nonzero(as_tuple=True)  # row-major order
    del mask
    if all_sparse:
        row_pos, cnt = rows, counts
        vmax = xmax
    else:
        sparse_ids = sparse.nonzero().squeeze(-1)
        row_pos = (torch.cumsum(sparse, 0) - 1)[rows]
        cnt = counts[sparse_ids]
        vmax = xmax[sparse_ids]
    k = int(cnt.max())
    start = torch.cumsum(cnt, 0) - cnt
    slot = torch.arange(rows.numel(), device=rows.device) - start[row_pos]
    v = torch.full((cnt.numel(), k), -math.inf, dtype=torch.float64, device=x2.device)
    v[row_pos, slot] = x2[rows, cols].to(torch.float64)
    vmax = vmax.to(torch.float64)
    t = _solve_threshold(v, vmax, alpha)
    p = _probs(v, t, alpha)
    out2[rows, cols] = p[row_pos, slot].to(out2.dtype)


def _dense_rows(x2, xmax, alpha, dense_rows, out2) -> None:
    """Solve the rows ``dense_rows`` on their full length, in chunks of rows.

    x2: (R, L); xmax: (R,); dense_rows: (D,) long; out2: (R, L) output, written.
    """
    length = x2.shape[-1]
    chunk = max(1, _DENSE_CHUNK_ELEMS // length)
    for i in range(0, dense_rows.numel(), chunk):
        ids = dense_rows[i:i + chunk]
        v = x2[ids]
        t = _solve_threshold(v, xmax[ids], alpha)
        out2[ids] = _probs(v, t, alpha).to(out2.dtype)
