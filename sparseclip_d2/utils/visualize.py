"""Figures of semantic-segmentation predictions (detectron2 ``Visualizer`` + matplotlib).

Everything renders off-screen (matplotlib ``Figure`` + Agg canvas, no pyplot state) and
returns ``(H, W, 3)`` uint8 RGB arrays; :func:`save_png` writes them.

- :func:`draw_overlay`: the prediction drawn over the photo by detectron2's ``Visualizer``
  (class names on the segments), a legend of the predicted classes (area %) in a corner and
  an optional banner; **same size as the photo**.
- :func:`compare_figure`: the photo plus one overlay panel per attention spec, one shared
  legend and a title (banner) line.
- :func:`probability_figure`: per-class probability heat maps.
- :func:`save_label_map`: the raw class-index PNG (uint8, or uint16 above 256 classes).

Class colours are fixed per class index (:func:`class_colors`), so panels of one figure and
figures of one vocabulary agree.
"""
import logging
import math
import os
from typing import List, Optional, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from PIL import Image

from detectron2.data.catalog import Metadata
from detectron2.utils.colormap import colormap
from detectron2.utils.visualizer import ColorMode, Visualizer

__all__ = [
    "RANDOM_WEIGHTS_BANNER",
    "class_colors",
    "draw_overlay",
    "compare_figure",
    "probability_figure",
    "save_png",
    "save_label_map",
    "label_map_dtype",
]

logger = logging.getLogger(__name__)

#: Text put on every figure made with random CLIP weights.
RANDOM_WEIGHTS_BANNER = "RANDOM WEIGHTS - not meaningful"
_BANNER_COLOR = "#c00000"


def class_colors(num_classes: int) -> np.ndarray:
    """``(num_classes, 3)`` uint8 RGB colours, deterministic: detectron2's palette without
    its repeated entries, black and white, then the same colours lightened / darkened, then seeded random
    colours (beyond about 350 classes)."""
    base = []
    for c in colormap(rgb=True, maximum=255).round().astype(np.int64):
        if tuple(c) not in {tuple(b) for b in base} and 0 < c.sum() < 3 * 255:  # no repeats, no black/white
            base.append(c)
    base = np.array(base, dtype=np.float64)
    shifts = (0.0, 0.45, -0.45, 0.75, -0.7)
    out = np.empty((num_classes, 3), dtype=np.float64)
    for i in range(num_classes):
        turn, j = divmod(i, len(base))
        if turn < len(shifts):
            s = shifts[turn]
            out[i] = base[j] + (255.0 - base[j]) * s if s >= 0 else base[j] * (1.0 + s)
        else:
            out[i] = np.random.RandomState(i).randint(0, 256, 3)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def _check_inputs(image: np.ndarray, labels: np.ndarray, class_names: Sequence[str]) -> None:
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ValueError(f"image must be (H, W, 3) uint8 RGB, got {image.shape} {image.dtype}")
    if labels.shape != image.shape[:2]:
        raise ValueError(f"label map {labels.shape} does not match the image {image.shape[:2]}")
    if labels.size and (labels.min() < 0 or labels.max() >= len(class_names)):
        raise ValueError(f"labels in [{labels.min()}, {labels.max()}] outside the {len(class_names)} classes")


def _legend_handles(labels: np.ndarray, class_names: Sequence[str], colors: np.ndarray, max_entries: int,
                    with_area: bool = True) -> List[Patch]:
    ids, counts = np.unique(labels, return_counts=True)
    order = np.argsort(-counts, kind="stable")
    total = max(int(labels.size), 1)
    handles = []
    for k in order[:max_entries]:
        c = int(ids[k])
        pct = 100.0 * counts[k] / total
        area = f"{pct:.1f}%" if pct >= 0.1 else "<0.1%"
        text = f"{class_names[c]} {area}" if with_area else class_names[c]
        handles.append(Patch(facecolor=colors[c] / 255.0, edgecolor="black", linewidth=0.5, label=text))
    if len(order) > max_entries:
        handles.append(Patch(facecolor="none", edgecolor="none", label=f"+{len(order) - max_entries} more"))
    return handles


