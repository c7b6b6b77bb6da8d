"""Evaluator factory: ``build_evaluator(cfg, dataset_name, output_folder)``.

Dispatches on the dataset metadata ``evaluator_type`` through :data:`EVALUATOR_REGISTRY`, an
fvcore ``Registry`` like the package's other registries: an entry is a function
``fn(cfg, dataset_name, output_folder) -> DatasetEvaluator`` whose ``__name__`` is the
``evaluator_type`` it serves (``sem_seg`` here, ``fgovd`` in ``fgovd_evaluation.py``).
"""
import io
import logging
from collections import OrderedDict
from typing import Optional

import numpy as np
from PIL import Image

from detectron2.data import MetadataCatalog
from detectron2.evaluation import DatasetEvaluator, SemSegEvaluator
from detectron2.utils.file_io import PathManager
from fvcore.common.registry import Registry
from iopath.common.file_io import PathHandler

from ..data.build import registered_evaluator_type
from ..data.class_names import display_name
from ..data.datasets.segmentation import load_sem_seg_gt

__all__ = ["EVALUATOR_REGISTRY", "build_evaluator", "SparseCLIPSemSegEvaluator"]

logger = logging.getLogger(__name__)

EVALUATOR_REGISTRY = Registry("SPARSECLIP_EVALUATOR")
EVALUATOR_REGISTRY.__doc__ = """
Evaluator builders keyed by dataset metadata ``evaluator_type`` (the function's name):
``fn(cfg, dataset_name, output_folder) -> DatasetEvaluator``.
"""


class _ConvertedGroundTruth(PathHandler):
    """Serves ground-truth label maps converted by :func:`load_sem_seg_gt` to
    ``SemSegEvaluator``, which reads every ground-truth file with ``PathManager.open``.

    A path is ``sparseclip-semseg-gt://<num_classes>/<reduce_zero_label 0|1>/<ignore>/<real path>``;
    opening it returns the converted ``(H, W)`` labels as an uncompressed PNG (8-bit, or
    16-bit when a label exceeds 255). iopath's documented extension point
    (``_get_supported_prefixes``/``_open``) is used; ``tests/test_evaluation.py`` pins that
    detectron2's ``SemSegEvaluator.process`` reads its ground truth through ``PathManager``.
    """

    PREFIX = "sparseclip-semseg-gt://"

    def _get_supported_prefixes(self):
        return [self.PREFIX]

    @classmethod
    def path(cls, real_path: str, *, num_classes: int, reduce_zero_label: bool, ignore_label: int) -> str:
        return f"{cls.PREFIX}{int(num_classes)}/{int(bool(reduce_zero_label))}/{int(ignore_label)}/{real_path}"

    @classmethod
    def parse(cls, path: str):
        num_classes, reduce_zero_label, ignore_label, real_path = path[len(cls.PREFIX):].split("/", 3)
        return real_path, int(num_classes), reduce_zero_label == "1", int(ignore_label)

    def _open(self, path, mode="r", buffering=-1, **kwargs):
        if "w" in mode or "a" in mode:
            raise ValueError(f"{path!r} is read-only (converted ground truth)")
        real_path, num_classes, reduce_zero_label, ignore_label = self.parse(path)
        gt = load_sem_seg_gt(
            real_path, num_classes=num_classes, reduce_zero_label=reduce_zero_label, ignore_label=ignore_label
        )
        image = Image.fromarray(gt.astype(np.uint8 if gt.max(initial=0) <= 255 else np.uint16))
        buf = io.BytesIO()
        image.save(buf, format="PNG", compress_level=0)
        buf.seek(0)
        return buf


_GT_HANDLER = _ConvertedGroundTruth()
PathManager.register_handler(_GT_HANDLER)


class _LabelMap:
    """The label map of a large output (``output["sem_seg_labels"]``, ``(H, W)``) in the
    place of ``output["sem_seg"]``: ``SemSegEvaluator.process`` reads the scores only through
    ``argmax(dim=0)`` (pinned by ``tests/test_postprocess_bands.py``, which compares the
    metrics of both outputs), so no ``(C, H, W)`` tensor is built for it."""

    def __init__(self, labels):
        self.labels = labels
        self.shape = tuple(labels.shape)

    def argmax(self, dim: int):
        if dim != 0:
            raise ValueError(f"a label map has no class dimension other than 0, got dim={dim}")
        return self.labels


