"""Test-time mapper of the segmentation datasets: read, resize, keep the output size.

Also the two input conventions the baselines differ in (``INPUT.RESIZE_MODE``,
``MODEL.SPARSECLIP.PIXEL_NORM``): :func:`build_resize`, :class:`MMSegRescale`,
:func:`mmseg_rescale_size` and :func:`pixel_normalization`.
"""
import copy
import logging
from typing import Dict, List, Sequence, Tuple

import cv2
import numpy as np
import torch
from PIL import Image

from detectron2.config import configurable
from detectron2.data import detection_utils as utils
from detectron2.data import transforms as T
from fvcore.common.registry import Registry

from .image_io import BadInputFile, check_input_format, convert_channel_order, read_image_rgb

__all__ = ["SparseCLIPTestMapper", "test_augmentations", "output_frame", "MMSegRescale", "CV2ResizeTransform", "mmseg_rescale_size", "build_resize",
           "RESIZE_REGISTRY", "RESIZE_MODES", "PIXEL_NORMS", "pixel_normalization"]

logger = logging.getLogger(__name__)

RESIZE_REGISTRY = Registry("SPARSECLIP_RESIZE")
RESIZE_REGISTRY.__doc__ = """
Test-time resizes keyed by ``INPUT.RESIZE_MODE`` (the function's name):
``fn(short, long) -> List[detectron2 Augmentation]`` for ``short > 0``.
"""

#: ``MODEL.SPARSECLIP.PIXEL_NORM`` values with their (mean, std) in 0-255 RGB; ``clip`` takes
#: the CLIP model's own constants instead (``None`` here).
PIXEL_NORMS = {
    "clip": None,
    # SCLIP / ClearCLIP / NACLIP SegDataPreProcessor (wangf3014/SCLIP clip_segmentor.py,
    # mc-lan/ClearCLIP clearclip_segmentor.py, sinahmr/NACLIP naclip.py).
    "clip_mmseg": ((122.771, 116.746, 104.094), (68.501, 66.632, 70.323)),
    # MaskCLIP img_norm_cfg (chongzhou96/MaskCLIP configs/_base_/datasets/*.py).
    "imagenet": ((123.675, 116.28, 103.53), (58.395, 57.12, 57.375)),
}


def pixel_normalization(name: str, clip_mean: Sequence[float], clip_std: Sequence[float]
                        ) -> Tuple[List[float], List[float]]:
    """``(mean, std)`` in 0-255 RGB for ``MODEL.SPARSECLIP.PIXEL_NORM`` ``name``; ``clip_mean`` /
    ``clip_std`` (0-1 scale, the CLIP model's) are used for ``clip``."""
    if name not in PIXEL_NORMS:
        raise ValueError(f"unknown MODEL.SPARSECLIP.PIXEL_NORM {name!r}; valid: {', '.join(PIXEL_NORMS)}")
    if PIXEL_NORMS[name] is None:
        return [255.0 * float(m) for m in clip_mean], [255.0 * float(s) for s in clip_std]
    mean, std = PIXEL_NORMS[name]
    return list(mean), list(std)


def mmseg_rescale_size(height: int, width: int, short: int, long: int) -> Tuple[int, int]:
    """Output ``(height, width)`` of MMSeg's ``Resize(scale=(long, short), keep_ratio=True)``,
    i.e. ``mmcv.imrescale``: ``scale = min(max(long, short) / max(h, w), min(long, short) /
    min(h, w))``, each side becomes ``int(side * scale + 0.5)`` (Python floats)."""
    if height <= 0 or width <= 0:
        raise ValueError(f"image size must be positive, got {height}x{width}")
    if short <= 0 or long <= 0:
        raise ValueError(f"resize sizes must be positive, got short={short}, long={long}")
    max_long, max_short = max(long, short), min(long, short)
    scale = min(max_long / max(height, width), max_short / min(height, width))
    return int(height * float(scale) + 0.5), int(width * float(scale) + 0.5)


