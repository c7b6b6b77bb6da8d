"""Attention maps of one query patch under several attention specs (``tools/visualize_attention.py``).

One CLIP model is built once; each spec gets its own ``DenseCLIPEncoder`` over the same
``visual`` (encoders wrap, never copy). For each spec the query patch's row of the last
block's attention is divided by its sum (sum sources: by their number of terms), averaged
over heads for the map, and summarised by the **mean over heads** of the support size
(non-zero weights) and of the perplexity ``exp(entropy)``, as in the attention statistics.
"""
import logging
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from ..clip import AttentionSpec, DenseCLIPEncoder

__all__ = ["DEFAULT_SPECS", "spec_label", "query_attention", "attention_figure"]

logger = logging.getLogger(__name__)

#: qk, qq, kk, vv x softmax, entmax 1.2 (spec strings of ``sparseclip_d2.clip.parse_attention_spec``).
DEFAULT_SPECS = ("qk:softmax", "qq:softmax", "kk:softmax", "vv:softmax",
                 "qk:entmax:1.2", "qq:entmax:1.2", "kk:entmax:1.2", "vv:entmax:1.2")


def spec_label(spec: AttentionSpec) -> str:
    """Short panel label, e.g. ``qq entmax 1.2`` or ``qk softmax``."""
    if spec.normalizer in ("entmax", "random_matched"):
        return f"{spec.source} {spec.normalizer} {spec.alpha:g}"
    if spec.temperature != 1.0:
        return f"{spec.source} {spec.normalizer} T={spec.temperature:g}"
    return f"{spec.source} {spec.normalizer}"


