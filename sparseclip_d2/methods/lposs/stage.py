"""LPOSS / LPOSS+ (vladan-stojnic/LPOSS) as a windows stage: the windows' logits of any head are
propagated jointly over a VFM patch graph (and, for LPOSS+, a Lab pixel graph). The maths and
the VFM are in ``propagation/``; the keys are ``MODEL.SPARSECLIP.LABEL_PROPAGATION.*``."""
import torch

from ...clip.text import max_over_synonyms
from ...dense.windows import dense_logits, symmetric_pad, window_grid
from ..registry import STAGES, Stage

__all__ = ["LabelPropagationStage"]


@STAGES.register("label_propagation")
class LabelPropagationStage(Stage):
    """Replaces the window loop: the head's logits of every window, propagated, merged by the same
    loop; with ``REDUCE_SYNONYMS before_resize`` the max over each class's synonyms follows at the
    working size (LPOSS's ``lposs_eval.py reduce_to_true_classes``)."""

    kind = "windows"
    key = "MODEL.SPARSECLIP.LABEL_PROPAGATION.KIND"
    records_attention = False
    excludes = {"pamr": "the propagated scores replace PAMR's refinement",
                "cluster_vote": "the propagated scores replace the vote's whole-image logits"}

    def __init__(self, propagation):
        super().__init__()
        self.propagation = propagation

    @classmethod
    def settings_from_config(cls, cfg):
        from .keys import check_label_propagation_config

        return check_label_propagation_config(cfg)

    @classmethod
    def from_config(cls, cfg, clip):
        from .keys import build_label_propagation

        if cls.settings_from_config(cfg) is None:
            return None
        return cls(build_label_propagation(cfg, cfg.MODEL.DEVICE, [m / 255.0 for m in clip.pixel_mean],
                                           [v / 255.0 for v in clip.pixel_std]))

    def forward(self, model, inputs, window_logits_fn):
        lp = self.propagation
        image = inputs.image
        p = lp.window_multiple(int(model.encoder.patch_size))
        H, W = image.shape[-2:]
        crop = model.crop_size if model.sliding_window else None
        windows = window_grid(H, W, model.crop_size, model.stride) if model.sliding_window else [(0, H, 0, W)]
        wh, ww = windows[0][1] - windows[0][0], windows[0][3] - windows[0][2]
        pad = symmetric_pad(wh, ww, p) if model.patch_remainder == "pad_crop" else (0, 0, 0, 0)

        def dense(fn):
            return dense_logits(image, fn, patch_size=p, crop_size=crop, stride=model.stride if crop else None,
                                batch_size=model.window_batch_size, patch_remainder=model.patch_remainder)

        rgb = None
        if "pixel_lab" in lp.settings.stages:
            rgb = model.rgb01(inputs.x["image"])
        logits = lp(window_logits_fn, dense, windows, (pad[2], pad[0]), rgb, crop)
        class_index = inputs.class_index
        if lp.settings.reduce_synonyms == "before_resize":
            logits = max_over_synonyms(logits, class_index, len(inputs.vocabulary), dim=0)
            class_index = torch.arange(len(inputs.vocabulary), device=logits.device)
        return logits, class_index

    def describe(self) -> str:
        return self.propagation.describe()
