"""A fixed **grid x brightness partition** of an image in the label-map form of CorrCLIP's region
masks (:func:`.corrclip.write_region_mask` writes it): cells of ``cell`` pixels, each split into
its pixels darker / not darker than mid-grey (luma 128), grey pixels unsegmented (0).

A deterministic stand-in for smoke runs and agreement checks (``tools/write_region_masks.py``,
the CorrCLIP rows of ``tools/benchmark_methods.py``), **not** a mask generator: CorrCLIP's
numbers need SAM2 masks. numpy only.
"""
import numpy as np

__all__ = ["grid_brightness_partition"]


def grid_brightness_partition(rgb: np.ndarray, cell: int = 48, grey: int = 16) -> np.ndarray:
    """``(H, W, 3)`` uint8 RGB -> ``(H, W)`` int64 labels: ``1 + 2 * cell index + (luma >= 128)``
    (cells row-major), 0 where ``max - min`` channel ``< grey``."""
    if rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError(f"expected an (H, W, 3) RGB image, got shape {rgb.shape}")
    if cell < 1:
        raise ValueError(f"--cell must be >= 1, got {cell}")
    h, w = rgb.shape[:2]
    f = rgb.astype(np.float64)
    luma = 0.299 * f[..., 0] + 0.587 * f[..., 1] + 0.114 * f[..., 2]
    ys, xs = np.arange(h)[:, None] // cell, np.arange(w)[None, :] // cell
    cells = ys * ((w + cell - 1) // cell) + xs
    labels = 1 + 2 * cells + (luma >= 128)
    chroma = rgb.max(axis=2).astype(np.int64) - rgb.min(axis=2).astype(np.int64)
    labels[chroma < grey] = 0
    return labels.astype(np.int64)
