"""Test-time mapper of the FG-OVD datasets: image, boxes, captions and proposals.

It resizes the whole image to ``RESOLUTION x RESOLUTION`` (dense protocol; the crop protocol
keeps the original image, crops are resized by the model), carries the ground-truth boxes and
the precomputed proposals through the same transform, applies the N-negatives rule
(:func:`sparseclip_d2.data.datasets.fgovd.select_negatives`) and attaches the run's
:class:`FGOVDOptions` so that the model knows how to pool regions and encode captions.
"""
import copy
import logging
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch
from detectron2.config import configurable
from detectron2.data import MetadataCatalog
from detectron2.data import detection_utils as utils
from detectron2.data.build import load_proposals_into_dataset
from detectron2.data import transforms as T
from detectron2.structures import Boxes, BoxMode, Instances

from .datasets.fgovd import resolve_num_negatives, select_negatives

__all__ = ["FGOVDOptions", "FGOVDDatasetMapper", "FGOVD_PROTOCOLS", "is_fgovd_dataset", "attach_fgovd_proposals"]

logger = logging.getLogger(__name__)

FGOVD_PROTOCOLS = ("dense", "crop")


@dataclass(frozen=True)
class FGOVDOptions:
    """Settings of FG-OVD inference (``MODEL.SPARSECLIP.FGOVD.*``).

    Attributes:
        protocol: "dense" (RoIAlign on the modified dense patch embeddings) or "crop"
            (encode each box crop with the unmodified image encoder).
        resolution: dense protocol working resolution R (image resized to R x R).
        pooler_resolution: RoIAlign output size P (the P x P bins are averaged).
        aligned: RoIAlign ``aligned`` flag (True: pixel centres, a box covering exactly one
            patch pools exactly that patch's embedding).
        templates: caption templates name ("none" = caption text as is), see
            ``sparseclip_d2.clip.get_templates``.
        iou_threshold: proposal mode, the IoU a proposal needs to stand for a box.
    """

    protocol: str = "dense"
    resolution: int = 224
    pooler_resolution: int = 1
    aligned: bool = True
    templates: str = "none"
    iou_threshold: float = 0.5

    def __post_init__(self):
        if self.protocol not in FGOVD_PROTOCOLS:
            raise ValueError(
                f"unknown MODEL.SPARSECLIP.FGOVD.PROTOCOL '{self.protocol}'; valid: {', '.join(FGOVD_PROTOCOLS)}"
            )
        if int(self.resolution) < 1 or int(self.pooler_resolution) < 1:
            raise ValueError(
                f"MODEL.SPARSECLIP.FGOVD.RESOLUTION ({self.resolution}) and POOLER_RESOLUTION "
                f"({self.pooler_resolution}) must be >= 1"
            )
        if not 0.0 < float(self.iou_threshold) <= 1.0:
            raise ValueError(f"MODEL.SPARSECLIP.FGOVD.IOU_THRESHOLD must be in (0, 1], got {self.iou_threshold}")

    @classmethod
    def from_config(cls, cfg) -> "FGOVDOptions":
        f = cfg.MODEL.SPARSECLIP.FGOVD
        return cls(
            protocol=f.PROTOCOL,
            resolution=int(f.RESOLUTION),
            pooler_resolution=int(f.POOLER_RESOLUTION),
            aligned=bool(f.ALIGNED),
            templates=f.TEMPLATES,
            iou_threshold=float(f.IOU_THRESHOLD),
        )


