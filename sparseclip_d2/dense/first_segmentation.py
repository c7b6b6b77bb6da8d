"""The first segmentation of a feedback second pass (ResCLIP's SFR): from the dense features
of a first run of the last block to the ``(B, P + N, P + N)`` prior the encoder blends into
its second run (``attention.feedback``).

Per window (any batch size): ``cos(patch, synonym)`` logits bilinearly resized to the
window's pixels (``align_corners=False``), PAMR-refined guided by the normalised window (the
whole window, also where the encoded patch grid leaves a remainder of fewer than ``p`` pixels
out: ``dense_logits``' ``windows``),
times the logit scale, softmax over synonyms, :func:`~sparseclip_d2.attention.patch_labels`
(threshold, patch mode), :func:`~sparseclip_d2.attention.feedback_prior`. Labels are synonym
indices, as upstream's query indices (yvhangyang/ResCLIP @ 0e085f7 ``clip/model.py``
``create_logit_temp`` with ``PAMR(10, dilations=(8, 16))``, ``create_patch_matrix``).
"""
import math
from dataclasses import dataclass
from typing import Tuple

import torch
import torch.nn.functional as F

from ..attention.feedback import feedback_prior, patch_labels
from ..common.activity import active_record, report
from ..common.keys import Key, Section, key_field
from .pamr import pamr

__all__ = ["FeedbackSettings", "FEEDBACK_SECTION", "first_segmentation_prior", "refuse_feedback_spec"]


def refuse_feedback_spec(spec, who: str) -> None:
    """Raise ``ValueError`` if ``spec`` (an ``AttentionSpec``, or None) has ``feedback=True``:
    ``who`` (a module that runs the encoder without class embeddings) cannot make the first
    segmentation the second pass is built from."""
    if spec is not None and spec.feedback.enabled:
        raise ValueError(
            f"{who} cannot run an attention spec with feedback=True (ResCLIP's SFR second pass, "
            "MODEL.SPARSECLIP.FEEDBACK.ENABLED True): the second pass needs a first segmentation against the "
            "class embeddings, which only the segmentation META_ARCHITECTURE (SparseCLIP) makes; set "
            "MODEL.SPARSECLIP.FEEDBACK.ENABLED False (in Python: AttentionSpec.preset('resclip_rcs'))")


@dataclass(frozen=True)
class FeedbackSettings:
    """How the first segmentation and its prior are made (``MODEL.SPARSECLIP.FEEDBACK.*``
    except the blend's ``WEIGHT`` / ``SCALE`` / ``PRECISION``, which are the attention spec's).

    Fields: ``threshold`` (pixels whose top probability is below it get label 0; in [0, 1]),
    ``pamr_steps`` (>= 0), ``pamr_dilations`` (positive integers), ``connectivity`` (bool),
    ``smooth_std`` (> 0 patches).
    """

    threshold: float = key_field(0.0, "THRESHOLD", "First segmentation: softmax over synonyms of the window's "
                                 "logits at pixel size, refined by PAMR_STEPS of PAMR (0 = none) with "
                                 "PAMR_DILATIONS; pixels whose top probability is below THRESHOLD get label 0 "
                                 "(ResCLIP's temp_thd); each patch takes its most frequent label.")
    pamr_steps: int = key_field(10, "PAMR_STEPS", "PAMR steps of the first segmentation (0 = none).")
    pamr_dilations: Tuple[int, ...] = key_field((8, 16), "PAMR_DILATIONS", "PAMR's dilations (a list key).")
    connectivity: bool = key_field(True, "CONNECTIVITY", "Prior: same-label patch pairs; CONNECTIVITY decays pairs "
                                   "no straight path of the label joins (ResCLIP's delete_same_entity).")
    smooth_std: float = key_field(5.0, "SMOOTH_STD", "The prior's rows smoothed by a gaussian of SMOOTH_STD patches.")

    def __post_init__(self):
        key = "MODEL.SPARSECLIP.FEEDBACK."
        t = self.threshold
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.0 <= float(t) <= 1.0:
            raise ValueError(f"{key}THRESHOLD = {t!r} is invalid; valid: a probability in [0, 1] (0 = off)")
        s = self.pamr_steps
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ValueError(f"{key}PAMR_STEPS = {s!r} is invalid; valid: an integer >= 0 (0 = no PAMR)")
        d = self.pamr_dilations
        if (isinstance(d, (str, bytes)) or not hasattr(d, "__iter__") or not list(d)
                or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in d)):
            raise ValueError(f"{key}PAMR_DILATIONS = {d!r} is invalid; valid: a non-empty list of positive "
                             "integers (ResCLIP: [8, 16])")
        object.__setattr__(self, "pamr_dilations", tuple(d))
        if not isinstance(self.connectivity, bool):
            raise ValueError(f"{key}CONNECTIVITY = {self.connectivity!r} is invalid; valid: True or False")
        sd = self.smooth_std
        if isinstance(sd, bool) or not isinstance(sd, (int, float)) or not (sd > 0 and math.isfinite(sd)):
            raise ValueError(f"{key}SMOOTH_STD = {sd!r} is invalid; valid: a finite number > 0 (patches)")

    @classmethod
    def from_config(cls, cfg) -> "FeedbackSettings":
        """Read and validate ``cfg.MODEL.SPARSECLIP.FEEDBACK``."""
        fb = cfg.MODEL.SPARSECLIP.FEEDBACK
        return cls(threshold=fb.THRESHOLD, pamr_steps=fb.PAMR_STEPS, pamr_dilations=tuple(fb.PAMR_DILATIONS),
                   connectivity=fb.CONNECTIVITY, smooth_std=fb.SMOOTH_STD)