def draw_overlay(
    image: np.ndarray,
    labels: np.ndarray,
    class_names: Sequence[str],
    *,
    colors: Optional[np.ndarray] = None,
    alpha: float = 0.55,
    legend: bool = True,
    max_legend_entries: int = 12,
    banner: Optional[str] = None,
    title: Optional[str] = None,
) -> np.ndarray:
    """Draw a label map over its photo with detectron2's ``Visualizer``.

    Args:
        image: ``(H, W, 3)`` uint8 RGB photo.
        labels: ``(H, W)`` integer class indices into ``class_names``.
        class_names: display names, one per class.
        colors: ``(C, 3)`` uint8 colours (default :func:`class_colors`).
        alpha: mask opacity.
        legend: draw the legend of the predicted classes (sorted by area, with area %) in
            the lower-right corner.
        max_legend_entries: at most this many legend rows ("+k more" after them).
        banner: text drawn on a red band at the top (e.g. :data:`RANDOM_WEIGHTS_BANNER`).
        title: text drawn at the top left (below the banner), e.g. the attention spec.

    Returns:
        ``(H, W, 3)`` uint8 RGB, the size of ``image``.
    """
    labels = np.asarray(labels)
    _check_inputs(image, labels, class_names)
    colors = class_colors(len(class_names)) if colors is None else np.asarray(colors)
    meta = Metadata(name="sparseclip_demo_overlay")
    meta.stuff_classes = list(class_names)
    meta.stuff_colors = [tuple(int(v) for v in c) for c in colors]
    vis = Visualizer(image, metadata=meta, scale=1.0, instance_mode=ColorMode.IMAGE)
    out = vis.draw_sem_seg(labels.astype(np.int64), area_threshold=None, alpha=alpha)
    font = float(vis._default_font_size)
    ax = out.ax
    y = 0.99
    if banner:
        ax.text(0.5, y, banner, transform=ax.transAxes, ha="center", va="top", fontsize=font * 1.3,
                fontweight="bold", color="white", family="sans-serif",
                bbox=dict(facecolor=_BANNER_COLOR, alpha=0.9, edgecolor="none", pad=3))
        y -= (1.6 * font * 1.3 + 10) * (out.dpi / 72.0) / out.height
    if title:
        ax.text(0.01, y, title, transform=ax.transAxes, ha="left", va="top", fontsize=font, color="white",
                family="sans-serif", bbox=dict(facecolor="black", alpha=0.6, edgecolor="none", pad=2))
    if legend:
        handles = _legend_handles(labels, class_names, colors, max_legend_entries)
        leg = ax.legend(handles=handles, loc="lower right", fontsize=font * 0.9, framealpha=0.8,
                        handlelength=1.0, handleheight=1.0, borderpad=0.3, labelspacing=0.25)
        leg.set_zorder(1000)  # above the segment labels
    rgb = out.get_image()
    if rgb.shape[:2] != image.shape[:2]:  # guard against matplotlib rounding
        rgb = np.asarray(Image.fromarray(rgb).resize((image.shape[1], image.shape[0]), Image.BILINEAR))
    return rgb


def _render(fig: Figure) -> np.ndarray:
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[:, :, :3].copy()


def compare_figure(
    image: np.ndarray,
    label_maps: Sequence[np.ndarray],
    panel_titles: Sequence[str],
    class_names: Sequence[str],
    *,
    colors: Optional[np.ndarray] = None,
    banner: Optional[str] = None,
    suptitle: Optional[str] = None,
    panel_width_inches: float = 4.0,
    max_cols: int = 4,
    max_legend_entries: int = 24,
    dpi: int = 100,
) -> np.ndarray:
    """Side-by-side panels: the photo, then one overlay per prediction.

    Args:
        image: ``(H, W, 3)`` uint8 RGB photo.
        label_maps: one ``(H, W)`` label map per panel.
        panel_titles: one title per label map (e.g. spec text and description, may hold
            a newline).
        class_names: display names.
        colors: ``(C, 3)`` uint8 (default :func:`class_colors`), shared by all panels.
        banner: red line above the panels (e.g. :data:`RANDOM_WEIGHTS_BANNER`).
        suptitle: black line above the panels (e.g. the file name).
        panel_width_inches, max_cols, dpi: layout.
        max_legend_entries: the shared legend lists the classes predicted in any panel,
            by total area, at most this many.

    Returns:
        ``(h, w, 3)`` uint8 RGB figure.
    """
    if len(label_maps) != len(panel_titles) or not label_maps:
        raise ValueError(f"need one title per label map, got {len(label_maps)} maps and {len(panel_titles)} titles")
    colors = class_colors(len(class_names)) if colors is None else np.asarray(colors)
    panels = [(image, "input")]
    for labels, title in zip(label_maps, panel_titles):
        labels = np.asarray(labels)
        _check_inputs(image, labels, class_names)
        panels.append((draw_overlay(image, labels, class_names, colors=colors, legend=False), title))
    n = len(panels)
    rows = math.ceil(n / max_cols)
    cols = math.ceil(n / rows)  # balanced rows: 6 panels -> 2 x 3, not 4 + 2
    h, w = image.shape[:2]
    pw = panel_width_inches
    ph = pw * h / w
    legend_rows = math.ceil(min(len(np.unique(np.concatenate([np.unique(m) for m in label_maps]))),
                                max_legend_entries + 1) / cols)
    head = 0.35 * (bool(banner) + bool(suptitle)) + 0.1
    title_h = 0.5
    legend_h = 0.28 * legend_rows + 0.2
    fig_h = head + rows * (ph + title_h) + legend_h
    fig = Figure(figsize=(cols * pw, fig_h), dpi=dpi, facecolor="white")
    for k, (img, title) in enumerate(panels):
        r, c = divmod(k, cols)
        bottom = legend_h + (rows - 1 - r) * (ph + title_h)
        ax = fig.add_axes([c / cols, bottom / fig_h, 1.0 / cols, ph / fig_h])
        ax.imshow(img, interpolation="bilinear")
        ax.set_axis_off()
        ax.set_title(title, fontsize=9, family="sans-serif", pad=3)
    y = 1.0 - 0.05 / fig_h
    if banner:
        fig.text(0.5, y, banner, ha="center", va="top", fontsize=13, fontweight="bold", color=_BANNER_COLOR)
        y -= 0.35 / fig_h
    if suptitle:
        fig.text(0.5, y, suptitle, ha="center", va="top", fontsize=10)
    all_labels = np.concatenate([np.asarray(m).ravel() for m in label_maps])
    handles = _legend_handles(all_labels, class_names, colors, max_legend_entries, with_area=False)
    fig.legend(handles=handles, loc="lower center", ncol=cols, fontsize=9, frameon=False,
               bbox_to_anchor=(0.5, 0.0), handlelength=1.0, handleheight=1.0)
    return _render(fig)


