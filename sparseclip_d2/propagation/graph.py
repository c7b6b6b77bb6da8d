"""The graphs and the solver of label propagation (LPOSS, LPOSS+), pure numpy / scipy / faiss.

Label propagation solves ``(I - alpha Wn) X = Y`` for the class scores ``X`` of the nodes of a
graph, ``Y`` the initial scores, ``Wn = D^-1/2 (W - diag W) D^-1/2`` the symmetrically
normalised affinity (``D`` the row sums; a node without edges keeps ``D = 1``). LPOSS
(vladan-stojnic/LPOSS @ e489a74 ``segmentation/evaluation/lposs_eval.py``) uses two graphs:

- :func:`knn_affinity`: the patches of every window of an image (all windows in one graph),
  edges to the ``k`` nearest neighbours by inner product of L2-normalised VFM features
  (``faiss.knn_gpu(..., metric=METRIC_INNER_PRODUCT)`` upstream; here an exact
  ``faiss.IndexFlatIP``), weight ``max(sim, 0) ** gamma * exp(-sigma * dist ** pix_dist_pow)``
  with ``dist`` the pixel distance of the two patch centres, then ``W + W^T``
  (``get_lposs_laplacian``);
- :func:`pixel_affinity`: the pixels of the image, edges to the ``(2 n + 1)^2 - 1`` pixels of the
  square around each, weight ``exp(-||lab_i - lab_j|| / tau)`` with CIE Lab scaled by
  ``(100, 128, 128)`` (``get_pixel_connections``, ``get_lposs_plus_laplacian``).

:func:`conjugate_gradient` solves all columns of ``Y`` at once, each column exactly as
``scipy.sparse.linalg.cg(L, y, rtol=tol, maxiter=maxiter)`` would alone (upstream: cupy's ``cg``
per class, ``tol=1e-6, maxiter=10``, ``dfs_search``).
"""
import logging
from typing import Callable, Sequence, Tuple

import numpy as np
import scipy.sparse as sp
import torch

__all__ = ["knn_search", "patch_centres", "knn_affinity", "normalized_affinity", "propagation_operator",
           "conjugate_gradient", "rgb_to_lab", "pixel_affinity"]

logger = logging.getLogger(__name__)


def _faiss():
    try:
        import faiss
    except ImportError as e:  # declared in pyproject.toml dependencies
        raise ImportError("label propagation (MODEL.SPARSECLIP.LABEL_PROPAGATION.KIND lposs / lposs_plus) needs "
                          "faiss: pip install faiss-cpu") from e
    return faiss


def knn_search(feats: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
    """Exact k nearest neighbours of every row of ``feats`` among all rows, by inner product.

    Args:
        feats: ``(N, D)`` float32 (L2-normalised for cosine similarity).
        k: neighbours per row, ``1 <= k <= N`` (each row is normally its own first neighbour).

    Returns:
        ``(sims (N, k) float32, idx (N, k) int64)``, each row by decreasing similarity
        (``faiss.IndexFlatIP``: brute force, the neighbours ``faiss.knn_gpu`` returns).
    """
    feats = np.ascontiguousarray(feats, dtype=np.float32)
    if feats.ndim != 2:
        raise ValueError(f"knn_search expects (N, D) features, got shape {feats.shape}")
    n = feats.shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"knn_search: k = {k} is invalid for {n} nodes; valid: 1 <= k <= {n}")
    faiss = _faiss()
    index = faiss.IndexFlatIP(feats.shape[1])
    index.add(feats)
    sims, idx = index.search(feats, int(k))
    return sims, idx.astype(np.int64)


def patch_centres(origins: Sequence[Tuple[float, float]], grids: Sequence[Tuple[int, int]],
                  cells: Sequence[Tuple[float, float]]) -> np.ndarray:
    """Pixel coordinates ``(y, x)`` of the patch centres of several windows, row-major per window,
    windows in order: patch ``(i, j)`` of a window at ``origin`` with cells ``(ch, cw)`` pixels
    is at ``origin + ((i + 0.5) ch, (j + 0.5) cw)`` (upstream: ``y1 + patch_size // 2 + i *
    patch_size``, the same for even patch sizes). Returns ``(sum h*w, 2)`` float64."""
    out = []
    for (y0, x0), (h, w), (ch, cw) in zip(origins, grids, cells):
        ii, jj = np.meshgrid(np.arange(h, dtype=np.float64), np.arange(w, dtype=np.float64), indexing="ij")
        out.append(np.stack([y0 + (ii.ravel() + 0.5) * ch, x0 + (jj.ravel() + 0.5) * cw], axis=1))
    return np.concatenate(out, axis=0)


