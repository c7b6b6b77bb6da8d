"""Test-time mapper of the FG-OVD datasets: the original image, its boxes, captions and proposals.

Pure data: no resize and no model setting. The model (``SparseCLIPFGOVD``) resizes or crops
per its protocol; the evaluator applies the N-negatives rule.
"""
import copy
import logging
from typing import List, Optional

import numpy as np
import torch
from detectron2.config import configurable
from detectron2.data import detection_utils as utils
from detectron2.data import transforms as T
from detectron2.data.build import build_detection_test_loader, load_proposals_into_dataset
from detectron2.structures import Boxes, BoxMode, Instances

from .build import TEST_LOADER_REGISTRY, consumed_by
from .image_io import BadInputFile, check_input_format, convert_channel_order, read_image_rgb

__all__ = ["FGOVDDatasetMapper", "attach_fgovd_proposals", "fgovd"]

logger = logging.getLogger(__name__)


class FGOVDDatasetMapper:
    """Map an FG-OVD dataset dict to the input of ``SparseCLIPFGOVD`` (test time only).

    Build it from a config as ``FGOVDDatasetMapper(cfg)`` or ``FGOVDDatasetMapper(cfg,
    dataset_name)``.

    Output dict keys:

    - ``image``: ``(3, H, W)`` uint8 tensor in ``image_format``, the original image.
    - ``height``, ``width``, ``image_id``, ``file_name`` (and ``dataset_name``).
    - ``instances``: :class:`Instances` of size ``(H, W)`` with ``gt_boxes`` (K boxes, XYXY
      in the image's pixels) and ``ann_ids`` ``(K,)`` long.
    - ``fgovd_captions``: K lists of caption texts, the positive first, then all the box's
      negatives in file order.
    - ``proposals`` (when the record has proposals): :class:`Instances` with
      ``proposal_boxes`` (XYXY, image pixels) and ``objectness_logits``, top-k by objectness.
    """

    @configurable
    def __init__(self, *, image_format: str = "RGB", proposal_topk: Optional[int] = None,
                 dataset_name: Optional[str] = None):
        """
        Args:
            image_format: ``INPUT.FORMAT`` ("RGB" or "BGR").
            proposal_topk: with proposals, keep the top-k by objectness (None: proposals are
                not expected; a record that has them is an error, to avoid using them silently).
            dataset_name: when given, set as the records' ``dataset_name``.
        """
        check_input_format(image_format)
        self.image_format = image_format
        self.proposal_topk = proposal_topk
        self.dataset_name = dataset_name

    @classmethod
    def from_config(cls, cfg, dataset_name: Optional[str] = None, is_train: bool = False):
        if is_train:
            raise ValueError("FGOVDDatasetMapper is test-only (sparseclip_d2 is training-free)")
        return {
            "image_format": cfg.INPUT.FORMAT,
            "proposal_topk": cfg.DATASETS.PRECOMPUTED_PROPOSAL_TOPK_TEST if cfg.MODEL.LOAD_PROPOSALS else None,
            "dataset_name": dataset_name,
        }

    def __call__(self, dataset_dict: dict) -> dict:
        d = copy.deepcopy(dataset_dict)
        if self.dataset_name is not None:
            d["dataset_name"] = self.dataset_name
        try:
            image = read_image_rgb(d["file_name"])
        except Exception as e:
            raise BadInputFile(f"cannot read FG-OVD image {d['file_name']!r}: {e}") from e
        image = convert_channel_order(image, "RGB", self.image_format)
        utils.check_image_size(d, image)
        h, w = image.shape[:2]
        d["image"] = torch.as_tensor(np.ascontiguousarray(image.transpose(2, 0, 1)))

        annos = d.pop("annotations")
        boxes = np.asarray(
            [BoxMode.convert(a["bbox"], a["bbox_mode"], BoxMode.XYXY_ABS) for a in annos], dtype=np.float64
        ).reshape(-1, 4)
        inst = Instances((h, w))
        inst.gt_boxes = Boxes(torch.as_tensor(boxes, dtype=torch.float32))
        inst.ann_ids = torch.as_tensor([a["id"] for a in annos], dtype=torch.long)
        d["instances"] = inst
        d["fgovd_captions"] = [[a["caption"], *a["neg_captions"]] for a in annos]

        if "proposal_boxes" in d:
            if self.proposal_topk is None:
                raise ValueError(f"record {d['file_name']} has proposals but MODEL.LOAD_PROPOSALS is False")
            utils.transform_proposals(d, (h, w), T.TransformList([]), proposal_topk=self.proposal_topk)
        elif self.proposal_topk is not None:
            raise KeyError(
                f"MODEL.LOAD_PROPOSALS is True but record {d['file_name']} has no "
                f"'proposal_boxes' (DATASETS.PROPOSAL_FILES_TEST not loaded?)"
            )
        return d


def attach_fgovd_proposals(cfg, dataset_name: str, dataset_dicts: List[dict]) -> List[dict]:
    """Load the precomputed proposals of ``dataset_name`` into its dicts when
    ``MODEL.LOAD_PROPOSALS`` is set (detectron2's proposal-file format, the file of the same
    position in ``DATASETS.PROPOSAL_FILES_TEST`` as the dataset in ``DATASETS.TEST``);
    otherwise return the dicts unchanged.

    Raises:
        ValueError: the two lists differ in length or the dataset is not in DATASETS.TEST.
        KeyError: an image has no proposals in the file (detectron2's loader).
    """
    if not cfg.MODEL.LOAD_PROPOSALS:
        return dataset_dicts
    names, files = list(cfg.DATASETS.TEST), list(cfg.DATASETS.PROPOSAL_FILES_TEST)
    if len(names) != len(files):
        raise ValueError(
            f"MODEL.LOAD_PROPOSALS: DATASETS.PROPOSAL_FILES_TEST has {len(files)} file(s) for "
            f"{len(names)} DATASETS.TEST dataset(s) {names}; give one per dataset"
        )
    if dataset_name not in names:
        raise ValueError(f"dataset {dataset_name!r} is not in DATASETS.TEST {names}")
    return load_proposals_into_dataset(dataset_dicts, files[names.index(dataset_name)])


@TEST_LOADER_REGISTRY.register()
@consumed_by("SparseCLIPFGOVD")
def fgovd(cfg, dataset_name: str, dataset_dicts: List[dict]):
    """Test loader of an FG-OVD dataset (``evaluator_type`` "fgovd"): proposals attached
    when ``MODEL.LOAD_PROPOSALS``, :class:`FGOVDDatasetMapper`."""
    dicts = attach_fgovd_proposals(cfg, dataset_name, dataset_dicts)
    return build_detection_test_loader(
        dicts, mapper=FGOVDDatasetMapper(cfg, dataset_name), num_workers=cfg.DATALOADER.NUM_WORKERS
    )