class FGOVDDatasetMapper:
    """Map an FG-OVD dataset dict to the model's input (test time only).

    Build it from a config as ``FGOVDDatasetMapper(cfg)`` or ``FGOVDDatasetMapper(cfg,
    dataset_name)`` (same call as the segmentation mapper).

    Output dict keys:

    - ``image``: ``(3, H', W')`` uint8 tensor in ``image_format``; ``H' = W' = R`` for the
      dense protocol, the original size for the crop protocol.
    - ``height``, ``width``, ``image_id``, ``file_name``, ``dataset_name``: from the record.
    - ``instances``: :class:`Instances` of size ``(H', W')`` with ``gt_boxes`` (K boxes, XYXY
      in the mapped image's pixels) and ``ann_ids`` ``(K,)`` long.
    - ``fgovd_captions``: K lists of ``1 + N`` caption texts (positive first).
    - ``fgovd_num_dropped``: boxes of the image dropped by the N-negatives rule.
    - ``proposals`` (when the record has proposals): :class:`Instances` with
      ``proposal_boxes`` and ``objectness_logits``, transformed like the boxes.
    - ``fgovd_options``: the :class:`FGOVDOptions` of the run.
    """

    @configurable
    def __init__(
        self,
        *,
        options: FGOVDOptions,
        image_format: str = "RGB",
        num_negatives: int = -1,
        proposal_topk: Optional[int] = None,
        dataset_name: Optional[str] = None,
    ):
        """
        Args:
            options: FG-OVD settings (protocol, resolution, ...).
            image_format: ``INPUT.FORMAT`` ("RGB" or "BGR").
            num_negatives: N; -1 = the dataset's default (metadata ``num_negatives``).
            proposal_topk: with proposals, keep the top-k by objectness (None: proposals are
                not expected; a record that has them is an error, to avoid using them silently).
            dataset_name: when given, set as the records' ``dataset_name`` (whose metadata
                gives the default N); None = use the records' own ``dataset_name``.
        """
        self.options = options
        self.image_format = image_format
        self.num_negatives = int(num_negatives)
        self.proposal_topk = proposal_topk
        self.dataset_name = dataset_name
        self._n_cache = {}

    @classmethod
    def from_config(cls, cfg, dataset_name: Optional[str] = None, is_train: bool = False):
        if is_train:
            raise ValueError("FGOVDDatasetMapper is test-only (sparseclip_d2 is training-free)")
        return {
            "options": FGOVDOptions.from_config(cfg),
            "image_format": cfg.INPUT.FORMAT,
            "num_negatives": cfg.MODEL.SPARSECLIP.FGOVD.NUM_NEGATIVES,
            "proposal_topk": cfg.DATASETS.PRECOMPUTED_PROPOSAL_TOPK_TEST if cfg.MODEL.LOAD_PROPOSALS else None,
            "dataset_name": dataset_name,
        }

    def _n_for(self, dataset_dict: dict) -> int:
        if self.num_negatives > 0:
            return self.num_negatives
        name = dataset_dict.get("dataset_name")
        if name is None:
            raise KeyError(
                f"record {dataset_dict.get('file_name')} has no 'dataset_name' to look the split's "
                f"default N up; set MODEL.SPARSECLIP.FGOVD.NUM_NEGATIVES or load it with "
                f"load_fgovd_json(..., dataset_name=...)"
            )
        if name not in self._n_cache:
            self._n_cache[name] = resolve_num_negatives(name, self.num_negatives)
        return self._n_cache[name]

    def __call__(self, dataset_dict: dict) -> dict:
        dataset_dict = copy.deepcopy(dataset_dict)
        if self.dataset_name is not None:
            dataset_dict["dataset_name"] = self.dataset_name
        image = utils.read_image(dataset_dict["file_name"], format=self.image_format)
        utils.check_image_size(dataset_dict, image)
        h0, w0 = image.shape[:2]

        annos, dropped = select_negatives(dataset_dict.pop("annotations"), self._n_for(dataset_dict))
        dataset_dict["fgovd_num_dropped"] = int(dataset_dict.get("fgovd_num_dropped", 0)) + dropped

        if self.options.protocol == "dense":
            r = int(self.options.resolution)
            tfm = T.ResizeTransform(h0, w0, r, r)
        else:
            tfm = T.NoOpTransform()
        transforms = T.TransformList([tfm])
        image = transforms.apply_image(image)
        image_shape = image.shape[:2]
        dataset_dict["image"] = torch.as_tensor(np.ascontiguousarray(image.transpose(2, 0, 1)))

        boxes = np.asarray(
            [BoxMode.convert(a["bbox"], a["bbox_mode"], BoxMode.XYXY_ABS) for a in annos], dtype=np.float64
        ).reshape(-1, 4)
        boxes = transforms.apply_box(boxes).reshape(-1, 4) if len(boxes) else boxes
        inst = Instances(image_shape)
        inst.gt_boxes = Boxes(torch.as_tensor(boxes, dtype=torch.float32))
        inst.ann_ids = torch.as_tensor([a["id"] for a in annos], dtype=torch.long)
        dataset_dict["instances"] = inst
        dataset_dict["fgovd_captions"] = [[a["caption"], *a["neg_captions"]] for a in annos]

        if "proposal_boxes" in dataset_dict:
            if self.proposal_topk is None:
                raise ValueError(
                    f"record {dataset_dict['file_name']} has proposals but MODEL.LOAD_PROPOSALS is False"
                )
            utils.transform_proposals(
                dataset_dict, image_shape, transforms, proposal_topk=self.proposal_topk
            )
        elif self.proposal_topk is not None:
            raise KeyError(
                f"MODEL.LOAD_PROPOSALS is True but record {dataset_dict['file_name']} has no "
                f"'proposal_boxes' (DATASETS.PROPOSAL_FILES_TEST not loaded?)"
            )
        dataset_dict["fgovd_options"] = self.options
        return dataset_dict


def is_fgovd_dataset(dataset_name: str) -> bool:
    """Whether ``dataset_name``'s metadata has ``evaluator_type == "fgovd"``."""
    return MetadataCatalog.get(dataset_name).get("evaluator_type", None) == "fgovd"


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
