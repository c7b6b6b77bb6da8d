"""CASS's object-presence prompt adjustment as a logit head (``MODEL.SPARSECLIP.OBJECT_PRESENCE.*``;
the maths is in ``methods/cass/object_presence.py``, CASS's spectral key matching in ``methods/cass/encoder.py``)."""
from typing import Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from ...clip.encoder import DenseCLIPEncoder
from .object_presence import object_presence_from_config, object_presence_logits, text_clusters
from ...clip.spec import AttentionSpec
from ..registry import LOGIT_HEADS, LogitHead

__all__ = ["ObjectPresenceHead"]


@LOGIT_HEADS.register("object_presence")
class ObjectPresenceHead(LogitHead):
    """Synonym embeddings adjusted by the image's object presence, per window. With ``GLOBAL
    image`` the image embedding comes from the unmodified tower (``native_encoder``: CLIP's own
    last block, sharing the weights)."""

    key = "MODEL.SPARSECLIP.OBJECT_PRESENCE.ENABLED"

    def __init__(self, settings, encoder):
        super().__init__()
        self.settings = settings
        self.native_encoder = None
        if settings.global_source == "image":
            self.native_encoder = DenseCLIPEncoder(encoder.visual, AttentionSpec(),
                                                   pos_embed_interp=encoder.pos_embed_interp,
                                                   attn_pool_dense=encoder.attn_pool_dense)

    @classmethod
    def settings_from_config(cls, cfg):
        return object_presence_from_config(cfg)

    @classmethod
    def from_config(cls, cfg, clip):
        s = cls.settings_from_config(cfg)
        return cls(s, clip.encoder) if s is not None else None

    def image_context(self, model, image, text_emb) -> Tuple[np.ndarray, Optional[torch.Tensor]]:
        """The synonyms' cluster ids and, with ``GLOBAL image``, the unmodified tower's unit pooled
        embedding ``(1, D)`` of the whole ``(3, H, W)`` normalised image (None with ``GLOBAL window``)."""
        clusters = text_clusters(text_emb, self.settings.cluster_threshold)
        if self.native_encoder is None:
            return clusters, None
        p = int(self.native_encoder.patch_size)
        h, w = image.shape[-2] // p * p, image.shape[-1] // p * p  # conv1 drops a partial patch
        tokens, _, _ = self.native_encoder.forward_tokens(image[None, :, :h, :w])
        return clusters, F.normalize(self.native_encoder.pooled_embedding(tokens).float(), dim=-1)

    def forward(self, model, images, text_emb, inputs, sink, context):
        encoder = model.encoder
        clusters, glob = context if context is not None else (None, None)
        if self.settings.global_source == "window":
            tokens, grid, _ = encoder.forward_tokens(images, **inputs)
            feats = encoder.dense_embedding(tokens, grid)
            glob = F.normalize(encoder.pooled_embedding(tokens).float(), dim=-1)
        else:
            feats = encoder(images, **inputs)
        if clusters is None:
            clusters = text_clusters(text_emb, self.settings.cluster_threshold)
        elif len(clusters) != text_emb.shape[0]:
            raise ValueError(f"object-presence context of {len(clusters)} synonyms for {text_emb.shape[0]} text "
                             "embeddings: build it with image_context(model, image, text_emb) of these texts")
        if glob is None:  # called without an image's context: the windows are the images
            tokens, _, _ = self.native_encoder.forward_tokens(images)
            glob = F.normalize(self.native_encoder.pooled_embedding(tokens).float(), dim=-1)
        return model.logit_scale * object_presence_logits(F.normalize(feats.float(), dim=1), glob, text_emb,
                                                          clusters, self.settings)

    def describe(self) -> str:
        return f"object presence (global {self.settings.global_source})"
