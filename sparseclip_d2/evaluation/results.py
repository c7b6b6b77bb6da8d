"""``results.json`` of an evaluation run, next to detectron2's printed table.

Layout::

    {"<dataset>": {"mIoU": .., "fwIoU": .., "mACC": .., "pACC": .., "num_images": N,
                   "seconds_per_image": ..},          # sem_seg datasets
     "<fgovd dataset>": {"top1": .., ..., "num_images": N, "seconds_per_image": ..},
     "config": {...}, "random_weights": bool,
     "max_images": N, "partial": true}                # only when TEST.MAX_IMAGES > 0
"""
import json
import math
import os
from typing import Any, Dict, Mapping

import yaml

__all__ = ["SEM_SEG_KEYS", "dataset_summary", "build_results", "write_results"]

SEM_SEG_KEYS = ("mIoU", "fwIoU", "mACC", "pACC")


def _json_number(x: Any) -> Any:
    if hasattr(x, "item"):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def dataset_summary(task_results: Mapping[str, Mapping[str, Any]], num_images: int,
                    seconds_per_image: float) -> Dict[str, Any]:
    """One dataset's entry from an evaluator's ``{task: {metric: value}}`` result.

    ``sem_seg`` results keep the four summary metrics and all per-class IoUs under
    ``"per_class_IoU"``; other tasks (FG-OVD) keep all their scalar metrics.
    """
    summary: Dict[str, Any] = {}
    for task, metrics in task_results.items():
        if task == "sem_seg":
            for k in SEM_SEG_KEYS:
                summary[k] = _json_number(metrics[k])
            summary["per_class_IoU"] = {
                k[len("IoU-"):]: _json_number(v) for k, v in metrics.items() if k.startswith("IoU-")
            }
        else:
            for k, v in metrics.items():
                v = _json_number(v)
                if isinstance(v, (int, float, str, bool)) or v is None:
                    summary[k] = v
    summary["num_images"] = int(num_images)
    summary["seconds_per_image"] = float(seconds_per_image)
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


def write_results(results: Mapping[str, Any], output_dir: str, filename: str = "results.json") -> str:
    """Write ``results`` as indented JSON into ``output_dir``; returns the path."""
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, filename)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=2, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)
    return path
