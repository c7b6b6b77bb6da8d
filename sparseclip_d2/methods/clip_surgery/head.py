"""CLIP Surgery's text-side feature surgery as a logit head (xmed-lab/CLIP_Surgery @ d4696d4
``clip/clip.py`` ``clip_feature_surgery``); the maths is in ``methods/clip_surgery/surgery.py``, the keys are
``MODEL.SPARSECLIP.FEATURE_SURGERY.*``."""
import torch
import torch.nn.functional as F

from .surgery import check_surgery_options, feature_surgery
from ..registry import LOGIT_HEADS, LogitHead

__all__ = ["FeatureSurgeryHead"]


@LOGIT_HEADS.register("feature_surgery")
class FeatureSurgeryHead(LogitHead):
    """Patch cosines with the CLS cosines' redundancy removed (``FEATURE_SURGERY.CLS_SCALE``)."""

    key = "MODEL.SPARSECLIP.FEATURE_SURGERY.ENABLED"
    records_attention = True

    def __init__(self, cls_scale: float):
        super().__init__()
        self.cls_scale = float(cls_scale)

    @classmethod
    def settings_from_config(cls, cfg):
        check_surgery_options(cfg)
        fs = cfg.MODEL.SPARSECLIP.FEATURE_SURGERY
        return float(fs.CLS_SCALE) if fs.ENABLED else None

    @classmethod
    def from_config(cls, cfg, clip):
        s = cls.settings_from_config(cfg)
        return cls(s) if s is not None else None

    def forward(self, model, images, text_emb, inputs, sink, context):
        tokens, grid, attn = model.encoder.forward_tokens(images, **inputs)
        if sink is not None:
            sink.extend(attn.unbind(0))
        feats = F.normalize(model.encoder.dense_embedding(tokens, grid).float(), dim=1)
        cls = F.normalize(model.encoder.pooled_embedding(tokens).float(), dim=-1)
        return model.logit_scale * feature_surgery(torch.einsum("ndhw,sd->nshw", feats, text_emb),
                                                   cls @ text_emb.T, self.cls_scale)

    def describe(self) -> str:
        return f"feature surgery (CLS scale {self.cls_scale:g})"
