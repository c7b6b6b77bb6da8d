"""Whole-image and sliding-window dense inference (pure torch, no detectron2).

The grid follows MMSeg's "slide" mode, as SCLIP / ClearCLIP / NACLIP use it: windows
start every ``stride`` pixels, the last window of a row/column is snapped back so that it
ends at the image edge, and overlapping logits are summed and divided by a count map.
A window whose sides are not multiples of the patch size is handled per
``patch_remainder`` (:data:`PATCH_REMAINDER_MODES`): by default zero-padded symmetrically (on
the normalised image) before encoding, its upsampled logits cropped back.

All windows of one image are encoded in batches of ``batch_size`` (windows of one image
always share one size), never one by one.

Large vocabularies: :func:`window_logits` keeps only the windows' patch logits (``(N, K, h / p,
w / p)``, small) and makes the ``(K, H, W)`` image logits in bands of rows on demand
(:class:`WindowLogits`), each band by the same upsampling calls, sums and division as the whole
image, so a band is bit for bit those rows of :func:`dense_logits` (which is ``window_logits(...)
.full()``). 847 classes = 1281 synonyms at 448 x 597 would otherwise be a 1.37 GB tensor.
"""
from typing import Callable, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from ..attention.self_correlation import cls_denoised_correlation, self_correlation_map

__all__ = ["window_grid", "symmetric_pad", "dense_logits", "window_logits", "WindowLogits",
           "encode_window_logits", "PATCH_REMAINDER_MODES"]

Window = Tuple[int, int, int, int]

# A batch of upsampled window logits above this many float32 elements (2 ** 27 = 512 MiB: e.g. one
# 336 px window of a ~1300-synonym vocabulary is 0.6 GB) is made in groups of channels of about
# _UPSAMPLE_GROUP_ELEMENTS (64 MiB), one window at a time. A group is a multiple of 64 channels:
# the CPU kernel vectorises over channels, and groups that start on a multiple of the vector width
# give the values of one call bit for bit (checked in tests/dense/test_window_channel_groups.py);
# against a batched call of several windows they may differ in the last float32 bit.
_UPSAMPLE_ELEMENTS = 1 << 27
_UPSAMPLE_GROUP_ELEMENTS = 1 << 24
# WindowLogits.band keeps one band of image rows of about this many float32 elements (2 ** 26 =
# 256 MiB): the (K, H, W) logits of the 150-171-class benchmarks at their working sizes fit in one
# band (computed once, as before); 1281 synonyms at 448 x 597 take 6 bands of 87 rows.
_ROW_BAND_ELEMENTS = 1 << 26

#: How a window whose sides are not multiples of the patch size p is encoded:
#:
#: - ``pad_crop``: zero-pad symmetrically (extra pixel right/bottom) to multiples of p,
#:   upsample the patch logits to the padded window and crop the window back
#:   (ClearCLIP's ``compute_padsize``).
#: - ``truncate``: encode only the top-left ``floor(h / p) * p x floor(w / p) * p`` pixels (the
#:   stride-p patch convolution of OpenAI CLIP drops the rest, as in SCLIP / NACLIP) and
#:   upsample those patch logits to the whole window.
#: - ``pad_corner``: zero-pad bottom/right to multiples of p (MMSeg's ``PatchEmbed``
#:   ``padding='corner'``, MaskCLIP) and upsample the logits of the padded grid to the
#:   unpadded window.
PATCH_REMAINDER_MODES = ("pad_crop", "truncate", "pad_corner")


