"""Test-only tiny timm towers (registered by tests/conftest.py, never by the package).

The real timm architectures of open_clip's SigLIP, EVA02, PE-Core and CLIP-style timm ViT
towers shrunk to 64 px, width 64, depth 2, 4 heads. Their timm entry points are registered
with timm's public ``register_model`` under names that start with ``sparseclip_``
(open_clip's ``TimmModel`` builds its trunk by timm name), and their open_clip configs with
:func:`sparseclip_d2.clip.model_configs.register_local_model_config`:

- ``sparseclip-tiny-siglip`` (timm ``sparseclip_tiny_siglip``, from
  ``vit_base_patch16_siglip_224``): no class token, MAP attention-pool head, SigLIP-style
  text tower (no causal mask, last-token pool, logit bias).
- ``sparseclip-tiny-eva02`` (``sparseclip_tiny_eva02``, from ``eva02_base_patch16_clip_224``):
  CLS token, rotary embeddings, SwiGLU, separate q/k/v projections, token pool + linear head.
- ``sparseclip-tiny-eva-postnorm`` (``sparseclip_tiny_eva_postnorm``): the EVA02 tower with
  post-norm blocks (``EvaBlockPostNorm``, as EVA02-E-14).
- ``sparseclip-tiny-pe`` (``sparseclip_tiny_pe``, from ``vit_pe_core_base_patch16_224``): timm
  ``Eva`` with ``AttentionRope`` (xy-indexed rope, grid offset 1), CLS token and a MAP head.
- ``sparseclip_tiny_dinov3`` (timm name only, a proxy backbone): ``vit_base_patch16_dinov3``'s
  ``Eva`` (RoPE, CLS + 4 registers, layer scale, no absolute position embedding) shrunk.
- ``sparseclip-tiny-timm-vit`` (``sparseclip_tiny_timm_vit``, from
  ``vit_base_patch16_clip_224``): CLIP-style timm ViT (pre-norm, CLS token) with one
  register token and ``no_embed_class`` position embeddings, token pool + linear head.
"""
from timm.models import register_model
from timm.models.eva import eva02_base_patch16_clip_224, vit_pe_core_base_patch16_224
from timm.models.vision_transformer import vit_base_patch16_clip_224, vit_base_patch16_siglip_224

from sparseclip_d2.clip.model_configs import register_local_model_config

_TINY_TOWER = dict(img_size=64, embed_dim=64, depth=2, num_heads=4)


def _tiny(fn, pretrained: bool, kwargs: dict, **extra):
    if pretrained:
        raise ValueError("sparseclip_d2's tiny timm test models have no pretrained weights")
    return fn(pretrained=False, **dict(_TINY_TOWER, **extra, **kwargs))


@register_model
def sparseclip_tiny_siglip(pretrained: bool = False, **kwargs):
    """Tiny SigLIP tower (timm ``vit_base_patch16_siglip_224`` at 64 px, width 64, depth 2)."""
    return _tiny(vit_base_patch16_siglip_224, pretrained, kwargs)


@register_model
def sparseclip_tiny_eva02(pretrained: bool = False, **kwargs):
    """Tiny EVA02 CLIP tower (timm ``eva02_base_patch16_clip_224`` at 64 px, width 64, depth 2)."""
    return _tiny(eva02_base_patch16_clip_224, pretrained, kwargs)


@register_model
def sparseclip_tiny_eva_postnorm(pretrained: bool = False, **kwargs):
    """Tiny EVA02-E-style tower: ``eva02_base_patch16_clip_224`` with post-norm blocks."""
    return _tiny(eva02_base_patch16_clip_224, pretrained, kwargs, use_post_norm=True, scale_attn_inner=False,
                 scale_mlp=False)


@register_model
def sparseclip_tiny_pe(pretrained: bool = False, **kwargs):
    """Tiny PE-Core tower (timm ``vit_pe_core_base_patch16_224`` at 64 px, width 64, depth 2)."""
    return _tiny(vit_pe_core_base_patch16_224, pretrained, kwargs, attn_pool_num_heads=4)


@register_model
def sparseclip_tiny_timm_vit(pretrained: bool = False, **kwargs):
    """Tiny CLIP-style timm ViT (``vit_base_patch16_clip_224`` at 64 px) with a register token."""
    return _tiny(vit_base_patch16_clip_224, pretrained, kwargs, reg_tokens=1, no_embed_class=True)


_TINY_TEXT = {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 4, "layers": 2}
_SIGLIP_TEXT = dict(_TINY_TEXT, context_length=16, no_causal_mask=True, proj_bias=True, pool_type="last",
                    norm_kwargs={"eps": 1e-6})

