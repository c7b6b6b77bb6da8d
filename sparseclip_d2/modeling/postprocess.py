"""From synonym logits to per-class scores: softmax, max over synonyms, background rules.

Pure torch. The order follows SCLIP's post-processing (also used by ClearCLIP and
NACLIP): softmax over all synonyms (queries), max over the synonyms of each class, then
the area rule, then the probability threshold.

The scores are computed band by band over output rows, optionally bilinearly resized to an
output size on the way (``out_size``): bilinear resizing with ``align_corners=False`` is
separable, so a band of output rows needs only the two input rows around each of its rows.
Peak extra memory is the ``(C, H, W)`` output plus ``O(S * band_rows * W)`` temporaries
instead of several full ``(S, H, W)`` copies (resized logits, softmax, max over synonyms).

The working-size logits may be a tensor or a :class:`~sparseclip_d2.dense.windows.WindowLogits`
(the window loop's patch logits, rows made on demand in bands): then not even the ``(S, h, w)``
working logits are held, and every band reads bit for bit the rows the whole tensor would hold.
"""
from typing import Dict, Iterator, Optional, Tuple, Union

import torch
import torch.nn.functional as F

from ..clip import max_over_synonyms
from ..dense.windows import WindowLogits

Logits = Union[torch.Tensor, WindowLogits]

__all__ = ["ScoreMaps", "class_scores", "bilinear_rows"]

# Default band height: about this many float32 elements per (S, band_rows, W) temporary
# (2 ** 24 elements = 64 MiB).
_BAND_ELEMENTS = 1 << 24


