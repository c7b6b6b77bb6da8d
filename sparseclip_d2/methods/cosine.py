"""The default logit head: ``logit_scale * cos(patch embedding, synonym embedding)``."""
import torch
import torch.nn.functional as F

from ..dense.windows import encode_window_logits
from .registry import LOGIT_HEADS, LogitHead

__all__ = ["CosineHead", "cosine_logits"]


def cosine_logits(feats: torch.Tensor, text_emb: torch.Tensor, logit_scale: float) -> torch.Tensor:
    """``(N, D, h, w)`` features -> ``(N, S, h, w)`` ``logit_scale * cos`` (float32)."""
    feats = F.normalize(feats.float(), dim=1)
    return logit_scale * torch.einsum("ndhw,sd->nshw", feats, text_emb)


@LOGIT_HEADS.register("cosine")
class CosineHead(LogitHead):
    """The encoder's dense features against the synonyms (every method's head unless another is on)."""

    key = "the cosine logit head"
    records_attention = True
    reads_correlation = True

    @classmethod
    def settings_from_config(cls, cfg):
        return True

    @classmethod
    def from_config(cls, cfg, clip):
        return cls()

    def forward(self, model, images, text_emb, inputs, sink, context):
        if sink is None:
            feats = model.encoder(images, **inputs)
        else:
            feats, attn = model.encoder(images, return_attention=True, **inputs)
            sink.extend(attn.unbind(0))
        return cosine_logits(feats, text_emb, model.logit_scale)

    def with_correlation(self, model, images, text_emb, inputs, layer):
        return encode_window_logits(model.encoder, images, text_emb, model.logit_scale, correlation_layer=layer,
                                    feedback=inputs.get("feedback"))
