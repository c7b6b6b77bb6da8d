"""Figures of semantic-segmentation predictions (numpy + PIL overlays, matplotlib panels).

Everything renders off-screen (PIL, or matplotlib ``Figure`` + Agg canvas, no pyplot
state) and returns ``(H, W, 3)`` uint8 RGB arrays; :func:`save_png` writes them.

- :func:`draw_overlay`: the prediction over the photo, blended in bands of rows, with the
  class names inside their segments (never over the banner, title or legend), a legend of
  the predicted classes (area %) in a corner and an optional banner; **same size as the
  photo**.
- :func:`compare_figure`: the photo plus one overlay panel per attention spec, one shared
  legend and a title (banner) line.
- :func:`probability_figure`: per-class probability heat maps (the top classes, stated).
- :func:`save_label_map`: the raw class-index PNG (uint8, or uint16 above 256 classes).

Class colours are fixed per class index (:func:`class_colors`), so panels of one figure and
figures of one vocabulary agree.
"""
import functools
import logging
import math
import os
import textwrap
from typing import Dict, List, Optional, Sequence

import numpy as np
from matplotlib import font_manager
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from PIL import Image, ImageDraw, ImageFont

from detectron2.utils.colormap import colormap

__all__ = [
    "BANNER_COLOR",
    "RANDOM_WEIGHTS_BANNER",
    "class_colors",
    "draw_overlay",
    "compare_figure",
    "wrap_title",
    "wrap_to_width",
    "probability_figure",
    "save_png",
    "save_label_map",
    "label_map_dtype",
    "load_font",
]

logger = logging.getLogger(__name__)

#: Text put on every figure made with random CLIP weights.
RANDOM_WEIGHTS_BANNER = "RANDOM WEIGHTS - not meaningful"
#: Colour of the band (and text) that carries :data:`RANDOM_WEIGHTS_BANNER`.
BANNER_COLOR = "#c00000"


@functools.lru_cache(maxsize=1)
def _base_palette() -> np.ndarray:
    """detectron2's palette without its repeated entries, black and white, ``(K, 3)`` float64
    (computed once: the de-duplication is quadratic; read-only)."""
    base, seen = [], set()
    for c in colormap(rgb=True, maximum=255).round().astype(np.int64):
        if tuple(c) not in seen and 0 < c.sum() < 3 * 255:  # no repeats, no black/white
            seen.add(tuple(c))
            base.append(c)
    base = np.array(base, dtype=np.float64)
    base.setflags(write=False)
    return base


def class_colors(num_classes: int) -> np.ndarray:
    """``(num_classes, 3)`` uint8 RGB colours, deterministic: detectron2's palette without
    its repeated entries, black and white, then the same colours lightened / darkened, then seeded random
    colours (beyond about 350 classes)."""
    base = _base_palette()
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


# Fonts tried, in order, for text DejaVu Sans cannot draw (CJK class names): files of the
# Debian packages fonts-wqy-microhei / fonts-wqy-zenhei / fonts-noto-cjk (scripts/setup.sh
# installs fonts-wqy-microhei where apt is available), then any installed font whose family
# name says CJK. Text no font covers is drawn with DejaVu Sans (boxes) and logged once.
FALLBACK_FONTS = [
    "/usr/share/fonts/truetype/wqy/wqy-microhei.ttc",
    "/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc",
    "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc",
]
_coverage_cache: Dict[str, frozenset] = {}
_font_warned = set()


def _dejavu(bold: bool = False) -> str:
    return font_manager.findfont(font_manager.FontProperties(family="DejaVu Sans",
                                                             weight="bold" if bold else "normal"))


def _coverage(path: str) -> frozenset:
    """Code points a font file maps (its cmap; first face of a .ttc), cached; empty when
    the file cannot be read."""
    if path not in _coverage_cache:
        try:
            from fontTools.ttLib import TTFont

            with TTFont(path, fontNumber=0, lazy=True) as f:
                _coverage_cache[path] = frozenset(f.getBestCmap() or {})
        except Exception:  # a missing or unreadable font is simply not a candidate
            _coverage_cache[path] = frozenset()
    return _coverage_cache[path]


def _candidate_fonts() -> List[str]:
    extra = sorted(f.fname for f in font_manager.fontManager.ttflist if "CJK" in f.name or "Hei" in f.name)
    return [p for p in dict.fromkeys(FALLBACK_FONTS + extra) if os.path.isfile(p)]


