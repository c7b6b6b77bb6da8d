"""Spectral key-graph matching and low-rank graph parts (CASS, CVPR 2025), pure torch + scipy.

MICV-yonsei/CASS @ 228ecdd ``clip/model.py`` (``compute_spectrum``,
``wasserstein_distance_pytorch``, ``_apply_spectral_strategy``, ``_apply_sequential_strategy``,
``optimal_q``, ``_scale_singular_values``, ``_normalize_attention_range``). With per-head
graphs ``C_i`` (CLIP's ``K K^T / sqrt(d)``) and ``G_j`` (a second backbone's key graph):

- :func:`graph_spectra`: the ``k`` largest eigenvalues of each symmetric graph (float64).
- :func:`spectral_cost`: ``cost[i, j] = 1 - W(G_i, C_j)`` with ``W`` the sum of absolute
  differences of the sorted, L2- then L1-normalised spectra (upstream's "Wasserstein").
- :data:`HEAD_MATCHING_REGISTRY`: which proxy head each CLIP head is combined with and the
  weight of the proxy graph: ``spectral`` (scipy's Hungarian assignment on the cost),
  ``sequential`` (head i with head i, equal weights).
- :func:`low_rank_graph`: rank-``q`` SVD approximation of a graph (upstream's randomized
  ``torch.svd_lowrank``, or the exact truncated SVD), singular values rescaled by
  :func:`scale_singular_values`, diagonal zeroed.
- :func:`match_range`: affine map of a tensor onto another's [min, max].
- :func:`combine_graphs`: ``(w * G + C) / (w + 1)``.

Everything returns scores; any registered normaliser then turns them into weights.
"""
import math
from typing import Callable, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from fvcore.common.registry import Registry

from ..common.replay import replayed_assignment

__all__ = [
    "HEAD_MATCHING_REGISTRY",
    "SVD_METHODS",
    "get_head_matching",
    "graph_spectra",
    "spectral_cost",
    "scale_singular_values",
    "low_rank_graph",
    "match_range",
    "combine_graphs",
]

#: How :func:`low_rank_graph` computes the rank-q SVD: ``randomized`` = ``torch.svd_lowrank(a,
#: q, niter=2)`` (upstream ``optimal_q``), its random draws from a generator seeded by the
#: caller (``torch.random.fork_rng``: the global state is left as it was); ``exact`` = the
#: first q triplets of ``torch.linalg.svd``.
SVD_METHODS = ("randomized", "exact")
# MICV-yonsei/CASS @ 228ecdd clip/model.py optimal_q: torch.svd_lowrank(..., q=current_q) with
# torch's default niter=2
_SVD_NITER = 2

HEAD_MATCHING_REGISTRY = Registry("HEAD_MATCHING")
HEAD_MATCHING_REGISTRY.__doc__ = """
Registry of head matchings ``fn(clip_graphs (H, N, N), proxy_graphs (H, N, N), *, k_eigen,
scale_factor) -> (pairs (H,) long, mix (H,) float64)``: CLIP head ``i`` is combined with proxy
head ``pairs[i]``, the proxy graph weighted ``mix[i]`` against CLIP's 1.
"""