class CV2ResizeTransform(T.Transform):
    """Resize ``(h, w) -> (new_h, new_w)`` with ``cv2.resize``: ``INTER_LINEAR`` (no
    antialiasing) for images, ``INTER_NEAREST`` for segmentation maps."""

    def __init__(self, h: int, w: int, new_h: int, new_w: int):
        super().__init__()
        self._set_attributes(locals())

    def apply_image(self, img: np.ndarray) -> np.ndarray:
        if img.shape[:2] != (self.h, self.w):
            raise ValueError(f"CV2ResizeTransform expects a {self.h}x{self.w} image, got {img.shape[:2]}")
        out = cv2.resize(img, (self.new_w, self.new_h), interpolation=cv2.INTER_LINEAR)
        return out.reshape(self.new_h, self.new_w, *img.shape[2:])

    def apply_segmentation(self, segmentation: np.ndarray) -> np.ndarray:
        return cv2.resize(segmentation, (self.new_w, self.new_h), interpolation=cv2.INTER_NEAREST)

    def apply_coords(self, coords: np.ndarray) -> np.ndarray:
        coords = coords.astype(np.float64, copy=True)
        coords[:, 0] *= self.new_w / self.w
        coords[:, 1] *= self.new_h / self.h
        return coords


class MMSegRescale(T.Augmentation):
    """MMSeg's test-time ``Resize(scale=(long, short), keep_ratio=True)`` (``mmcv.imrescale``
    with the cv2 backend): size by :func:`mmseg_rescale_size`, pixels by ``cv2.resize``
    ``INTER_LINEAR``. Unlike detectron2's ``ResizeShortestEdge`` (PIL bilinear, antialiased
    when shrinking) it does not antialias."""

    def __init__(self, short: int, long: int):
        super().__init__()
        if int(short) <= 0 or int(long) <= 0:
            raise ValueError(f"MMSegRescale needs positive sizes, got short={short}, long={long}")
        self._init(dict(short=int(short), long=int(long)))

    def get_transform(self, image: np.ndarray) -> T.Transform:
        h, w = image.shape[:2]
        new_h, new_w = mmseg_rescale_size(h, w, self.short, self.long)
        return CV2ResizeTransform(h, w, new_h, new_w)


@RESIZE_REGISTRY.register()
def detectron2(short: int, long: int) -> List[T.Augmentation]:
    """detectron2's ``ResizeShortestEdge``: short side ``short``, long side capped at ``long``."""
    return [T.ResizeShortestEdge(short, long, "choice")]


@RESIZE_REGISTRY.register()
def mmseg(short: int, long: int) -> List[T.Augmentation]:
    """MMSeg's ``Resize(scale=(long, short), keep_ratio=True)``: :class:`MMSegRescale`."""
    return [MMSegRescale(short, long)]


#: ``INPUT.RESIZE_MODE`` values, in registration order.
RESIZE_MODES = tuple(name for name, _ in RESIZE_REGISTRY)


def build_resize(mode: str, short: int, long: int) -> List[T.Augmentation]:
    """The test-time resize of ``INPUT.RESIZE_MODE`` ``mode`` (``[]`` when ``short <= 0``)."""
    if not isinstance(mode, str) or mode not in RESIZE_REGISTRY:
        raise ValueError(f"unknown INPUT.RESIZE_MODE {mode!r}; valid: {', '.join(RESIZE_MODES)}")
    if short <= 0:
        return []
    return RESIZE_REGISTRY.get(mode)(short, long)


def test_augmentations(cfg) -> List[T.Augmentation]:
    """The test-time geometry of ``cfg`` for every entry point (mapper, Predictor, demo, app):
    ``INPUT.CENTER_CROP_TEST`` (CLIPtrase's protocol, ``data/center_crop.py``) replaces the resize;
    else :func:`build_resize` of ``INPUT.RESIZE_MODE``."""
    crop = int(cfg.INPUT.get("CENTER_CROP_TEST", 0))
    if crop:
        from .center_crop import CenterCropResize

        return [CenterCropResize(crop)]
    return build_resize(cfg.INPUT.RESIZE_MODE, cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MAX_SIZE_TEST)


def output_frame(cfg, image: np.ndarray) -> np.ndarray:
    """The ``(H, W, 3)`` image the prediction is made for (its size is the output size): the centre
    crop at ``INPUT.CENTER_CROP_TEST`` px, else ``image`` itself."""
    crop = int(cfg.INPUT.get("CENTER_CROP_TEST", 0))
    if not crop:
        return image
    from .center_crop import CenterCropResize

    return CenterCropResize(crop).get_transform(image).apply_image(image)


