"""Additive attention-score priors (score biases) over token pairs.

A prior builder is ``fn(grid_hw, *, std, num_prefix_tokens=1, device=None) -> bias`` with
``bias`` a float32 ``(L, L)`` tensor, ``L = num_prefix_tokens + h * w`` (prefix/CLS tokens
first, patches in row-major order), or ``None`` for no prior. Registered in
:data:`PRIOR_REGISTRY`:

- ``none``: no bias.
- ``gaussian``: NACLIP's neighbourhood prior. For patches ``i = (r_i, c_i)`` and
  ``j = (r_j, c_j)`` on the ``h x w`` grid, ``bias[i, j] = exp(-((r_i - r_j)^2 +
  (c_i - c_j)^2) / (2 std^2))`` (``std`` in patches); rows and columns of prefix (CLS)
  tokens are 0. NACLIP (sinahmr/NACLIP ``clip/model.py``, ``gaussian_window`` and
  ``get_attention_addition``) computes the same matrix by a 'same'-padded convolution of
  one-hot patch maps with a ``(2h - 1, 2w - 1)`` gaussian window: the window reaches every
  offset on the grid, so nothing is truncated and the two agree exactly.
"""
from typing import Optional, Tuple

import torch
from fvcore.common.registry import Registry

__all__ = ["PRIOR_REGISTRY", "get_prior", "build_prior"]

PRIOR_REGISTRY = Registry("ATTENTION_PRIOR")
PRIOR_REGISTRY.__doc__ = """
Registry of additive attention priors ``fn(grid_hw, *, std, num_prefix_tokens, device)
-> (L, L) float32 or None``.
"""


@PRIOR_REGISTRY.register()
def none(grid_hw: Tuple[int, int], *, std: float = 5.0, num_prefix_tokens: int = 1,
         device: Optional[torch.device] = None):
    """No prior: returns ``None``."""
    return None


@PRIOR_REGISTRY.register()
def gaussian(grid_hw: Tuple[int, int], *, std: float = 5.0, num_prefix_tokens: int = 1,
             device: Optional[torch.device] = None) -> torch.Tensor:
    """NACLIP gaussian neighbourhood bias for an ``h x w`` patch grid.

    Returns:
        ``(P + h*w, P + h*w)`` float32, P = ``num_prefix_tokens``; prefix rows/cols are 0.
    """
    h, w = int(grid_hw[0]), int(grid_hw[1])
    if h < 1 or w < 1:
        raise ValueError(f"gaussian prior needs a non-empty grid, got {grid_hw}")
    if not std > 0:
        raise ValueError(f"gaussian prior std must be > 0 patches, got {std}")
    rows = torch.arange(h, dtype=torch.float32, device=device).repeat_interleave(w)
    cols = torch.arange(w, dtype=torch.float32, device=device).repeat(h)
    d2 = (rows[:, None] - rows[None, :]) ** 2 + (cols[:, None] - cols[None, :]) ** 2
    patch_bias = torch.exp(-d2 / (2.0 * float(std) ** 2))
    P = int(num_prefix_tokens)
    out = torch.zeros(P + h * w, P + h * w, dtype=torch.float32, device=device)
    out[P:, P:] = patch_bias
    return out


def get_prior(name: str):
    """The registered prior builder called ``name``.

    Raises:
        ValueError: unknown name, listing the valid ones.
    """
    if not isinstance(name, str) or name not in PRIOR_REGISTRY:
        valid = ", ".join(sorted(n for n, _ in PRIOR_REGISTRY))
        raise ValueError(f"unknown attention prior {name!r}; valid: {valid}")
    return PRIOR_REGISTRY.get(name)


def build_prior(name: str, grid_hw: Tuple[int, int], *, std: float = 5.0, num_prefix_tokens: int = 1,
                device: Optional[torch.device] = None) -> Optional[torch.Tensor]:
    """Build prior ``name`` for a grid: ``(P + h*w, P + h*w)`` float32 or ``None``."""
    return get_prior(name)(grid_hw, std=std, num_prefix_tokens=num_prefix_tokens, device=device)