def knn_affinity(feats: np.ndarray, centres: np.ndarray, *, k: int, sigma: float, pix_dist_pow: float,
                 gamma: float) -> sp.csr_matrix:
    """LPOSS's patch graph ``W + W^T`` (float64 CSR, ``(N, N)``), ``W[i, j] = max(s_ij, 0) ** gamma *
    exp(-sigma * d_ij ** pix_dist_pow)`` for the ``k`` nearest neighbours ``j`` of ``i`` by
    inner product ``s_ij`` of ``feats`` rows, ``d_ij`` the distance of ``centres`` (pixels).

    Args:
        feats: ``(N, D)`` L2-normalised features (float32).
        centres: ``(N, 2)`` patch centres in pixels.
        k: neighbours per node (``k > N`` is clipped to ``N``, logged).
    """
    n = feats.shape[0]
    if centres.shape != (n, 2):
        raise ValueError(f"knn_affinity: centres must be ({n}, 2), got {centres.shape}")
    if k > n:
        logger.info("label propagation: k = %d > %d nodes; using k = %d", k, n, n)
        k = n
    sims, idx = knn_search(feats, k)
    sims = np.maximum(sims, 0).astype(np.float64) ** gamma
    rows = np.repeat(np.arange(n), k)
    cols = idx.ravel()
    dist = np.sqrt(((centres[rows] - centres[cols]) ** 2).sum(axis=1))
    data = sims.ravel() * np.exp(-sigma * dist ** pix_dist_pow)
    w = sp.csr_matrix((data, (rows, cols)), shape=(n, n))
    return (w + w.T).tocsr()


def normalized_affinity(w: sp.spmatrix) -> sp.csr_matrix:
    """``D^-1/2 (W - diag W) D^-1/2`` (float64 CSR), ``D`` the row sums of ``W - diag W`` with
    0 replaced by 1 (upstream ``normalize_connection_graph``). The values are scaled in place of
    one float64 copy of ``W`` (the LPOSS+ pixel graph has tens of millions of edges)."""
    w = sp.csr_matrix(w, dtype=np.float64, copy=True)
    w.sum_duplicates()
    n = w.shape[0]
    rows = np.repeat(np.arange(n, dtype=w.indices.dtype), np.diff(w.indptr))
    diagonal = w.indices == rows
    if diagonal.any():
        w.data[diagonal] = 0
    s = np.asarray(w.sum(axis=1)).ravel()
    s[s == 0] = 1
    d = 1.0 / np.sqrt(s)
    d[~np.isfinite(d)] = 0
    w.data *= d[rows]
    w.data *= d[w.indices]
    del rows, diagonal
    w.eliminate_zeros()
    return w


def propagation_operator(wn: sp.spmatrix, alpha: float) -> Callable[[np.ndarray], np.ndarray]:
    """``X -> (I - alpha Wn) X`` for ``(N, C)`` float64 ``X`` (the matrix ``L`` of upstream's
    ``eye(N) - alpha * Wn``, applied without forming it)."""
    wn = sp.csr_matrix(wn)

    def apply(x: np.ndarray) -> np.ndarray:
        return x - alpha * (wn @ x)

    return apply


def conjugate_gradient(apply: Callable[[np.ndarray], np.ndarray], b: np.ndarray, *, tol: float = 1e-6,
                       maxiter: int = 10, columns_per_solve: int = 32) -> np.ndarray:
    """Conjugate gradient for ``L X = B``, every column on its own as ``scipy.sparse.linalg.cg``
    (x0 = 0, no preconditioner): a column stops when its residual norm is below
    ``tol * ||b||`` (checked before each step) or after ``maxiter`` steps; a zero column gives 0.

    Args:
        apply: ``X (N, m) -> L X`` for symmetric positive definite ``L``.
        b: ``(N, C)`` right-hand sides (cast to float64).
        columns_per_solve: columns solved together (bounds the work arrays to a few
            ``(N, columns_per_solve)`` float64 blocks; the columns are independent either way).

    Returns:
        ``(N, C)`` float64.
    """
    b = np.asarray(b, dtype=np.float64)
    if b.ndim != 2:
        raise ValueError(f"conjugate_gradient expects (N, C) right-hand sides, got shape {b.shape}")
    if b.shape[1] > columns_per_solve:
        return np.concatenate([conjugate_gradient(apply, b[:, i:i + columns_per_solve], tol=tol, maxiter=maxiter,
                                                  columns_per_solve=columns_per_solve)
                               for i in range(0, b.shape[1], columns_per_solve)], axis=1)
    x = np.zeros_like(b)
    r = b.copy()
    atol = tol * np.linalg.norm(b, axis=0)
    active = np.linalg.norm(b, axis=0) > 0
    p = np.zeros_like(b)
    rho_prev = np.ones(b.shape[1])
    for it in range(int(maxiter)):
        active &= ~(np.linalg.norm(r, axis=0) < atol)
        a = np.flatnonzero(active)
        if a.size == 0:
            break
        ra = r[:, a]
        rho = np.einsum("ij,ij->j", ra, ra)
        if it == 0:
            pa = ra.copy()
        else:
            pa = p[:, a] * (rho / rho_prev[a]) + ra
        q = apply(pa)
        step = rho / np.einsum("ij,ij->j", pa, q)
        x[:, a] += step * pa
        r[:, a] = ra - step * q
        p[:, a] = pa
        rho_prev[a] = rho
    return x


