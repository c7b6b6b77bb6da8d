"""Test-time mapper of the segmentation datasets: read, resize, keep the output size."""
import copy
import logging
from typing import Dict, List

import numpy as np
import torch

from detectron2.config import configurable
from detectron2.data import detection_utils as utils
from detectron2.data import transforms as T

__all__ = ["SparseCLIPTestMapper"]

logger = logging.getLogger(__name__)


class SparseCLIPTestMapper:
    """Dataset dict -> model input.

    Reads ``file_name`` in ``image_format``, resizes with ``ResizeShortestEdge``
    (``INPUT.MIN_SIZE_TEST`` short side, ``INPUT.MAX_SIZE_TEST`` long-side cap), and returns
    the dict with ``image`` ``(3, h, w)`` uint8, ``height``/``width`` the original size (the
    model predicts at that size, as the evaluator expects) and ``dataset_name``.
    Unreadable images raise; nothing is skipped.
    """

    @configurable
    def __init__(self, *, dataset_name: str, augmentations: List, image_format: str = "RGB"):
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
            image = utils.read_image(d["file_name"], format=self.image_format)
        except Exception as e:
            raise RuntimeError(f"cannot read image {d['file_name']!r} of dataset {self.dataset_name!r}: {e}") from e
        utils.check_image_size(d, image)
        d.setdefault("height", image.shape[0])
        d.setdefault("width", image.shape[1])
        aug_input = T.AugInput(image)
        self.augmentations(aug_input)
        d["image"] = torch.as_tensor(np.ascontiguousarray(aug_input.image.transpose(2, 0, 1)))
        d["dataset_name"] = self.dataset_name
        return d
