"""CLIPtrase's centre-crop evaluation protocol (``INPUT.CENTER_CROP_TEST``), usable with any method.

Image and ground truth are resized so that their short side is ``n`` (the long side
``int(n * long / short)``), then centre-cropped to ``n x n`` (offsets ``round((side - n) / 2)``);
the prediction is made on the crop and evaluated against the cropped ground truth, so pixels
outside the crop are not scored. Images: PIL bicubic; ground truth: PIL nearest.

leaves162/CLIPtrase @ 2b7de61 ``clip_self_correlation.py``: ``_transform1`` (``Resize(n_px,
interpolation=BICUBIC)``, ``CenterCrop(n_px)``) and ``gt_transform`` (``Resize(n_px,
interpolation=NEAREST)``, ``CenterCrop(n_px)``); the sizes and offsets are torchvision's
(``transforms/functional.py`` ``_compute_resized_output_size`` and ``center_crop``).
"""
from typing import Tuple

import numpy as np
from PIL import Image

from detectron2.data import transforms as T

__all__ = ["center_crop_geometry", "CenterCropTransform", "CenterCropResize", "center_crop_labels"]


def center_crop_geometry(height: int, width: int, size: int) -> Tuple[Tuple[int, int], Tuple[int, int]]:
    """``((resized_h, resized_w), (top, left))`` of the short-side-``size`` resize and the
    ``size x size`` centre crop of a ``height x width`` image."""
    if height <= 0 or width <= 0:
        raise ValueError(f"image size must be positive, got {height}x{width}")
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise ValueError(f"INPUT.CENTER_CROP_TEST = {size!r} is invalid; valid: 0 (off) or an integer > 0")
    if width <= height:
        new_w, new_h = size, int(size * height / width)
    else:
        new_h, new_w = size, int(size * width / height)
    top = int(round((new_h - size) / 2.0))
    left = int(round((new_w - size) / 2.0))
    return (new_h, new_w), (top, left)


def _resize_crop(array: np.ndarray, size: int, resample) -> np.ndarray:
    h, w = array.shape[:2]
    (new_h, new_w), (top, left) = center_crop_geometry(h, w, size)
    im = Image.fromarray(array)
    if (new_h, new_w) != (h, w):
        im = im.resize((new_w, new_h), resample)
    out = np.asarray(im)[top:top + size, left:left + size]
    return np.ascontiguousarray(out)


class CenterCropTransform(T.Transform):
    """Short side to ``size`` then the centre ``size x size`` crop (bicubic image, nearest labels)."""

    def __init__(self, h: int, w: int, size: int):
        super().__init__()
        self._set_attributes(locals())

    def apply_image(self, img: np.ndarray) -> np.ndarray:
        if img.shape[:2] != (self.h, self.w):
            raise ValueError(f"CenterCropTransform expects a {self.h}x{self.w} image, got {img.shape[:2]}")
        if img.dtype != np.uint8:
            raise ValueError(f"CenterCropTransform resizes uint8 images (PIL bicubic), got {img.dtype}")
        return _resize_crop(img, self.size, Image.BICUBIC)

    def apply_segmentation(self, segmentation: np.ndarray) -> np.ndarray:
        return center_crop_labels(segmentation, self.size)

    def apply_coords(self, coords: np.ndarray) -> np.ndarray:
        (new_h, new_w), (top, left) = center_crop_geometry(self.h, self.w, self.size)
        coords = coords.astype(np.float64, copy=True)
        coords[:, 0] = coords[:, 0] * new_w / self.w - left
        coords[:, 1] = coords[:, 1] * new_h / self.h - top
        return coords


class CenterCropResize(T.Augmentation):
    """The augmentation giving :class:`CenterCropTransform` for each image."""

    def __init__(self, size: int):
        super().__init__()
        center_crop_geometry(1, 1, size)  # validates size
        self._init(dict(size=int(size)))

    def get_transform(self, image: np.ndarray) -> T.Transform:
        h, w = image.shape[:2]
        return CenterCropTransform(h, w, self.size)


def center_crop_labels(labels: np.ndarray, size: int) -> np.ndarray:
    """A ``(H, W)`` integer label map resized (nearest) and centre-cropped to ``size x size``,
    dtype kept (values up to 65535; int64 maps are resized through int32)."""
    labels = np.asarray(labels)
    if labels.ndim != 2:
        raise ValueError(f"a label map must be (H, W), got shape {labels.shape}")
    dtype = labels.dtype
    work = labels
    if dtype not in (np.uint8, np.int32):
        if labels.size and (labels.min() < np.iinfo(np.int32).min or labels.max() > np.iinfo(np.int32).max):
            raise ValueError("label values do not fit int32")
        work = labels.astype(np.int32)
    return _resize_crop(work, size, Image.NEAREST).astype(dtype, copy=False)
