"""FG-OVD region-recognition evaluator (rank of the positive caption among 1 + N).

Model outputs consumed (one dict per image, see ``sparseclip_d2.modeling.fgovd``)::

    output["fgovd"] = {
        "scores":       (K, C) float, column 0 the positive caption, then the box's negatives
                        in file order (NaN beyond a row's own captions),
        "num_captions": (K,) long, captions of each box (1 + its negatives); optional, C,
        "matched":      (K,) bool, False for a box no region could be matched to (proposal
                        mode); it counts as a miss with the worst rank,
        "ann_ids":      (K,) long, the annotation ids of the boxes,
    }

The N-negatives rule, the tie rule and the median follow
:class:`~sparseclip_d2.modeling.fgovd_conventions.FGOVDConventions`.
"""
import copy
import itertools
import json
import logging
import math
import os
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.evaluation import DatasetEvaluator, print_csv_format
from detectron2.utils import comm

from ..common.io import atomic_write_text
from ..data.datasets.fgovd import resolve_num_negatives
from ..modeling.fgovd_conventions import CONVENTION_CHOICES, FGOVD_CONVENTION_PRESETS, FGOVDConventions, conventions_from_config
from .build import EVALUATOR_REGISTRY
from .results import SUMMARY_HOOK_REGISTRY

__all__ = [
    "FGOVDEvaluator",
    "fgovd_ranks",
    "fgovd_metrics",
    "median",
    "add_mhme",
    "fgovd",
    "fgovd_mhme",
    "MHME_SPLITS",
]

logger = logging.getLogger(__name__)

MHME_SPLITS = ("hard", "medium", "easy")


