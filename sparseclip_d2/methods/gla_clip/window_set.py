"""Window-set attention (pure torch): the last CLIP block of every window attends over the second
backbone's tokens of **all** windows of the image, with a proxy anchor and a dynamic normalisation.

Facts from 2btlFe/GLA-CLIP @ ba74915 (core files unchanged since f95acd2), ``myutils.py``
``KV_Extension.forward`` (L83-201) with the flags of ``predict.sh`` (``--token_norm
--KV_token_extension --proxy_sim --mini_iters 2 --dynamic_beta --beta_alpha 0.3 --dynamic_gamma
--gamma_alpha 30``), read as the code runs them:

- keys: the windows' proxy tokens, flattened window-major to ``N = B * S`` rows and L2-normalised;
- proxy anchor: ``A = normalize(keys) keys^T``; ``iterations`` times: ``M = A > threshold`` (a row
  with no entry gets its diagonal), ``proxy = normalize((M keys) / (rowsum M + 1e-6))``,
  ``A = proxy keys^T``; the scores are the last ``A``, the counts the last ``M``'s row sums;
- dynamic normalisation (``token_norm``): ``mu`` = each row's mean, negatives set to 0;
  ``beta = 1 + beta_alpha * log1p(B)`` (``dynamic_beta(x=B, ...)``: the number of windows),
  ``gamma = 1 + gamma_alpha / count`` per row (``dynamic_gamma``); ``(A - beta mu) gamma``;
- masking: entries below ``min(row max, 0)`` (``cutting_hp`` 0.0, ``cfg.py``) set to ``-inf``, then
  the normaliser (upstream: softmax, ``temperature`` 1.0) over all ``N`` columns.

Every step is row-wise (a row's proxy reads only its own row of ``A``), so the rows are computed in
blocks of ``block_rows``: the ``N x N`` matrices upstream holds at once are never formed.
"""
import dataclasses
import math
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from ...common.keys import check_number, key_field

__all__ = ["WindowSetSettings", "check_window_set_settings", "window_set_beta", "anchor_scores", "dynamic_normalise",
           "window_set_attend", "PRECISIONS"]

#: the dtypes the window-set maths can run in: fp32 (the project's default) or fp16 (upstream's: its
#: CLIP and DINO run in half, ``create_model(..., precision='fp16')``, ``self.vfm.half()``)
PRECISIONS = {"fp32": torch.float32, "fp16": torch.float16}


@dataclasses.dataclass(frozen=True)
class WindowSetSettings:
    """The window-set attention's settings (section ``MODEL.SPARSECLIP.PROXY.GLA``)."""

    # eval.py --initial_crit_pos default=0.55: predict.sh sets initial_crit_pos=0.6 in a shell variable
    # it never passes to eval.py, so the code runs 0.55 (2btlFe/GLA-CLIP @ ba74915 predict.sh, eval.py)
    threshold: float = key_field(0.55, "THRESHOLD", "Proxy anchor: keys whose cosine to a row's anchor exceeds it "
                                 "form the next anchor (GLA-CLIP eval.py --initial_crit_pos default 0.55; "
                                 "predict.sh's 0.6 is never passed).")
    iterations: int = key_field(2, "ITERATIONS", "Proxy-anchor mini-iterations (GLA-CLIP predict.sh "
                                "--mini_iters 2); 0: the plain key cosines, counts of the first mask.")
    beta_alpha: float = key_field(0.3, "BETA_ALPHA", "beta = 1 + BETA_ALPHA * log1p(windows) (GLA-CLIP predict.sh "
                                  "--beta_alpha 0.3; myutils.py dynamic_beta).")
    gamma_alpha: float = key_field(30.0, "GAMMA_ALPHA", "gamma = 1 + GAMMA_ALPHA / mask count of the row (GLA-CLIP "
                                   "predict.sh --gamma_alpha 30; myutils.py dynamic_gamma).")
    precision: str = key_field("fp32", "PRECISION", "dtype of the window-set maths: fp32, or fp16 as upstream "
                               "(gla_clip_segmentor.py precision='fp16', self.vfm.half()).")
    block_rows: int = key_field(1024, "BLOCK_ROWS", "Query rows computed at once (memory: BLOCK_ROWS x all "
                                "windows' tokens); the result does not depend on it.")


