"""PAMR (Araslanov & Roth 2020) as a logits stage, as NACLIP and ResCLIP run it after the logits
(``MODEL.SPARSECLIP.PAMR.*``; the maths is in ``dense/pamr.py``)."""
import torch
import torch.nn.functional as F

from ..dense.pamr import pamr
from .registry import STAGES, Stage

__all__ = ["PAMRStage"]


@STAGES.register("pamr")
class PAMRStage(Stage):
    """The logits and the normalised image bilinearly resized to the output size
    (``align_corners=False``, as NACLIP's predict), then ``STEPS`` PAMR iterations with
    ``DILATIONS`` (linear in the logits, so the logit scale commutes with it)."""

    kind = "logits"
    key = "MODEL.SPARSECLIP.PAMR.STEPS"

    def __init__(self, steps: int, dilations):
        super().__init__()
        self.steps, self.dilations = int(steps), tuple(int(d) for d in dilations)
        pamr(torch.zeros(1, 3, 2, 2), torch.zeros(1, 1, 2, 2), 1, self.dilations)  # validates the dilations

    @classmethod
    def settings_from_config(cls, cfg):
        p = cfg.MODEL.SPARSECLIP.PAMR
        if isinstance(p.STEPS, bool) or int(p.STEPS) != p.STEPS or p.STEPS < 0:
            raise ValueError(f"MODEL.SPARSECLIP.PAMR.STEPS must be a non-negative integer, got {p.STEPS!r}")
        return (int(p.STEPS), tuple(p.DILATIONS)) if p.STEPS else None

    @classmethod
    def from_config(cls, cfg, clip):
        s = cls.settings_from_config(cfg)
        return cls(*s) if s is not None else None

    def forward(self, model, inputs, logits):
        return refine(inputs.image, logits, inputs.out_size, self.steps, self.dilations)

    def describe(self) -> str:
        return f"PAMR {self.steps} steps, dilations {list(self.dilations)}"


def refine(image: torch.Tensor, logits: torch.Tensor, out_size, steps: int, dilations) -> torch.Tensor:
    """PAMR-refined ``(S, out_h, out_w)`` logits from ``(S, h, w)`` logits and the ``(3, h, w)``
    normalised image (both bilinearly resized to ``out_size`` first, ``align_corners=False``)."""
    size = (int(out_size[0]), int(out_size[1]))
    img = F.interpolate(image[None].float(), size=size, mode="bilinear", align_corners=False)
    full = F.interpolate(logits[None].float(), size=size, mode="bilinear", align_corners=False)
    return pamr(img, full, steps, dilations)[0]