def font_path_for(text: str, bold: bool = False) -> str:
    """The font file to draw ``text`` with: DejaVu Sans when it covers every character, else
    the first of :data:`FALLBACK_FONTS` (and installed CJK fonts) that does. When none does,
    DejaVu Sans, with one warning per set of missing characters naming them and the fix."""
    needed = {ord(ch) for ch in text if not ch.isspace()}
    base = _dejavu(bold)
    if needed <= _coverage(base):
        return base
    for path in _candidate_fonts():
        if needed <= _coverage(path):
            return path
    missing = "".join(sorted({chr(c) for c in needed - _coverage(base)}))
    if missing not in _font_warned:
        _font_warned.add(missing)
        logger.warning("no installed font draws %r (%s); these characters appear as boxes in the figures: "
                       "install a CJK font (Debian: apt-get install fonts-wqy-microhei or fonts-noto-cjk)",
                       missing, ", ".join(f"U+{ord(c):04X}" for c in missing[:8]))
    return base


def load_font(size: float, bold: bool = False, path: Optional[str] = None) -> ImageFont.FreeTypeFont:
    """The PIL font at ``path`` (default DejaVu Sans, shipped with matplotlib; bold when
    ``bold``) at ``size`` px (at least 6); :func:`font_path_for` picks ``path`` for text
    DejaVu Sans cannot draw."""
    return ImageFont.truetype(path or _dejavu(bold), size=max(6, int(round(size))))


_font = load_font  # the old private name (tests/analysis/test_overlay_text.py uses it)


def _boxes_overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _blend(image: np.ndarray, labels: np.ndarray, colors: np.ndarray, alpha: float,
           band_rows: int = 512) -> np.ndarray:
    """``image * (1 - alpha) + colors[labels] * alpha`` with segment boundaries darkened,
    computed in bands of rows (temporaries ``O(band_rows * W)``). Returns (H, W, 3) uint8."""
    h, w = labels.shape
    out = np.empty_like(image)
    palette = colors.astype(np.float32)
    for r0 in range(0, h, band_rows):
        r1 = min(r0 + band_rows, h)
        lab = labels[r0:r1].astype(np.intp)
        band = image[r0:r1].astype(np.float32) * (1.0 - alpha) + palette[lab] * alpha
        # Boundaries: pixels whose right or lower neighbour has another class.
        edge = np.zeros(lab.shape, dtype=bool)
        edge[:, :-1] |= lab[:, :-1] != lab[:, 1:]
        below = labels[r0 + 1:r1 + 1].astype(np.intp)
        edge[:below.shape[0]] |= lab[:below.shape[0]] != below
        band[edge] *= 0.35
        out[r0:r1] = np.clip(np.rint(band), 0, 255).astype(np.uint8)
    return out


