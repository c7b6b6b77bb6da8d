"""Metrics of semantic segmentation beside detectron2's (mIoU, fwIoU, mACC, pACC): the share of
classes with zero IoU and the boundary IoU, accumulated over a dataset from label maps.

- **Share of classes with zero IoU** (vocabulary robustness, reported by the 2026 benchmark of
  training-free methods, Ricardo-ChenTY/TF-OVOS): among the classes present in the ground truth
  of the evaluated images (at least one non-ignored pixel), the percentage whose dataset-level
  IoU is 0 (no pixel of the class predicted as the class). Classes absent from the ground truth
  are left out, as they are from detectron2's mIoU.
- **Boundary IoU** (Cheng, Girshick, Dollar, Berg, Kirillov, "Boundary IoU: Improving
  Object-Centric Image Segmentation Evaluation", CVPR 2021, eq. 2): for class ``c`` with
  ground-truth mask ``G`` and predicted mask ``P``, ``|(G_d & G) & (P_d & P)| / |(G_d & G) | (P_d
  & P)|``, where ``X_d & X`` are the pixels of ``X`` within distance ``d`` of its contour. As in
  bowenc0221/boundary-iou-api @ 37d2558 ``boundary_iou/utils/boundary_utils.py``
  ``mask_to_boundary``: the mask minus its erosion by a 3x3 square applied ``d`` times (a
  ``(2d+1)`` square, Chebyshev distance), the image border counting as a contour (the mask is
  padded with 0), and ``d = max(1, round(dilation_ratio * sqrt(H^2 + W^2)))`` per image
  (``dilation_ratio`` default 0.02 there). Intersections and unions are summed over the dataset
  per class (as detectron2 sums its confusion matrix) and averaged over the classes present in
  the ground truth, like mIoU. Pixels whose ground truth is ignored count in neither mask (as
  they count in no cell of detectron2's IoU); the ignore region is still "not ``c``" for the
  contour of ``G``.

Every class's inner boundary band is computed at once from the label map: a pixel lies in the
band of its own class exactly when its ``(2d+1)`` window reaches another label or the outside,
i.e. when the window's minimum and maximum label differ (with the outside as a value no label
takes): OpenCV's grey erosion and dilation of the label map (float32, exact below 2**24). Memory
is a few ``(H, W)`` arrays whatever the number of classes.
"""
import math
from typing import Dict

import numpy as np

__all__ = ["dilation_width", "boundary_band", "SemSegExtraMetrics"]

#: boundary-iou-api @ 37d2558 boundary_iou/utils/boundary_utils.py ``mask_to_boundary(mask,
#: dilation_ratio=0.02)``.
DEFAULT_DILATION_RATIO = 0.02


def dilation_width(height: int, width: int, dilation_ratio: float = DEFAULT_DILATION_RATIO,
                   pixels: int = 0) -> int:
    """The boundary width ``d`` in pixels: ``pixels`` when > 0, else
    ``max(1, round(dilation_ratio * sqrt(height^2 + width^2)))`` (``int(round(...))`` as
    boundary-iou-api does, i.e. Python's round)."""
    if pixels and int(pixels) > 0:
        return int(pixels)
    d = int(round(float(dilation_ratio) * math.sqrt(height ** 2 + width ** 2)))
    return max(1, d)


def boundary_band(labels: np.ndarray, d: int) -> np.ndarray:
    """``(H, W)`` bool: the pixels within Chebyshev distance ``d`` of the contour of their own
    label's region (another label, or the image border, inside their ``(2d+1)`` window): the union
    over labels ``c`` of boundary-iou-api's ``mask_to_boundary(labels == c)``."""
    import cv2

    if d < 1:
        raise ValueError(f"the boundary width must be >= 1 pixel, got {d}")
    lab = np.asarray(labels)
    if lab.size and (lab.min() < 0 or lab.max() >= 1 << 24):
        raise ValueError(f"labels must lie in [0, 2**24) to be exact in float32, got {lab.min()}..{lab.max()}")
    x = lab.astype(np.float32)
    kernel = np.ones((2 * int(d) + 1, 2 * int(d) + 1), dtype=np.uint8)  # the (2d+1) square: d 3x3 erosions
    # the outside is a value no label takes: below every label for the minimum, above for the maximum
    low = cv2.erode(x, kernel, borderType=cv2.BORDER_CONSTANT, borderValue=-1.0)
    high = cv2.dilate(x, kernel, borderType=cv2.BORDER_CONSTANT, borderValue=float(1 << 25))
    return low != high


