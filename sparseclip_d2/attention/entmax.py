"""alpha-entmax (bootstrap version: exact float64 bisection; to be replaced by the fast
implementation of the fast-entmax issue, same signature)."""
import torch

__all__ = ["alpha_entmax"]


def alpha_entmax(x: torch.Tensor, alpha: float, dim: int = -1) -> torch.Tensor:
    """alpha-entmax of ``x`` along ``dim`` for alpha in [1, 2]; returns ``x``'s dtype."""
    alpha = float(alpha)
    if not 1.0 <= alpha <= 2.0:
        raise ValueError(f"alpha must be in [1, 2], got {alpha}")
    if alpha == 1.0:
        return torch.softmax(x.float(), dim=dim).to(x.dtype)
    z = x.double().movedim(dim, -1)
    if torch.isneginf(z).all(dim=-1).any():
        raise ValueError("alpha_entmax: a row is entirely -inf")
    am1 = alpha - 1.0
    z = z * am1
    mx = z.max(dim=-1, keepdim=True).values
    lo, hi = mx - 1.0, mx
    for _ in range(80):
        tau = (lo + hi) / 2
        p = torch.clamp(z - tau, min=0) ** (1.0 / am1)
        big = p.sum(-1, keepdim=True) >= 1
        lo = torch.where(big, tau, lo)
        hi = torch.where(big, hi, tau)
    p = torch.clamp(z - lo, min=0) ** (1.0 / am1)
    p = p / p.sum(-1, keepdim=True)
    return p.movedim(-1, dim).to(x.dtype)