def bilinear_rows(in_size: int, out_size: int, start: int, stop: int,
                  device=None) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Source rows and weights of output rows ``start:stop`` of a 1-D bilinear resize from
    ``in_size`` to ``out_size`` with ``align_corners=False``, computed as PyTorch does
    (float32 ``scale = in / out``, ``src = max(scale * (dst + 0.5) - 0.5, 0)`` rounded once,
    ``i0 = min(floor(src), in - 1)``, ``i1 = min(i0 + 1, in - 1)``, ``lambda = src - i0``).

    Returns:
        ``(i0, i1, lam)``: two ``(stop - start,)`` long tensors and one ``(stop - start,)``
        float32 tensor; output row ``r`` is ``(1 - lam) * in[i0] + lam * in[i1]``. The
        weights equal those of PyTorch's CPU kernel bit for bit (tested); the blended values
        can differ from ``F.interpolate`` by about one float32 ulp (summation order).
    """
    scale = (torch.tensor(in_size, dtype=torch.float32) / out_size).double()
    # scale * (dst + 0.5) - 0.5 as one fused multiply-add (what the compiled CPU kernel
    # does): exact in float64 for a float32 scale, then rounded once to float32.
    dst = torch.arange(start, stop, dtype=torch.float64)
    src = (scale * (dst + 0.5) - 0.5).float().clamp(min=0)
    i0 = src.floor().long().clamp(max=in_size - 1)
    i1 = (i0 + 1).clamp(max=in_size - 1)
    lam = src - i0.float()
    return i0.to(device), i1.to(device), lam.to(device)


def _logit_rows(logits: Logits, start: int, stop: int) -> torch.Tensor:
    """Rows ``start:stop`` of ``(S, h, w)`` logits (a tensor's view, or a band of a ``WindowLogits``)."""
    return logits.band(start, stop) if isinstance(logits, WindowLogits) else logits[:, start:stop]


def _resized_band(logits: Logits, out_size: Tuple[int, int], start: int, stop: int) -> torch.Tensor:
    """Rows ``start:stop`` of ``F.interpolate(logits[None], out_size, mode="bilinear",
    align_corners=False)[0]`` for ``(S, h, w)`` logits, from at most ``2 * (stop - start)``
    input rows. Returns ``(S, stop - start, W)`` in the dtype of ``logits``."""
    h, w = logits.shape[-2:]
    out_h, out_w = out_size
    if h == out_h:
        rows = _logit_rows(logits, start, stop)
        return rows if w == out_w else F.interpolate(rows[None], size=(stop - start, out_w), mode="bilinear",
                                                     align_corners=False)[0]
    i0, i1, lam = bilinear_rows(h, out_h, start, stop, logits.device)
    first = int(i0[0])
    last = int(i1[-1])  # i0, i1 are non-decreasing in the output row
    rows = _logit_rows(logits, first, last + 1)
    if w != out_w:
        # Width only: the height is kept (scale 1, src = dst exactly, lambda 0), so this is
        # the horizontal pass of the full-size resize on these rows.
        rows = F.interpolate(rows[None], size=(rows.shape[1], out_w), mode="bilinear", align_corners=False)[0]
    lam = lam.to(rows.dtype).view(1, -1, 1)
    return rows[:, i0 - first] * (1 - lam) + rows[:, i1 - first] * lam


class ScoreMaps:
    """The class scores of one image at its output size, produced in bands of output rows.

    Holds only the working-resolution ``(S, h, w)`` synonym logits (a tensor, or a
    ``WindowLogits`` that makes their rows in bands); every full-size result is computed band by
    band (see the module docstring), so memory stays ``O(S * band_rows * W)`` plus what the
    caller keeps:

    - :meth:`bands` yields ``(r0, r1, probs, labels)``: the class probabilities of output
      rows ``r0:r1`` (max over synonyms of the softmax over synonyms; no background rule)
      and the predicted labels after the rules;
    - :meth:`labels`: the ``(H, W)`` label map;
    - :meth:`scores`: the full ``(C, H, W)`` scores of :func:`class_scores` (allocates them).

    Args: as :func:`class_scores`.
    """

    def __init__(
        self,
        synonym_logits: Logits,
        class_index: torch.Tensor,
        num_classes: int,
        *,
        prob_threshold: float = 0.0,
        area_threshold: float = 0.0,
        background_index: Optional[int] = None,
        out_size: Optional[Tuple[int, int]] = None,
        band_rows: Optional[int] = None,
    ):
        if synonym_logits.dim() != 3:
            raise ValueError(f"expected (S, H, W) synonym logits, got shape {tuple(synonym_logits.shape)}")
        if class_index.numel() != synonym_logits.shape[0]:
            raise ValueError(
                f"class_index has {class_index.numel()} entries but there are {synonym_logits.shape[0]} synonym channels"
            )
        if background_index is not None and not 0 <= background_index < num_classes:
            raise ValueError(f"background_index {background_index} outside [0, {num_classes})")
        S, h, w = synonym_logits.shape
        out_h, out_w = (h, w) if out_size is None else (int(out_size[0]), int(out_size[1]))
        if out_h <= 0 or out_w <= 0 or h == 0 or w == 0:
            raise ValueError(f"cannot resize ({h}, {w}) logits to ({out_h}, {out_w})")
        if band_rows is None:
            band_rows = max(1, _BAND_ELEMENTS // max(1, S * out_w))
        if band_rows <= 0:
            raise ValueError(f"band_rows must be positive, got {band_rows}")
        self.source = synonym_logits
        self.class_index = class_index.to(synonym_logits.device)
        self.num_classes = int(num_classes)
        self.prob_threshold = float(prob_threshold) if background_index is not None else 0.0
        self.area_threshold = float(area_threshold)
        self.background_index = background_index
        self.out_size = (out_h, out_w)
        self.band_rows = int(band_rows)
        self._suppressed: Optional[torch.Tensor] = None

    @property
    def logits(self) -> torch.Tensor:
        """The ``(S, h, w)`` working-size logits as one tensor (a ``WindowLogits`` source is made
        whole: for small images and tests; the bands never need it)."""
        return self.source.full() if isinstance(self.source, WindowLogits) else self.source

    @property
    def shape(self) -> Tuple[int, int, int]:
        """``(C, H, W)`` of the full-size scores."""
        return (self.num_classes,) + self.out_size

    @property
    def num_bands(self) -> int:
        """Number of bands :meth:`bands` yields."""
        return -(-self.out_size[0] // self.band_rows)

    def _bands(self):
        out_h = self.out_size[0]
        return [(r, min(r + self.band_rows, out_h)) for r in range(0, out_h, self.band_rows)]

    def _probabilities(self, r0: int, r1: int) -> torch.Tensor:
        """``(C, r1 - r0, W)`` float32 class probabilities of output rows ``r0:r1``."""
        probs = _resized_band(self.source, self.out_size, r0, r1).float().softmax(dim=0)
        return max_over_synonyms(probs, self.class_index, self.num_classes, dim=0)

    def _suppression_from_area(self, area: torch.Tensor) -> torch.Tensor:
        foreground = torch.ones(self.num_classes, dtype=torch.bool, device=area.device)
        if self.background_index is not None:
            foreground[self.background_index] = False
        area_f = area.to(torch.float32)
        total = area_f[foreground].sum()
        return foreground & ~(area_f > self.area_threshold * total)

    def suppressed(self) -> torch.Tensor:
        """``(C,)`` bool: the classes the area rule suppresses (a pass over the bands for the
        whole-image histogram of the argmax; all False without the rule)."""
        if self._suppressed is None:
            if self.area_threshold <= 0:
                self._suppressed = torch.zeros(self.num_classes, dtype=torch.bool, device=self.source.device)
            else:
                area = torch.zeros(self.num_classes, dtype=torch.long, device=self.source.device)
                for r0, r1 in self._bands():
                    area += torch.bincount(self._probabilities(r0, r1).argmax(dim=0).flatten(),
                                           minlength=self.num_classes)
                self._suppressed = self._suppression_from_area(area)
        return self._suppressed

    def _apply_rules(self, band: torch.Tensor) -> torch.Tensor:
        """Labels ``(b, W)`` of a probability band after the area rule and the threshold."""
        suppressed = self.suppressed()
        if bool(suppressed.any()):
            band = band.masked_fill(suppressed.view(-1, 1, 1), 0.0)
        best, labels = band.max(dim=0)
        if self.prob_threshold > 0:
            labels[best < self.prob_threshold] = self.background_index
        return labels

    def bands(self) -> Iterator[Tuple[int, int, torch.Tensor, torch.Tensor]]:
        """Yields ``(r0, r1, probs (C, r1 - r0, W) float32, labels (r1 - r0, W) long)``:
        the raw class probabilities and the labels after the background rules."""
        self.suppressed()  # the area rule's histogram pass, if any, before the first band
        for r0, r1 in self._bands():
            probs = self._probabilities(r0, r1)
            yield r0, r1, probs, self._apply_rules(probs)

    def labels(self) -> torch.Tensor:
        """``(H, W)`` long label map (the argmax of :meth:`scores`), computed in bands."""
        out = torch.empty(self.out_size, dtype=torch.long, device=self.source.device)
        for r0, r1, _, labels in self.bands():
            out[r0:r1] = labels
        return out

    def rules(self) -> Dict[str, object]:
        """What the label map applies on top of the probabilities (for output metadata)."""
        return {
            "probabilities": "max over each class's synonyms of the softmax over all synonyms",
            "area_threshold": self.area_threshold,
            "suppressed_classes": self.suppressed().nonzero().flatten().tolist()
            if self.area_threshold > 0 else [],
            "prob_threshold": self.prob_threshold,
            "background_index": self.background_index,
            "label_rule": ("argmax over classes after zeroing the area-suppressed classes; pixels "
                           "whose highest remaining probability is below prob_threshold get "
                           "background_index") if (self.prob_threshold > 0 or self.area_threshold > 0)
            else "argmax over classes",
        }

    def scores(self) -> torch.Tensor:
        """The full ``(C, H, W)`` float32 scores of :func:`class_scores`."""
        out_h, out_w = self.out_size
        scores = torch.empty(self.num_classes, out_h, out_w, dtype=torch.float32, device=self.source.device)
        area = (torch.zeros(self.num_classes, dtype=torch.long, device=self.source.device)
                if self.area_threshold > 0 else None)
        bands = self._bands()
        # Pass 1: softmax and max over synonyms per band (+ the argmax histogram for the area rule).
        for r0, r1 in bands:
            band = self._probabilities(r0, r1)
            scores[:, r0:r1] = band
            if area is not None:
                area += torch.bincount(band.argmax(dim=0).flatten(), minlength=self.num_classes)
            del band
        # Pass 2 (in place): the area rule needs the whole-image histogram, then the threshold.
        if area is not None:
            self._suppressed = self._suppression_from_area(area)
            for c in self._suppressed.nonzero().flatten().tolist():
                scores[c].zero_()
        if self.prob_threshold > 0:
            for r0, r1 in bands:
                low = scores[:, r0:r1].max(dim=0).values < self.prob_threshold
                scores[self.background_index, r0:r1][low] = 1.0
        return scores


def class_scores(
    synonym_logits: Logits,
    class_index: torch.Tensor,
    num_classes: int,
    *,
    prob_threshold: float = 0.0,
    area_threshold: float = 0.0,
    background_index: Optional[int] = None,
    out_size: Optional[Tuple[int, int]] = None,
    band_rows: Optional[int] = None,
) -> torch.Tensor:
    """Per-class scores of one image whose argmax is the prediction.

    Equal (to float rounding) to bilinearly resizing the logits to ``out_size``
    (``align_corners=False``) and post-processing the whole image at once, but computed in
    bands of output rows so that no full-size ``(S, H, W)`` tensor is ever allocated.
    (:class:`ScoreMaps` gives the same results band by band without the full output.)

    Args:
        synonym_logits: ``(S, h, w)`` logits, one channel per synonym (already multiplied
            by the logit scale).
        class_index: ``(S,)`` long, the class of each synonym (values in ``[0, C)``).
        num_classes: C.
        prob_threshold: pixels whose highest class probability is below it become
            ``background_index``. Ignored (0) when ``background_index`` is None.
        area_threshold: classes (other than the background) whose predicted area is at
            most this fraction of the predicted non-background area get probability 0
            (SCLIP's ``area_thd``). 0 disables.
        background_index: the background class, or None for datasets without one.
        out_size: ``(H, W)`` of the output; None keeps ``(h, w)``.
        band_rows: output rows per band; None picks about ``2 ** 24 / (S * W)`` (64 MiB
            float32 temporaries).

    Returns:
        ``(C, H, W)`` float32: the class probabilities (max over synonyms of the softmax
        over synonyms), with suppressed classes set to 0 and thresholded pixels given
        probability 1 on the background class, so that ``argmax(0)`` is the prediction.
    """
    return ScoreMaps(synonym_logits, class_index, num_classes, prob_threshold=prob_threshold,
                     area_threshold=area_threshold, background_index=background_index,
                     out_size=out_size, band_rows=band_rows).scores()