def fgovd_ranks(
    scores: torch.Tensor,
    num_negatives: int,
    num_captions: Optional[torch.Tensor] = None,
    matched: Optional[torch.Tensor] = None,
    min_negatives: str = "drop",
    ties: str = "miss",
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rank of the positive caption (column 0) of each box among itself and its first N negatives.

    ``rank = 1 + #{negatives j : score_j >= score_pos}`` with ``ties="miss"`` (FG-OVD
    evaluation/ranks.py), ``1 + #{j : score_j > score_pos}`` with ``ties="hit"``
    (360CVGroup/FG-CLIP fgovd_eval.py). A box with fewer than N negatives is dropped
    (``min_negatives="drop"``) or ranked among the ones it has (``"keep"``). An unmatched box
    gets the worst rank ``1 + its negatives`` (a miss).

    Args:
        scores: ``(K, C)`` scores; row k valid in its first ``num_captions[k]`` columns.
        num_negatives: N >= 1.
        num_captions: ``(K,)``; None = C for every box.
        matched: ``(K,)`` bool; None = all matched.

    Returns:
        ``(ranks (K,) long, negatives used (K,) long, kept (K,) bool)``; dropped boxes have
        rank 0 and ``kept`` False.

    Raises:
        ValueError: bad shapes, an unknown convention, or a non-finite score among the
            captions a matched, kept box is ranked with.
    """
    if min_negatives not in CONVENTION_CHOICES["min_negatives"]:
        raise ValueError(f"unknown min_negatives {min_negatives!r}; valid: {', '.join(CONVENTION_CHOICES['min_negatives'])}")
    if ties not in CONVENTION_CHOICES["ties"]:
        raise ValueError(f"unknown ties {ties!r}; valid: {', '.join(CONVENTION_CHOICES['ties'])}")
    if int(num_negatives) < 1:
        raise ValueError(f"num_negatives must be >= 1, got {num_negatives}")
    if scores.dim() != 2 or scores.shape[1] < 1:
        raise ValueError(f"scores must be (K, 1 + N), got shape {tuple(scores.shape)}")
    k, c = scores.shape
    n = int(num_negatives)
    ncap = torch.full((k,), c, dtype=torch.long) if num_captions is None else num_captions.long().cpu()
    matched = torch.ones(k, dtype=torch.bool) if matched is None else matched.bool().cpu()
    if ncap.shape != (k,) or matched.shape != (k,):
        raise ValueError(f"num_captions and matched must be ({k},), got {tuple(ncap.shape)}, {tuple(matched.shape)}")
    if k and (ncap.min() < 1 or ncap.max() > c):
        raise ValueError(f"num_captions must be in [1, {c}], got {ncap.tolist()}")
    available = ncap - 1
    kept = available >= n if min_negatives == "drop" else torch.ones(k, dtype=torch.bool)
    used = torch.clamp(available, max=n)
    cols = torch.arange(1, c)[None, :]
    valid = cols <= used[:, None]  # (K, C - 1) the negatives each box is ranked with
    s = scores.detach().float().cpu()
    check = (matched & kept)[:, None] & torch.cat([torch.ones(k, 1, dtype=torch.bool), valid], 1)
    if k and not torch.isfinite(s[check]).all():
        bad = (check & ~torch.isfinite(s)).any(1).nonzero().flatten().tolist()
        raise ValueError(f"non-finite scores for matched boxes at rows {bad}")
    pos, neg = s[:, :1], s[:, 1:]
    above = (neg >= pos) if ties == "miss" else (neg > pos)
    ranks = 1 + (above & valid).sum(dim=1)
    ranks = torch.where(matched, ranks, 1 + used)
    ranks = torch.where(kept, ranks, torch.zeros_like(ranks))
    return ranks.long(), used, kept


def median(values: Sequence[float], definition: str = "mean") -> float:
    """Median rank (NaN when empty).

    ``definition``: "mean" - the middle value, for an even count the mean of the two middle
    values; "fgclip" - ``sorted(v)[n // 2]`` (lorebianchi98/FG-CLIP src/eval_util.py);
    "fgovd" - ``sorted(v)[n // 2 + 1]`` (lorebianchi98/FG-OVD evaluation/ranks.py
    get_median_rank; for n <= 2 that index is past the end, where the official code raises
    IndexError: the last value is taken).
    """
    if definition not in CONVENTION_CHOICES["median"]:
        raise ValueError(f"unknown median definition {definition!r}; valid: {', '.join(CONVENTION_CHOICES['median'])}")
    v = sorted(float(x) for x in values)
    n = len(v)
    if n == 0:
        return float("nan")
    if definition == "fgclip":
        return v[n // 2]
    if definition == "fgovd":
        return v[min(n // 2 + 1, n - 1)]
    mid = n // 2
    return v[mid] if n % 2 else (v[mid - 1] + v[mid]) / 2.0


def fgovd_metrics(ranks: Sequence[int], num_dropped: int = 0, num_missed: int = 0, num_short: int = 0,
                  median_definition: str = "mean") -> Dict[str, float]:
    """Dataset metrics from the per-box ranks of the evaluated boxes.

    Returns:
        ``top1`` (% of evaluated boxes ranked first), ``mean_rank``, ``median_rank`` (per
        ``median_definition``), ``num_boxes`` (evaluated boxes, misses included),
        ``num_dropped`` (boxes dropped by the N-negatives rule), ``num_missed`` (boxes
        without a matching proposal; worst rank) and ``num_short`` (boxes kept with fewer than
        N negatives). With no evaluated box the three scores are NaN (and a warning is logged).
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
        median_rank=median(ranks, median_definition),
        num_boxes=n,
        num_dropped=int(num_dropped),
        num_missed=int(num_missed),
        num_short=int(num_short),
    )