def _label_positions(labels: np.ndarray, class_ids: Sequence[int], text_sizes: Sequence, reserved: List,
                     thumb_side: int = 512) -> List:
    """Where to write each class name: the most interior point of the class (largest
    distance to another class or the image border, on a thumbnail), with the text box kept
    inside the image and off ``reserved`` boxes and the names already placed.

    Returns ``[(class id, (x0, y0, x1, y1))]`` in image pixels; classes without room are left out.
    """
    import cv2

    h, w = labels.shape
    step = max(1, -(-max(h, w) // thumb_side))
    thumb = labels[::step, ::step]
    taken = list(reserved)
    placed = []
    for c, (tw, th) in zip(class_ids, text_sizes):
        mask = np.zeros((thumb.shape[0] + 2, thumb.shape[1] + 2), dtype=np.uint8)
        mask[1:-1, 1:-1] = thumb == c  # zero border: the distance counts the image edge too
        dist = cv2.distanceTransform(mask, cv2.DIST_L2, 3)[1:-1, 1:-1]
        for box in taken:  # no centre where the text would overlap something already there
            x0 = max(0, int((box[0] - tw / 2) // step))
            x1 = int(-(-(box[2] + tw / 2) // step))
            y0 = max(0, int((box[1] - th / 2) // step))
            y1 = int(-(-(box[3] + th / 2) // step))
            dist[y0:y1, x0:x1] = 0
        ty, tx = np.unravel_index(int(np.argmax(dist)), dist.shape)
        if dist[ty, tx] * step < max(3.0, th / 4):  # no room left for this class's name
            continue
        cx = min(max(tx * step + step / 2, tw / 2 + 1), w - tw / 2 - 1)
        cy = min(max(ty * step + step / 2, th / 2 + 1), h - th / 2 - 1)
        box = (cx - tw / 2, cy - th / 2, cx + tw / 2, cy + th / 2)
        if any(_boxes_overlap(box, t) for t in taken) or box[0] < 0 or box[1] < 0 or box[2] > w or box[3] > h:
            continue
        taken.append(box)
        placed.append((c, box))
    return placed


def draw_overlay(
    image: np.ndarray,
    labels: np.ndarray,
    class_names: Sequence[str],
    *,
    colors: Optional[np.ndarray] = None,
    alpha: float = 0.55,
    legend: bool = True,
    max_legend_entries: int = 12,
    max_segment_labels: int = 40,
    banner: Optional[str] = None,
    title: Optional[str] = None,
    text_scale: float = 1.0,
) -> np.ndarray:
    """Draw a label map over its photo: coloured segments with darkened boundaries, the
    class name inside each segment, a legend of the predicted classes and optional banner
    and title lines.

    The colours are blended in bands of rows; names are written (PIL, DejaVu Sans) at the
    most interior point of each class, inside the image and never over the banner, the
    title, the legend or another name (a class without room for its name is listed in the
    legend only).

    Args:
        image: ``(H, W, 3)`` uint8 RGB photo.
        labels: ``(H, W)`` integer class indices into ``class_names``.
        class_names: display names, one per class.
        colors: ``(C, 3)`` uint8 colours (default :func:`class_colors`).
        alpha: mask opacity.
        legend: draw the legend of the predicted classes (sorted by area, with area %) in
            the lower-right corner.
        max_legend_entries: at most this many legend rows ("+k more" after them).
        max_segment_labels: at most this many names on segments (the largest classes).
        banner: text drawn on a red band at the top (e.g. :data:`RANDOM_WEIGHTS_BANNER`).
        title: text drawn at the top left (below the banner), e.g. the attention spec.
        text_scale: text size relative to the default (about 2.8 % of the short side).

    Returns:
        ``(H, W, 3)`` uint8 RGB, the size of ``image``.
    """
    labels = np.asarray(labels)
    _check_inputs(image, labels, class_names)
    colors = class_colors(len(class_names)) if colors is None else np.asarray(colors)
    h, w = labels.shape
    canvas = Image.fromarray(_blend(image, labels, colors, alpha))
    draw = ImageDraw.Draw(canvas)
    # Text height from the SHORT side (2.8 %, at least 9 px, or short / 12 on tiny strips), so a
    # 20000 x 100 panorama gets 9 px text, not a title bar over a third of its height.
    short = min(h, w)
    size = max(int(round(min(9, short / 12))), int(round(0.028 * text_scale * short)), 1)
    texts = " ".join([banner or "", title or ""] + [str(n) for n in class_names])
    path = font_path_for(texts)
    bold_path = font_path_for(banner or "", bold=True)
    font, small = load_font(size, path=path), load_font(0.85 * size, path=path)
    bold = load_font(1.2 * size, True, bold_path)
    pad = max(2, size // 5)
    reserved = []
    y = 0
    if banner:
        x0, y0, x1, y1 = draw.textbbox((0, 0), banner, font=bold)
        band_h = (y1 - y0) + 2 * pad
        draw.rectangle((0, 0, w, band_h), fill=BANNER_COLOR)
        draw.text(((w - (x1 - x0)) / 2 - x0, pad - y0), banner, font=bold, fill="white")
        reserved.append((0, 0, w, band_h))
        y = band_h + pad
    if title:
        # A long title (e.g. GEM's description) wraps to the image's width instead of running
        # off its right edge; the lines share one black box.
        lines = wrap_to_width(title, lambda t: draw.textlength(t, font=font), w - 4 * pad)
        step = max(draw.textbbox((0, 0), "Ag", font=font)[3], 1) + pad // 2
        x0, y0, _, _ = draw.textbbox((0, 0), lines[0], font=font)
        text_w = max(draw.textbbox((0, 0), line, font=font)[2] - x0 for line in lines)
        _, _, _, y1 = draw.textbbox((0, 0), lines[-1], font=font)
        box = (pad, y, pad + text_w + 2 * pad, y + step * (len(lines) - 1) + (y1 - y0) + 2 * pad)
        draw.rectangle(box, fill=(0, 0, 0))
        for k, line in enumerate(lines):
            draw.text((box[0] + pad - x0, box[1] + pad - y0 + k * step), line, font=font, fill="white")
        reserved.append(box)
    ids, counts = np.unique(labels, return_counts=True)
    order = np.argsort(-counts, kind="stable")
    legend_rows = []
    if legend:
        total = max(int(labels.size), 1)
        for k in order[:max_legend_entries]:
            pct = 100.0 * counts[k] / total
            legend_rows.append((int(ids[k]), f"{class_names[int(ids[k])]} {pct:.1f}%" if pct >= 0.1
                                else f"{class_names[int(ids[k])]} <0.1%"))
        if len(order) > max_legend_entries:
            legend_rows.append((None, f"+{len(order) - max_legend_entries} more"))
        line = max(draw.textbbox((0, 0), "Ag", font=small)[3], 1) + pad
        swatch = line - pad
        text_w = max(draw.textlength(t, font=small) for _, t in legend_rows)
        lw, lh = 3 * pad + swatch + text_w + pad, pad + line * len(legend_rows) + pad
        box = (w - lw - pad, h - lh - pad, w - pad, h - pad)
        reserved.append(box)
    # Names on the segments, largest classes first, off everything reserved.
    ids_by_area = [int(ids[k]) for k in order[:max_segment_labels]]
    sizes = []
    for c in ids_by_area:
        x0, y0, x1, y1 = draw.textbbox((0, 0), class_names[c], font=font, stroke_width=2)
        sizes.append((x1 - x0 + 2, y1 - y0 + 2))
    for c, (x0, y0, x1, y1) in _label_positions(labels, ids_by_area, sizes, reserved):
        bx0, by0, _, _ = draw.textbbox((0, 0), class_names[c], font=font, stroke_width=2)
        light = tuple(int(v + (255 - v) * 0.6) for v in colors[c])
        draw.text((x0 + 1 - bx0, y0 + 1 - by0), class_names[c], font=font, fill=light, stroke_width=2,
                  stroke_fill=(0, 0, 0))
    if legend:
        draw.rectangle(box, fill=(255, 255, 255), outline=(0, 0, 0))
        ty = box[1] + pad
        for c, text in legend_rows:
            if c is not None:
                draw.rectangle((box[0] + pad, ty, box[0] + pad + swatch, ty + swatch),
                               fill=tuple(int(v) for v in colors[c]), outline=(0, 0, 0))
            draw.text((box[0] + 2 * pad + swatch, ty), text, font=small, fill=(0, 0, 0))
            ty += line
    return np.asarray(canvas)


def _downscale(image: np.ndarray, labels: Sequence[np.ndarray], max_side: int):
    """The image (area-averaged) and label maps (nearest) with the long side <= max_side."""
    h, w = image.shape[:2]
    if max(h, w) <= max_side:
        return image, [np.asarray(m) for m in labels]
    scale = max_side / max(h, w)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    small = np.asarray(Image.fromarray(image).resize(size, Image.BOX))
    maps = []
    for m in labels:
        m = np.asarray(m)
        rows = (np.arange(size[1]) * h // size[1])
        cols = (np.arange(size[0]) * w // size[0])
        maps.append(m[rows][:, cols])
    return small, maps


def _render(fig: Figure) -> np.ndarray:
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[:, :, :3].copy()


#: Average glyph width of the panel titles' 9 pt sans-serif, in points: a line of
#: ``panel_width_inches * 72 / _TITLE_CHAR_PT`` characters fits a panel.
_TITLE_CHAR_PT = 5.4


def wrap_to_width(text: str, length, width: float) -> List[str]:
    """``text`` split into lines, greedily at spaces (explicit newlines kept), each no
    longer than ``width`` by ``length`` (e.g. a font's ``textlength``); a single word longer
    than ``width`` is cut between characters. Joining the lines' words gives back the words
    of ``text``."""
    out: List[str] = []
    for part in str(text).split("\n"):
        line = ""
        for word in part.split(" "):
            candidate = f"{line} {word}" if line else word
            if length(candidate) <= width:
                line = candidate
                continue
            if line:
                out.append(line)
            line = ""
            while word and length(word) > width:  # a word wider than the image: cut it
                cut = 1
                while cut < len(word) and length(word[:cut + 1]) <= width:
                    cut += 1
                out.append(word[:cut])
                word = word[cut:]
            line = word
        out.append(line)
    return out


def wrap_title(title: str, width: int) -> str:
    """``title`` with each of its lines wrapped at word boundaries to at most ``width``
    characters (a longer single word stays whole); its own newlines are kept."""
    lines: List[str] = []
    for part in str(title).split("\n"):
        lines += textwrap.wrap(part, width=max(8, int(width)), break_long_words=False, break_on_hyphens=False) or [""]
    return "\n".join(lines)


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
    for labels in label_maps:
        _check_inputs(image, np.asarray(labels), class_names)
    # Panels are drawn at about twice their size on the figure, not at the photo's size.
    small, small_maps = _downscale(image, label_maps, max_side=int(2 * panel_width_inches * dpi))
    panels = [(small, "input")]
    chars = int(panel_width_inches * 72 / _TITLE_CHAR_PT)  # long spec descriptions wrap inside their panel
    for labels, title in zip(small_maps, panel_titles):
        panels.append((draw_overlay(small, labels, class_names, colors=colors, legend=False, text_scale=1.6),
                       wrap_title(title, chars)))
    n = len(panels)
    rows = math.ceil(n / max_cols)
    cols = math.ceil(n / rows)  # balanced rows: 6 panels -> 2 x 3, not 4 + 2
    h, w = image.shape[:2]
    pw = panel_width_inches
    ph = pw * h / w
    legend_rows = math.ceil(min(len(np.unique(np.concatenate([np.unique(m) for m in label_maps]))),
                                max_legend_entries + 1) / cols)
    head = 0.35 * (bool(banner) + bool(suptitle)) + 0.1
    title_lines = max(t.count("\n") + 1 for _, t in panels)
    title_h = max(0.5, 0.1 + 0.16 * title_lines)  # 9 pt lines, about 0.16 in each
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
        fig.text(0.5, y, banner, ha="center", va="top", fontsize=13, fontweight="bold", color=BANNER_COLOR)
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
    means: Optional[np.ndarray] = None,
    banner: Optional[str] = None,
    title: Optional[str] = None,
    max_classes: int = 12,
    panel_width_inches: float = 2.6,
    max_cols: int = 4,
    dpi: int = 100,
) -> np.ndarray:
    """Heat maps (0..1, one shared colour scale) of the classes with the largest mean
    probability; the figure says how many of how many classes it shows.

    Args:
        probs: ``(C, h, w)`` class probabilities (any resolution, e.g. a thumbnail).
        class_names: C display names.
        means: ``(C,)`` mean probability of each class over the full-size image (default:
            the means of ``probs``); they choose and order the panels.
        banner: red line above the panels.
        title: black line above the panels (e.g. the attention spec).
        max_classes: at most this many panels.

    Returns:
        ``(h, w, 3)`` uint8 RGB figure.
    """
    probs = np.asarray(probs, dtype=np.float32)
    if probs.ndim != 3 or probs.shape[0] != len(class_names):
        raise ValueError(f"probs must be (C, H, W) with C = {len(class_names)} classes, got {probs.shape}")
    means = probs.reshape(len(class_names), -1).mean(1) if means is None else np.asarray(means, dtype=np.float64)
    order = np.argsort(-means, kind="stable")[:max_classes]
    n = len(order)
    cols = min(n, max_cols)
    rows = math.ceil(n / cols)
    h, w = probs.shape[1:]
    pw, ph, title_h = panel_width_inches, panel_width_inches * h / w, 0.3
    lines = [t for t in (banner, title) if t] + [
        f"top {n} of {len(class_names)} classes by mean probability" if n < len(class_names)
        else f"all {n} classes"]
    head = 0.1 + 0.3 * len(lines)
    cbar_h = 0.8
    fig_h = head + rows * (ph + title_h) + cbar_h
    fig = Figure(figsize=(cols * pw, fig_h), dpi=dpi, facecolor="white")
    im = None
    for k, c in enumerate(order):
        r, col = divmod(k, cols)
        bottom = cbar_h + (rows - 1 - r) * (ph + title_h)
        ax = fig.add_axes([col / cols, bottom / fig_h, 1.0 / cols * 0.98, ph / fig_h])
        im = ax.imshow(probs[c], vmin=0.0, vmax=1.0, cmap="viridis", interpolation="bilinear")
        ax.set_axis_off()
        ax.set_title(f"{class_names[c]} (mean {means[c]:.2f})", fontsize=8, family="sans-serif")
    cax = fig.add_axes([0.25, 0.45 / fig_h, 0.5, 0.12 / fig_h])
    cbar = fig.colorbar(im, cax=cax, orientation="horizontal")
    cbar.ax.tick_params(labelsize=7)
    cbar.set_label("class probability (softmax over synonyms, max per class)", fontsize=7)
    y = 1.0 - 0.05 / fig_h
    for text in lines:
        style = dict(fontsize=12, fontweight="bold", color=BANNER_COLOR) if text == banner else dict(fontsize=9)
        fig.text(0.5, y, text, ha="center", va="top", **style)
        y -= 0.3 / fig_h
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
