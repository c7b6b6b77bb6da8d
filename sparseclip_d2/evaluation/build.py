"""Evaluator factory: ``build_evaluator(cfg, dataset_name, output_folder)``.

Dispatches on the dataset metadata ``evaluator_type`` through ``EVALUATOR_FACTORIES``
(a plain dict other modules add to: ``EVALUATOR_FACTORIES["fgovd"] = build_fgovd_evaluator``).
A factory is ``factory(cfg, dataset_name, output_folder) -> DatasetEvaluator``.
"""
import logging
from typing import Callable, Dict, Optional

import numpy as np

from detectron2.data import MetadataCatalog
from detectron2.evaluation import DatasetEvaluator, SemSegEvaluator

from ..data.class_names import display_name
from ..data.datasets.segmentation import load_sem_seg_gt

__all__ = ["EVALUATOR_FACTORIES", "build_evaluator", "build_sem_seg_evaluator", "SparseCLIPSemSegEvaluator"]

logger = logging.getLogger(__name__)


class SparseCLIPSemSegEvaluator(SemSegEvaluator):
    """detectron2's ``SemSegEvaluator`` whose ground truth is read through
    :func:`load_sem_seg_gt` (the dataset's ``reduce_zero_label`` label map, out-of-range
    labels raise) and whose per-class table uses display names (first synonym).

    Metrics (mIoU, fwIoU, mACC, pACC, per-class IoU/ACC) are detectron2's own
    ``SemSegEvaluator.evaluate``.
    """

    def __init__(self, dataset_name: str, distributed: bool = True, output_dir: Optional[str] = None):
        super().__init__(dataset_name, distributed=distributed, output_dir=output_dir)
        meta = MetadataCatalog.get(dataset_name)
        self._reduce_zero_label = bool(meta.get("reduce_zero_label", False))
        self._class_names = [display_name(c) for c in meta.stuff_classes]
        # Newer detectron2 also computes a boundary IoU from predictions it collects in
        # process(); this process() does not, so keep that off on every version.
        self._compute_boundary_iou = False

    def process(self, inputs, outputs):
        for input, output in zip(inputs, outputs):
            pred = output["sem_seg"].argmax(dim=0).cpu().numpy().astype(np.int64)
            gt_file = self.input_file_to_gt_file[input["file_name"]]
            gt = load_sem_seg_gt(
                gt_file, num_classes=self._num_classes, reduce_zero_label=self._reduce_zero_label,
                ignore_label=self._ignore_label,
            )
            if gt.shape != pred.shape:
                raise ValueError(
                    f"prediction {pred.shape} and ground truth {gt.shape} of {input['file_name']!r} differ in size"
                )
            gt[gt == self._ignore_label] = self._num_classes
            self._conf_matrix += np.bincount(
                (self._num_classes + 1) * pred.reshape(-1) + gt.reshape(-1),
                minlength=self._conf_matrix.size,
            ).reshape(self._conf_matrix.shape)
            self._predictions.extend(self.encode_json_sem_seg(pred, input["file_name"]))


def build_sem_seg_evaluator(cfg, dataset_name: str, output_folder: Optional[str] = None) -> DatasetEvaluator:
    """``"sem_seg"`` factory: :class:`SparseCLIPSemSegEvaluator`."""
    return SparseCLIPSemSegEvaluator(dataset_name, distributed=True, output_dir=output_folder)


EVALUATOR_FACTORIES: Dict[str, Callable[..., DatasetEvaluator]] = {
    "sem_seg": build_sem_seg_evaluator,
}


def build_evaluator(cfg, dataset_name: str, output_folder: Optional[str] = None) -> DatasetEvaluator:
    """The evaluator of ``dataset_name`` chosen by its metadata ``evaluator_type``.

    Raises:
        ValueError: the dataset has no ``evaluator_type`` or no factory is registered for it.
    """
    evaluator_type = MetadataCatalog.get(dataset_name).get("evaluator_type", None)
    if evaluator_type is None:
        raise ValueError(f"dataset {dataset_name!r} has no evaluator_type in its metadata")
    if evaluator_type not in EVALUATOR_FACTORIES:
        raise ValueError(
            f"no evaluator for evaluator_type {evaluator_type!r} of dataset {dataset_name!r}; "
            f"registered: {', '.join(sorted(EVALUATOR_FACTORIES))}"
        )
    return EVALUATOR_FACTORIES[evaluator_type](cfg, dataset_name, output_folder)
