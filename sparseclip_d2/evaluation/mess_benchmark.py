"""MESS's own evaluator (``mess-benchmark`` 0.2, the ``mess`` extra) behind detectron2's
``DatasetEvaluator`` interface, for the datasets MESS registered
(``sparseclip_d2.data.datasets.mess_benchmark``; metadata ``benchmark`` ``"mess"``).

``build_evaluator`` gives such a dataset (``evaluator_type`` "sem_seg"; this module registers
itself in ``build.BENCHMARK_EVALUATORS``) a
:class:`SparseCLIPMESSEvaluator`: this project's :class:`~sparseclip_d2.evaluation.build.
SparseCLIPSemSegEvaluator` (each mask checked, label-map outputs, the centre-crop protocol,
display names) over MESS's ``MESSSemSegEvaluator``
(``mess/evaluation/sem_seg_evaluation.py``), whose ``evaluate`` computes the metrics: mIoU,
fwIoU, mACC, pACC, the class-of-interest means CoI-mIoU / CoI-mACC (metadata
``classes_of_interest``) and, on two-class datasets, Specificity (class 0's accuracy) and
Sensitivity (class 1's). Nothing of MESS's is re-implemented here.

Added around it:

- the evaluator's result gets a second task, ``"mess"``, with MESS's own metrics (those of
  :data:`MESS_METRICS` it reports): ``results.json`` keeps every scalar of a task other than
  ``sem_seg`` (``evaluation/results.py``), so the dataset's entry holds them beside mIoU;
- ``results_extras``: ``benchmark``, and MESS's name and domain of the dataset
  (``mess/evaluation/mess_evaluation.py`` ``dataset_names`` / ``dataset_domains``; None for
  the variants MESS does not report, e.g. ``*_official``);
- MESS's ``evaluate`` saves its metrics in ``<output>/sem_seg_evaluation.pth`` as numpy
  scalars, which ``torch.load``'s default ``weights_only=True`` (torch >= 2.6) refuses, so that
  MESS's own ``mess_evaluation.py`` could not read them; the file is written again with the
  same keys as plain Python floats (values unchanged).
"""
import logging
import os
from collections import OrderedDict
from typing import Any, Dict, Optional

import torch

from detectron2.data import MetadataCatalog

from ..data.datasets.mess_benchmark import MESS_BENCHMARK, MESS_REQUIREMENT, is_mess_dataset
from .build import BENCHMARK_EVALUATORS, SparseCLIPSemSegEvaluator, boundary_iou_setting
from .sem_seg_metrics import DEFAULT_DILATION_RATIO

try:
    from mess.evaluation.sem_seg_evaluation import MESSSemSegEvaluator
except ImportError as e:  # pragma: no cover - the package is the optional `mess` extra
    raise ImportError(f"MESS's evaluator needs its package: pip install {MESS_REQUIREMENT!r} (the `mess` extra: "
                      f"pip install -e .[mess]; scripts/setup.sh installs it): {e}") from e

__all__ = ["MESS_METRICS", "MESS_RESULTS_FILE", "SparseCLIPMESSEvaluator", "mess_dataset_info", "build_mess_evaluator"]

logger = logging.getLogger(__name__)

#: The metrics MESS adds to detectron2's (mess/evaluation/sem_seg_evaluation.py ``evaluate``);
#: Specificity / Sensitivity only on two-class datasets.
MESS_METRICS = ("CoI-mIoU", "CoI-mACC", "Specificity", "Sensitivity")
#: The file MESS's evaluator writes and its ``mess_evaluation.py`` reads (``<model output>/<dataset>/**/``).
MESS_RESULTS_FILE = "sem_seg_evaluation.pth"


def mess_dataset_info(dataset_name: str) -> Dict[str, Optional[str]]:
    """MESS's display name and domain of a dataset (``mess/evaluation/mess_evaluation.py``),
    None for a registered variant that MESS's table does not report."""
    from mess.evaluation.mess_evaluation import dataset_domains, dataset_names

    return {"mess_dataset": dataset_names.get(dataset_name), "mess_domain": dataset_domains.get(dataset_name)}


class SparseCLIPMESSEvaluator(SparseCLIPSemSegEvaluator, MESSSemSegEvaluator):
    """:class:`SparseCLIPSemSegEvaluator` whose ``evaluate`` is MESS's (method resolution:
    this class, ours, ``MESSSemSegEvaluator``, detectron2's ``SemSegEvaluator``)."""

    def __init__(self, dataset_name: str, distributed: bool = True, output_dir: Optional[str] = None,
                 center_crop: int = 0, boundary_iou=(DEFAULT_DILATION_RATIO, 0)):
        if not is_mess_dataset(dataset_name):
            raise ValueError(f"dataset {dataset_name!r} was not registered by MESS's package (metadata benchmark "
                             f"{MetadataCatalog.get(dataset_name).get('benchmark', None)!r}); use the sem_seg evaluator")
        super().__init__(dataset_name, distributed=distributed, output_dir=output_dir, center_crop=center_crop,
                         boundary_iou=boundary_iou)
        self._mess_info = mess_dataset_info(dataset_name)

    def results_extras(self) -> Dict[str, Any]:
        return dict(benchmark="MESS", **self._mess_info)

    def evaluate(self):
        results = super().evaluate()
        if not results or "sem_seg" not in results:
            return results
        self._save_plain_floats()
        mess = OrderedDict((k, float(results["sem_seg"][k])) for k in MESS_METRICS if k in results["sem_seg"])
        logger.info("MESS metrics of %s: %s", self._dataset_name,
                    ", ".join(f"{k} {v:.4f}" for k, v in mess.items()))
        return OrderedDict(list(results.items()) + [("mess", mess)])

    def _save_plain_floats(self) -> None:
        if not self._output_dir:
            return
        path = os.path.join(self._output_dir, MESS_RESULTS_FILE)
        if not os.path.isfile(path):
            return
        saved = torch.load(path, weights_only=False)  # written a moment ago by MESS's evaluate in this process
        tmp = path + ".tmp"
        torch.save({str(k): float(v) for k, v in saved.items()}, tmp)
        os.replace(tmp, path)


def build_mess_evaluator(cfg, dataset_name: str, output_folder: Optional[str] = None) -> SparseCLIPMESSEvaluator:
    """The evaluator of a MESS dataset (called by ``build.sem_seg`` for ``benchmark`` "mess")."""
    return SparseCLIPMESSEvaluator(dataset_name, distributed=True, output_dir=output_folder,
                                   center_crop=cfg.INPUT.get("CENTER_CROP_TEST", 0) if cfg is not None else 0,
                                   boundary_iou=boundary_iou_setting(cfg))


BENCHMARK_EVALUATORS[MESS_BENCHMARK] = build_mess_evaluator
