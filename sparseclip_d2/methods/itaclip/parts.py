"""ITACLIP's parts (m-arda-aydn/ITACLIP @ 521a33c ``itaclip_segmentor.py``): test-time augmentation
of each window's logits (a logit head) and the closing of the label map (a labels stage). The
maths is in ``methods/itaclip/tta.py``; the keys are ``TEST.TTA.*`` and ``MODEL.SPARSECLIP.LABEL_CLOSING``."""
from .tta import check_label_closing, check_tta_options, close_labels, tta_logits
from ..registry import LOGIT_HEADS, STAGES, LogitHead, Stage

__all__ = ["TTAHead", "LabelClosingStage"]


@LOGIT_HEADS.register("tta")
class TTAHead(LogitHead):
    """``TEST.TTA.MODE``: the windows' logits averaged over grey, blurred and flipped views."""

    key = "TEST.TTA.MODE"
    passes_encoder_inputs = False  # the views run the plain encoder

    def __init__(self, mode: str, weight: float):
        super().__init__()
        self.mode, self.weight = mode, float(weight)

    @classmethod
    def settings_from_config(cls, cfg):
        check_tta_options(cfg)
        return (cfg.TEST.TTA.MODE, float(cfg.TEST.TTA.WEIGHT)) if cfg.TEST.TTA.MODE else None

    @classmethod
    def from_config(cls, cfg, clip):
        s = cls.settings_from_config(cfg)
        return cls(*s) if s else None

    def forward(self, model, images, text_emb, inputs, sink, context):
        return tta_logits(self.mode, model.encoder, images, text_emb, model.logit_scale, self.weight)

    def describe(self) -> str:
        return f"TTA {self.mode} (weight {self.weight:g})"


@STAGES.register("label_closing")
class LabelClosingStage(Stage):
    """``MODEL.SPARSECLIP.LABEL_CLOSING``: a morphological closing of the label map, last."""

    kind = "labels"
    key = "MODEL.SPARSECLIP.LABEL_CLOSING"

    def __init__(self, kernel: int):
        super().__init__()
        self.kernel = int(kernel)

    @classmethod
    def settings_from_config(cls, cfg):
        return check_label_closing(cfg) or None

    @classmethod
    def from_config(cls, cfg, clip):
        k = cls.settings_from_config(cfg)
        return cls(k) if k else None

    def forward(self, model, inputs, labels):
        return close_labels(labels, self.kernel)

    def describe(self) -> str:
        return f"label closing {self.kernel}"