class SparseCLIPSemSegEvaluator(SemSegEvaluator):
    """detectron2's ``SemSegEvaluator`` on ground truth converted by :func:`load_sem_seg_gt`
    (the dataset's ``reduce_zero_label`` label map; out-of-range labels raise, naming the
    file), with a clear error when a prediction and its ground truth differ in size, and a
    per-class table keyed by display names (first synonym).

    Only public API: the ground-truth paths of ``input_file_to_gt_file`` point at a
    ``PathManager`` handler that converts the labels, and ``evaluate`` renames the
    per-class keys of detectron2's result. Metrics (mIoU, fwIoU, mACC, pACC, per-class
    IoU/ACC) are detectron2's own ``SemSegEvaluator.evaluate``.
    """

    def __init__(self, dataset_name: str, distributed: bool = True, output_dir: Optional[str] = None):
        super().__init__(dataset_name, distributed=distributed, output_dir=output_dir)
        meta = MetadataCatalog.get(dataset_name)
        self._gt_params = dict(
            num_classes=len(meta.stuff_classes),
            reduce_zero_label=bool(meta.get("reduce_zero_label", False)),
            ignore_label=int(meta.ignore_label),
        )
        self._real_gt = dict(self.input_file_to_gt_file)
        self.input_file_to_gt_file = {
            k: _ConvertedGroundTruth.path(v, **self._gt_params) for k, v in self._real_gt.items()
        }
        self._display = {name: display_name(name) for name in meta.stuff_classes}

    def process(self, inputs, outputs):
        for input, output in zip(inputs, outputs):
            if input["file_name"] not in self._real_gt:
                raise KeyError(f"{input['file_name']!r} is not an image of this evaluator's dataset")
            gt_file = self._real_gt[input["file_name"]]
            with Image.open(gt_file) as im:
                gt_size = (im.height, im.width)
            pred = output["sem_seg"] if "sem_seg" in output else output["sem_seg_labels"]
            pred_size = tuple(pred.shape[-2:])
            if gt_size != pred_size:
                raise ValueError(
                    f"prediction {pred_size} and ground truth {gt_size} of {input['file_name']!r} differ in size"
                )
        super().process(inputs, [o if "sem_seg" in o else {"sem_seg": _LabelMap(o["sem_seg_labels"])}
                                 for o in outputs])

    def evaluate(self):
        results = super().evaluate()
        if not results or "sem_seg" not in results:
            return results
        renamed = OrderedDict()
        for key, value in results["sem_seg"].items():
            for prefix in ("IoU-", "ACC-", "BoundaryIoU-", "min(IoU, B-Iou)-"):
                if key.startswith(prefix) and key[len(prefix):] in self._display:
                    key = prefix + self._display[key[len(prefix):]]
                    break
            renamed[key] = value
        return OrderedDict([("sem_seg", renamed)] + [(k, v) for k, v in results.items() if k != "sem_seg"])


@EVALUATOR_REGISTRY.register()
def sem_seg(cfg, dataset_name: str, output_folder: Optional[str] = None) -> DatasetEvaluator:
    """Segmentation datasets (``evaluator_type`` "sem_seg"): :class:`SparseCLIPSemSegEvaluator`."""
    return SparseCLIPSemSegEvaluator(dataset_name, distributed=True, output_dir=output_folder)


def build_evaluator(cfg, dataset_name: str, output_folder: Optional[str] = None) -> DatasetEvaluator:
    """The evaluator of ``dataset_name`` chosen by its metadata ``evaluator_type``.

    Raises:
        ValueError: the dataset has no ``evaluator_type`` or no evaluator is registered for it.
    """
    evaluator_type = registered_evaluator_type(dataset_name, EVALUATOR_REGISTRY, "evaluator")
    return EVALUATOR_REGISTRY.get(evaluator_type)(cfg, dataset_name, output_folder)
