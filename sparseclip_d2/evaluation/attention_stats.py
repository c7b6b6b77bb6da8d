"""Attention statistics of the modified last block against the ground truth
(``AttentionStatsEvaluator``). The statistics and the ``output["attention"]`` record they
read are defined in ``docs/diagnostics.md`` ("Reference definitions")."""
import logging
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from PIL import Image

from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.evaluation import DatasetEvaluator
from detectron2.utils import comm

from ..data.ground_truth import load_sem_seg_gt

__all__ = [
    "ROW_STAT_KEYS",
    "STAT_KEYS",
    "patch_labels",
    "resize_labels",
    "window_patch_labels",
    "row_statistics",
    "image_statistics",
    "reduce_image_statistics",
    "AttentionStatsEvaluator",
    "build_attention_stats_evaluator",
]

logger = logging.getLogger(__name__)

#: Per-row statistics, in the order of :func:`row_statistics`'s columns.
ROW_STAT_KEYS = (
    "same_class_mass", "non_class_mass", "background_mass", "self_mass", "cls_mass",
    "support_size", "support_fraction", "perplexity",
)
#: Keys of the dataset result (``results.json`` under the dataset).
STAT_KEYS = ROW_STAT_KEYS + ("attention_images", "attention_images_without_foreground", "attention_rows")

Box = Tuple[int, int, int, int]


# ---------------------------------------------------------------------------------- labels
def patch_labels(labels: np.ndarray, patch_size: int, ignore_label: int = 255) -> np.ndarray:
    """Majority label per ``patch_size x patch_size`` patch.

    Args:
        labels: ``(h * p, w * p)`` integer label map (``ignore_label`` for ignored pixels).
        patch_size: ``p``.
        ignore_label: counted as an ordinary value; it only matters for ties (smallest value
            wins, so real classes beat 255).

    Returns:
        ``(h, w)`` int64 array of patch labels.
    Raises:
        ValueError: the map's sides are not multiples of ``patch_size``.
    """
    labels = np.asarray(labels)
    if labels.ndim != 2:
        raise ValueError(f"labels must be a 2-D (H, W) map, got shape {labels.shape}")
    H, W = labels.shape
    p = int(patch_size)
    if p <= 0 or H % p or W % p or H == 0 or W == 0:
        raise ValueError(f"label map {H}x{W} is not a positive multiple of patch_size {patch_size}")
    h, w = H // p, W // p
    values, inverse = np.unique(labels.astype(np.int64), return_inverse=True)
    inverse = inverse.reshape(h, p, w, p).transpose(0, 2, 1, 3).reshape(h * w, p * p)
    U = len(values)
    counts = np.zeros((h * w, U), dtype=np.int64)
    np.add.at(counts, (np.repeat(np.arange(h * w), p * p), inverse.reshape(-1)), 1)
    # argmax returns the first maximum: the smallest value (np.unique is sorted).
    return values[counts.argmax(axis=1)].reshape(h, w)


def resize_labels(labels: np.ndarray, size: Tuple[int, int]) -> np.ndarray:
    """Nearest-neighbour resize of an ``(H, W)`` label map to ``size = (H', W')`` (PIL NEAREST,
    as detectron2 resizes segmentation maps). Returns int64."""
    labels = np.asarray(labels)
    out_h, out_w = int(size[0]), int(size[1])
    if labels.shape == (out_h, out_w):
        return labels.astype(np.int64)
    if labels.min() < 0 or labels.max() > 255:
        im = Image.fromarray(labels.astype(np.int32), mode="I")
    else:
        im = Image.fromarray(labels.astype(np.uint8), mode="L")
    return np.asarray(im.resize((out_w, out_h), Image.NEAREST), dtype=np.int64)