class SemSegExtraMetrics:
    """Per-class pixel counts over a dataset, for the share of classes with zero IoU and the
    boundary IoU (module docstring).

    Args:
        num_classes: C; labels ``[0, C)`` are classes.
        ignore_label: the ground truth's ignore value.
        boundary: compute the boundary IoU.
        dilation_ratio, dilation_pixels: the boundary width (:func:`dilation_width`).
    """

    def __init__(self, num_classes: int, ignore_label: int, *, boundary: bool = True,
                 dilation_ratio: float = DEFAULT_DILATION_RATIO, dilation_pixels: int = 0):
        self.num_classes = int(num_classes)
        self.ignore_label = int(ignore_label)
        self.boundary = bool(boundary)
        self.dilation_ratio = float(dilation_ratio)
        self.dilation_pixels = int(dilation_pixels)
        self.reset()

    def reset(self) -> None:
        c = self.num_classes
        # rows: intersection, ground truth, prediction; [0] pixels, [1] boundary bands
        self.counts = np.zeros((2, 3, c), dtype=np.int64)
        self.widths = []

    def _bincount(self, x: np.ndarray) -> np.ndarray:
        return np.bincount(x, minlength=self.num_classes)[: self.num_classes]

    def update(self, pred: np.ndarray, gt: np.ndarray) -> None:
        """Add one image: ``pred`` and ``gt`` ``(H, W)`` integer label maps of the same size
        (``gt`` may hold ``ignore_label``)."""
        pred = np.asarray(pred)
        gt = np.asarray(gt)
        if pred.shape != gt.shape or pred.ndim != 2:
            raise ValueError(f"prediction {pred.shape} and ground truth {gt.shape} must be (H, W) maps of one size")
        valid = gt != self.ignore_label
        if pred.size and (pred.min() < 0 or pred.max() >= self.num_classes):
            raise ValueError(f"predicted labels must lie in [0, {self.num_classes}), got "
                             f"{int(pred.min())}..{int(pred.max())}")
        p, g = pred[valid].astype(np.int64), gt[valid].astype(np.int64)
        hit = p == g
        self.counts[0] += np.stack([self._bincount(g[hit]), self._bincount(g), self._bincount(p)])
        if not self.boundary:
            return
        d = dilation_width(*gt.shape, self.dilation_ratio, self.dilation_pixels)
        self.widths.append(d)
        bp = boundary_band(pred, d)[valid]
        bg = boundary_band(gt, d)[valid]
        both = bp & bg & hit
        self.counts[1] += np.stack([self._bincount(g[both]), self._bincount(g[bg]), self._bincount(p[bp])])

    @staticmethod
    def _iou(counts: np.ndarray) -> np.ndarray:
        inter, gt, pred = (counts[i].astype(np.float64) for i in range(3))
        union = gt + pred - inter
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(union > 0, inter / np.maximum(union, 1), np.nan)

    def results(self, class_names=None) -> Dict[str, object]:
        """``{"zero_IoU_share", "zero_IoU_classes", "classes_present"}`` and, with the boundary,
        ``"boundary_IoU"`` (mean over the classes present in the ground truth), the widths used
        and, with ``class_names``, ``"BoundaryIoU-<name>"`` per class (NaN where absent).
        Percentages, as detectron2's metrics; NaN when no class is present."""
        present = self.counts[0, 1] > 0
        n_present = int(present.sum())
        zero = present & (self.counts[0, 0] == 0)
        out: Dict[str, object] = {
            "zero_IoU_share": 100.0 * int(zero.sum()) / n_present if n_present else float("nan"),
            "zero_IoU_classes": int(zero.sum()),
            "classes_present": n_present,
        }
        if self.boundary:
            biou = self._iou(self.counts[1])
            biou[~present] = np.nan
            out["boundary_IoU"] = 100.0 * float(np.nanmean(biou[present])) if n_present else float("nan")
            out["boundary_dilation_ratio"] = self.dilation_ratio
            out["boundary_dilation_pixels"] = self.dilation_pixels
            if self.widths:
                out["boundary_width_min"] = int(min(self.widths))
                out["boundary_width_max"] = int(max(self.widths))
            if class_names is not None:
                for i, name in enumerate(class_names):
                    out[f"BoundaryIoU-{name}"] = 100.0 * float(biou[i])
        return out

    def state(self) -> Dict[str, object]:
        """The counts as plain data (for ``all_gather``; :meth:`merge_state` adds them)."""
        return {"counts": self.counts, "widths": list(self.widths)}

    def merge_state(self, state: Dict[str, object]) -> None:
        """Add the counts of another accumulator's :meth:`state` (another process's images)."""
        self.counts += np.asarray(state["counts"], dtype=np.int64)
        self.widths += list(state["widths"])
