"""``output["attention"]``: the record of the last block's attention that the META_ARCH
attaches to its outputs when ``TEST.ATTENTION_STATS.ENABLED`` (read by
:class:`~sparseclip_d2.evaluation.attention_stats.AttentionStatsEvaluator`; the format is
described in ``docs/diagnostics.md``)."""
from typing import Dict, Optional, Sequence, Tuple

import torch

from ..attention import parse_source
from ..dense.windows import symmetric_pad, window_grid

__all__ = ["attention_record", "rows_sum_to"]


def rows_sum_to(source: str, sum_mode: str = "normalize_then_sum") -> int:
    """What the rows of a source's attention sum to: its number of ``+`` terms with
    ``normalize_then_sum``, else 1."""
    return len(parse_source(source)) if sum_mode == "normalize_then_sum" else 1


def attention_record(weights: Sequence[torch.Tensor], image_size: Tuple[int, int], patch_size: int, *,
                     crop_size: Optional[int] = None, stride: Optional[int] = None,
                     source: str = "qk", sum_mode: str = "normalize_then_sum",
                     num_prefix_tokens: int = 1, rows_sum: Optional[float] = None) -> Dict:
    """Build ``output["attention"]`` from the last block's attention of each window.

    Args:
        weights: per window, in the order of ``window_grid`` (one for whole-image inference),
            ``(heads, P + h*w, P + h*w)`` float32, the ``P`` prefix tokens first.
        image_size: ``(H, W)`` of the resized image the windows tile.
        patch_size: the encoder's patch size.
        crop_size, stride: the sliding window (None = whole image).
        source, sum_mode: the last block's score source (gives ``rows_sum_to`` when
            ``rows_sum`` is None).
        num_prefix_tokens: ``P``, the tokens before the patches (1 = CLS; 0 for SigLIP
            towers; 1 + registers for towers with register tokens).
        rows_sum: what the rows sum to, when more than the source decides it (an
            ``AttentionSpec.rows_sum_to``: attention mixed across layers scales and blends it).
    """
    H, W = int(image_size[0]), int(image_size[1])
    boxes = [(0, H, 0, W)] if crop_size is None else window_grid(H, W, int(crop_size), int(stride or crop_size))
    if len(boxes) != len(weights):
        raise ValueError(f"{len(weights)} attention maps for {len(boxes)} windows of a {H}x{W} image")
    p = int(patch_size)
    grids = []
    for (y1, y2, x1, x2) in boxes:
        l, r, t, b = symmetric_pad(y2 - y1, x2 - x1, p)
        grids.append(((y2 - y1 + t + b) // p, (x2 - x1 + l + r) // p))
    return {
        "weights": [w.detach() for w in weights],
        "boxes": boxes,
        "grids": grids,
        "patch_size": p,
        "image_size": (H, W),
        "rows_sum_to": rows_sum_to(source, sum_mode) if rows_sum is None else float(rows_sum),
        "num_prefix_tokens": int(num_prefix_tokens),
    }