def window_patch_labels(labels: np.ndarray, box: Box, grid: Tuple[int, int], patch_size: int,
                        ignore_label: int = 255) -> np.ndarray:
    """Patch labels of one attention window.

    Args:
        labels: ``(H, W)`` labels of the resized image.
        box: ``(y1, y2, x1, x2)`` window in ``labels`` (end-exclusive).
        grid: ``(h, w)`` patch grid of the window's attention.
        patch_size: ``p``; the window is padded symmetrically (``symmetric_pad``, extra pixel
            right/bottom) to ``(h * p, w * p)`` with ``ignore_label``.

    Returns:
        ``(h, w)`` int64 patch labels.
    """
    y1, y2, x1, x2 = (int(v) for v in box)
    h, w = int(grid[0]), int(grid[1])
    p = int(patch_size)
    crop = np.asarray(labels)[y1:y2, x1:x2]
    if crop.shape != (y2 - y1, x2 - x1) or crop.size == 0:
        raise ValueError(f"window box {box} lies outside the label map {np.asarray(labels).shape}")
    ph, pw = h * p - crop.shape[0], w * p - crop.shape[1]
    if ph < 0 or pw < 0 or ph >= p or pw >= p:
        raise ValueError(
            f"window {crop.shape[0]}x{crop.shape[1]} does not pad to the grid {h}x{w} of patch {p} "
            "(expected less than one patch of padding per side)")
    top, left = ph // 2, pw // 2
    padded = np.full((h * p, w * p), ignore_label, dtype=np.int64)
    padded[top:top + crop.shape[0], left:left + crop.shape[1]] = crop
    return patch_labels(padded, p, ignore_label)


# ---------------------------------------------------------------------------------- statistics
def row_statistics(weights: torch.Tensor, labels: Union[np.ndarray, torch.Tensor], *,
                   ignore_label: int = 255, background_index: Optional[int] = None,
                   num_prefix_tokens: int = 1) -> torch.Tensor:
    """Statistics of the attention rows of the foreground query patches.

    Args:
        weights: ``(heads, T + h*w, T + h*w)`` attention, the ``T`` prefix tokens first (rows
            may sum to K).
        labels: ``(h, w)`` or ``(h*w,)`` patch labels (row-major like the tokens).
        ignore_label, background_index: patches with these labels are background/ignored.
        num_prefix_tokens: ``T``: 1 for a CLS token, 0 for SigLIP towers, 1 + registers.
            ``cls_mass`` is the mass on all prefix tokens (0 without any).

    Returns:
        ``(heads * F, 8)`` float64 tensor on CPU, columns :data:`ROW_STAT_KEYS`, one row per
        (head, foreground query) (head-major); ``F`` = number of foreground patches (0 rows
        when there are none).
    """
    if weights.dim() != 3 or weights.shape[-1] != weights.shape[-2]:
        raise ValueError(f"weights must be (heads, L, L), got shape {tuple(weights.shape)}")
    lab = torch.as_tensor(np.asarray(labels) if not torch.is_tensor(labels) else labels).reshape(-1).long()
    heads, L, _ = weights.shape
    T = int(num_prefix_tokens)
    if T < 0 or T >= L:
        raise ValueError(f"num_prefix_tokens={num_prefix_tokens!r} does not fit weights of shape {tuple(weights.shape)}")
    P = L - T
    if lab.numel() != P:
        raise ValueError(f"{lab.numel()} patch labels for {P} patch tokens after {T} prefix token(s) "
                         f"(weights {tuple(weights.shape)})")
    lab = lab.to(weights.device)
    bg = lab == int(ignore_label)
    if background_index is not None:
        bg |= lab == int(background_index)
    fg_idx = torch.nonzero(~bg).reshape(-1)
    Fn = int(fg_idx.numel())
    if Fn == 0:
        return torch.zeros((0, len(ROW_STAT_KEYS)), dtype=torch.float64)
    w = weights.double()
    rows = w[:, T + fg_idx, :]  # (heads, F, L)
    total = rows.sum(-1, keepdim=True)
    if bool((total <= 0).any()):
        raise ValueError("an attention row sums to zero or less; cannot normalise it")
    p = rows / total
    # Mass per label value present among the patches: (heads, F, U).
    values, compact = torch.unique(lab, return_inverse=True)
    onehot = torch.nn.functional.one_hot(compact, len(values)).double()  # (P, U)
    mass = p[..., T:] @ onehot
    q_compact = compact[fg_idx]  # (F,)
    own = mass.gather(-1, q_compact.view(1, Fn, 1).expand(heads, Fn, 1)).squeeze(-1)
    self_mass = p[:, torch.arange(Fn, device=p.device), T + fg_idx]
    same = own - self_mass
    value_is_bg = values == int(ignore_label)
    if background_index is not None:
        value_is_bg |= values == int(background_index)
    background = mass[..., value_is_bg].sum(-1)
    cls = p[..., :T].sum(-1)
    non = mass[..., ~value_is_bg].sum(-1) - own
    support = (p > 0).sum(-1).double()
    plogp = torch.where(p > 0, p * torch.log(p.clamp_min(torch.finfo(torch.float64).tiny)), torch.zeros_like(p))
    perplexity = torch.exp(-plogp.sum(-1))
    out = torch.stack([same, non.clamp_min(0.0), background, self_mass, cls, support, support / L, perplexity], -1)
    return out.reshape(heads * Fn, len(ROW_STAT_KEYS)).cpu()