def check_window_set_settings(s: WindowSetSettings, key: str) -> WindowSetSettings:
    """``s`` validated (ValueError naming ``key.<KEY>``, the value and the valid choices)."""
    check_number(f"{key}.THRESHOLD", s.threshold, -1.0, 1.0)
    check_number(f"{key}.ITERATIONS", s.iterations, 0, 100, integer=True)
    check_number(f"{key}.BETA_ALPHA", s.beta_alpha, 0.0, math.inf)
    check_number(f"{key}.GAMMA_ALPHA", s.gamma_alpha, 0.0, math.inf)
    check_number(f"{key}.BLOCK_ROWS", s.block_rows, 1, math.inf, integer=True)
    if s.precision not in PRECISIONS:
        raise ValueError(f"{key}.PRECISION = {s.precision!r} is invalid; valid: {', '.join(PRECISIONS)}")
    return dataclasses.replace(s, iterations=int(s.iterations), block_rows=int(s.block_rows))


def window_set_beta(windows: int, beta_alpha: float) -> float:
    """``1 + beta_alpha * log1p(windows)`` (``myutils.py dynamic_beta``, in float64)."""
    return 1.0 + beta_alpha * math.log1p(windows)


def anchor_scores(keys: torch.Tensor, rows: slice, threshold: float, iterations: int):
    """The proxy-anchor scores of the query rows ``rows`` of unit ``keys`` ``(N, C)``.

    Returns ``(scores (R, N), counts (R, 1) or None)`` in ``keys.dtype``: the counts are the last
    mask's row sums (None with ``iterations`` 0, where upstream's counts come from the first mask:
    then ``A > threshold`` of the plain cosines)."""
    proxy = F.normalize(keys[rows], dim=-1)  # upstream normalises the (already unit) keys again
    scores = proxy @ keys.T
    index = torch.arange(scores.shape[0], device=keys.device)
    diag = index + (rows.start or 0)
    if iterations == 0:
        return scores, (scores > threshold).to(keys.dtype).sum(dim=-1, keepdim=True)
    for _ in range(iterations):
        mask = (scores > threshold).to(keys.dtype)
        empty = mask.sum(dim=-1) == 0
        if bool(empty.any()):
            mask[index[empty], diag[empty]] = 1
        counts = mask.sum(dim=-1, keepdim=True)
        proxy = F.normalize((mask @ keys) / (counts + 1e-6), dim=-1)
        scores = proxy @ keys.T
    return scores, counts


def dynamic_normalise(scores: torch.Tensor, counts: torch.Tensor, beta: float, gamma_alpha: float) -> torch.Tensor:
    """``(scores - beta * max(row mean, 0)) * (1 + gamma_alpha / counts)``, entries below
    ``min(row max, 0)`` set to ``-inf`` (``scores (R, N)``, ``counts (R, 1)``, their dtype)."""
    mean = scores.mean(dim=-1, keepdim=True)
    mean = mean.masked_fill(mean < 0, 0)
    gamma = 1 + gamma_alpha / counts
    s = (scores - mean * beta) * gamma
    cut = torch.minimum(s.max(dim=-1, keepdim=True).values, torch.zeros((), dtype=s.dtype, device=s.device))
    return s.masked_fill(s < cut, float("-inf"))


def window_set_attend(feats: torch.Tensor, values: torch.Tensor, settings: WindowSetSettings,
                      normalise: Callable[[torch.Tensor], torch.Tensor],
                      keep: Optional[list] = None) -> torch.Tensor:
    """Every window's tokens attend over all windows' values.

    Args:
        feats: ``(B, C, h, w)`` the second backbone's tokens of the ``B`` windows of one image.
        values: ``(B, S, D)`` the values on the same grid (``S = h * w``; heads side by side).
        settings: :class:`WindowSetSettings`.
        normalise: scores ``(R, N)`` -> weights (the spec's normaliser; upstream: softmax).
        keep: a list to append each block's ``(R, N)`` float32 weights to (tests, records), or None.
    Returns:
        ``(B, S, D)`` in ``values.dtype``.
    """
    B, C, h, w = feats.shape
    S = h * w
    if values.shape[:2] != (B, S):
        raise ValueError(f"values {tuple(values.shape)} do not match {B} windows of {h}x{w} tokens")
    dtype = PRECISIONS[settings.precision]
    keys = F.normalize(feats.to(dtype).permute(0, 2, 3, 1).reshape(B * S, C), dim=-1)
    v = values.reshape(B * S, -1).to(dtype)
    beta = window_set_beta(B, settings.beta_alpha)
    out = torch.empty(B * S, v.shape[1], dtype=dtype, device=v.device)
    for start in range(0, B * S, settings.block_rows):
        rows = slice(start, min(start + settings.block_rows, B * S))
        scores, counts = anchor_scores(keys, rows, settings.threshold, settings.iterations)
        weights = normalise(dynamic_normalise(scores, counts, beta, settings.gamma_alpha))
        if keep is not None:
            keep.append(weights.float())
        out[rows] = weights.to(dtype) @ v
    return out.reshape(B, S, -1).to(values.dtype)