class FGOVDEvaluator(DatasetEvaluator):
    """Fine-grained region recognition: the rank of each box's positive caption among itself
    and its first N negatives, under the given :class:`FGOVDConventions`.

    Per dataset: ``top1``, ``mean_rank``, ``median_rank``, ``num_boxes``, ``num_dropped``,
    ``num_missed``, ``num_short`` (see :func:`fgovd_metrics`); :meth:`results_extras` gives
    N and the conventions for results.json.

    Distributed: every process keeps the records of its own images; :meth:`evaluate` gathers
    them on the main process (``detectron2.utils.comm.gather``), which alone returns the
    results (the others return ``{}``). State is per instance and cleared by :meth:`reset`.
    """

    def __init__(
        self,
        dataset_name: str,
        num_negatives: Optional[int] = None,
        conventions: Optional[FGOVDConventions] = None,
        output_dir: Optional[str] = None,
        distributed: bool = True,
    ):
        """
        Args:
            dataset_name: registered FG-OVD dataset.
            num_negatives: N; None = the dataset's metadata ``num_negatives``.
            conventions: None = the ``fgovd`` preset (the official FG-OVD rank evaluation).
            output_dir: when given, per-box ranks are written to
                ``<output_dir>/fgovd_ranks.json`` on the main process.
            distributed: gather over all processes (no-op in a single process).
        """
        self._dataset_name = dataset_name
        self._n = resolve_num_negatives(dataset_name, -1 if num_negatives is None else int(num_negatives))
        self._conventions = FGOVD_CONVENTION_PRESETS["fgovd"] if conventions is None else conventions
        self._output_dir = output_dir
        self._distributed = distributed
        self.reset()

    @property
    def num_negatives(self) -> int:
        return self._n

    @property
    def conventions(self) -> FGOVDConventions:
        return self._conventions

    def reset(self):
        self._boxes: List[dict] = []
        self._dropped: List[int] = []

    def process(self, inputs, outputs):
        """Record the per-box ranks of a batch. See the module docstring for the formats."""
        conv = self._conventions
        for inp, out in zip(inputs, outputs):
            if "fgovd" not in out:
                raise KeyError(
                    f"FGOVDEvaluator({self._dataset_name}): model output for image "
                    f"{inp.get('image_id')} lacks 'fgovd'; keys: {sorted(out)}"
                )
            pred = out["fgovd"]
            scores = pred["scores"].detach().float().cpu()
            ann_ids = pred["ann_ids"].detach().cpu().tolist()
            if scores.dim() != 2 or scores.shape[0] != len(ann_ids):
                raise ValueError(
                    f"image {inp.get('image_id')}: scores {tuple(scores.shape)} for {len(ann_ids)} boxes"
                )
            if not ann_ids:
                self._dropped.append(0)
                continue
            matched = pred["matched"].detach().cpu()
            ranks, used, kept = fgovd_ranks(
                scores, self._n, pred.get("num_captions"), matched, conv.min_negatives, conv.ties
            )
            for aid, r, u, m, k in zip(ann_ids, ranks.tolist(), used.tolist(), matched.tolist(), kept.tolist()):
                if k:
                    self._boxes.append({"image_id": inp.get("image_id"), "ann_id": int(aid), "rank": int(r),
                                        "matched": bool(m), "num_negatives": int(u)})
            self._dropped.append(int((~kept).sum()))

    def results_extras(self) -> Dict:
        """What results.json records next to the metrics: N and the conventions."""
        return {"num_negatives": self._n, "conventions": self._conventions.as_dict()}

    def evaluate(self):
        """Return ``{"fgovd": metrics}`` on the main process, ``{}`` elsewhere."""
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
            path = os.path.join(self._output_dir, "fgovd_ranks.json")
            atomic_write_text(path, json.dumps(boxes))  # never a half-written file after a crash
            logger.info("FG-OVD per-box ranks of %s written to %s", self._dataset_name, path)

        metrics = fgovd_metrics(
            [b["rank"] for b in boxes],
            num_dropped=sum(dropped),
            num_missed=sum(1 for b in boxes if not b["matched"]),
            num_short=sum(1 for b in boxes if b["num_negatives"] < self._n),
            median_definition=self._conventions.median,
        )
        logger.info(
            "FG-OVD %s (N=%d, %s): top1 %.2f, mean rank %.3f, median rank %.1f over %d boxes "
            "(%d dropped, %d missed, %d with fewer than N negatives)",
            self._dataset_name, self._n, self._conventions.as_dict(), metrics["top1"], metrics["mean_rank"],
            metrics["median_rank"], metrics["num_boxes"], metrics["num_dropped"], metrics["num_missed"],
            metrics["num_short"],
        )
        return OrderedDict(fgovd=metrics)


@EVALUATOR_REGISTRY.register()
def fgovd(cfg, dataset_name: str, output_folder: Optional[str] = None) -> FGOVDEvaluator:
    """FG-OVD datasets (``evaluator_type`` "fgovd"): :class:`FGOVDEvaluator`, N from
    ``MODEL.SPARSECLIP.FGOVD.NUM_NEGATIVES`` (-1: the split's), conventions from the config."""
    n = resolve_num_negatives(dataset_name, cfg.MODEL.SPARSECLIP.FGOVD.NUM_NEGATIVES)
    return FGOVDEvaluator(dataset_name, n, conventions_from_config(cfg), output_dir=output_folder)


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
    return out


@SUMMARY_HOOK_REGISTRY.register()
def fgovd_mhme(summaries: Dict[str, dict]) -> Dict[str, dict]:
    """Run-level hook (``SUMMARY_HOOK_REGISTRY``): :func:`add_mhme` on the results.json entries, and
    detectron2's csv table of it when computed."""
    out = add_mhme(summaries)
    if "fgovd_mHME" in out:
        logger.info("FG-OVD mHME (mean top1 of Hard, Medium, Easy):")
        print_csv_format({"fgovd_mHME": out["fgovd_mHME"]})
    return out