def image_statistics(attention: Dict, labels: np.ndarray, *, ignore_label: int = 255,
                     background_index: Optional[int] = None) -> Optional[Dict[str, float]]:
    """One image's statistics from an ``output["attention"]`` record and its ground truth.

    Args:
        attention: the record (``docs/diagnostics.md``, ``modeling.attention_record``).
        labels: ``(H0, W0)`` ground truth at any size; resized (nearest) to
            ``attention["image_size"]``.

    Returns:
        ``{key: mean over (window, head, foreground query)}`` for :data:`ROW_STAT_KEYS` plus
        ``"attention_rows"`` (number of rows), or None when the image has no foreground patch.
    """
    weights, boxes, grids = _windows(attention)
    image_size = tuple(int(v) for v in attention["image_size"])
    patch = int(attention["patch_size"])
    resized = resize_labels(labels, image_size)
    expected = float(attention.get("rows_sum_to", 1))
    prefix = int(attention.get("num_prefix_tokens", 1))  # records written before the key had a CLS token
    all_rows = []
    for wt, box, grid in zip(weights, boxes, grids):
        if wt.dim() == 4 and wt.shape[0] == 1:
            wt = wt[0]
        if tuple(grid) == (0, 0):
            raise ValueError("empty grid")
        sums = wt[:, prefix:, :].sum(-1)
        if expected > 0 and not torch.allclose(sums, torch.full_like(sums, expected), atol=1e-3 * expected):
            logger.warning("attention rows sum to %.4f..%.4f, not rows_sum_to=%s; normalising each row by its sum",
                           float(sums.min()), float(sums.max()), expected)
        plab = window_patch_labels(resized, box, grid, patch, ignore_label)
        all_rows.append(row_statistics(wt, plab, ignore_label=ignore_label, background_index=background_index,
                                       num_prefix_tokens=prefix))
    rows = torch.cat(all_rows, 0)
    if rows.shape[0] == 0:
        return None
    mean = rows.mean(0).tolist()
    out = OrderedDict(zip(ROW_STAT_KEYS, mean))
    out["attention_rows"] = int(rows.shape[0])
    return out


def reduce_image_statistics(per_image: Sequence[Optional[Dict[str, float]]]) -> Dict[str, float]:
    """Dataset statistics: the mean of the per-image values over images that have a
    foreground patch (None entries are counted in ``attention_images_without_foreground``).
    Statistics are NaN when no image has one."""
    valid = [s for s in per_image if s is not None]
    out: Dict[str, float] = OrderedDict()
    for k in ROW_STAT_KEYS:
        out[k] = float(np.mean([s[k] for s in valid])) if valid else float("nan")
    out["attention_images"] = len(valid)
    out["attention_images_without_foreground"] = len(per_image) - len(valid)
    out["attention_rows"] = int(sum(s["attention_rows"] for s in valid))
    return out