#: ``MODEL.SPARSECLIP.FEEDBACK``: ``ENABLED``, the blend's keys (read by the attention spec,
#: ``AttentionSpec.feedback_*``: the one part whose defaults this table still repeats), then
#: :class:`FeedbackSettings`' keys.
FEEDBACK_SECTION = Section(FeedbackSettings, switch="ENABLED", before=(
    Key("ENABLED", False),
    Key("WEIGHT", 0.7, "The prior's share in [0, 1] (ResCLIP's SFR lambda)."),
    Key("SCALE", 2.2, "The blend's factor > 0 (ResCLIP's SFR tau)."),
    Key("PRECISION", "float32", '"float32", or "float16" (ResCLIP casts the prior to float16 even in float32 runs).')))


def first_segmentation_prior(feats: torch.Tensor, images: torch.Tensor, text_emb: torch.Tensor,
                             logit_scale: float, settings: FeedbackSettings, patch: int,
                             num_prefix_tokens: int = 1) -> torch.Tensor:
    """The feedback prior of a first pass.

    Args:
        feats: ``(B, D, h, w)`` dense features of the first run of the last block.
        images: ``(B, 3, H, W)`` the normalised windows they come from, ``H // p = h`` and
            ``W // p = w`` (the resize size and PAMR's guide; patch labels from the top-left
            ``h * p x w * p`` pixels).
        text_emb: ``(S, D)`` L2-normalised synonym embeddings.
        logit_scale: the softmax's scale of the cosines.
        settings: :class:`FeedbackSettings`.
        patch: patch side ``p``.
        num_prefix_tokens: prefix tokens of the prior (CLS: 1).
    Returns:
        ``(B, P + h*w, P + h*w)`` float32.
    """
    h, w = feats.shape[-2:]
    if images.shape[0] != feats.shape[0] or (images.shape[-2] // patch, images.shape[-1] // patch) != (h, w):
        raise ValueError(f"the first segmentation of {tuple(feats.shape[-2:])} patches of side {patch} needs "
                         f"{feats.shape[0]} windows of {h * patch}..{h * patch + patch - 1} x "
                         f"{w * patch}..{w * patch + patch - 1} pixels, got {tuple(images.shape)}")
    f = F.normalize(feats.float(), dim=1)
    cos = torch.einsum("bdhw,sd->bshw", f, text_emb.float().to(f.device))
    cos = F.interpolate(cos, size=tuple(images.shape[-2:]), mode="bilinear", align_corners=False)
    if settings.pamr_steps:
        cos = pamr(images.float(), cos, settings.pamr_steps, settings.pamr_dilations)
    probs = torch.softmax(cos * float(logit_scale), dim=1)
    labels = patch_labels(probs, patch, settings.threshold)
    if active_record() is not None:  # the stage-activity record: distinct patch labels of each window
        for window in labels:
            n = int(window.unique().numel())
            report("first segmentation", n > 1, labels=n)
    return feedback_prior(labels, settings.smooth_std, settings.connectivity, num_prefix_tokens)