def probability_figure(
    probs: np.ndarray,
    class_names: Sequence[str],
    *,
    banner: Optional[str] = None,
    max_classes: int = 12,
    panel_width_inches: float = 2.6,
    max_cols: int = 4,
    dpi: int = 100,
) -> np.ndarray:
    """Heat maps (0..1, shared colour scale) of the classes with the largest total probability.

    Args:
        probs: ``(C, H, W)`` class probabilities.
        class_names: C display names.
        banner: red line above the panels.
        max_classes: at most this many panels (the classes with the largest mean
            probability, in decreasing order).

    Returns:
        ``(h, w, 3)`` uint8 RGB figure.
    """
    probs = np.asarray(probs, dtype=np.float32)
    if probs.ndim != 3 or probs.shape[0] != len(class_names):
        raise ValueError(f"probs must be (C, H, W) with C = {len(class_names)} classes, got {probs.shape}")
    order = np.argsort(-probs.reshape(len(class_names), -1).mean(1), kind="stable")[:max_classes]
    n = len(order)
    cols = min(n, max_cols)
    rows = math.ceil(n / cols)
    h, w = probs.shape[1:]
    pw, ph, title_h = panel_width_inches, panel_width_inches * h / w, 0.3
    head = 0.45 if banner else 0.1
    cbar_h = 0.6
    fig_h = head + rows * (ph + title_h) + cbar_h
    fig = Figure(figsize=(cols * pw, fig_h), dpi=dpi, facecolor="white")
    im = None
    for k, c in enumerate(order):
        r, col = divmod(k, cols)
        bottom = cbar_h + (rows - 1 - r) * (ph + title_h)
        ax = fig.add_axes([col / cols, bottom / fig_h, 1.0 / cols * 0.98, ph / fig_h])
        im = ax.imshow(probs[c], vmin=0.0, vmax=1.0, cmap="viridis", interpolation="bilinear")
        ax.set_axis_off()
        ax.set_title(f"{class_names[c]} (mean {probs[c].mean():.2f})", fontsize=8, family="sans-serif")
    cax = fig.add_axes([0.25, 0.3 / fig_h, 0.5, 0.12 / fig_h])
    fig.colorbar(im, cax=cax, orientation="horizontal").ax.tick_params(labelsize=7)
    if banner:
        fig.text(0.5, 1.0 - 0.05 / fig_h, banner, ha="center", va="top", fontsize=12, fontweight="bold",
                 color=_BANNER_COLOR)
    return _render(fig)


def label_map_dtype(num_classes: int):
    """``np.uint8`` for up to 256 classes, else ``np.uint16`` (up to 65536)."""
    if num_classes <= 256:
        return np.uint8
    if num_classes <= 65536:
        return np.uint16
    raise ValueError(f"{num_classes} classes do not fit a 16-bit label PNG")


def save_label_map(labels: np.ndarray, num_classes: int, path: str) -> str:
    """Write ``(H, W)`` class indices as a single-channel PNG (pixel value i = class i of the
    vocabulary): 8-bit for up to 256 classes, 16-bit above. Returns ``path``."""
    labels = np.asarray(labels)
    if labels.ndim != 2:
        raise ValueError(f"label map must be (H, W), got {labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"labels in [{labels.min()}, {labels.max()}] outside [0, {num_classes})")
    return save_png(labels.astype(label_map_dtype(num_classes)), path)


def save_png(array: np.ndarray, path: str) -> str:
    """Write a uint8 (H, W[, 3]) or uint16 (H, W) array as PNG, creating the folder. Returns ``path``."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    Image.fromarray(np.ascontiguousarray(array)).save(path, format="PNG")
    return path