def window_grid(height: int, width: int, crop_size: int, stride: int) -> List[Window]:
    """MMSeg slide-mode window coordinates.

    Args:
        height, width: image size in pixels.
        crop_size: square window side; windows are ``min(crop_size, side)`` long.
        stride: step between window starts.

    Returns:
        list of ``(y1, y2, x1, x2)`` (end-exclusive), row-major. Every pixel is covered;
        the last window of each row/column ends at the image edge.
    """
    if crop_size <= 0 or stride <= 0:
        raise ValueError(f"crop_size and stride must be positive, got crop_size={crop_size}, stride={stride}")
    if stride > crop_size:
        raise ValueError(f"stride {stride} is larger than crop_size {crop_size}: pixels between "
                         f"windows would be left out; valid: 1 <= stride <= crop_size")
    if height <= 0 or width <= 0:
        raise ValueError(f"image size must be positive, got {height}x{width}")
    h_grids = max(height - crop_size + stride - 1, 0) // stride + 1
    w_grids = max(width - crop_size + stride - 1, 0) // stride + 1
    windows = []
    for hi in range(h_grids):
        for wi in range(w_grids):
            y1, x1 = hi * stride, wi * stride
            y2, x2 = min(y1 + crop_size, height), min(x1 + crop_size, width)
            y1, x1 = max(y2 - crop_size, 0), max(x2 - crop_size, 0)
            windows.append((y1, y2, x1, x2))
    return windows


def symmetric_pad(height: int, width: int, multiple: int) -> Tuple[int, int, int, int]:
    """Padding ``(left, right, top, bottom)`` that makes ``height x width`` multiples of
    ``multiple``, split as evenly as possible (the extra pixel goes right/bottom)."""
    ph = (-height) % multiple
    pw = (-width) % multiple
    return pw // 2, pw - pw // 2, ph // 2, ph - ph // 2


def dense_logits(image: torch.Tensor, logits_fn: Callable[..., torch.Tensor], **kwargs) -> torch.Tensor:
    """Pixel logits ``(K, H, W)`` float32 of one image: :func:`window_logits` (same arguments) made
    whole (:meth:`WindowLogits.full`)."""
    return window_logits(image, logits_fn, **kwargs).full()


