"""The sparse-attention CLIP vision tower as a detectron2 ``Backbone``.

Another META_ARCH can use the modified CLIP features with ``MODEL.BACKBONE.NAME:
SparseCLIPBackbone``; ``build_backbone(cfg)`` then returns a frozen backbone whose single
output feature ``"clip"`` has stride = patch size and channels = the joint embedding
dimension D. Inputs are images normalised with ``MODEL.PIXEL_MEAN/STD`` (set them to
CLIP's mean/std, as ``configs/Base-SparseCLIP.yaml`` does).
"""
import logging
from typing import Callable, Dict, NamedTuple, Optional, Tuple

import torch
from torch import nn

from detectron2.config import configurable
from detectron2.layers import ShapeSpec
from detectron2.modeling import BACKBONE_REGISTRY, Backbone

from ..attention.entmax import entmax_backend
from ..clip import (
    AttentionSpec,
    DenseCLIPEncoder,
    TextClassifier,
    build_clip,
    get_tokenizer,
    is_random_weights,
    vision_tower_variant,
)
from ..config import check_device, check_sparseclip_config

__all__ = [
    "CLIPParts",
    "SparseCLIPBackbone",
    "build_clip_from_config",
    "build_clip_parts",
    "build_encoder_from_config",
    "resolve_device",
]

logger = logging.getLogger(__name__)


def resolve_device(device: str) -> str:
    """``device`` unless it asks for CUDA on a machine without a GPU; then ``"cpu"`` (logged).

    Raises:
        ValueError: ``device`` is not cpu, cuda, cuda:N or mps (the error names it).
    """
    check_device(device)
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        logger.warning("MODEL.DEVICE=%s but no CUDA GPU is available: running on CPU.", device)
        return "cpu"
    return str(device)


def build_clip_from_config(cfg) -> Tuple[nn.Module, bool]:
    """Build the frozen open_clip model named by ``cfg.MODEL.SPARSECLIP.CLIP``.

    Returns:
        ``(clip_model, random_weights)``. Random weights (``PRETRAINED: none``) are logged
        with WARNING lines: such a run is a smoke test whose numbers mean nothing.

    Raises:
        RuntimeError: the weights could not be loaded; the message says how to pass a
            local checkpoint file and how to run with random weights instead.
    """
    c = cfg.MODEL.SPARSECLIP.CLIP
    random_weights = is_random_weights(c.PRETRAINED)
    try:
        model = build_clip(
            c.NAME,
            c.PRETRAINED,
            precision=c.PRECISION,
            device=resolve_device(cfg.MODEL.DEVICE),
            force_quick_gelu=c.FORCE_QUICK_GELU,
            cache_dir=c.CACHE_DIR or None,
        )
    except (RuntimeError, OSError) as e:
        raise RuntimeError(
            f"could not load CLIP weights MODEL.SPARSECLIP.CLIP.PRETRAINED={c.PRETRAINED!r} for "
            f"MODEL.SPARSECLIP.CLIP.NAME={c.NAME!r}: {e}\n"
            "Offline? Download the checkpoint on a connected machine (e.g. open_clip's "
            "'openai' weights) and pass the local file: MODEL.SPARSECLIP.CLIP.PRETRAINED "
            "/path/to/checkpoint.pt. For a smoke run with random weights (meaningless "
            "numbers) pass MODEL.SPARSECLIP.CLIP.PRETRAINED none."
        ) from e
    # build_clip itself logs the RANDOM WEIGHTS warning; callers record random_weights
    return model, random_weights


def build_encoder_from_config(cfg, clip_model: nn.Module) -> DenseCLIPEncoder:
    """The ``DenseCLIPEncoder`` of ``cfg`` around ``clip_model``'s vision tower: the attention
    spec, ``MODEL.SPARSECLIP.CLIP.POS_EMBED_INTERP``, and a rebuilt tower when
    ``MODEL.SPARSECLIP.CLIP.VISION_ACT`` / ``VISION_LN_EPS`` ask for another activation or
    LayerNorm eps (the text tower is never changed)."""
    c = cfg.MODEL.SPARSECLIP.CLIP
    visual = clip_model.visual
    if c.VISION_ACT or c.VISION_LN_EPS:
        visual = vision_tower_variant(clip_model, c.NAME, act=c.VISION_ACT, ln_eps=c.VISION_LN_EPS)
    return DenseCLIPEncoder(visual, AttentionSpec.from_config(cfg), pos_embed_interp=c.POS_EMBED_INTERP,
                            attn_pool_dense=c.ATTN_POOL_DENSE)