# sRGB (D65) -> CIE XYZ -> CIE Lab, the constants of the sRGB standard (IEC 61966-2-1) and CIE
# 15: the sRGB transfer threshold 0.04045, the linear-RGB -> XYZ matrix, the D65 white
# (0.95047, 1, 1.08883), the Lab threshold 0.008856 = (6/29)^3 and slope 7.787 = (29/6)^2 / 3
# (kornia.color.rgb_to_lab, which upstream calls, uses these).
_RGB_TO_XYZ = ((0.412453, 0.357580, 0.180423),
               (0.212671, 0.715160, 0.072169),
               (0.019334, 0.119193, 0.950227))
_D65_WHITE = (0.95047, 1.0, 1.08883)


def rgb_to_lab(rgb: torch.Tensor) -> torch.Tensor:
    """``(3, H, W)`` sRGB in [0, 1] -> ``(3, H, W)`` CIE Lab (L in [0, 100]), same dtype."""
    if rgb.dim() != 3 or rgb.shape[0] != 3:
        raise ValueError(f"rgb_to_lab expects a (3, H, W) image, got shape {tuple(rgb.shape)}")
    lin = torch.where(rgb > 0.04045, torch.pow(((rgb + 0.055) / 1.055).clamp_min(0), 2.4), rgb / 12.92)
    m = torch.tensor(_RGB_TO_XYZ, dtype=rgb.dtype, device=rgb.device)
    xyz = torch.einsum("ij,jhw->ihw", m, lin)
    xyz = xyz / torch.tensor(_D65_WHITE, dtype=rgb.dtype, device=rgb.device).view(3, 1, 1)
    f = torch.where(xyz > 0.008856, torch.pow(xyz.clamp_min(0.008856), 1.0 / 3.0), 7.787 * xyz + 4.0 / 29.0)
    L = 116.0 * f[1] - 16.0
    a = 500.0 * (f[0] - f[1])
    b = 200.0 * (f[1] - f[2])
    return torch.stack([L, a, b])


def pixel_affinity(rgb: torch.Tensor, *, neighbourhood: int, tau: float) -> sp.csr_matrix:
    """LPOSS+'s pixel graph (float64 CSR, ``(H W, H W)``, row-major pixels): pixel ``i`` is joined
    to every other pixel ``j`` of the ``(2 n + 1)^2`` square around it (``n = neighbourhood``,
    inside the image) with weight ``exp(-||lab_i - lab_j|| / tau)``, Lab divided by
    ``(100, 128, 128)``; the distances are computed in float32 as upstream does.

    Args:
        rgb: ``(3, H, W)`` sRGB in [0, 1].
    """
    lab = rgb_to_lab(rgb.float()) / torch.tensor([100.0, 128.0, 128.0], device=rgb.device).view(3, 1, 1)
    _, h, w = lab.shape
    n = int(neighbourhood)
    offsets = [(dy, dx) for dy in range(-n, n + 1) for dx in range(-n, n + 1) if (dy, dx) != (0, 0)]
    # (H*W, M) weights and columns, offsets in lexicographic order = increasing column per row
    data = np.zeros((h * w, len(offsets)), dtype=np.float32)
    cols = np.full((h * w, len(offsets)), -1, dtype=np.int32 if h * w < 2 ** 31 - 1 else np.int64)
    yy, xx = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    lab_np = lab.cpu().numpy()
    for m, (dy, dx) in enumerate(offsets):
        ys, ye = max(0, -dy), min(h, h - dy)
        xs, xe = max(0, -dx), min(w, w - dx)
        if ys >= ye or xs >= xe:
            continue
        src = lab_np[:, ys:ye, xs:xe]
        dst = lab_np[:, ys + dy:ye + dy, xs + dx:xe + dx]
        d = np.sqrt(((src - dst) ** 2).sum(axis=0))
        rows = (yy[ys:ye, xs:xe] * w + xx[ys:ye, xs:xe]).ravel()
        data[rows, m] = np.exp(-d / np.float32(tau)).ravel()
        cols[rows, m] = ((yy[ys:ye, xs:xe] + dy) * w + xx[ys:ye, xs:xe] + dx).ravel()
    valid = cols >= 0
    indptr = np.concatenate([[0], np.cumsum(valid.sum(axis=1))])
    return sp.csr_matrix((data[valid].astype(np.float64), cols[valid], indptr), shape=(h * w, h * w))
