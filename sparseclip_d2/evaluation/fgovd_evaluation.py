"""FG-OVD region-recognition evaluator (rank of the positive caption among 1 + N).

Model outputs consumed (one dict per image, see ``sparseclip_d2.modeling.fgovd``)::

    output["fgovd"] = {
        "scores":  (K, 1 + N) float tensor, column 0 the positive caption, columns 1..N the
                   negatives in file order (cosine similarities; any monotone score works),
        "matched": (K,) bool tensor, False for a box that no region could be matched to
                   (proposal mode: no proposal with IoU >= threshold); its scores are ignored,
        "ann_ids": (K,) long tensor, the annotation ids of the boxes,
    }

and from the mapped input dict: ``image_id`` and ``fgovd_num_dropped`` (boxes of the image
dropped by the N-negatives rule; 0 when absent).
"""
import copy
import itertools
import json
import logging
import math
import os
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence

import torch
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.evaluation import DatasetEvaluator
from detectron2.utils import comm
from detectron2.utils.file_io import PathManager

__all__ = [
    "FGOVDEvaluator",
    "fgovd_ranks",
    "fgovd_metrics",
    "median",
    "add_mhme",
    "build_fgovd_evaluator",
    "MHME_SPLITS",
]

logger = logging.getLogger(__name__)

MHME_SPLITS = ("hard", "medium", "easy")


