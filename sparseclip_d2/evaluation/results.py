"""``results.json`` of an evaluation run, next to detectron2's printed table.

Layout::

    {"<dataset>": {"mIoU": .., "fwIoU": .., "mACC": .., "pACC": .., "num_images": N,
                   "seconds_per_image": .., "zero_IoU_share": .., "boundary_IoU": ..,
                   "per_class_IoU": {..}, "per_class_boundary_IoU": {..}},  # sem_seg datasets
     "<fgovd dataset>": {"top1": .., ..., "num_images": N, "seconds_per_image": ..,
                         "num_negatives": N, "conventions": {..}},  # evaluator.results_extras()
     "config": {...}, "random_weights": bool,
     "max_images": N, "partial": true}                # only when TEST.MAX_IMAGES > 0

A run that fails (or is interrupted) leaves no ``results.json`` but ``error.json``
(``{"type", "message", "traceback"}``): :func:`begin_results` removes both at the start
of a run, :class:`RecordFailures` writes ``error.json`` when the run raises, and
:func:`write_results` writes ``results.json`` atomically at the end.

An evaluator may define ``results_extras() -> dict``: its (JSON-able) entries are added to
its dataset's entry. The functions of :data:`SUMMARY_HOOK_REGISTRY` (an fvcore ``Registry``;
``summaries -> summaries``) run once all datasets of a run are evaluated, in registration
order (FG-OVD registers ``fgovd_mhme``), through :func:`finalize_summaries`.
"""
import logging
import math
import os
import traceback
from typing import Any, Callable, Dict, Mapping, Optional

import yaml
from fvcore.common.registry import Registry

from ..common.io import atomic_write_json
from ..common.errors import explain

__all__ = ["SEM_SEG_KEYS", "SEM_SEG_EXTRA_KEYS", "RESULTS_FILE", "ERROR_FILE", "SUMMARY_HOOK_REGISTRY", "dataset_summary", "finalize_summaries",
           "build_results", "write_results", "begin_results", "write_error", "RecordFailures"]

logger = logging.getLogger(__name__)

RESULTS_FILE = "results.json"
ERROR_FILE = "error.json"
# The output folder of the run in progress in this process (set by begin_results).
_ACTIVE_OUTPUT_DIR: Optional[str] = None

SEM_SEG_KEYS = ("mIoU", "fwIoU", "mACC", "pACC")
#: Kept when the evaluator reports them (evaluation/sem_seg_metrics.py): the share of the classes
#: present in the ground truth whose IoU is 0 (percent) and its counts, the boundary IoU (percent)
#: and the boundary width it used.
SEM_SEG_EXTRA_KEYS = ("zero_IoU_share", "zero_IoU_classes", "classes_present", "boundary_IoU",
                      "boundary_dilation_ratio", "boundary_dilation_pixels", "boundary_width_min",
                      "boundary_width_max")


SUMMARY_HOOK_REGISTRY = Registry("SPARSECLIP_SUMMARY_HOOK")
SUMMARY_HOOK_REGISTRY.__doc__ = """
Run-level hooks ``fn(summaries) -> summaries`` (summaries: dataset name -> results.json
entry), applied by :func:`finalize_summaries` in registration order.
"""


