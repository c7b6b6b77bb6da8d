"""The app's pictures, drawn with numpy and PIL (no Gradio): the shown photo, one overlay per
method and the grid that tiles them, a method's class-probability panel (maps, names, means,
colour bar), and the PNG / JPEG files the page shows."""
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from PIL import Image, ImageDraw

from ..modeling.postprocess import ScoreMaps
from ..utils.overlays import BANNER_COLOR, class_colors, draw_overlay, font_path_for, load_font

__all__ = ["DISPLAY_SIDE", "downscale_photo", "method_overlay", "grid_columns", "tile_images", "probability_panel",
           "shared_legend", "banner_strip", "overlay_picture", "save_png", "save_jpeg"]

DISPLAY_SIDE = 1024  # long side of the photo, overlays and heat maps shown in the page
TOP_PROB_CLASSES = 8  # probability maps shown per method
PROB_THUMB_SIDE = 256  # long side of each probability map in the page
PROB_COLUMNS = 4  # probability maps per row of a method's panel
OVERLAY_COLUMNS = 2  # at most this many overlays in a row: each is then shown at least half the page wide
LEGEND_TEXT_FRACTION = 0.018  # the shared legend's text height, as a fraction of the overlay picture's width
LEGEND_MIN_TEXT = 14  # ... and at least this many pixels
LEGEND_MAX_ENTRIES = 24  # classes listed in the shared legend, largest first
TILE_GAP = 8  # white pixels between the tiles of the overlay and probability images
JPEG_QUALITY = 90  # the overlay and probability images are display pictures (lossless: the downloads)


def downscale_photo(image: np.ndarray, max_side: int = DISPLAY_SIDE) -> np.ndarray:
    """The photo as the page shows it: long side at most ``max_side`` (PIL BOX filter); a
    smaller photo is returned as it is."""
    h, w = image.shape[:2]
    if max(h, w) <= max_side:
        return image
    s = max_side / max(h, w)
    return np.asarray(Image.fromarray(image).resize((max(1, round(w * s)), max(1, round(h * s))), Image.BOX))


