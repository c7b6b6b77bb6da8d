"""The attention row of the patch under one pixel of a photo, read from an attention record.

An ``output["attention"]`` record (``docs/diagnostics.md``, ``modeling.attention_record``)
holds the last block's attention of every window the model saw. :func:`query_token` finds
the token under a pixel of the original photo; :func:`attention_at` returns that token's
row, its map over the resized image, and its support size, perplexity and same-class mass,
computed by :func:`~sparseclip_d2.evaluation.attention_stats.row_statistics` on a label
map (the app passes the predicted one: it has no ground truth).
"""
from typing import Dict, Tuple

import numpy as np

from ..evaluation.attention_stats import ROW_STAT_KEYS, resize_labels, row_statistics, window_patch_labels
from ..dense.windows import symmetric_pad

__all__ = ["query_token", "attention_at"]


def query_token(record: Dict, x: float, y: float, size: Tuple[int, int]) -> Dict:
    """Where pixel ``(x, y)`` of the ORIGINAL photo (``size = (H, W)``) lies in an attention
    record (``docs/diagnostics.md``).

    The pixel is mapped to the resized image the model saw (``record["image_size"]``) by its
    centre, ``floor((x + 0.5) * W' / W)``; among the windows holding it the one whose centre
    is nearest is taken (whole-image inference: the only one); inside it, the padding of
    ``symmetric_pad`` is added and the patch is ``(row, col) = (y // p, x // p)``.

    Returns:
        ``{"window", "token" (prefix tokens counted), "patch": (row, col), "grid": (h, w),
        "resized_xy": (x', y')}``.
    Raises:
        ValueError: the point lies outside the photo.
    """
    H, W = int(size[0]), int(size[1])
    if not (0 <= x < W and 0 <= y < H):
        raise ValueError(f"the point (x={x:g}, y={y:g}) lies outside the {W}x{H} photo")
    Hr, Wr = (int(v) for v in record["image_size"])
    xr = min(int(np.floor((float(x) + 0.5) * Wr / W)), Wr - 1)
    yr = min(int(np.floor((float(y) + 0.5) * Hr / H)), Hr - 1)
    boxes = record.get("boxes") or [(0, Hr, 0, Wr)]
    p = int(record["patch_size"])
    best = None
    for i, (y1, y2, x1, x2) in enumerate(boxes):
        if y1 <= yr < y2 and x1 <= xr < x2:
            d = ((y1 + y2) / 2 - yr) ** 2 + ((x1 + x2) / 2 - xr) ** 2
            if best is None or d < best[0]:
                best = (d, i)
    if best is None:  # pragma: no cover - the windows tile the image
        raise ValueError(f"no attention window holds the point ({xr}, {yr}) of the {Wr}x{Hr} resized image")
    i = best[1]
    y1, y2, x1, x2 = boxes[i]
    left, _, top, _ = symmetric_pad(y2 - y1, x2 - x1, p)
    gh, gw = (int(v) for v in record["grids"][i])
    row, col = (yr - y1 + top) // p, (xr - x1 + left) // p
    T = int(record.get("num_prefix_tokens", 1))
    return {"window": i, "token": T + row * gw + col, "patch": (row, col), "grid": (gh, gw), "resized_xy": (xr, yr)}


def attention_at(record: Dict, labels: np.ndarray, x: float, y: float) -> Dict:
    """The attention row of the patch under pixel ``(x, y)`` of the original photo, with its
    statistics (:func:`~sparseclip_d2.evaluation.attention_stats.row_statistics` on
    ``labels``: "same class" = the patches labelled as the query's class).

    Args:
        record: a Prediction's attention record.
        labels: ``(H, W)`` labels at the photo's size (the app: the predicted label map).

    Returns:
        ``{"row": (heads, L) float32 raw row, "map": (H', W') float64 head mean of the row
        divided by its sum over the resized image (0 outside the window), "support",
        "perplexity", "same_class_mass" (means over heads), "num_tokens", "query": query_token}``.
    """
    H, W = labels.shape
    q = query_token(record, x, y, (H, W))
    i = q["window"]
    weights = record["weights"][i]
    if weights.dim() == 4:
        weights = weights[0]
    T = int(record.get("num_prefix_tokens", 1))
    p = int(record["patch_size"])
    gh, gw = q["grid"]
    Hr, Wr = (int(v) for v in record["image_size"])
    box = tuple((record.get("boxes") or [(0, Hr, 0, Wr)])[i])
    num_classes = int(labels.max()) + 1
    pad_label = max(num_classes, 256)  # padding patches: neither a class nor the query's
    resized = resize_labels(labels, tuple(record["image_size"]))
    plab = window_patch_labels(resized, box, (gh, gw), p, ignore_label=pad_label).reshape(-1)
    k = q["token"] - T
    if plab[k] == pad_label:  # a border patch mostly made of padding: it takes the clicked pixel's class
        plab[k] = int(labels[int(y), int(x)])
    fg = np.nonzero(plab != pad_label)[0]
    stats = row_statistics(weights, plab, ignore_label=pad_label, num_prefix_tokens=T)
    stats = stats.reshape(weights.shape[0], len(fg), -1)[:, int(np.searchsorted(fg, k))]  # (heads, 8)
    mean = dict(zip(ROW_STAT_KEYS, stats.mean(0).tolist()))
    row = weights[:, q["token"], :].float()
    return {"row": row.cpu().numpy(), "map": _row_map(row, q, box, T, p, (Hr, Wr)), "support": mean["support_size"],
            "perplexity": mean["perplexity"], "same_class_mass": mean["same_class_mass"],
            "num_tokens": int(weights.shape[-1]), "query": q}


def _row_map(row, q: Dict, box: Tuple[int, int, int, int], T: int, p: int, image_size: Tuple[int, int]) -> np.ndarray:
    """``(H', W')`` float64 map of a ``(heads, L)`` row: divided by its sum, the mean over heads
    of its patch tokens, each patch's value on its ``p x p`` pixels of the window (padding
    cropped), 0 outside the window."""
    gh, gw = q["grid"]
    r = row.double() / row.double().sum(-1, keepdim=True)
    grid_map = r[:, T:].mean(0).reshape(gh, gw).cpu().numpy()
    y1, y2, x1, x2 = box
    left, _, top, _ = symmetric_pad(y2 - y1, x2 - x1, p)
    full = np.kron(grid_map, np.ones((p, p)))[top:top + (y2 - y1), left:left + (x2 - x1)]
    canvas = np.zeros(image_size, dtype=np.float64)
    canvas[y1:y2, x1:x2] = full
    return canvas