def _prepare(image: np.ndarray, resolution: int, patch: int, mean, std) -> Tuple[torch.Tensor, float, float]:
    """``(H, W, 3)`` uint8 RGB -> ``(1, 3, h', w')`` normalised image whose short side is about
    ``resolution`` and whose sides are multiples of ``patch``; returns (tensor, sy, sx) scales."""
    H, W = image.shape[:2]
    s = resolution / min(H, W)
    nh, nw = max(patch, int(round(H * s / patch)) * patch), max(patch, int(round(W * s / patch)) * patch)
    x = torch.from_numpy(np.array(image, dtype=np.uint8, copy=True)).permute(2, 0, 1).float()[None] / 255.0
    x = F.interpolate(x, size=(nh, nw), mode="bilinear", align_corners=False)
    x = (x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    return x, nh / H, nw / W


def query_attention(visual: torch.nn.Module, image: np.ndarray, query_xy: Tuple[float, float],
                    specs: Sequence[AttentionSpec], *, resolution: int = 448,
                    device: str = "cpu") -> List[Dict]:
    """The query patch's attention under each spec.

    Args:
        visual: an open_clip vision tower (``model.visual``).
        image: ``(H, W, 3)`` uint8 RGB.
        query_xy: query point ``(x, y)`` in pixels of ``image``.
        specs: attention specs (one encoder each, sharing ``visual``).
        resolution: short side of the working image (rounded to multiples of the patch).

    Returns:
        per spec ``{"spec", "label", "map": (h, w) float (head mean of the normalised row over
        patches), "support": mean over heads, "perplexity": mean over heads, "cls_mass" (mass on
        the prefix tokens: CLS and registers; 0 for SigLIP), "grid": (h, w), "query_patch":
        (row, col), "num_tokens": prefix + patch tokens}``.
    """
    H, W = image.shape[:2]
    x, y = float(query_xy[0]), float(query_xy[1])
    if not (0 <= x < W and 0 <= y < H):
        raise ValueError(f"query point (x={x}, y={y}) lies outside the {W}x{H} image")
    out = []
    prepared = None
    for spec in specs:
        enc = DenseCLIPEncoder(visual, spec).to(device)
        p = enc.patch_size if isinstance(enc.patch_size, int) else enc.patch_size[0]
        if prepared is None:
            prepared = _prepare(image, resolution, p, enc.image_mean, enc.image_std)
        img, sy, sx = prepared
        h, w = img.shape[-2] // p, img.shape[-1] // p
        row, col = min(int(y * sy) // p, h - 1), min(int(x * sx) // p, w - 1)
        with torch.no_grad():
            _, attn = enc(img.to(device), return_attention=True)
        T = int(enc.num_prefix_tokens)  # 1 = CLS, 0 for SigLIP, 1 + registers
        r = attn[0, :, T + row * w + col, :].double()  # (heads, L)
        r = r / r.sum(-1, keepdim=True)
        support = (r > 0).sum(-1).double()
        plogp = torch.where(r > 0, r * torch.log(r.clamp_min(1e-300)), torch.zeros_like(r))
        ppl = torch.exp(-plogp.sum(-1))
        out.append({
            "spec": spec, "label": spec_label(spec),
            "map": r[:, T:].mean(0).reshape(h, w).cpu().numpy(),
            "support": float(support.mean()), "perplexity": float(ppl.mean()),
            "cls_mass": float(r[:, :T].sum(-1).mean()), "grid": (h, w), "query_patch": (row, col),
            "num_tokens": int(r.shape[-1]),
        })
    return out


def attention_figure(image: np.ndarray, results: Sequence[Dict], query_xy: Tuple[float, float], *,
                     title: str = "", random_weights: bool = False, ncols: Optional[int] = None,
                     shared_scale: bool = True):
    """One panel per spec: the image with the query patch's attention map over it (colour =
    attention weight), the query marked by a cross; panel titles give the support size and
    the perplexity (means over heads).

    ``shared_scale`` (default): one colour scale, 0 to the largest weight of all panels, and
    one colour bar for the figure, so that panels compare by colour (softmax and entmax
    maps differ by up to 50x in their peak); False: each panel its own scale and bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(results)
    ncols = ncols or min(4, n)
    nrows = int(np.ceil(n / ncols))
    H, W = image.shape[:2]
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 3.6 * nrows * H / W + 0.9),
                             constrained_layout=True, squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    vmax = max(float(np.max(res["map"])) for res in results) if shared_scale else None
    for ax, res in zip(axes.flat, results):
        ax.imshow(image)
        im = ax.imshow(res["map"], cmap="inferno", alpha=0.65, extent=(0, W, H, 0), interpolation="nearest",
                       vmin=0.0 if shared_scale else None, vmax=vmax)
        ax.plot([query_xy[0]], [query_xy[1]], marker="x", color="cyan", markersize=10, markeredgewidth=2.5)
        h, w = res["grid"]
        tokens = res.get("num_tokens", 1 + h * w)  # results built without it: a CLS tower
        ax.set_title(f"{res['label']}\nsupport {res['support']:.1f}/{tokens}, perplexity {res['perplexity']:.1f}",
                     fontsize=9)
        ax.set_xlabel("x (px)", fontsize=8)
        ax.set_ylabel("y (px)", fontsize=8)
        ax.tick_params(labelsize=7)
        if not shared_scale:
            cb = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
            cb.set_label("attention weight (head mean)", fontsize=7)
            cb.ax.tick_params(labelsize=6)
    if shared_scale:
        cb = fig.colorbar(im, ax=axes[:, :].ravel().tolist()[:n], fraction=0.03, pad=0.02, shrink=0.9)
        # the bar's own label stays shorter than the bar (a one-row figure's bar is ~2.5 inches:
        # a longer label was cut at both ends); the scale is said once under the panels
        cb.set_label("attention (head mean)", fontsize=8)
        cb.ax.tick_params(labelsize=7)
        fig.supxlabel(f"one colour scale for all panels: 0 to {vmax:.3g}", fontsize=8)
    head = title or "Attention of the query patch (x) in the last block"
    if random_weights:
        head += "\nRANDOM WEIGHTS (smoke test: maps and numbers are meaningless)"
    fig.suptitle(head, fontsize=11)
    return fig