class CLIPParts(NamedTuple):
    """What every META_ARCH of this package builds from ``MODEL.SPARSECLIP`` (:func:`build_clip_parts`).

    ``text_classifier(templates)`` returns a :class:`~sparseclip_d2.clip.TextClassifier` for a
    template-set name or file, with the configured tokenizer, text cache and batch size.
    """

    clip_model: nn.Module
    random_weights: bool
    encoder: DenseCLIPEncoder
    text_classifier: Callable[[str], TextClassifier]


def build_clip_parts(cfg) -> CLIPParts:
    """Validate ``cfg``'s user-facing keys, then build the CLIP model, its dense encoder and
    the text-classifier factory, shared by the segmentation and FG-OVD META_ARCHs.

    The validation (:func:`~sparseclip_d2.config.check_sparseclip_config` and the attention
    spec) runs before the weights are loaded. On CPU with a sparse normaliser the alpha-entmax
    kernel is built or loaded here, announced with its own progress lines, rather than inside
    the first forward under the caller's progress bar.
    """
    sc = cfg.MODEL.SPARSECLIP
    check_sparseclip_config(cfg)
    AttentionSpec.from_config(cfg)
    clip_model, random_weights = build_clip_from_config(cfg)
    encoder = build_encoder_from_config(cfg, clip_model)
    if encoder.spec.normalizer != "softmax" and next(clip_model.parameters()).device.type == "cpu":
        entmax_backend()
    tokenizer = get_tokenizer(sc.CLIP.NAME, sc.TEXT.TOKENIZER or None, random_weights=random_weights)

    def text_classifier(templates: str) -> TextClassifier:
        return TextClassifier(
            clip_model,
            tokenizer,
            templates,
            model_name=f"{sc.CLIP.NAME}:{sc.CLIP.PRETRAINED}",
            cache_dir=sc.TEXT.CACHE_DIR or None,
            batch_size=sc.TEXT.BATCH_SIZE,
        )

    return CLIPParts(clip_model, random_weights, encoder, text_classifier)


@BACKBONE_REGISTRY.register()
class SparseCLIPBackbone(Backbone):
    """Frozen CLIP vision tower with the configured final attention (``DenseCLIPEncoder``).

    ``forward(images)``: ``(B, 3, H, W)`` normalised images, H and W multiples of the patch
    size p (``size_divisibility``) -> ``{"clip": (B, D, H / p, W / p)}`` patch embeddings
    in CLIP's joint space (final norm + per-patch head, not L2-normalised).
    """

    @configurable
    def __init__(self, *, encoder: nn.Module, out_feature: str = "clip"):
        """
        Args:
            encoder: a ``DenseCLIPEncoder`` (or any module with ``patch_size`` and
                ``embed_dim`` mapping ``(B, 3, H, W)`` to ``(B, D, H/p, W/p)``); frozen here.
            out_feature: name of the output feature.
        """
        super().__init__()
        self.encoder = encoder
        for p in self.encoder.parameters():
            p.requires_grad_(False)
        self._out_features = [out_feature]
        self._out_feature_strides = {out_feature: int(encoder.patch_size)}
        self._out_feature_channels = {out_feature: int(encoder.embed_dim)}

    @classmethod
    def from_config(cls, cfg, input_shape: Optional[ShapeSpec] = None):
        if input_shape is not None and input_shape.channels not in (None, 3):
            raise ValueError(f"SparseCLIPBackbone needs 3 input channels, got input_shape={input_shape}")
        clip_model, _ = build_clip_from_config(cfg)
        return {"encoder": build_encoder_from_config(cfg, clip_model)}

    @property
    def size_divisibility(self) -> int:
        return self._out_feature_strides[self._out_features[0]]

    def forward(self, x: torch.Tensor) -> Dict[str, torch.Tensor]:
        """``(B, 3, H, W)`` -> ``{"clip": (B, D, H / p, W / p)}``."""
        p = self.size_divisibility
        if x.dim() != 4 or x.shape[1] != 3 or x.shape[-2] % p or x.shape[-1] % p:
            raise ValueError(
                f"SparseCLIPBackbone expects (B, 3, H, W) with H, W multiples of {p}, got {tuple(x.shape)}"
            )
        param = next(self.encoder.parameters(), None)
        if param is not None:
            x = x.to(param.dtype)
        return {self._out_features[0]: self.encoder(x)}

    def output_shape(self) -> Dict[str, ShapeSpec]:
        return {
            name: ShapeSpec(channels=self._out_feature_channels[name], stride=self._out_feature_strides[name])
            for name in self._out_features
        }
