"""The sparse-attention CLIP vision tower as a detectron2 ``Backbone``.

Another META_ARCH can use the modified CLIP features with ``MODEL.BACKBONE.NAME:
SparseCLIPBackbone``; ``build_backbone(cfg)`` then returns a frozen backbone whose single
output feature ``"clip"`` has stride = patch size and channels = the joint embedding
dimension D. Inputs are images normalised with ``MODEL.PIXEL_MEAN/STD`` (set them to
CLIP's mean/std, as ``configs/Base-SparseCLIP.yaml`` does).
"""
import logging
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

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
from ..data.mapper import PIXEL_NORMS, pixel_normalization
from ..dense.first_segmentation import refuse_feedback_spec

__all__ = [
    "CLIPParts",
    "SparseCLIPBackbone",
    "build_clip_from_config",
    "build_clip_parts",
    "build_encoder_from_config",
    "check_unread_keys",
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
        # a download that failed (RuntimeError) gets the offline advice; a missing file's message
        # already says what to pass
        offline = ("\nOffline? Download the checkpoint on a connected machine (e.g. open_clip's "
                   "'openai' weights) and pass the local file: MODEL.SPARSECLIP.CLIP.PRETRAINED "
                   "/path/to/checkpoint.pt. For a smoke run with random weights (meaningless "
                   "numbers) pass MODEL.SPARSECLIP.CLIP.PRETRAINED none.") if isinstance(e, RuntimeError) else ""
        raise RuntimeError(
            f"could not load CLIP weights MODEL.SPARSECLIP.CLIP.PRETRAINED={c.PRETRAINED!r} for "
            f"MODEL.SPARSECLIP.CLIP.NAME={c.NAME!r}: {e}{offline}"
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
    if cfg.MODEL.SPARSECLIP.PROXY.NAME:  # a second backbone gives the last block its attention
        from ..methods.encoders import build_proxy_encoder

        return build_proxy_encoder(cfg, visual, next(clip_model.parameters()).device,
                                   pos_embed_interp=c.POS_EMBED_INTERP, attn_pool_dense=c.ATTN_POOL_DENSE)
    return DenseCLIPEncoder(visual, AttentionSpec.from_config(cfg), pos_embed_interp=c.POS_EMBED_INTERP,
                            attn_pool_dense=c.ATTN_POOL_DENSE)


class CLIPParts(NamedTuple):
    """What every META_ARCH of this package builds from ``MODEL.SPARSECLIP`` (:func:`build_clip_parts`).

    ``text_classifier(templates)`` returns a :class:`~sparseclip_d2.clip.TextClassifier` for a
    template-set name or file, with the configured tokenizer, text cache and batch size.
    ``pixel_mean`` / ``pixel_std``: the RGB normalisation (0-255 scale) of
    ``MODEL.SPARSECLIP.PIXEL_NORM``, the one source of it.
    """

    clip_model: nn.Module
    random_weights: bool
    encoder: DenseCLIPEncoder
    text_classifier: Callable[[str], TextClassifier]
    pixel_mean: List[float]
    pixel_std: List[float]


# detectron2/config/defaults.py: MODEL.BACKBONE.NAME, MODEL.PIXEL_MEAN / PIXEL_STD (BGR
# ImageNet) as get_cfg() leaves them; a config that keeps them has not set them.
_D2_BACKBONE_DEFAULT = "build_resnet_backbone"
_D2_PIXEL_DEFAULT = ([103.530, 116.280, 123.675], [1.0, 1.0, 1.0])


def check_unread_keys(cfg, pixel_mean: Sequence[float], pixel_std: Sequence[float]) -> None:
    """Refuse the detectron2 keys the sparseclip_d2 META_ARCHs do not read when a config sets
    them to something that would not take effect (a key is honoured or refused, never
    silently ignored).

    Raises:
        ValueError: naming the key, its value and what to set instead.
    """
    if cfg.MODEL.WEIGHTS:
        raise ValueError(f"MODEL.WEIGHTS = {cfg.MODEL.WEIGHTS!r} is not read: the CLIP weights come from "
                         "MODEL.SPARSECLIP.CLIP.PRETRAINED (a tag, a file, hf:/dir or none); leave MODEL.WEIGHTS ''")
    name = cfg.MODEL.BACKBONE.NAME
    if name not in (_D2_BACKBONE_DEFAULT, "SparseCLIPBackbone"):
        raise ValueError(f"MODEL.BACKBONE.NAME = {name!r} is not used by {cfg.MODEL.META_ARCHITECTURE}: its vision "
                         "tower is the SparseCLIPBackbone's DenseCLIPEncoder of MODEL.SPARSECLIP; valid: "
                         "SparseCLIPBackbone (or unset)")
    mean, std = [float(v) for v in cfg.MODEL.PIXEL_MEAN], [float(v) for v in cfg.MODEL.PIXEL_STD]
    if (mean, std) == _D2_PIXEL_DEFAULT:
        return
    if len(mean) != 3 or len(std) != 3 or any(abs(a - b) > 1e-3 for a, b in zip(mean + std, list(pixel_mean) +
                                                                               list(pixel_std))):
        raise ValueError(
            f"MODEL.PIXEL_MEAN/PIXEL_STD = {mean}/{std} are not read by {cfg.MODEL.META_ARCHITECTURE}: it normalises "
            f"with MODEL.SPARSECLIP.PIXEL_NORM = {cfg.MODEL.SPARSECLIP.PIXEL_NORM!r} (here mean "
            f"{[round(v, 4) for v in pixel_mean]}, std {[round(v, 4) for v in pixel_std]}, RGB 0-255); remove them "
            "or choose PIXEL_NORM")


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
    if sc.PIXEL_NORM not in PIXEL_NORMS:
        raise ValueError(f"unknown MODEL.SPARSECLIP.PIXEL_NORM {sc.PIXEL_NORM!r}; valid: {', '.join(PIXEL_NORMS)}")
    clip_model, random_weights = build_clip_from_config(cfg)
    encoder = build_encoder_from_config(cfg, clip_model)
    pixel_mean, pixel_std = pixel_normalization(sc.PIXEL_NORM, encoder.image_mean, encoder.image_std)
    check_unread_keys(cfg, pixel_mean, pixel_std)
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
            memory_size=0,  # the META_ARCHs keep the one in-memory cache (bounded LRUs)
        )

    # a random second backbone makes the run a smoke run too
    random_any = random_weights or any(b.opts.random_weights for b in encoder.second_backbones())
    return CLIPParts(clip_model, random_any, encoder, text_classifier, pixel_mean, pixel_std)


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
        if encoder.needs.first_segmentation:  # the encoder contract (common/needs.py)
            refuse_feedback_spec(encoder.spec, "SparseCLIPBackbone")
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
        refuse_feedback_spec(AttentionSpec.from_config(cfg), "SparseCLIPBackbone")  # before the weights load
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
