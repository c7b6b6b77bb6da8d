"""Fast exact alpha-entmax for attention rows: :func:`alpha_entmax` (CPU: a fused C++
kernel, elsewhere the pure-torch implementation below; :func:`entmax_backend` says which).
The algorithm (bounds, pruning, safeguarded Newton on the p-norm, why it is exact) is
described in ``docs/architecture.md``, section "alpha-entmax"."""
import logging

import torch

from sparseclip_d2.attention import _entmax_cpu

__all__ = ["alpha_entmax", "entmax_backend"]

logger = logging.getLogger(__name__)

# Rows with at most this fraction of their length as candidates take the compacted path.
_SPARSE_FRACTION = 0.25
# Dense rows are processed in chunks of about this many elements (bounds temporaries).
_DENSE_CHUNK_ELEMS = 1 << 20
# Above this r = 1/(alpha-1) float32 loses ~r*eps relative accuracy in u^r: use float64.
_FLOAT32_MAX_R = 64.0
_MAX_ITER = 50
# Newton converges quadratically and monotonically: stopping once a step is below
# ``tol`` leaves an error of order tol**2 after that (applied) step.
_STEP_TOL = {torch.float32: 1e-6, torch.float64: 1e-10}


def _exponent(alpha: float) -> float:
    """r = 1 / (alpha - 1), snapped to an integer when within rounding of one (1/0.2 is
    not exactly 5 in floating point, and integer exponents take the fast path)."""
    r = 1.0 / (alpha - 1.0)
    return float(round(r)) if abs(r - round(r)) <= 1e-9 * r else r


def _power(u: torch.Tensor, e: float) -> torch.Tensor:
    """``u ** e`` for ``u >= 0`` with the convention ``0 ** 0 == 0``; returns a new tensor.

    Small integer exponents use repeated multiplication (several times faster than
    ``torch.pow`` with a float exponent on CPU).
    """
    if e == 0.0:
        return (u > 0).to(u.dtype)
    if e == 1.0:
        return u.clone()
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
        return result if result is not u else u.clone()
    return u.pow(e)


def _solve_shift(w: torch.Tensor, alpha: float) -> torch.Tensor:
    """Per-row shift ``s`` in [0, 1] with ``sum_i [w_i - s]_+ ** (1/(alpha-1)) == 1``.

    Here ``w_i = 1 + (alpha - 1) (x_i - max(x))`` (so ``max w = 1``; padding and pruned
    entries may hold any value <= 0), and the threshold of docs/architecture.md "alpha-entmax" is
    ``t = max(x) + s / (alpha - 1)``.  Safeguarded Newton on ``h(s) = f(s) ** (alpha-1)``,
    ``f = sum u^r``, ``u = [w - s]_+``, started at ``s = 0`` (``h >= 1``), bracket [0, 1].

    Args:
        w: (R, K) float32 or float64, every row with at least one entry equal to 1.
        alpha: in (1, 2].

    Returns:
        (R,) shifts, ``w``'s dtype.
    """
    am1 = alpha - 1.0
    r = _exponent(alpha)
    rows = w.shape[0]
    s = w.new_zeros(rows)
    lo = w.new_zeros(rows)
    hi = w.new_ones(rows)
    tol = _STEP_TOL[w.dtype]
    for it in range(_MAX_ITER):
        u = (w - s.unsqueeze(-1)).clamp_(min=0.0)
        g = _power(u, r - 1.0)  # u^(r-1), (R, K)
        big_s = g.sum(-1)
        f = torch.linalg.vecdot(g, u) if r != 1.0 else u.sum(-1)
        del u, g
        log_f = torch.log(f)
        left = f >= 1.0  # h(s) >= 1: s is at or left of the root
        lo = torch.where(left, s, lo)
        hi = torch.where(left, hi, s)
        # Newton step on h: (h - 1) / (-h'(s)), h'(s) = -f^(alpha-2) S.
        step = torch.expm1(am1 * log_f) / (torch.exp((am1 - 1.0) * log_f) * big_s)
        # Left of the root the exact step is >= 0; a negative one is rounding at the root.
        step = torch.where(left, step.clamp(min=0.0), step)
        s_new = s + step
        bad = ~((s_new >= lo) & (s_new <= hi))  # also catches NaN (f == 0 at s == 1)
        s_new = torch.where(bad, 0.5 * (lo + hi), s_new)
        done = bool(((s_new - s).abs() <= tol).all())
        s = s_new
        if done:
            break
    else:
        logger.debug("alpha_entmax: Newton iteration hit the cap (%d)", it + 1)
    return s


