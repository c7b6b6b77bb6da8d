"""Evaluator factory: ``build_evaluator(cfg, dataset_name, output_folder)``.

Dispatches on the dataset metadata ``evaluator_type`` through :data:`EVALUATOR_REGISTRY`, an
fvcore ``Registry`` like the package's other registries: an entry is a function
``fn(cfg, dataset_name, output_folder) -> DatasetEvaluator`` whose ``__name__`` is the
``evaluator_type`` it serves (``sem_seg`` here, ``fgovd`` in ``fgovd_evaluation.py``).
"""
import logging
from collections import OrderedDict
from typing import Callable, Dict, Optional

import torch

from detectron2.data import MetadataCatalog
from detectron2.evaluation import DatasetEvaluator, SemSegEvaluator
from fvcore.common.registry import Registry

from ..data.build import registered_evaluator_type
from ..data.class_names import display_name
from ..data.ground_truth import load_sem_seg_gt
from .sem_seg_metrics import DEFAULT_DILATION_RATIO, SemSegExtraMetrics

__all__ = ["EVALUATOR_REGISTRY", "BENCHMARK_EVALUATORS", "build_evaluator", "SparseCLIPSemSegEvaluator",
           "label_map_scores", "boundary_iou_setting", "ONE_HOT_MAX_BYTES"]

logger = logging.getLogger(__name__)

EVALUATOR_REGISTRY = Registry("SPARSECLIP_EVALUATOR")
EVALUATOR_REGISTRY.__doc__ = """
Evaluator builders keyed by dataset metadata ``evaluator_type`` (the function's name):
``fn(cfg, dataset_name, output_folder) -> DatasetEvaluator``.
"""


#: ``sem_seg`` evaluators of the datasets whose metadata ``benchmark`` names one:
#: ``{benchmark: fn(cfg, dataset_name, output_folder) -> DatasetEvaluator}``, filled by the module
#: that serves it (``evaluation/mess_benchmark.py``: "mess", imported by ``evaluation/__init__.py``
#: when MESS's package is installed).
BENCHMARK_EVALUATORS: Dict[str, Callable] = {}


def label_map_scores(labels: torch.Tensor) -> torch.Tensor:
    """``(H, W)`` integer label map -> ``(K, H, W)`` uint8 one-hot scores whose
    ``argmax(dim=0)`` is ``labels`` (``K = labels.max() + 1``: channels above the largest
    label cannot win the argmax, so they are left out). One byte per element: a quarter of
    the float32 scores the META_ARCH avoided by returning ``sem_seg_labels``."""
    labels = torch.as_tensor(labels).long().cpu()
    if labels.dim() != 2:
        raise ValueError(f"a label map must be (H, W), got shape {tuple(labels.shape)}")
    if labels.numel() and int(labels.min()) < 0:
        raise ValueError(f"a label map holds the negative label {int(labels.min())}")
    k = int(labels.max()) + 1 if labels.numel() else 1
    scores = torch.zeros((k,) + tuple(labels.shape), dtype=torch.uint8)
    scores.scatter_(0, labels[None], 1)
    return scores


#: Above this many bytes of one-hot scores (847 classes at 2048 x 1536: 2.6 GB), a label map is
#: given to ``SemSegEvaluator.process`` in bands of rows.
ONE_HOT_MAX_BYTES = 64 << 20