TINY_TIMM_CONFIGS = {
    # open_clip ViT-B-16-SigLIP.json, shrunk
    "sparseclip-tiny-siglip": {
        "embed_dim": 64,
        "init_logit_bias": -10,
        "custom_text": True,
        "vision_cfg": {"image_size": 64, "timm_model_name": "sparseclip_tiny_siglip", "timm_model_pretrained": False,
                       "timm_pool": "map", "timm_proj": "none"},
        "text_cfg": dict(_SIGLIP_TEXT),
    },
    # open_clip EVA02-B-16.json, shrunk
    "sparseclip-tiny-eva02": {
        "embed_dim": 32,
        "custom_text": True,
        "vision_cfg": {"image_size": 64, "timm_model_name": "sparseclip_tiny_eva02", "timm_model_pretrained": False,
                       "timm_pool": "token", "timm_proj": None},
        "text_cfg": dict(_TINY_TEXT),
    },
    # open_clip EVA02-E-14.json (post-norm EVA blocks), shrunk
    "sparseclip-tiny-eva-postnorm": {
        "embed_dim": 32,
        "custom_text": True,
        "vision_cfg": {"image_size": 64, "timm_model_name": "sparseclip_tiny_eva_postnorm",
                       "timm_model_pretrained": False, "timm_pool": "token", "timm_proj": None},
        "text_cfg": dict(_TINY_TEXT),
    },
    # open_clip PE-Core-B-16.json, shrunk
    "sparseclip-tiny-pe": {
        "embed_dim": 32,
        "custom_text": True,
        "vision_cfg": {"image_size": 64, "timm_model_name": "sparseclip_tiny_pe", "timm_model_pretrained": False,
                       "timm_pool": "map", "timm_proj": None},
        "text_cfg": dict(_TINY_TEXT, no_causal_mask=False),
    },
    # open_clip MobileCLIP2-L-14.json (a timm vit_*_clip trunk), shrunk
    "sparseclip-tiny-timm-vit": {
        "embed_dim": 32,
        "custom_text": True,
        "vision_cfg": {"image_size": 64, "timm_model_name": "sparseclip_tiny_timm_vit", "timm_model_pretrained": False,
                       "timm_pool": "token", "timm_proj": None},
        "text_cfg": dict(_TINY_TEXT),
    },
}

#: The tiny configs whose vision tower is a timm model.
TINY_TIMM_MODEL_NAMES = tuple(TINY_TIMM_CONFIGS)


def register_tiny_models() -> None:
    """Register the tiny timm towers' open_clip configs (idempotent)."""
    for name, config in TINY_TIMM_CONFIGS.items():
        register_local_model_config(name, config)
    register_local_model_config(TINY_CLIP5_NAME, TINY_CLIP5_CONFIG)


# ----------------------------------------------------------------------------- proxy backbones
# Tiny versions of the vision foundation models of sparseclip_d2.proxy (timm names of
# PROXY_MODELS, shrunk to width 64, depth 2, 4 heads), for MODEL.SPARSECLIP.PROXY.NAME.
from timm.models.vision_transformer import (  # noqa: E402
    vit_base_patch8_224, vit_base_patch14_reg4_dinov2, vit_base_patch16_224)

_TINY_PROXY = dict(embed_dim=64, depth=2, num_heads=4)


@register_model
def sparseclip_tiny_dino8(pretrained: bool = False, **kwargs):
    """Tiny DINO B/8 (timm ``vit_base_patch8_224.dino``'s architecture at 32 px, width 64, depth 2)."""
    return _tiny(vit_base_patch8_224, pretrained, kwargs, **dict(_TINY_PROXY, img_size=32))


@register_model
def sparseclip_tiny_dinov2(pretrained: bool = False, **kwargs):
    """Tiny DINOv2 B/14 with 4 registers (``vit_base_patch14_reg4_dinov2`` at 56 px, width 64, depth 2)."""
    return _tiny(vit_base_patch14_reg4_dinov2, pretrained, kwargs, **dict(_TINY_PROXY, img_size=56))


@register_model
def sparseclip_tiny_mae(pretrained: bool = False, **kwargs):
    """Tiny MAE B/16 (``vit_base_patch16_224.mae``'s architecture at 32 px, width 64, depth 2)."""
    return _tiny(vit_base_patch16_224, pretrained, kwargs, **dict(_TINY_PROXY, img_size=32))


from timm.models.vision_transformer_sam import samvit_base_patch16  # noqa: E402
from timm.models.eva import vit_base_patch16_dinov3  # noqa: E402


@register_model
def sparseclip_tiny_dinov3(pretrained: bool = False, **kwargs):
    """Tiny DINOv3 B/16 (timm ``vit_base_patch16_dinov3``'s ``Eva`` at 32 px: RoPE ``rope_type='dinov3'``
    on a 2 x 2 native grid, CLS + 4 registers, layer scale, no absolute position embedding; width
    64, depth 2, 4 heads of 16 channels, i.e. 4 RoPE periods per axis)."""
    return _tiny(vit_base_patch16_dinov3, pretrained, kwargs, **dict(_TINY_PROXY, img_size=32))


@register_model
def sparseclip_tiny_samvit(pretrained: bool = False, **kwargs):
    """Tiny SAM ViT-B image encoder (``samvit_base_patch16``'s architecture at 128 px: an 8 x 8
    grid, width 64, depth 2, 4 heads, windows of 4 in block 0, global attention in block 1, a
    32-channel neck), for Trident's SAM (sparseclip_d2/methods/trident/encoder.py)."""
    return _tiny(samvit_base_patch16, pretrained, kwargs, embed_dim=64, depth=2, num_heads=4, img_size=128,
                 window_size=4, global_attn_indexes=[1], neck_chans=32)
# ----------------------------------------------------------------------------- a deeper tiny CLIP
# sparseclip-tiny-vit with 5 vision blocks: CorrCLIP's spatial branch averages blocks depth-2-N ..
# depth-3 (tests/methods/test_corrclip.py), which a 2-block tower does not have.
TINY_CLIP5_NAME = "sparseclip-tiny-vit-5l"
TINY_CLIP5_CONFIG = {
    "embed_dim": 32,
    "quick_gelu": True,
    "vision_cfg": {"image_size": 64, "layers": 5, "width": 64, "head_width": 16, "patch_size": 16},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 4, "layers": 2},
}