class SparseCLIPTestMapper:
    """Dataset dict -> model input.

    Reads ``file_name`` with :func:`read_image_rgb` (EXIF orientation applied; grayscale,
    palette, RGBA, 16-bit ... converted to 8-bit RGB), flips it to ``image_format`` "BGR" if
    asked, checks that a ``sem_seg_file_name`` mask has the image's size, resizes it
    (``INPUT.RESIZE_MODE``: detectron2's ``ResizeShortestEdge`` with ``INPUT.MIN_SIZE_TEST``
    short side and ``INPUT.MAX_SIZE_TEST`` long-side cap, or MMSeg's rescale, see
    :func:`build_resize`), and returns
    the dict with ``image`` ``(3, h, w)`` uint8, ``height``/``width`` the original size (the
    model predicts at that size, as the evaluator expects) and ``dataset_name``.
    Unreadable images and masks of another size raise, naming the files; nothing is skipped.
    """

    @configurable
    def __init__(self, *, dataset_name: str, augmentations: List, image_format: str = "RGB", center_crop: int = 0):
        check_input_format(image_format)
        self.dataset_name = dataset_name
        self.augmentations = T.AugmentationList(augmentations)
        self.image_format = image_format
        # INPUT.CENTER_CROP_TEST (CLIPtrase's protocol, data/center_crop.py): the crop replaces the
        # resize (as test_augmentations gives it) and the output size is the crop's
        self.center_crop = int(center_crop)
        if self.center_crop:
            from .center_crop import CenterCropResize

            self.augmentations = T.AugmentationList([CenterCropResize(self.center_crop)])

    @classmethod
    def from_config(cls, cfg, dataset_name: str):
        return {"dataset_name": dataset_name, "augmentations": test_augmentations(cfg), "image_format": cfg.INPUT.FORMAT,
                "center_crop": cfg.INPUT.get("CENTER_CROP_TEST", 0)}

    def __call__(self, dataset_dict: Dict) -> Dict:
        d = copy.deepcopy(dataset_dict)
        try:
            image = read_image_rgb(d["file_name"])
        except Exception as e:
            raise BadInputFile(f"cannot read image {d['file_name']!r} of dataset {self.dataset_name!r}: {e}") from e
        image = convert_channel_order(image, "RGB", self.image_format)
        if "sem_seg_file_name" in d:
            check_mask_size(d["file_name"], image.shape[:2], d["sem_seg_file_name"])
        utils.check_image_size(d, image)
        d.setdefault("height", image.shape[0])
        d.setdefault("width", image.shape[1])
        aug_input = T.AugInput(image)
        self.augmentations(aug_input)
        d["image"] = torch.as_tensor(np.ascontiguousarray(aug_input.image.transpose(2, 0, 1)))
        if self.center_crop:  # the prediction is made and scored on the crop
            d["height"] = d["width"] = self.center_crop
        d["dataset_name"] = self.dataset_name
        return d


def check_mask_size(image_file: str, image_hw, mask_file: str) -> None:
    """Raise ``ValueError`` naming both files when the label mask ``mask_file`` is not
    ``image_hw`` (the image's ``(H, W)`` after its EXIF orientation) in size. Only the mask's
    header is read."""
    try:
        with Image.open(mask_file) as m:
            mask_wh = m.size
    except Exception as e:
        raise BadInputFile(f"cannot read the ground-truth mask {mask_file!r} of image {image_file!r}: {e}") from e
    h, w = int(image_hw[0]), int(image_hw[1])
    if (mask_wh[1], mask_wh[0]) != (h, w):
        hint = ""
        if (mask_wh[1], mask_wh[0]) == (w, h):
            hint = " (the transposed size: is the image EXIF-rotated while the mask is not?)"
        raise ValueError(
            f"ground-truth mask {mask_file!r} is {mask_wh[1]}x{mask_wh[0]} (HxW) but its image "
            f"{image_file!r} is {h}x{w}{hint}; a mask must have its image's size"
        )