class SparseCLIPSemSegEvaluator(SemSegEvaluator):
    """detectron2's ``SemSegEvaluator``, through its public API only: it reads each
    ground-truth file as it is (the datasets point at files converted offline by
    ``tools/prepare_datasets.py``); the metrics (mIoU, fwIoU, mACC, pACC, per-class IoU/ACC)
    are its own ``evaluate``.

    Added around it, per image, before ``SemSegEvaluator.process``:

    - the ground truth is checked with :func:`~sparseclip_d2.data.ground_truth.load_sem_seg_gt`
      (a single-channel label PNG whose labels lie in ``[0, C)`` or are ``ignore_label``; the
      file is named otherwise: ``SemSegEvaluator`` would count an out-of-range label in a
      wrong cell of its confusion matrix), and its size against the prediction's;
    - a label-map output (``output["sem_seg_labels"]`` ``(H, W)``, returned by the META_ARCH
      above ``TEST.SEM_SEG_SCORES_MAX_MB``) is given to it as the one-hot scores of
      :func:`label_map_scores`, one image at a time;
    - ``evaluate`` renames the per-class keys to display names (first synonym);
    - the share of classes with zero IoU and the boundary IoU (``boundary_iou``: ``(dilation
      ratio, dilation pixels)``, None = off) are accumulated beside it from the same label maps
      (:class:`~sparseclip_d2.evaluation.sem_seg_metrics.SemSegExtraMetrics`) and added to
      ``evaluate``'s ``sem_seg`` metrics.

    A label map whose one-hot scores would exceed :data:`ONE_HOT_MAX_BYTES` (847 classes at
    2048 x 1536: 2.6 GB) is given to ``SemSegEvaluator.process`` in bands of rows, each with its
    band of the ground truth in a temporary file (as the centre crop is), and
    ``encode_json_sem_seg`` (public) writes the whole image's entries once, at its last band.
    """

    def __init__(self, dataset_name: str, distributed: bool = True, output_dir: Optional[str] = None,
                 center_crop: int = 0, boundary_iou=(DEFAULT_DILATION_RATIO, 0)):
        meta = MetadataCatalog.get(dataset_name)
        if meta.get("reduce_zero_label", False):
            raise ValueError(
                f"dataset {dataset_name!r} has reduce_zero_label=True in its metadata: label maps are not "
                "converted at evaluation time; convert the masks once (sparseclip_d2.data.ground_truth."
                "convert_sem_seg_gt, or tools/prepare_datasets.py) and register the converted files"
            )
        super().__init__(dataset_name, distributed=distributed, output_dir=output_dir)
        self._num_gt_classes = len(meta.stuff_classes)
        self._gt_ignore = int(meta.ignore_label)
        # per-class keys by display name (first synonym), or by the whole class string where two
        # classes share a first synonym (ADE20K-847: "pot" and "pot, flowerpot"), so none is lost
        shown = [display_name(name) for name in meta.stuff_classes]
        self._display = {name: s if shown.count(s) == 1 else name for name, s in zip(meta.stuff_classes, shown)}
        # INPUT.CENTER_CROP_TEST (data/center_crop.py): the ground truth is cropped as the image was
        self._center_crop = int(center_crop)
        self._extra = SemSegExtraMetrics(
            self._num_gt_classes, self._gt_ignore, boundary=boundary_iou is not None,
            dilation_ratio=boundary_iou[0] if boundary_iou is not None else DEFAULT_DILATION_RATIO,
            dilation_pixels=boundary_iou[1] if boundary_iou is not None else 0)

    def reset(self):
        super().reset()
        self._extra.reset()

        self._banded_labels = None  # the whole label map while its bands are processed

    def _process_labels(self, input, labels: torch.Tensor, gt) -> None:
        """``SemSegEvaluator.process`` of a label map: whole (one-hot scores) when they fit
        :data:`ONE_HOT_MAX_BYTES`, else band by band with the ground truth's band in a temporary
        uint16 TIFF (the confusion matrix is a sum over pixels, so the bands add up to the image)."""
        import tempfile

        import numpy as np
        from PIL import Image

        labels = torch.as_tensor(labels).long().cpu()
        k = int(labels.max()) + 1 if labels.numel() else 1
        height, width = labels.shape
        if k * labels.numel() <= ONE_HOT_MAX_BYTES:
            super().process([input], [{"sem_seg": label_map_scores(labels)}])
            return
        if gt.min(initial=0) < 0 or gt.max(initial=0) > 65535:
            raise ValueError(f"ground truth of {input['file_name']!r} holds labels outside 0..65535")
        rows = max(1, ONE_HOT_MAX_BYTES // (k * width))
        original = self.input_file_to_gt_file[input["file_name"]]
        self._banded_labels = labels
        try:
            with tempfile.TemporaryDirectory(prefix="sparseclip_bands_") as tmp:
                for r0 in range(0, height, rows):
                    r1 = min(r0 + rows, height)
                    path = f"{tmp}/gt_{r0}.tif"
                    Image.fromarray(np.ascontiguousarray(gt[r0:r1]).astype(np.uint16)).save(path, format="TIFF")
                    self.input_file_to_gt_file[input["file_name"]] = path
                    self._last_band = r1 == height
                    super().process([input], [{"sem_seg": label_map_scores(labels[r0:r1])}])
        finally:
            self._banded_labels = None
            self.input_file_to_gt_file[input["file_name"]] = original

    def encode_json_sem_seg(self, sem_seg, input_file_name):
        """detectron2's entries of one image; while a label map is processed in bands, none
        until its last band, then those of the whole label map."""
        if self._banded_labels is None:
            return super().encode_json_sem_seg(sem_seg, input_file_name)
        if not self._last_band:
            return []
        return super().encode_json_sem_seg(self._banded_labels.numpy(), input_file_name)

    def process(self, inputs, outputs):
        for input, output in zip(inputs, outputs):
            if input["file_name"] not in self.input_file_to_gt_file:
                raise KeyError(f"{input['file_name']!r} is not an image of this evaluator's dataset")
            gt_file = self.input_file_to_gt_file[input["file_name"]]
            gt = load_sem_seg_gt(gt_file, num_classes=self._num_gt_classes, ignore_label=self._gt_ignore)
            if self._center_crop:
                self._process_cropped(input, output, gt)
                continue
            if "sem_seg" in output:
                pred_size = tuple(output["sem_seg"].shape[-2:])
            else:
                pred_size = tuple(output["sem_seg_labels"].shape[-2:])
            if tuple(gt.shape) != pred_size:
                raise ValueError(
                    f"prediction {pred_size} and ground truth {tuple(gt.shape)} of {input['file_name']!r} differ in size"
                )
            if "sem_seg" in output:
                super().process([input], [output])
                self._extra.update(output["sem_seg"].argmax(dim=0).cpu().numpy(), gt)
            else:
                self._process_labels(input, output["sem_seg_labels"], gt)
                self._extra.update(torch.as_tensor(output["sem_seg_labels"]).cpu().numpy(), gt)

    def _process_cropped(self, input, output, gt):
        """``process`` of one image under the centre-crop protocol: the ground truth cropped
        (``data.center_crop.center_crop_labels``) is written to a temporary label PNG that
        ``SemSegEvaluator.process`` reads in place of the original file."""
        import tempfile

        import numpy as np
        from PIL import Image

        from ..data.center_crop import center_crop_labels

        gt = center_crop_labels(gt.astype(np.int32), self._center_crop)
        pred = output["sem_seg"] if "sem_seg" in output else output["sem_seg_labels"]
        if tuple(pred.shape[-2:]) != tuple(gt.shape):
            raise ValueError(f"prediction {tuple(pred.shape[-2:])} and centre-cropped ground truth {tuple(gt.shape)} "
                             f"of {input['file_name']!r} differ in size (INPUT.CENTER_CROP_TEST = {self._center_crop})")
        pred_labels = pred.argmax(dim=0) if "sem_seg" in output else torch.as_tensor(pred)
        self._extra.update(pred_labels.cpu().numpy(), gt)
        if "sem_seg" not in output:
            output = {"sem_seg": label_map_scores(output["sem_seg_labels"])}
        mode = "L" if gt.max(initial=0) <= 255 else "I"
        original = self.input_file_to_gt_file[input["file_name"]]
        with tempfile.TemporaryDirectory(prefix="sparseclip_center_crop_") as tmp:
            path = f"{tmp}/gt.png"
            Image.fromarray(gt.astype(np.uint8) if mode == "L" else gt, mode=mode).save(path)
            self.input_file_to_gt_file[input["file_name"]] = path
            try:
                super().process([input], [output])
            finally:
                self.input_file_to_gt_file[input["file_name"]] = original

    def evaluate(self):
        extra = self._extra
        if self._distributed:  # every process calls all_gather, before SemSegEvaluator's own
            from detectron2.utils import comm

            states = comm.all_gather(self._extra.state())
            extra = SemSegExtraMetrics(self._num_gt_classes, self._gt_ignore, boundary=self._extra.boundary,
                                       dilation_ratio=self._extra.dilation_ratio,
                                       dilation_pixels=self._extra.dilation_pixels)
            for state in states:
                extra.merge_state(state)
        results = super().evaluate()
        if not results or "sem_seg" not in results:
            return results
        results["sem_seg"].update(extra.results(self._class_names))
        renamed = OrderedDict()
        for key, value in results["sem_seg"].items():
            for prefix in ("IoU-", "ACC-", "BoundaryIoU-", "min(IoU, B-Iou)-"):
                if key.startswith(prefix) and key[len(prefix):] in self._display:
                    key = prefix + self._display[key[len(prefix):]]
                    break
            renamed[key] = value
        return OrderedDict([("sem_seg", renamed)] + [(k, v) for k, v in results.items() if k != "sem_seg"])


def boundary_iou_setting(cfg):
    """``(dilation ratio, dilation pixels)`` of ``TEST.BOUNDARY_IOU``, or None when it is off
    (the defaults when ``cfg`` is None)."""
    if cfg is None:
        return (DEFAULT_DILATION_RATIO, 0)
    b = cfg.TEST.get("BOUNDARY_IOU", None)
    if b is None:
        return (DEFAULT_DILATION_RATIO, 0)
    return (float(b.DILATION_RATIO), int(b.DILATION_PIXELS)) if b.ENABLED else None


@EVALUATOR_REGISTRY.register()
def sem_seg(cfg, dataset_name: str, output_folder: Optional[str] = None) -> DatasetEvaluator:
    """Segmentation datasets (``evaluator_type`` "sem_seg"): :class:`SparseCLIPSemSegEvaluator`;
    for a dataset whose metadata names a ``benchmark``, that benchmark's evaluator from
    :data:`BENCHMARK_EVALUATORS` (MESS's: ``evaluation/mess_benchmark.py``)."""
    benchmark = MetadataCatalog.get(dataset_name).get("benchmark", None)
    if benchmark is not None:
        if benchmark not in BENCHMARK_EVALUATORS:
            raise ValueError(f"dataset {dataset_name!r} is of benchmark {benchmark!r} (its metadata), whose evaluator "
                             f"is not registered; registered: {', '.join(sorted(BENCHMARK_EVALUATORS)) or 'none'} "
                             "(MESS's needs its package: pip install -e '.[mess]')")
        return BENCHMARK_EVALUATORS[benchmark](cfg, dataset_name, output_folder)
    return SparseCLIPSemSegEvaluator(dataset_name, distributed=True, output_dir=output_folder,
                                     center_crop=cfg.INPUT.get("CENTER_CROP_TEST", 0) if cfg is not None else 0,
                                     boundary_iou=boundary_iou_setting(cfg))


def build_evaluator(cfg, dataset_name: str, output_folder: Optional[str] = None) -> DatasetEvaluator:
    """The evaluator of ``dataset_name`` chosen by its metadata ``evaluator_type``.

    Raises:
        ValueError: the dataset has no ``evaluator_type`` or no evaluator is registered for it.
    """
    evaluator_type = registered_evaluator_type(dataset_name, EVALUATOR_REGISTRY, "evaluator")
    return EVALUATOR_REGISTRY.get(evaluator_type)(cfg, dataset_name, output_folder)