def _nearest(labels: np.ndarray, shape: Tuple[int, int]) -> np.ndarray:
    h, w = labels.shape
    if (h, w) == tuple(shape):
        return labels
    return labels[(np.arange(shape[0]) * h // shape[0])][:, (np.arange(shape[1]) * w // shape[1])]


def method_overlay(display: np.ndarray, labels: np.ndarray, names: Sequence[str], num_classes: int, *,
                   banner: Optional[str], title: str, legend: bool = True, text_scale: float = 1.0) -> np.ndarray:
    """One method's overlay on the shown photo ``display``: its label map (at the photo's size)
    sampled to the shown size, coloured by class (:func:`~sparseclip_d2.utils.overlays.class_colors`
    of ``num_classes``), with ``title`` and ``banner``, and its own legend unless ``legend`` is
    False (the app draws one :func:`shared_legend` under all overlays). ``text_scale``
    enlarges the text (the app: by the number of columns, so it is shown at one size)."""
    return draw_overlay(display, _nearest(labels, display.shape[:2]), names, colors=class_colors(num_classes),
                        banner=banner, title=title, legend=legend, text_scale=text_scale)


def shared_legend(names: Sequence[str], num_classes: int, label_maps: Sequence[np.ndarray], width: int,
                  max_entries: int = LEGEND_MAX_ENTRIES) -> np.ndarray:
    """One legend for every overlay (the methods share the class colours): a ``width``-wide
    ``(h, width, 3)`` uint8 strip with a swatch and the name of each class that some method
    predicts, largest first (by its largest area over the methods), wrapped into rows. Its
    text is :data:`LEGEND_TEXT_FRACTION` of ``width`` high (at least :data:`LEGEND_MIN_TEXT`
    px), so that it reads at one size however many overlays the picture holds. At most
    ``max_entries`` classes are listed, then ``+k more`` (300 predicted classes would fill a page)."""
    colors = class_colors(num_classes)
    share = np.zeros(num_classes, dtype=np.float64)
    for labels in label_maps:
        counts = np.bincount(np.asarray(labels).ravel().astype(np.int64), minlength=num_classes)[:num_classes]
        share = np.maximum(share, counts / max(int(np.asarray(labels).size), 1))
    shown = [int(c) for c in np.argsort(-share, kind="stable") if share[c] > 0]
    size = max(LEGEND_MIN_TEXT, int(round(LEGEND_TEXT_FRACTION * width)))
    font = load_font(size, path=font_path_for(" ".join(str(names[c]) for c in shown)))
    pad, swatch = size // 2, size
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    entries = [(c, f"{names[c]} {100 * share[c]:.0f}%" if share[c] >= 0.005 else f"{names[c]} <1%")
               for c in shown[:max_entries]]
    if len(shown) > max_entries:
        entries.append((None, f"+{len(shown) - max_entries} more (the downloads hold every class)"))
    rows, row, x = [], [], pad
    for c, text in entries:
        w = swatch + pad // 2 + int(probe.textlength(text, font=font)) + 2 * pad
        if row and x + w > width:
            rows.append(row)
            row, x = [], pad
        row.append((c, text, x))
        x += w
    if row:
        rows.append(row)
    line = size + pad
    canvas = Image.new("RGB", (width, pad + max(1, len(rows)) * line), "white")
    draw = ImageDraw.Draw(canvas)
    for r, items in enumerate(rows):
        y = pad // 2 + r * line
        for c, text, x0 in items:
            if c is not None:
                draw.rectangle((x0, y + 2, x0 + swatch, y + 2 + swatch), fill=tuple(int(v) for v in colors[c]),
                               outline="black")
            draw.text((x0 + swatch + pad // 2, y), _fit(draw, text, font, width - x0 - swatch - pad), font=font,
                      fill="black")
    return np.asarray(canvas)


def overlay_picture(display: np.ndarray, results: Sequence[Tuple[str, np.ndarray]], names: Sequence[str],
                    num_classes: int, *, banner: Optional[str]) -> Tuple[np.ndarray, int]:
    """The app's overlay picture: ``banner`` once on top (:func:`banner_strip`), one overlay per
    ``(title, labels)`` of ``results`` in a grid of at most :data:`OVERLAY_COLUMNS` columns,
    their text enlarged by the number of columns (each is shown that much smaller), and one
    :func:`shared_legend` under them. Returns ``(picture, columns)``."""
    columns = grid_columns(len(results))
    tiles = [method_overlay(display, labels, names, num_classes, banner=None, title=title, legend=False,
                            text_scale=float(columns)) for title, labels in results]
    grid = tile_images(tiles, columns)
    legend = shared_legend(names, num_classes, [labels for _, labels in results], grid.shape[1])
    parts = ([banner_strip(banner, grid.shape[1])] if banner else []) + [grid, legend]
    return np.concatenate(parts, axis=0), columns


def banner_strip(text: str, width: int) -> np.ndarray:
    """``text`` (the random-weights banner) once across the overlay picture, white bold on the
    banner colour, the legend's text size: drawn on each overlay at twice the size it was cut
    at the overlay's edge."""
    size = max(LEGEND_MIN_TEXT, int(round(LEGEND_TEXT_FRACTION * width)))
    font = load_font(1.2 * size, bold=True, path=font_path_for(text, bold=True))
    pad = size // 3
    canvas = Image.new("RGB", (width, int(1.2 * size) + 3 * pad), BANNER_COLOR)
    draw = ImageDraw.Draw(canvas)
    text = _fit(draw, text, font, width - 2 * pad)
    x0, y0, x1, _ = draw.textbbox((0, 0), text, font=font)
    draw.text(((width - (x1 - x0)) / 2 - x0, pad - y0), text, font=font, fill="white")
    return np.asarray(canvas)


def save_png(array: np.ndarray, path: str) -> str:
    """Write an image for the page (fast zlib level: the page, not the archive, reads it)."""
    Image.fromarray(np.ascontiguousarray(array)).save(path, format="PNG", compress_level=1)
    return path


def save_jpeg(array: np.ndarray, path: str) -> str:
    """Write a display picture as JPEG (quality :data:`JPEG_QUALITY`, no chroma subsampling,
    so coloured text and segment edges stay sharp): about a tenth of the PNG encoder's time
    on these pictures. The label maps and probabilities are downloaded losslessly."""
    Image.fromarray(np.ascontiguousarray(array)).save(path, format="JPEG", quality=JPEG_QUALITY, subsampling=0)
    return path


def grid_columns(count: int, max_columns: int = OVERLAY_COLUMNS) -> int:
    """Columns of a grid of ``count`` tiles with at most ``max_columns`` a row and rows as
    full as possible (4 tiles: 2 x 2, 5: 3 + 2, 7: 3 + 3 + 1)."""
    if count < 1 or max_columns < 1:
        raise ValueError(f"a grid needs at least one tile and one column, got {count} tiles, {max_columns} columns")
    rows = -(-count // max_columns)
    return -(-count // rows)


def tile_images(images: Sequence[np.ndarray], columns: int, gap: int = TILE_GAP) -> np.ndarray:
    """The ``(h, w, 3)`` uint8 images in one picture, row-major, ``columns`` a row, ``gap``
    white pixels between tiles (none around them). A tile is placed at the top left of its
    cell; cells are as wide as the widest image of their column and as high as the highest
    of their row; the rest is white."""
    if not images:
        raise ValueError("no images to tile")
    if columns < 1 or gap < 0:
        raise ValueError(f"columns must be >= 1 and gap >= 0, got columns={columns}, gap={gap}")
    for i, im in enumerate(images):
        if im.ndim != 3 or im.shape[2] != 3 or im.dtype != np.uint8:
            raise ValueError(f"tile {i} must be (h, w, 3) uint8, got {im.shape} {im.dtype}")
    rows = -(-len(images) // columns)
    widths = [max(im.shape[1] for im in images[c::columns]) for c in range(min(columns, len(images)))]
    heights = [max(im.shape[0] for im in images[r * columns:(r + 1) * columns]) for r in range(rows)]
    x0s = np.concatenate([[0], np.cumsum(np.array(widths) + gap)])
    y0s = np.concatenate([[0], np.cumsum(np.array(heights) + gap)])
    canvas = np.full((int(y0s[-1]) - gap, int(x0s[-1]) - gap, 3), 255, dtype=np.uint8)
    for i, im in enumerate(images):
        r, c = divmod(i, columns)
        canvas[y0s[r]:y0s[r] + im.shape[0], x0s[c]:x0s[c] + im.shape[1]] = im
    return canvas


_VIRIDIS: List[np.ndarray] = []


def _colormap(values: np.ndarray, vmax: float = 1.0) -> np.ndarray:
    """``values / vmax`` in viridis (256 levels, level ``floor(255 v / vmax + 0.5)`` clipped to
    0..255), ``(..., 3)`` uint8. The 256 colours are matplotlib's table, read once."""
    if not _VIRIDIS:
        import matplotlib

        _VIRIDIS.append((matplotlib.colormaps["viridis"](np.linspace(0, 1, 256))[:, :3] * 255).astype(np.uint8))
    idx = np.clip(np.asarray(values, dtype=np.float32) * np.float32(255.0 / vmax) + np.float32(0.5), 0, 255)
    return _VIRIDIS[0][idx.astype(np.uint8)]


def _fit(draw: ImageDraw.ImageDraw, text: str, font, width: float) -> str:
    """``text``, cut with an ellipsis to at most ``width`` px in ``font``."""
    if draw.textlength(text, font=font) <= width:
        return text
    while text and draw.textlength(text + "...", font=font) > width:
        text = text[:-1]
    return text + "..."


def _class_probabilities(score_maps: ScoreMaps, side: int) -> np.ndarray:
    """``(C, h, w)`` class probabilities from ``score_maps``' logits resized to long side
    ``side`` (never above the photo's)."""
    C, H, W = score_maps.shape
    scale = min(1.0, side / max(H, W))
    th, tw = max(1, round(H * scale)), max(1, round(W * scale))
    small = ScoreMaps(score_maps.source, score_maps.class_index, score_maps.num_classes, out_size=(th, tw))
    return torch.cat([p for _, _, p, _ in small.bands()], dim=1).cpu().numpy()


def _draw_colour_bar(canvas: Image.Image, draw: ImageDraw.ImageDraw, font, y: int, gap: int, bar_h: int) -> None:
    """The 0-to-1 viridis bar at height ``y``, framed, with its ends and "probability" written."""
    bar_w = min(canvas.width - 2 * gap, 256)
    strip = np.repeat(_colormap(np.linspace(0.0, 1.0, bar_w))[None], bar_h, axis=0)
    canvas.paste(Image.fromarray(strip), (gap, y))
    draw.rectangle((gap - 1, y - 1, gap + bar_w, y + bar_h), outline="black")
    draw.text((gap, y + bar_h + 2), "0", font=font, fill="black")
    draw.text((gap + bar_w - draw.textlength("1", font=font), y + bar_h + 2), "1", font=font, fill="black")
    draw.text((gap + bar_w + gap, y), "probability", font=font, fill="black")


def probability_panel(score_maps: ScoreMaps, names: Sequence[str], title: str, *, banner: Optional[str] = None,
                      top: int = TOP_PROB_CLASSES, side: int = PROB_THUMB_SIDE, columns: int = PROB_COLUMNS
                      ) -> Dict:
    """One image with the probability maps of the ``top`` classes of highest mean probability.

    The maps are the class probabilities (max over synonyms of the softmax over synonyms,
    before the background rules, as :meth:`Prediction.probabilities
    <sparseclip_d2.predictor.Prediction.probabilities>`) computed from the same
    working-resolution logits at the map's size (long side ``side``, never above the
    photo's): the logits resized bilinearly to that size, not to the photo's. The means are
    over those pixels. Maps are drawn in viridis on the fixed scale 0 to 1 (colour bar at the
    bottom), ``columns`` per row, each under its class name and mean; ``title`` on top, and
    ``banner`` (random weights) on a red band above it.

    Returns:
        ``{"image": (h, w, 3) uint8, "shown": [(class index, mean probability)] in the order
        shown, "maps": (C, h', w') float32 probabilities of every class at the map's size}``.
    """
    probs = _class_probabilities(score_maps, side)  # (C, th, tw)
    C, th, tw = probs.shape
    means = probs.reshape(C, -1).astype(np.float64).mean(1)
    shown = [(int(c), float(means[c])) for c in np.argsort(-means, kind="stable")[:top]]
    cols = max(1, min(columns, len(shown)))
    rows = -(-len(shown) // cols)
    gap = 6
    text_px = 13
    font_path = font_path_for(" ".join([title] + [names[c] for c, _ in shown]))
    font = load_font(text_px, path=font_path)
    line = text_px + 6
    width = cols * tw + (cols + 1) * gap
    band = line + 4 if banner else 0
    top_h = band + line + gap
    bar_h = 12
    height = top_h + rows * (line + th + gap) + bar_h + line + gap
    canvas = Image.new("RGB", (max(width, 200), height), "white")
    draw = ImageDraw.Draw(canvas)
    if banner:
        bold = load_font(text_px + 1, bold=True, path=font_path_for(banner, bold=True))
        draw.rectangle((0, 0, canvas.width, band - 1), fill=BANNER_COLOR)
        bw = draw.textlength(banner, font=bold)
        draw.text(((canvas.width - bw) / 2, 2), banner, font=bold, fill="white")
    draw.text((gap, band + 3), _fit(draw, title, font, canvas.width - 2 * gap), font=font, fill="black")
    for k, (c, mean) in enumerate(shown):
        r, q = divmod(k, cols)
        x0, y0 = gap + q * (tw + gap), top_h + r * (line + th + gap)
        suffix = f" (mean p {mean:.2f})"
        name = _fit(draw, str(names[c]), font, max(tw - draw.textlength(suffix, font=font), 0))
        draw.text((x0, y0 + 2), name + suffix, font=font, fill="black")
        canvas.paste(Image.fromarray(_colormap(probs[c])), (x0, y0 + line))
    _draw_colour_bar(canvas, draw, font, top_h + rows * (line + th + gap), gap, bar_h)
    return {"image": np.asarray(canvas), "shown": shown, "maps": probs}
