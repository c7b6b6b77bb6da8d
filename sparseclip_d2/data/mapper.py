"""Test-time mapper of the segmentation datasets: read, resize, keep the output size."""
import copy
import logging
from typing import Dict, List

import numpy as np
import torch
from PIL import Image

from detectron2.config import configurable
from detectron2.data import detection_utils as utils
from detectron2.data import transforms as T

from .image_io import read_image_rgb

__all__ = ["SparseCLIPTestMapper"]

logger = logging.getLogger(__name__)


class SparseCLIPTestMapper:
    """Dataset dict -> model input.

    Reads ``file_name`` with :func:`read_image_rgb` (EXIF orientation applied; grayscale,
    palette, RGBA, 16-bit ... converted to 8-bit RGB), flips it to ``image_format`` "BGR" if
    asked, checks that a ``sem_seg_file_name`` mask has the image's size, resizes with ``ResizeShortestEdge``
    (``INPUT.MIN_SIZE_TEST`` short side, ``INPUT.MAX_SIZE_TEST`` long-side cap), and returns
    the dict with ``image`` ``(3, h, w)`` uint8, ``height``/``width`` the original size (the
    model predicts at that size, as the evaluator expects) and ``dataset_name``.
    Unreadable images and masks of another size raise, naming the files; nothing is skipped.
    """

    @configurable
    def __init__(self, *, dataset_name: str, augmentations: List, image_format: str = "RGB"):
        if image_format not in ("RGB", "BGR"):
            raise ValueError(f"INPUT.FORMAT must be RGB or BGR, got {image_format!r}")
        self.dataset_name = dataset_name
        self.augmentations = T.AugmentationList(augmentations)
        self.image_format = image_format

    @classmethod
    def from_config(cls, cfg, dataset_name: str):
        augs = []
        if cfg.INPUT.MIN_SIZE_TEST > 0:
            augs.append(T.ResizeShortestEdge(cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MAX_SIZE_TEST, "choice"))
        return {"dataset_name": dataset_name, "augmentations": augs, "image_format": cfg.INPUT.FORMAT}

    def __call__(self, dataset_dict: Dict) -> Dict:
        d = copy.deepcopy(dataset_dict)
        try:
            image = read_image_rgb(d["file_name"])
        except Exception as e:
            raise RuntimeError(f"cannot read image {d['file_name']!r} of dataset {self.dataset_name!r}: {e}") from e
        if self.image_format == "BGR":
            image = np.ascontiguousarray(image[:, :, ::-1])
        if "sem_seg_file_name" in d:
            check_mask_size(d["file_name"], image.shape[:2], d["sem_seg_file_name"])
        utils.check_image_size(d, image)
        d.setdefault("height", image.shape[0])
        d.setdefault("width", image.shape[1])
        aug_input = T.AugInput(image)
        self.augmentations(aug_input)
        d["image"] = torch.as_tensor(np.ascontiguousarray(aug_input.image.transpose(2, 0, 1)))
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
        raise RuntimeError(f"cannot read the ground-truth mask {mask_file!r} of image {image_file!r}: {e}") from e
    h, w = int(image_hw[0]), int(image_hw[1])
    if (mask_wh[1], mask_wh[0]) != (h, w):
        hint = ""
        if (mask_wh[1], mask_wh[0]) == (w, h):
            hint = " (the transposed size: is the image EXIF-rotated while the mask is not?)"
        raise ValueError(
            f"ground-truth mask {mask_file!r} is {mask_wh[1]}x{mask_wh[0]} (HxW) but its image "
            f"{image_file!r} is {h}x{w}{hint}; a mask must have its image's size"
        )