def window_logits(
    image: torch.Tensor,
    logits_fn: Callable[[torch.Tensor], torch.Tensor],
    *,
    patch_size: int,
    crop_size: Optional[int] = None,
    stride: Optional[int] = None,
    batch_size: int = 8,
    patch_remainder: str = "pad_crop",
    side: Optional[torch.Tensor] = None,
    side_pad_value: float = 0,
    with_windows: bool = False,
    band_rows: Optional[int] = None,
) -> "WindowLogits":
    """Pixel logits of one image from a patch-level logits function, as a :class:`WindowLogits`
    (the windows' patch logits; rows of the image logits made on demand).

    Args:
        image: ``(3, H, W)`` normalised image.
        logits_fn: maps ``(N, 3, h, w)`` windows (h, w multiples of ``patch_size``) to
            patch logits ``(N, K, h / p, w / p)``.
        patch_size: windows are padded to multiples of it.
        crop_size, stride: sliding-window size and step; ``None`` = whole image (one
            window).
        batch_size: windows per ``logits_fn`` call.
        patch_remainder: one of :data:`PATCH_REMAINDER_MODES` (windows whose sides are not
            multiples of ``patch_size``).
        side: optional ``(H, W)`` map cut into the same windows and padded the same way with
            ``side_pad_value`` (CorrCLIP's region masks, padded with their label 10000); then
            ``logits_fn(crops, side_crops)`` gets the ``(N, h, w)`` windows of it too.
        with_windows: also give ``logits_fn`` the keyword ``windows``: the ``(N, 3, h', w')``
            pixels each crop stands for, at the size its patch logits are upsampled to. With
            ``truncate`` these are the whole windows (``h' x w'`` = the window, of which the crop
            is the top-left ``floor(h' / p) * p x floor(w' / p) * p``); with the padding modes,
            the padded crops themselves. (A first segmentation made from a window's patch logits
            is made at this size, guided by these pixels: yvhangyang/ResCLIP @ 0e085f7
            ``clip/model.py`` ``create_logit_temp`` resizes to, and runs PAMR on, the whole input
            its truncated patch grid comes from.)
        band_rows: rows per cached band of :meth:`WindowLogits.band`; None: about
            ``_ROW_BAND_ELEMENTS`` float32 elements.

    Returns:
        :class:`WindowLogits` of ``(K, H, W)`` float32 logits: per window, patch logits are
        upsampled bilinearly to the padded window, cropped, summed into the image, and divided by
        the number of windows covering each pixel.
    """
    if image.dim() != 3:
        raise ValueError(f"expected a (3, H, W) image, got shape {tuple(image.shape)}")
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    _, H, W = image.shape
    if crop_size is None:
        windows: Sequence[Window] = [(0, H, 0, W)]
    else:
        windows = window_grid(H, W, crop_size, stride if stride is not None else crop_size)

    if patch_remainder not in PATCH_REMAINDER_MODES:
        raise ValueError(f"unknown patch_remainder {patch_remainder!r}; valid: {', '.join(PATCH_REMAINDER_MODES)}")
    # All windows of one image have the same size (min(crop, side)): one padding.
    wh, ww = windows[0][1] - windows[0][0], windows[0][3] - windows[0][2]
    top = left = 0
    keep_h, keep_w = wh, ww  # encoded pixels of each window
    if patch_remainder == "pad_crop":
        pad = symmetric_pad(wh, ww, patch_size)
        left, _, top, _ = pad
    elif patch_remainder == "pad_corner":
        pad = (0, (-ww) % patch_size, 0, (-wh) % patch_size)
    else:
        pad = (0, 0, 0, 0)
        keep_h, keep_w = wh - wh % patch_size, ww - ww % patch_size
        if keep_h == 0 or keep_w == 0:
            raise ValueError(
                f"patch_remainder='truncate' cannot encode a {wh}x{ww} window: it is smaller than one "
                f"{patch_size}x{patch_size} patch")

    batches: List[Tuple[torch.Tensor, Sequence[Window]]] = []
    count = torch.zeros((1, H, W), dtype=torch.float32, device=image.device)
    for start in range(0, len(windows), batch_size):
        chunk = windows[start : start + batch_size]
        crops = torch.stack([image[:, y1:y1 + keep_h, x1:x1 + keep_w] for (y1, y2, x1, x2) in chunk])
        if any(pad):
            crops = F.pad(crops, pad)
        extra = {}
        if with_windows:
            if (keep_h, keep_w) == (wh, ww):  # nothing truncated: the (padded) crops
                extra["windows"] = crops
            else:
                extra["windows"] = torch.stack([image[:, y1:y2, x1:x2] for (y1, y2, x1, x2) in chunk])
        if side is not None:
            side_crops = torch.stack([side[y1:y1 + keep_h, x1:x1 + keep_w] for (y1, y2, x1, x2) in chunk])
            if any(pad):
                side_crops = F.pad(side_crops, pad, value=side_pad_value)
            patch_logits = logits_fn(crops, side_crops, **extra)
        else:
            patch_logits = logits_fn(crops, **extra)
        if patch_logits.dim() != 4 or patch_logits.shape[0] != len(chunk):
            raise ValueError(
                f"logits_fn must return (N, K, h, w) with N={len(chunk)}, got {tuple(patch_logits.shape)}"
            )
        if batches and patch_logits.shape[1] != batches[0][0].shape[1]:
            raise ValueError(f"logits_fn returned {patch_logits.shape[1]} channels for windows {chunk}, "
                             f"{batches[0][0].shape[1]} for the first windows")
        batches.append((patch_logits, chunk))
        for (y1, y2, x1, x2) in chunk:
            count[:, y1:y2, x1:x2] += 1
    if not batches or not bool((count > 0).all()):  # window_grid covers every pixel
        raise RuntimeError(f"the window grid left pixels of the {H}x{W} image uncovered "
                           f"(crop_size={crop_size}, stride={stride})")
    # the padded crop's size (pad_crop), else the (truncated or corner-padded) grid stretched
    # over the unpadded window
    target = (wh + pad[2] + pad[3], ww + pad[0] + pad[1]) if patch_remainder == "pad_crop" else (wh, ww)
    crop_box = (top, top + wh, left, left + ww) if patch_remainder == "pad_crop" else None
    return WindowLogits(batches, count, target, crop_box, band_rows)