def _windows(attention: Dict) -> Tuple[List[torch.Tensor], List[Box], List[Tuple[int, int]]]:
    for key in ("weights", "image_size", "patch_size"):
        if key not in attention:
            raise KeyError(f"output['attention'] lacks {key!r}; has {sorted(attention)} (see attention_record)")
    weights = attention["weights"]
    H, W = (int(v) for v in attention["image_size"])
    if torch.is_tensor(weights):
        weights = [weights]
    weights = list(weights)
    boxes = attention.get("boxes") or [(0, H, 0, W)] * len(weights)
    p = int(attention["patch_size"])
    grids = attention.get("grids")
    if grids is None:
        grids = [(-(-(b[1] - b[0]) // p), -(-(b[3] - b[2]) // p)) for b in boxes]
    if not (len(weights) == len(boxes) == len(grids)):
        raise ValueError(f"output['attention'] has {len(weights)} weights, {len(boxes)} boxes, {len(grids)} grids")
    prefix = int(attention.get("num_prefix_tokens", 1))
    for wt, g in zip(weights, grids):
        if wt.shape[-1] != prefix + int(g[0]) * int(g[1]):
            raise ValueError(f"attention of shape {tuple(wt.shape)} does not match grid {tuple(g)} "
                             f"({prefix} prefix + h*w tokens)")
    return weights, [tuple(b) for b in boxes], [tuple(g) for g in grids]


# ---------------------------------------------------------------------------------- evaluator
class AttentionStatsEvaluator(DatasetEvaluator):
    """Accumulates :func:`image_statistics` over a dataset; combine it with the segmentation
    evaluator through detectron2's ``DatasetEvaluators``.

    ``evaluate()`` returns ``{"attention_stats": {same_class_mass, non_class_mass,
    background_mass, self_mass, cls_mass, support_size, support_fraction, perplexity,
    attention_images, attention_images_without_foreground, attention_rows}}``, which
    ``results.dataset_summary`` flattens into the dataset's ``results.json`` entry.
    """

    def __init__(self, dataset_name: str, distributed: bool = True):
        meta = MetadataCatalog.get(dataset_name)
        classes = meta.get("stuff_classes", None)
        if not classes:
            raise ValueError(f"dataset {dataset_name!r} has no stuff_classes; attention statistics need "
                             "a semantic-segmentation dataset")
        self._dataset_name = dataset_name
        self._num_classes = len(classes)
        self._ignore_label = int(meta.get("ignore_label", 255))
        self._background_index = meta.get("background_index", None)
        self._distributed = distributed
        self._gt_files: Optional[Dict[str, str]] = None
        self._per_image: List[Optional[Dict[str, float]]] = []

    def reset(self):
        self._per_image = []

    def _gt_file(self, input: Dict) -> str:
        if "sem_seg_file_name" in input:
            return input["sem_seg_file_name"]
        if self._gt_files is None:
            self._gt_files = {d["file_name"]: d["sem_seg_file_name"] for d in DatasetCatalog.get(self._dataset_name)}
        return self._gt_files[input["file_name"]]

    def process(self, inputs, outputs):
        for input, output in zip(inputs, outputs):
            if "attention" not in output:
                raise KeyError(
                    "TEST.ATTENTION_STATS.ENABLED needs the model to return output['attention'] "
                    f"(see sparseclip_d2.evaluation.attention_stats); got keys {sorted(output)}")
            gt = load_sem_seg_gt(self._gt_file(input), num_classes=self._num_classes, ignore_label=self._ignore_label)
            self._per_image.append(image_statistics(
                output["attention"], gt, ignore_label=self._ignore_label, background_index=self._background_index))

    def evaluate(self):
        per_image = self._per_image
        if self._distributed:
            comm.synchronize()
            gathered = comm.gather(per_image, dst=0)
            if not comm.is_main_process():
                return None
            per_image = [s for part in gathered for s in part]
        res = reduce_image_statistics(per_image)
        logger.info("attention statistics of %s: %s", self._dataset_name,
                    ", ".join(f"{k}={v:.4g}" for k, v in res.items()))
        if res["attention_images"] == 0:
            logger.warning("no image of %s has a foreground patch: attention statistics are NaN", self._dataset_name)
        return OrderedDict(attention_stats=res)


def build_attention_stats_evaluator(cfg, dataset_name: str) -> Optional[AttentionStatsEvaluator]:
    """The attention-statistics evaluator of ``dataset_name`` when
    ``TEST.ATTENTION_STATS.ENABLED`` and the dataset is a segmentation dataset; else None
    (FG-OVD datasets have no label maps; logged)."""
    if not cfg.TEST.ATTENTION_STATS.ENABLED:
        return None
    if MetadataCatalog.get(dataset_name).get("evaluator_type", None) != "sem_seg":
        logger.info("attention statistics skipped for %s: not a semantic-segmentation dataset", dataset_name)
        return None
    return AttentionStatsEvaluator(dataset_name, distributed=True)
