"""Semantic-segmentation ground truth: converted once, offline, then read as it is.

detectron2's ``SemSegEvaluator`` reads each ``sem_seg_file_name`` as it is on disk
(``np.array(Image.open(f), dtype=int)``) and treats ``ignore_label`` (255) as ignored, so a
dataset's files must already hold the class indices ``[0, num_classes)`` of its
``stuff_classes``. Datasets whose official files use another label map (MMSeg's
``reduce_zero_label``: 0 = "other" -> ignore, v -> v - 1; ADE20K, VOC20, Pascal Context 59)
are converted by ``tools/prepare_datasets.py`` with :func:`convert_sem_seg_gt`, as
detectron2's ``datasets/prepare_ade20k_sem_seg.py`` converts ADE20K into
``annotations_detectron2/``: uint8 PNGs (16-bit above 255 classes), 255 = ignore.

:func:`load_sem_seg_gt` reads (and, for conversion, maps) one file, refusing labels out of
range with the file named.
"""
import logging
import os
from typing import Optional

import numpy as np
from PIL import Image

from ..common.io import atomic_path

__all__ = ["IGNORE_LABEL", "MASK_MODES", "load_sem_seg_gt", "convert_sem_seg_gt", "is_up_to_date"]

logger = logging.getLogger(__name__)

IGNORE_LABEL = 255

#: PIL modes of a single-channel label PNG that ``SemSegEvaluator`` reads as class indices:
#: 8-bit gray ``L``, palette ``P`` (the palette index is the label, as in Pascal VOC) and
#: 16/32-bit integers.
MASK_MODES = ("L", "P", "I;16", "I;16L", "I;16B", "I;16N", "I")


def load_sem_seg_gt(path: str, *, num_classes: int, reduce_zero_label: bool = False,
                    ignore_label: int = IGNORE_LABEL) -> np.ndarray:
    """Read a label PNG as ``SemSegEvaluator`` does and check its labels; with
    ``reduce_zero_label`` (MMSeg), also map 0 -> ignore, v -> v - 1 (the offline conversion
    of ADE20K, VOC20, Context59).

    Returns:
        ``(H, W)`` int64 array of labels in ``[0, num_classes)`` or ``ignore_label``.
    Raises:
        ValueError: the file is not a single-channel label image (mode named), or holds a
            label outside ``[0, num_classes)`` other than ``ignore_label``, naming the file
            and the bad values.
    """
    with Image.open(path) as im:
        if im.mode not in MASK_MODES:
            raise ValueError(f"ground truth {path!r} has PIL mode {im.mode!r}; expected a single-channel label "
                             f"PNG (modes {', '.join(MASK_MODES)})")
        gt = np.asarray(im, dtype=np.int64).copy()
    if gt.ndim != 2:
        raise ValueError(f"ground truth {path!r} has shape {gt.shape}; expected a single-channel label PNG")
    if reduce_zero_label:
        ignore = (gt == ignore_label) | (gt == 0)
        gt = gt - 1
        gt[ignore] = ignore_label
    bad = (gt != ignore_label) & ((gt < 0) | (gt >= num_classes))
    if bad.any():
        raise ValueError(
            f"ground truth {path!r} holds labels {sorted(np.unique(gt[bad]).tolist())[:10]} outside "
            f"[0, {num_classes}) and != ignore {ignore_label} (after reduce_zero_label={reduce_zero_label})"
        )
    return gt


def is_up_to_date(src: str, dst: str) -> bool:
    """True when ``dst`` exists and is not older than ``src`` (make's rule)."""
    return os.path.isfile(dst) and os.stat(dst).st_mtime_ns >= os.stat(src).st_mtime_ns


def convert_sem_seg_gt(src: str, dst: str, *, num_classes: int, reduce_zero_label: bool,
                       ignore_label: int = IGNORE_LABEL, lut: Optional[np.ndarray] = None) -> None:
    """Write the evaluator-ready labels of ``src`` to ``dst`` (atomically: a killed conversion
    never leaves half a PNG): uint8 mode ``L`` (uint16 when ``num_classes > 255``), labels in
    ``[0, num_classes)``, ``ignore_label`` for ignored pixels.

    Args:
        lut: optional ``(256,)`` look-up table applied to the raw values first (Cityscapes
            label ids -> train ids, COCO-Stuff raw ids -> train ids); the result is then read
            like a raw file (``reduce_zero_label``, range check).
    Raises:
        ValueError: a label of ``src`` is out of range after the mapping (file named).
    """
    if lut is not None:
        with Image.open(src) as im:
            if im.mode not in ("L", "P"):
                raise ValueError(f"ground truth {src!r} has PIL mode {im.mode!r}; expected an 8-bit label PNG")
            raw = np.asarray(im)
        gt = lut[raw].astype(np.int64)
        if reduce_zero_label:
            ignore = (gt == ignore_label) | (gt == 0)
            gt = gt - 1
            gt[ignore] = ignore_label
        bad = (gt != ignore_label) & ((gt < 0) | (gt >= num_classes))
        if bad.any():
            raise ValueError(f"ground truth {src!r} maps to labels {sorted(np.unique(gt[bad]).tolist())[:10]} "
                             f"outside [0, {num_classes})")
    else:
        gt = load_sem_seg_gt(src, num_classes=num_classes, reduce_zero_label=reduce_zero_label,
                             ignore_label=ignore_label)
    dtype = np.uint8 if max(num_classes - 1, ignore_label) <= 255 else np.uint16
    with atomic_path(dst) as tmp:
        Image.fromarray(gt.astype(dtype)).save(tmp, format="PNG")