def finalize_summaries(summaries: Dict[str, Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """Apply every :data:`SUMMARY_HOOK_REGISTRY` function, in registration order."""
    for _, hook in SUMMARY_HOOK_REGISTRY:
        summaries = hook(summaries)
    return summaries


def _json_number(x: Any) -> Any:
    if hasattr(x, "item"):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def dataset_summary(task_results: Mapping[str, Mapping[str, Any]], num_images: int,
                    seconds_per_image: float, extras: Mapping[str, Any] = None) -> Dict[str, Any]:
    """One dataset's entry from an evaluator's ``{task: {metric: value}}`` result.

    ``sem_seg`` results keep the four summary metrics and all per-class IoUs under
    ``"per_class_IoU"``; other tasks (FG-OVD) keep all their scalar metrics. ``extras``
    (an evaluator's ``results_extras()``) are added as they are.
    """
    summary: Dict[str, Any] = {}
    for task, metrics in task_results.items():
        if task == "sem_seg":
            for k in SEM_SEG_KEYS:
                summary[k] = _json_number(metrics[k])
            for k in SEM_SEG_EXTRA_KEYS:
                if k in metrics:
                    summary[k] = _json_number(metrics[k])
            summary["per_class_IoU"] = {
                k[len("IoU-"):]: _json_number(v) for k, v in metrics.items() if k.startswith("IoU-")
            }
            boundary = {k[len("BoundaryIoU-"):]: _json_number(v) for k, v in metrics.items()
                        if k.startswith("BoundaryIoU-")}
            if boundary:
                summary["per_class_boundary_IoU"] = boundary
        else:
            for k, v in metrics.items():
                v = _json_number(v)
                if isinstance(v, (int, float, str, bool)) or v is None:
                    summary[k] = v
    summary["num_images"] = int(num_images)
    summary["seconds_per_image"] = float(seconds_per_image)
    summary.update(extras or {})
    return summary


def build_results(per_dataset: Mapping[str, Dict[str, Any]], cfg, *, random_weights: bool) -> Dict[str, Any]:
    """The whole ``results.json`` dict."""
    results: Dict[str, Any] = dict(per_dataset)
    results["config"] = yaml.safe_load(cfg.dump())
    results["random_weights"] = bool(random_weights)
    max_images = int(cfg.TEST.MAX_IMAGES)
    if max_images > 0:
        results["max_images"] = max_images
        results["partial"] = True
    return results


def write_results(results: Mapping[str, Any], output_dir: str, filename: str = RESULTS_FILE) -> str:
    """Write ``results`` as indented JSON into ``output_dir`` atomically (temporary file +
    ``os.replace``: a reader never sees half a file); returns the path."""
    return atomic_write_json(os.path.join(output_dir, filename), dict(results), allow_nan=True)


def _is_main_process() -> bool:
    from detectron2.utils import comm

    return comm.is_main_process()


def begin_results(output_dir: str) -> None:
    """Start a run in ``output_dir``: remove the ``results.json`` and ``error.json`` of an
    earlier run (so that an interrupted or failing run never leaves a result that looks
    finished beside its own ``config.yaml``) and remember the folder for
    :class:`RecordFailures`. Only the main process touches the files."""
    global _ACTIVE_OUTPUT_DIR
    _ACTIVE_OUTPUT_DIR = output_dir
    if not _is_main_process():
        return
    for name in (RESULTS_FILE, ERROR_FILE):
        path = os.path.join(output_dir, name)
        if os.path.exists(path):
            os.remove(path)
            logger.info("removed %s of an earlier run", path)


def write_error(output_dir: str, exc: BaseException) -> str:
    """Write ``error.json`` (``{"type", "message", "traceback"}`` of ``exc``) atomically."""
    record = {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    }
    return atomic_write_json(os.path.join(output_dir, ERROR_FILE), record)


class RecordFailures:
    """Wrap a ``main(args)`` so that an exception it raises (``KeyboardInterrupt`` included)
    is written to ``error.json`` of the folder given to :func:`begin_results`, then re-raised.
    A class (not a closure) so that detectron2's ``launch`` can pickle it for workers."""

    def __init__(self, main: Callable):
        self.main = main

    def __call__(self, *args, **kwargs):
        try:
            return self.main(*args, **kwargs)
        except BaseException as e:
            if _ACTIVE_OUTPUT_DIR is not None and _is_main_process():
                try:
                    path = write_error(_ACTIVE_OUTPUT_DIR, e)
                    # a user mistake or Ctrl-C is said in one line by the entry point
                    # (common/errors.py); a bug's traceback follows this line
                    mistake = isinstance(e, KeyboardInterrupt) or explain(e, strict=True) is not None
                    (logger.debug if mistake else logger.error)(
                        "run failed: %s: %s (details in %s)", type(e).__name__, e, path)
                except OSError as write_failure:  # never hide the run's own exception
                    logger.error("could not write %s: %s", ERROR_FILE, write_failure)
            raise