def _probs_(w: torch.Tensor, s: torch.Tensor, alpha: float) -> torch.Tensor:
    """Normalised ``[w - s]_+ ** (1/(alpha-1))`` along the last dim; w: (R, K), s: (R,)."""
    p = _power((w - s.unsqueeze(-1)).clamp_(min=0.0), _exponent(alpha))
    return p.div_(p.sum(-1, keepdim=True))


def _flat_nonzero(mask_buf: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
    """Flat indices of the True entries of ``mask_buf``, ascending.

    ``torch.nonzero`` scans one element at a time; scanning the mask as int64 words first
    (8 bools each) and then only the bytes of the non-zero words is several times faster
    for sparse masks.

    Args:
        mask_buf: (8 M,) bool, contiguous.
        words: (W,) long, indices of the non-zero int64 words of ``mask_buf``, ascending.

    Returns:
        (N,) long.
    """
    if words.numel() == 0:
        return words
    word_bytes = mask_buf.view(torch.int64)[words].view(torch.uint8)  # (8 W,)
    pos = word_bytes.nonzero().squeeze(-1)  # 8 * (index into words) + byte
    return words[pos >> 3] * 8 + (pos & 7)


_MSG_ALL_NEG_INF = ("alpha_entmax: a row is entirely -inf (no finite score); alpha-entmax "
                    "is undefined for it")
_MSG_NAN = ("alpha_entmax: the input holds NaN or +inf scores; only finite values and -inf "
            "are allowed")


def _check_rows(xmax: torch.Tensor) -> None:
    """Raise ValueError when a row is all -inf or holds NaN / +inf (would give NaN)."""
    if bool(torch.isfinite(xmax).all()):
        return
    if bool(torch.isneginf(xmax).any()):
        raise ValueError(_MSG_ALL_NEG_INF)
    raise ValueError(_MSG_NAN)


def entmax_backend() -> str:
    """``"cpu-kernel"`` when CPU float32 inputs (alpha in (1, 2]) use the fused C++ kernel,
    ``"torch"`` when they use the pure torch path (kernel disabled by
    ``SPARSECLIP_ENTMAX_KERNEL=0`` or unavailable).  May build the kernel (first call)."""
    if _entmax_cpu.kernel_enabled() and _entmax_cpu.load_kernel() is not None:
        return "cpu-kernel"
    return "torch"


def _raise_row_error(code: int) -> None:
    """Raise :func:`_check_rows`'s ValueError for a kernel error code (bit 1: a row is
    entirely -inf, bit 2: NaN / +inf; the -inf message wins, as in _check_rows)."""
    raise ValueError(_MSG_ALL_NEG_INF if code & 1 else _MSG_NAN)


#: The valid range of alpha: 1 = softmax, 2 = sparsemax.
ALPHA_RANGE = (1.0, 2.0)


def check_alpha(alpha, name: str = "alpha") -> float:
    """``alpha`` as a float in :data:`ALPHA_RANGE`; the one range check of alpha (used by
    ``alpha_entmax``, ``attention_weights`` and ``AttentionSpec``).

    Raises:
        ValueError: not a number (booleans included), NaN, or outside [1, 2].
    """
    if isinstance(alpha, bool):
        raise ValueError(f"{name} must be a number in [1, 2], got {alpha!r}")
    try:
        a = float(alpha)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number in [1, 2], got {alpha!r}") from None
    if not ALPHA_RANGE[0] <= a <= ALPHA_RANGE[1]:  # also rejects NaN
        raise ValueError(f"{name} must be in [1, 2], got {alpha!r} (1 = softmax, 2 = sparsemax)")
    return a


class _AlphaEntmaxFunction(torch.autograd.Function):
    """alpha-entmax with its closed-form backward, for every forward backend.

    With ``p = entmax(x)`` and ``g = p ** (2 - alpha)`` on the support (0 off it), the
    Jacobian-vector product is ``dx = g * dy - g * sum(g * dy) / sum(g)`` along the row
    (Peters, Niculae and Martins 2019, "Sparse Sequence-to-Sequence Models", section 3).
    Only ``p`` is saved.  The backward itself is not differentiable again
    (``once_differentiable``: a second-order use raises instead of returning zeros).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, alpha: float, dim: int) -> torch.Tensor:
        p = _entmax_forward(x, alpha, dim)
        ctx.alpha, ctx.dim = alpha, dim
        ctx.save_for_backward(p)
        return p

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        (p,) = ctx.saved_tensors
        work = torch.float64 if p.dtype == torch.float64 else torch.float32
        pw, dy = p.to(work), grad_out.to(work)
        if ctx.alpha == 2.0:
            g = (pw > 0).to(work)
        else:
            g = torch.where(pw > 0, pw.pow(2.0 - ctx.alpha), torch.zeros((), dtype=work, device=pw.device))
        gdy = g * dy
        q = gdy.sum(ctx.dim, keepdim=True) / g.sum(ctx.dim, keepdim=True)
        return (gdy - q * g).to(p.dtype), None, None


def alpha_entmax(x: torch.Tensor, alpha: float, dim: int = -1) -> torch.Tensor:
    """Exact alpha-entmax of ``x`` along ``dim`` for ``alpha`` in [1, 2], differentiable.

    When ``x`` requires grad (and grad mode is on), the result carries the closed-form
    entmax backward (:class:`_AlphaEntmaxFunction`) whatever backend computed it (the CPU
    kernel or the torch path); ``alpha == 1`` is ``torch.softmax`` with its own backward.
    Under ``torch.no_grad()`` or for inputs without grad nothing is saved.

    ``alpha == 1`` is the softmax, ``alpha == 1.5`` equals ``entmax.entmax15``,
    ``alpha == 2`` equals ``entmax.sparsemax``.  See docs/architecture.md "alpha-entmax" for the
    algorithm and why it is exact.

    Args:
        x: scores of any shape, e.g. attention logits (B, H, L, L); float32, float64,
            float16 or bfloat16, any device.  ``-inf`` entries get exact zeros.
        alpha: float in [1, 2].
        dim: the dimension that sums to one.

    Returns:
        Contiguous tensor of ``x``'s shape and dtype (float16/bfloat16 are computed in
        float32 and cast back; float64 stays float64).

    Raises:
        ValueError: ``alpha`` outside [1, 2]; a row entirely ``-inf``; NaN or ``+inf``
            scores; a non-floating-point ``x``.
    """
    alpha = check_alpha(alpha, "alpha_entmax: alpha")
    if not torch.is_floating_point(x):
        raise ValueError(f"alpha_entmax: x must be a floating-point tensor, got {x.dtype}")
    if x.dim() == 0:
        raise ValueError("alpha_entmax: x must have at least one dimension, got a scalar")
    if x.numel() == 0:
        return torch.empty_like(x, memory_format=torch.contiguous_format)
    if alpha > 1.0 and x.requires_grad and torch.is_grad_enabled():
        return _AlphaEntmaxFunction.apply(x, alpha, dim)
    return _entmax_forward(x, alpha, dim)


def _entmax_forward(x: torch.Tensor, alpha: float, dim: int) -> torch.Tensor:
    """The forward of :func:`alpha_entmax` (validated input, no graph for alpha > 1)."""
    if x.numel() == 0:
        return torch.empty_like(x, memory_format=torch.contiguous_format)
    out_dtype = x.dtype
    work_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    xw = x.movedim(dim, -1)
    length = xw.shape[-1]
    x2 = xw.to(work_dtype).reshape(-1, length).contiguous()  # (R, L); a view when possible
    if (alpha > 1.0 and x.device.type == "cpu" and work_dtype == torch.float32
            and _entmax_cpu.kernel_enabled()):
        result = _entmax_cpu.entmax_rows(x2, _exponent(alpha))
        if result is not None:
            out2, code = result
            if code:
                _raise_row_error(code)
            out = out2.view(xw.shape).to(out_dtype)
            if (dim % x.dim()) != x.dim() - 1:
                out = out.movedim(-1, dim).contiguous()
            return out
    xmax = x2.amax(-1)  # (R,)
    _check_rows(xmax)
    if alpha == 1.0:
        return torch.softmax(x.to(work_dtype), dim=dim).to(out_dtype)

    rows_total = x2.shape[0]
    r = _exponent(alpha)
    solve_dtype = torch.float64 if (r > _FLOAT32_MAX_R or work_dtype == torch.float64) \
        else torch.float32
    out2 = torch.zeros((rows_total, length), dtype=out_dtype, device=x.device)
    # Candidates: x > max - r.  Lower the cut by a relative margin so that rounding can
    # only add candidates (a spurious candidate just gets p = 0), never drop one.
    cut = xmax - r - (xmax.abs() + r) * (8 * torch.finfo(work_dtype).eps)
    numel = rows_total * length
    # The bool mask lives in a buffer padded to a multiple of 8 bytes so that it can be
    # scanned as int64 words (see _flat_nonzero).
    mask_buf = torch.zeros(-(-numel // 8) * 8, dtype=torch.bool, device=x.device)
    mask = mask_buf[:numel].view(rows_total, length)
    torch.gt(x2, cut.unsqueeze(-1), out=mask)
    cap = max(1, int(_SPARSE_FRACTION * length))
    words = mask_buf.view(torch.int64).nonzero().squeeze(-1)
    if (8 * words.numel() <= rows_total * cap
            or int(torch.count_nonzero(mask)) <= rows_total * cap):
        # Few candidates overall: one compaction; rows with too many go dense afterwards.
        flat = _flat_nonzero(mask_buf, words)  # (N,) row-major
        del mask, mask_buf, words
        rows = torch.div(flat, length, rounding_mode="floor")
        counts = torch.bincount(rows, minlength=rows_total)
        dense = counts > cap
        if bool(dense.any()):
            keep = ~dense[rows]
            flat, rows = flat[keep], rows[keep]
    else:
        # Many candidates (alpha near 1 or flat rows): exclude dense rows before compacting.
        del words
        counts = mask.sum(-1, dtype=torch.int32)
        dense = counts > cap
        mask[dense.nonzero().squeeze(-1)] = False
        flat = _flat_nonzero(mask_buf, mask_buf.view(torch.int64).nonzero().squeeze(-1))
        del mask, mask_buf
        rows = torch.div(flat, length, rounding_mode="floor")
    dense_ids = dense.nonzero().squeeze(-1)
    if dense_ids.numel():
        _dense_rows(x2, xmax, alpha, dense_ids, out2, solve_dtype)
    if flat.numel():
        sparse_all = dense_ids.numel() == 0
        _sparse_rows(x2, xmax, alpha, flat, rows, counts, dense, sparse_all, out2,
                     solve_dtype)
    out = out2.view(xw.shape)
    if (dim % x.dim()) != x.dim() - 1:
        out = out.movedim(-1, dim).contiguous()
    return out


def _sparse_rows(x2, xmax, alpha, flat, rows, counts, dense, sparse_all, out2,
                 solve_dtype) -> None:
    """Solve the rows whose candidates are few, on a padded (rows, K) matrix.

    x2: (R, L) scores; xmax: (R,); flat: (N,) flat indices of the candidates in
    row-major order (none on dense rows); rows: (N,) their rows; counts: (R,) candidates
    per row (valid on non-dense rows); dense: (R,) bool; out2: (R, L) output, written.
    """
    am1 = alpha - 1.0
    if sparse_all:
        local, cnt = rows, counts
    else:
        sparse = ~dense
        local = (torch.cumsum(sparse, 0) - 1)[rows]  # row index among the sparse rows
        cnt = counts[sparse]
    k = int(cnt.max())
    n_rows = cnt.numel()
    # Position of each candidate in the padded matrix: row * k + slot within the row.
    offset = torch.arange(n_rows, device=flat.device) * k - (torch.cumsum(cnt, 0) - cnt)
    pad_idx = torch.arange(flat.numel(), device=flat.device) + offset[local]
    xv = x2.view(-1)[flat].to(solve_dtype)
    wv = (xv - xmax.to(solve_dtype)[rows]).mul_(am1).add_(1.0)  # (N,) w = 1 + am1 (x - max)
    del xv
    w = torch.zeros(n_rows * k, dtype=solve_dtype, device=flat.device)
    w[pad_idx] = wv
    w = w.view(n_rows, k)
    s = _solve_shift(w, alpha)
    p = _probs_(w, s, alpha)
    out2.view(-1)[flat] = p.view(-1)[pad_idx].to(out2.dtype)


def _dense_rows(x2, xmax, alpha, dense_ids, out2, solve_dtype) -> None:
    """Solve the rows ``dense_ids`` on their full length, in chunks of rows.

    x2: (R, L); xmax: (R,); dense_ids: (D,) long; out2: (R, L) output, written.
    """
    am1 = alpha - 1.0
    length = x2.shape[-1]
    chunk = max(1, _DENSE_CHUNK_ELEMS // length)
    for i in range(0, dense_ids.numel(), chunk):
        ids = dense_ids[i:i + chunk]
        w = x2[ids].to(solve_dtype)
        w.sub_(xmax[ids].to(solve_dtype).unsqueeze(-1)).mul_(am1).add_(1.0)
        s = _solve_shift(w, alpha)
        out2[ids] = _probs_(w, s, alpha).to(out2.dtype)