class WindowLogits:
    """The ``(K, H, W)`` float32 logits of :func:`window_logits`, held as the windows' patch logits.

    :meth:`rows` makes rows ``start:stop`` from the windows that cover them: each window's patch
    logits upsampled (bilinear) by the very calls the whole image uses (a batch at once, or per
    window in groups of channels above ``_UPSAMPLE_ELEMENTS``), cropped, its rows in the band added
    in window order to zeros, divided by the count map. Every output element is therefore the same
    float32 operations on the same operands as in :meth:`full`: a band is bit for bit those rows.
    Memory: the patch logits, the ``(1, H, W)`` count, the band and one upsampling temporary; the
    price is that a window covering ``n`` bands is upsampled ``n`` times.

    :meth:`band` serves rows from a cached band of about ``_ROW_BAND_ELEMENTS`` (made anew when a
    request leaves it), for readers that walk down the image (``ScoreMaps``).
    """

    def __init__(self, batches: List[Tuple[torch.Tensor, Sequence[Window]]], count: torch.Tensor,
                 target: Tuple[int, int], crop_box: Optional[Tuple[int, int, int, int]],
                 band_rows: Optional[int] = None):
        self._batches = batches
        self._count = count
        self._target = tuple(int(t) for t in target)
        self._crop_box = crop_box
        _, H, W = count.shape
        K = int(batches[0][0].shape[1])
        self.shape = torch.Size((K, H, W))
        self.device = count.device
        self.dtype = torch.float32
        if band_rows is None:
            band_rows = max(1, _ROW_BAND_ELEMENTS // max(1, K * W))
        if band_rows <= 0:
            raise ValueError(f"band_rows must be positive, got {band_rows}")
        self.band_rows = int(band_rows)
        self._cache: Optional[Tuple[int, int, torch.Tensor]] = None

    def dim(self) -> int:
        return 3

    def rows(self, start: int, stop: int) -> torch.Tensor:
        """``(K, stop - start, W)`` float32: rows ``start:stop`` of the image logits (a new tensor)."""
        K, H, W = self.shape
        if not 0 <= start < stop <= H:
            raise ValueError(f"rows {start}:{stop} outside the {H} rows of the window logits")
        out = torch.zeros((K, stop - start, W), dtype=torch.float32, device=self.device)
        for patch_logits, chunk in self._batches:
            if any(y1 < stop and y2 > start for (y1, y2, _, _) in chunk):
                _add_upsampled(out, patch_logits, chunk, self._target, self._crop_box, rows=(start, stop))
        return out.div_(self._count[:, start:stop])  # in place: no second band

    def full(self) -> torch.Tensor:
        """The whole ``(K, H, W)`` float32 logits (one band)."""
        return self.rows(0, self.shape[1])

    def band(self, start: int, stop: int) -> torch.Tensor:
        """Rows ``start:stop`` as a view of the cached band (at least ``band_rows`` rows from
        ``start``, made anew when the request is not inside the cached one)."""
        if self._cache is None or not (self._cache[0] <= start and stop <= self._cache[1]):
            self._cache = None  # free the old band before making the next
            stop_band = min(self.shape[1], max(stop, start + self.band_rows))
            self._cache = (start, stop_band, self.rows(start, stop_band))
        first, _, cached = self._cache
        return cached[:, start - first:stop - first]


def _add_upsampled(summed: torch.Tensor, patch_logits: torch.Tensor, chunk: Sequence[Window],
                   target: Tuple[int, int], crop_box: Optional[Tuple[int, int, int, int]],
                   rows: Optional[Tuple[int, int]] = None) -> None:
    """Add each window's ``patch_logits`` upsampled (bilinear) to ``target`` and cut to ``crop_box``
    ``(y0, y1, x0, x1)`` (None: kept whole) into ``summed`` at its window; ``rows`` ``(r0, r1)``:
    ``summed`` holds only image rows ``r0:r1`` (None: all), and only those rows are added. Above
    ``_UPSAMPLE_ELEMENTS`` the upsampling runs in groups of channels, one window at a time
    (bilinear resizing treats each channel alone): a vocabulary of ~1300 synonyms would otherwise
    need an ``(N, K, crop, crop)`` temporary of 0.6 GB per 336 px window. The calls do not depend
    on ``rows``: a band gets the values of the whole image's calls."""
    r0, r1 = (0, summed.shape[1]) if rows is None else rows
    num_channels = patch_logits.shape[1]
    area = target[0] * target[1]
    if len(chunk) * num_channels * area <= _UPSAMPLE_ELEMENTS:
        parts = [(patch_logits, chunk, 0, num_channels)]  # one call for the batch
    else:
        step = max(64, _UPSAMPLE_GROUP_ELEMENTS // area // 64 * 64)
        parts = [(patch_logits[i:i + 1, k0:k0 + step], [window], k0, min(k0 + step, num_channels))
                 for i, window in enumerate(chunk) if window[0] < r1 and window[1] > r0
                 for k0 in range(0, num_channels, step)]
    for part, part_windows, k0, k1 in parts:
        logits = F.interpolate(part.float(), size=target, mode="bilinear", align_corners=False)
        if crop_box is not None:
            logits = logits[:, :, crop_box[0]:crop_box[1], crop_box[2]:crop_box[3]]
        for (y1, y2, x1, x2), up in zip(part_windows, logits):
            a, b = max(y1, r0), min(y2, r1)
            if a < b:
                summed[k0:k1, a - r0:b - r0, x1:x2] += up[:, a - y1:b - y1]
        del logits


def encode_window_logits(encoder, images: torch.Tensor, text_emb: torch.Tensor, logit_scale: float, *,
                         cls_product: bool = False, correlation_layer: Optional[int] = None,
                         feedback: Optional[Callable] = None) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Patch logits of windows, optionally times the CLS logits, and the windows' self-correlation.

    Args:
        encoder: a ``DenseCLIPEncoder``.
        images: ``(N, 3, h*p, w*p)`` normalised windows.
        text_emb: ``(S, D)`` L2-normalised synonym embeddings.
        logit_scale: logits = ``logit_scale * cos``.
        cls_product: multiply each window's patch logits by its CLS logits (per synonym).
        correlation_layer: also return the CLS-denoised self-correlation of this block's q/k/v.
        feedback: the first-segmentation callable of a feedback spec (``forward_pass``).
    Returns:
        ``(logits (N, S, h, w) float32, corr (N, h*w, h*w) float32 or None)``.
    """
    taps = () if correlation_layer is None else (encoder.block_index(correlation_layer),)
    p = encoder.forward_pass(images, tap_layers=taps, feedback=feedback)
    feats = F.normalize(encoder.dense_embedding(p.tokens, p.grid).float(), dim=1)
    logits = logit_scale * torch.einsum("ndhw,sd->nshw", feats, text_emb.float())
    if cls_product:
        cls = F.normalize(encoder.pooled_embedding(p.tokens).float(), dim=-1)
        logits = logits * (logit_scale * (cls @ text_emb.float().T))[:, :, None, None]
    corr = None
    if correlation_layer is not None:
        q, k, v = encoder.block_qkv(taps[0], p.taps[taps[0]], p.grid)
        corr = cls_denoised_correlation(self_correlation_map(q, k, v), int(encoder.num_prefix_tokens))
    return logits, corr