def fgovd_ranks(scores: torch.Tensor, matched: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Rank of the positive caption (column 0) among the ``1 + N`` captions of each box.

    Ties are ranked pessimistically: ``rank = 1 + #{negatives j : score_j >= score_pos}``, so
    a box whose positive ties with a negative is never counted as ranked first. A box with
    ``matched`` False gets the worst rank ``N + 1`` (a miss).

    Args:
        scores: ``(K, 1 + N)`` scores.
        matched: ``(K,)`` bool, or None (all matched).

    Returns:
        ``(K,)`` long ranks in ``[1, N + 1]``.

    Raises:
        ValueError: a matched box has a non-finite score (NaN would silently compare False).
    """
    if scores.dim() != 2 or scores.shape[1] < 2:
        raise ValueError(f"scores must be (K, 1 + N) with N >= 1, got shape {tuple(scores.shape)}")
    k, c = scores.shape
    if matched is None:
        matched = torch.ones(k, dtype=torch.bool, device=scores.device)
    matched = matched.to(dtype=torch.bool, device=scores.device)
    if matched.shape != (k,):
        raise ValueError(f"matched must be ({k},), got {tuple(matched.shape)}")
    if k and not torch.isfinite(scores[matched]).all():
        bad = (~torch.isfinite(scores) & matched[:, None]).any(1).nonzero().flatten().tolist()
        raise ValueError(f"non-finite scores for matched boxes at rows {bad}")
    ranks = 1 + (scores[:, 1:] >= scores[:, :1]).sum(dim=1)
    return torch.where(matched, ranks, torch.full_like(ranks, c)).long()


def median(values: Sequence[float]) -> float:
    """Median; for an even count, the mean of the two middle values (NaN when empty)."""
    v = sorted(float(x) for x in values)
    n = len(v)
    if n == 0:
        return float("nan")
    mid = n // 2
    return v[mid] if n % 2 else (v[mid - 1] + v[mid]) / 2.0


def fgovd_metrics(ranks: Sequence[int], num_dropped: int = 0, num_missed: int = 0) -> Dict[str, float]:
    """Dataset metrics from the per-box ranks.

    Returns:
        ``top1`` (% of evaluated boxes ranked first), ``mean_rank``, ``median_rank`` (even
        count: mean of the two middle ranks), ``num_boxes`` (evaluated boxes, misses
        included), ``num_dropped`` (boxes dropped by the N-negatives rule) and
        ``num_missed`` (boxes without a matching proposal; they count with the worst rank).
        With no evaluated box the three scores are NaN (and a warning is logged).
    """
    ranks = [int(r) for r in ranks]
    n = len(ranks)
    if n == 0:
        logger.warning("FG-OVD: no box evaluated (%d dropped); metrics are NaN", num_dropped)
        top1 = mean_rank = float("nan")
    else:
        top1 = 100.0 * sum(1 for r in ranks if r == 1) / n
        mean_rank = sum(ranks) / n
    return OrderedDict(
        top1=top1,
        mean_rank=mean_rank,
        median_rank=median(ranks),
        num_boxes=n,
        num_dropped=int(num_dropped),
        num_missed=int(num_missed),
    )


class FGOVDEvaluator(DatasetEvaluator):
    """Fine-grained region recognition: the rank of each box's positive caption.

    Per box, the rank of the positive among its ``1 + N`` captions, with ties ranked
    **pessimistically** (``rank = 1 + number of negatives scoring >= the positive``); a box
    that could not be matched to a region (proposal mode) counts as a miss with the worst
    rank ``N + 1``, as the official rank metric does. Per dataset: ``top1`` (% of boxes ranked
    first), ``mean_rank``, ``median_rank`` (for an even number of boxes the mean of the two
    middle ranks), ``num_boxes``, ``num_dropped`` (boxes with fewer than N negatives, removed
    by the mapper) and ``num_missed``.

    Distributed: every process keeps the records of its own images; :meth:`evaluate` gathers
    them on the main process (``detectron2.utils.comm.gather``), which alone returns the
    results (the others return ``{}``). State is per instance and cleared by :meth:`reset`.
    """

    def __init__(self, dataset_name: str, output_dir: Optional[str] = None, distributed: bool = True):
        """
        Args:
            dataset_name: registered FG-OVD dataset (used for logging and the output file).
            output_dir: when given, per-box ranks are written to
                ``<output_dir>/fgovd_ranks.json`` on the main process.
            distributed: gather over all processes (no-op in a single process).
        """
        self._dataset_name = dataset_name
        self._output_dir = output_dir
        self._distributed = distributed
        self.reset()

    def reset(self):
        self._boxes: List[dict] = []
        self._dropped: List[int] = []

    def process(self, inputs, outputs):
        """Record the per-box ranks of a batch. See the module docstring for the formats."""
        for inp, out in zip(inputs, outputs):
            if "fgovd" not in out:
                raise KeyError(
                    f"FGOVDEvaluator({self._dataset_name}): model output for image "
                    f"{inp.get('image_id')} lacks 'fgovd'; keys: {sorted(out)}"
                )
            pred = out["fgovd"]
            scores = pred["scores"].detach().float().cpu()
            matched = pred["matched"].detach().cpu()
            ann_ids = pred["ann_ids"].detach().cpu().tolist()
            if scores.shape[0] != len(ann_ids):
                raise ValueError(
                    f"image {inp.get('image_id')}: {scores.shape[0]} score rows for {len(ann_ids)} boxes"
                )
            ranks = fgovd_ranks(scores, matched).tolist() if ann_ids else []
            n_neg = scores.shape[1] - 1 if scores.dim() == 2 else 0
            for aid, r, m in zip(ann_ids, ranks, matched.tolist()):
                self._boxes.append(
                    {"image_id": inp.get("image_id"), "ann_id": int(aid), "rank": int(r),
                     "matched": bool(m), "num_negatives": n_neg}
                )
            self._dropped.append(int(inp.get("fgovd_num_dropped", 0)))

    def evaluate(self):
        """Return ``{"fgovd": {top1, mean_rank, median_rank, num_boxes, num_dropped,
        num_missed}}`` on the main process, ``{}`` elsewhere."""
        if self._distributed and comm.get_world_size() > 1:
            comm.synchronize()
            boxes = comm.gather(self._boxes, dst=0)
            dropped = comm.gather(self._dropped, dst=0)
            if not comm.is_main_process():
                return {}
            boxes = list(itertools.chain(*boxes))
            dropped = list(itertools.chain(*dropped))
        else:
            boxes, dropped = self._boxes, self._dropped

        if self._output_dir:
            PathManager.mkdirs(self._output_dir)
            path = os.path.join(self._output_dir, "fgovd_ranks.json")
            with PathManager.open(path, "w") as f:
                json.dump(boxes, f)
            logger.info("FG-OVD per-box ranks of %s written to %s", self._dataset_name, path)

        metrics = fgovd_metrics(
            [b["rank"] for b in boxes],
            num_dropped=sum(dropped),
            num_missed=sum(1 for b in boxes if not b["matched"]),
        )
        logger.info(
            "FG-OVD %s: top1 %.2f, mean rank %.3f, median rank %.1f over %d boxes "
            "(%d dropped, %d missed)",
            self._dataset_name, metrics["top1"], metrics["mean_rank"], metrics["median_rank"],
            metrics["num_boxes"], metrics["num_dropped"], metrics["num_missed"],
        )
        return OrderedDict(fgovd=metrics)


def build_fgovd_evaluator(cfg, dataset_name: str, output_folder: Optional[str] = None) -> FGOVDEvaluator:
    """Evaluator factory registered as ``"fgovd"`` in ``EVALUATOR_FACTORIES``."""
    return FGOVDEvaluator(dataset_name, output_dir=output_folder)


def _fgovd_split(name: str) -> Optional[str]:
    """The FG-OVD split of a registered dataset name (metadata ``split``), else None."""
    if name not in DatasetCatalog.list():
        return None
    md = MetadataCatalog.get(name)
    if md.get("evaluator_type", None) != "fgovd":
        return None
    return md.get("split", None)


def _top1_of(entry) -> Optional[float]:
    """top1 of a dataset entry, nested ``{"fgovd": {"top1": ..}}`` or flat ``{"top1": ..}``."""
    if not isinstance(entry, dict):
        return None
    if isinstance(entry.get("fgovd"), dict) and "top1" in entry["fgovd"]:
        return entry["fgovd"]["top1"]
    return entry.get("top1", None)


def add_mhme(results: Dict[str, dict]) -> Dict[str, dict]:
    """Add mHME (mean top1 of the Hard, Medium and Easy splits) to a results dict.

    Args:
        results: per-dataset results keyed by dataset name, either as the evaluators return
            them (``{name: {"fgovd": {"top1": ..}}}``, detectron2's nested form) or flattened
            as in ``results.json`` (``{name: {"top1": .., ...}}``). Other entries are left
            alone. Datasets are identified by their metadata ``evaluator_type == "fgovd"``
            and ``split`` (so re-registered copies of a split count too).

    Returns:
        A copy of ``results``. When exactly one evaluated dataset of each of the splits hard,
        medium and easy is present, it has the extra entry ``"fgovd_mHME"``:
        ``{"mHME": mean, "hard": top1, "medium": top1, "easy": top1}``, nested under
        ``"fgovd"`` when the split entries were nested. Otherwise (logged when only some
        splits are present) nothing is added. A NaN/None top1 makes mHME NaN.
    """
    out = copy.deepcopy(results)
    found: Dict[str, List[float]] = {s: [] for s in MHME_SPLITS}
    nested = False
    for name, res in results.items():
        split = _fgovd_split(name)
        if split in found:
            top1 = _top1_of(res)
            if top1 is None and not (isinstance(res, dict) and ("fgovd" in res or "top1" in res)):
                continue
            found[split].append(float("nan") if top1 is None else float(top1))
            nested = nested or isinstance(res.get("fgovd"), dict)
    present = [s for s in MHME_SPLITS if found[s]]
    if not present:
        return out
    if len(present) < len(MHME_SPLITS) or any(len(v) > 1 for v in found.values()):
        logger.info(
            "mHME not computed: needs exactly one dataset of each FG-OVD split %s, found %s",
            MHME_SPLITS, {s: len(v) for s, v in found.items()},
        )
        return out
    top1 = {s: found[s][0] for s in MHME_SPLITS}
    mhme = sum(top1.values()) / len(MHME_SPLITS)
    if any(math.isnan(v) for v in top1.values()):
        logger.warning("mHME is NaN: a split has no top1 (%s)", top1)
    entry = OrderedDict(mHME=mhme, **top1)
    out["fgovd_mHME"] = {"fgovd": entry} if nested else dict(entry)
    logger.info("FG-OVD mHME (mean top1 of hard, medium, easy): %.2f", mhme)
    return out


def _register_factory() -> None:
    from .build import EVALUATOR_FACTORIES

    EVALUATOR_FACTORIES["fgovd"] = build_fgovd_evaluator


_register_factory()
