"""From synonym logits to per-class scores: softmax, max over synonyms, background rules.

Pure torch. The order follows SCLIP's post-processing (also used by ClearCLIP and
NACLIP): softmax over all synonyms (queries), max over the synonyms of each class, then
the area rule, then the probability threshold.
"""
from typing import Optional

import torch

from ..clip import max_over_synonyms

__all__ = ["class_scores"]


def class_scores(
    synonym_logits: torch.Tensor,
    class_index: torch.Tensor,
    num_classes: int,
    *,
    prob_threshold: float = 0.0,
    area_threshold: float = 0.0,
    background_index: Optional[int] = None,
) -> torch.Tensor:
    """Per-class scores of one image whose argmax is the prediction.

    Args:
        synonym_logits: ``(S, H, W)`` logits, one channel per synonym (already multiplied
            by the logit scale).
        class_index: ``(S,)`` long, the class of each synonym (values in ``[0, C)``).
        num_classes: C.
        prob_threshold: pixels whose highest class probability is below it become
            ``background_index``. Ignored (0) when ``background_index`` is None.
        area_threshold: classes (other than the background) whose predicted area is at
            most this fraction of the predicted non-background area get probability 0
            (SCLIP's ``area_thd``). 0 disables.
        background_index: the background class, or None for datasets without one.

    Returns:
        ``(C, H, W)`` float32: the class probabilities (max over synonyms of the softmax
        over synonyms), with suppressed classes set to 0 and thresholded pixels given
        probability 1 on the background class, so that ``argmax(0)`` is the prediction.
    """
    if synonym_logits.dim() != 3:
        raise ValueError(f"expected (S, H, W) synonym logits, got shape {tuple(synonym_logits.shape)}")
    if class_index.numel() != synonym_logits.shape[0]:
        raise ValueError(
            f"class_index has {class_index.numel()} entries but there are {synonym_logits.shape[0]} synonym channels"
        )
    if background_index is not None and not 0 <= background_index < num_classes:
        raise ValueError(f"background_index {background_index} outside [0, {num_classes})")
    probs = synonym_logits.float().softmax(dim=0)
    scores = max_over_synonyms(probs, class_index.to(probs.device), num_classes, dim=0)

    if area_threshold > 0:
        pred = scores.argmax(dim=0)
        area = torch.bincount(pred.flatten(), minlength=num_classes).to(scores.dtype)
        foreground = torch.ones(num_classes, dtype=torch.bool, device=scores.device)
        if background_index is not None:
            foreground[background_index] = False
        total = area[foreground].sum()
        suppressed = foreground & ~(area > area_threshold * total)
        scores[suppressed] = 0.0

    if prob_threshold > 0 and background_index is not None:
        low = scores.max(dim=0).values < prob_threshold
        scores[background_index][low] = 1.0
    return scores