def graph_spectra(graphs: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` largest eigenvalues of each symmetric ``(N, N)`` graph, descending.

    ``(H, N, N)`` -> ``(H, min(k, N))`` float64 (``torch.linalg.eigvalsh`` of the float64 graph;
    upstream ``compute_spectrum``).
    """
    if graphs.dim() != 3 or graphs.shape[-1] != graphs.shape[-2]:
        raise ValueError(f"graphs must be (H, N, N), got shape {tuple(graphs.shape)}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k_eigen = {k!r} is invalid; valid: an integer >= 1")
    vals = torch.linalg.eigvalsh(graphs.double())
    return vals.flip(-1)[:, :k]


def spectral_cost(proxy_spectra: torch.Tensor, clip_spectra: torch.Tensor) -> torch.Tensor:
    """Upstream's matching cost ``cost[i, j] = 1 - W(p_i, c_j)``.

    Each spectrum is L2-normalised, then divided by the sum of its absolute values; ``W`` is
    the sum of absolute differences of the two sorted vectors (the 1-Wasserstein distance of
    two equal-size samples, times the sample size).

    Args:
        proxy_spectra, clip_spectra: ``(H, k)`` float.
    Returns:
        ``(H, H)`` float64: rows proxy heads, columns CLIP heads.
    """
    def prob(s):
        s = F.normalize(s.double(), p=2, dim=-1)
        return F.normalize(s, p=1, dim=-1).sort(dim=-1).values

    p, c = prob(proxy_spectra), prob(clip_spectra)
    return 1.0 - (p[:, None, :] - c[None, :, :]).abs().sum(-1)


def get_head_matching(name: str) -> Callable:
    """The registered head matching called ``name``; ``ValueError`` listing the valid ones."""
    if not isinstance(name, str) or name not in HEAD_MATCHING_REGISTRY:
        valid = ", ".join(sorted(n for n, _ in HEAD_MATCHING_REGISTRY))
        raise ValueError(f"unknown head matching {name!r}; valid: {valid}")
    return HEAD_MATCHING_REGISTRY.get(name)


@HEAD_MATCHING_REGISTRY.register()
def spectral(clip_graphs: torch.Tensor, proxy_graphs: torch.Tensor, *, k_eigen: int = 20,
             scale_factor: float = 10.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """CASS's spectral matching (upstream ``_apply_spectral_strategy``).

    ``cost`` = :func:`spectral_cost` of the proxy (rows) and CLIP (columns) spectra;
    ``row, col = scipy.optimize.linear_sum_assignment(cost)`` (rows are ``0..H-1``). As
    upstream, CLIP head ``i`` is then combined with proxy head ``col[i]`` and the proxy graph
    weighted ``scale_factor * (1 - cost[i, col[i]])`` (the cost entry of proxy head ``i`` and
    CLIP head ``col[i]``: upstream reads ``clip_key_adj = attn_weights[i]``, ``dino_key_adj =
    dino_attn_weights[j]``, ``w_d = 1 - cost_matrix[i, j]``).

    The cost is rounded to float32 before the assignment, as upstream stores it. Under the
    agreement driver's :func:`~sparseclip_d2.common.replay.replaying` only, ``col`` is upstream's
    recorded minimiser where it ties with scipy's here (equal total cost within float32 rounding).

    Returns:
        ``(pairs (H,) long, mix (H,) float64)``.
    """
    from scipy.optimize import linear_sum_assignment

    H = clip_graphs.shape[0]
    if proxy_graphs.shape[0] != H:
        raise ValueError(f"spectral head matching needs as many proxy heads as CLIP heads, got "
                         f"{proxy_graphs.shape[0]} and {H}")
    # float32 as upstream's cost_matrix = torch.zeros(num_heads, num_heads) holds it
    cost = spectral_cost(graph_spectra(proxy_graphs, k_eigen), graph_spectra(clip_graphs, k_eigen)).float().cpu()
    rows, cols = linear_sum_assignment(cost.numpy())
    # the agreement driver's replay of upstream's minimiser where two tie (common/replay.py); a no-op otherwise
    cols = replayed_assignment("assignment", cost.numpy(), rows, cols)
    pairs = torch.as_tensor(cols, dtype=torch.long)[torch.as_tensor(rows).argsort()]
    idx = torch.arange(H)
    mix = (float(scale_factor) * (1.0 - cost[idx, pairs])).double()
    return pairs, mix


@HEAD_MATCHING_REGISTRY.register()
def sequential(clip_graphs: torch.Tensor, proxy_graphs: torch.Tensor, *, k_eigen: int = 20,
               scale_factor: float = 10.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """Head ``i`` with head ``i``, equal weights (upstream ``_apply_sequential_strategy``:
    ``(dino_sparse_adj + clip_key_adj) / 2``); ``k_eigen`` and ``scale_factor`` are unused."""
    H = clip_graphs.shape[0]
    if proxy_graphs.shape[0] != H:
        raise ValueError(f"sequential head matching needs as many proxy heads as CLIP heads, got "
                         f"{proxy_graphs.shape[0]} and {H}")
    return torch.arange(H), torch.ones(H, dtype=torch.float64)


def scale_singular_values(s: torch.Tensor, low: float = 0.5, high: float = 1.5) -> torch.Tensor:
    """Stretch singular values so that the smallest becomes ``low * min`` and the largest
    ``high * max``, linearly in between (upstream ``_scale_singular_values``: ``(s - min) /
    (max - min) * (1.5 max - 0.5 min) + 0.5 min``). ``low == high == 1`` returns ``s`` itself
    (upstream's VOC20 / Cityscapes rule); so does a constant ``s``."""
    if low == 1.0 and high == 1.0:
        return s
    lo, hi = s.min(), s.max()
    if not bool(hi > lo):
        return s
    return (s - lo) / (hi - lo) * (high * hi - low * lo) + low * lo


def low_rank_graph(graph: torch.Tensor, rank: int, *, method: str = "randomized", low: float = 0.5,
                   high: float = 1.5) -> torch.Tensor:
    """Rank-``rank`` approximation ``U diag(scale(S)) V^T`` of a ``(N, N)`` graph in float64,
    diagonal set to 0 (upstream ``optimal_q`` + ``_scale_singular_values`` +
    ``fill_diagonal_(0)``).

    ``method`` (:data:`SVD_METHODS`): ``randomized`` draws from the current global torch
    generator (callers fork and seed it: :class:`~sparseclip_d2.methods.cass.encoder.CASSEncoder`);
    ``exact`` needs no randomness.
    """
    if method not in SVD_METHODS:
        raise ValueError(f"SVD method {method!r} is invalid; valid: {', '.join(SVD_METHODS)}")
    a = graph.double()
    n = min(a.shape)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= n:
        raise ValueError(f"SVD rank {rank!r} is invalid for a {tuple(a.shape)} graph; valid: 1..{n}")
    if method == "randomized":
        u, s, v = torch.svd_lowrank(a, q=rank, niter=_SVD_NITER)
    else:
        u, s, vh = torch.linalg.svd(a, full_matrices=False)
        u, s, v = u[:, :rank], s[:rank], vh[:rank].transpose(0, 1)
    out = (u * scale_singular_values(s, low, high)) @ v.transpose(0, 1)
    out.fill_diagonal_(0)
    return out


def match_range(x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """``x`` mapped affinely onto ``[ref.min(), ref.max()]`` (upstream ``_normalize_attention_range``
    and ``_normalize_key_range``), in ``x``'s dtype; ``ValueError`` if ``x`` is constant.

    Written as upstream's expression (CASS ``clip/model.py`` 228ecdd:
    ``normalized * (k_max - k_min) + k_min``): ``ref``'s min and max stay 0-dim tensors in
    ``ref``'s dtype, so where the dtypes differ (fp16 keys, fp32 CLIP keys) PyTorch's own
    promotion decides, as it does upstream on the same device. On the CPU an fp16 tensor times a
    0-dim float32 tensor uses the float32 value (``(a.float() * s).half()``), while the sum rounds
    the 0-dim term to fp16 first (both measured in ``tests/methods/test_cass.py``).
    """
    lo, hi = x.min(), x.max()
    if not bool(hi > lo):
        raise ValueError("match_range: the tensor is constant, its range cannot be mapped")
    rlo, rhi = ref.min(), ref.max()
    return (x - lo) / (hi - lo) * (rhi - rlo) + rlo


def combine_graphs(clip_graph: torch.Tensor, proxy_graph: torch.Tensor, mix: float) -> torch.Tensor:
    """``(mix * proxy + clip) / (mix + 1)`` (upstream ``combined_attn[idx]``), float64."""
    mix = float(mix)
    if not math.isfinite(mix) or mix <= -1:
        raise ValueError(f"combine_graphs: mix = {mix!r}; valid: a finite number > -1")
    return (mix * proxy_graph.double() + clip_graph.double()) / (mix + 1.0)
