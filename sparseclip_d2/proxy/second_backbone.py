"""``ProxyBackbone``: a second frozen vision backbone (a VFM: DINO, DINOv2, DINOv3, MAE, SAM) built
through timm, returning one dense feature map per image for the proxy attention of the last
CLIP block (:mod:`sparseclip_d2.methods.proxyclip.encoder`).

Position information comes in two kinds: an absolute position embedding added to the patch
tokens (DINO, DINOv2, MAE: resized to every window's grid with ``POS_EMBED_INTERP``), or rotary
embeddings applied to the queries and keys inside each block (DINOv3, timm's ``Eva`` with
``rope_type='dinov3'``: no absolute embedding, timm's RoPE module builds the rotation for each
window's grid, so nothing is resized and ``POS_EMBED_INTERP`` does not apply).

Weights (``MODEL.SPARSECLIP.PROXY.WEIGHTS``): ``none`` (random, logged loudly as for CLIP),
``timm`` (timm's own pretrained tag of the name, downloaded by timm), or a local file
(``.pth``/``.pt``/``.bin``/``.safetensors``) in timm's key layout or in the layout of the
upstream releases (torch hub DINO and DINOv2, MAE's ``{'model': ...}`` checkpoints, SAM's
``image_encoder.*``, DINOv3's ``storage_tokens`` / ``ls1.gamma`` release), converted with the
``checkpoint_filter_fn`` of the timm module that defines the model.
"""
import functools
import logging
import math
import os
from dataclasses import MISSING, dataclass
from typing import Dict, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..clip.encoder import interpolate_pos_embed
from ..common.cache import LRUCache
from ..common.keys import key_field

__all__ = [
    "PROXY_FEATURES",
    "PROXY_POS_EMBED_INTERP_MODES",
    "PROXY_WEIGHT_TAGS",
    "PROXY_MODELS",
    "ProxyBackbone",
    "ProxyOptions",
    "build_proxy",
    "check_proxy_options",
    "is_sam_encoder",
    "load_proxy_state_dict",
    "meta_model",
    "to_proxy_input",
    "uint8_image",
]

logger = logging.getLogger(__name__)

#: What the proxy returns per patch (``MODEL.SPARSECLIP.PROXY.FEATURE``):
#: ``tokens`` = the output of block ``LAYER`` through the final norm (DINO / DINOv2
#: ``get_intermediate_layers``, MAE ``forward_features``; SAM: its neck output, last layer
#: only); ``keys`` / ``queries`` / ``values`` = block ``LAYER``'s k / q / v projections of its
#: normed input (with their biases and q / k norms), heads concatenated, before any rotary
#: embedding (a RoPE model rotates q and k by each patch's position inside the attention; the
#: projections are the content of the patch, as for every other proxy) (the alternatives commented out in ProxyCLIP's
#: ``proxyclip_segmentor.py`` ``forward_feature``); ``queries+keys`` = their sum (CorrCLIP,
#: zdk258/CorrCLIP @ 103bc18 ``corrclip_segmentor.py`` ``forward_feature``: ``qkv[0] + qkv[1]``).
PROXY_FEATURES = ("tokens", "keys", "queries", "values", "queries+keys")
#: How the proxy's position embeddings are resized to another grid (``PROXY.POS_EMBED_INTERP``),
#: bicubic: ``size`` and ``scale_factor`` as :func:`~sparseclip_d2.clip.encoder.interpolate_pos_embed`
#: (``scale_factor`` = torch hub DINO's ``(w0 + 0.1) / sqrt(N)``); ``size_antialias`` = by size
#: with ``antialias=True``, as torch hub DINOv2 with registers does (facebookresearch/dinov2 @
#: b8931f7 ``dinov2/hub/backbones.py`` ``dinov2_vitb14_reg``: ``interpolate_antialias=True,
#: interpolate_offset=0.0``; ``models/vision_transformer.py`` ``interpolate_pos_encoding``).
PROXY_POS_EMBED_INTERP_MODES = ("size", "scale_factor", "size_antialias")
#: ``WEIGHTS`` values that are not files: random weights, or timm's own pretrained tag.
PROXY_WEIGHT_TAGS = ("none", "timm")
_RANDOM = ("", "none", "random")
#: ``POS_EMBED_INTERP``'s default: the only value a model without an absolute position embedding takes.
_DEFAULT_POS_EMBED_INTERP = "scale_factor"

#: The VFMs of the field by timm name, with the PROXY.INPUT_SIZE / POS_EMBED_INTERP values that
#: follow the upstream code that uses them (set in each config file) (mc-lan/ProxyCLIP @ e7b767f ``proxyclip_segmentor.py`` ``forward_feature``):
#: ``input_size`` 0 = the window as it is; ``-1`` = resized to the sliding-window crop
#: (MAE: ``F.interpolate(imgs_norm, size=(self.slide_crop, self.slide_crop), mode='bilinear')``);
#: a number = resized to that square (SAM: 1024). ``pos_embed_interp``: DINO's hub model resizes
#: position embeddings with ``scale_factor=(w0 + 0.1) / sqrt(N)`` (facebookresearch/dino
#: ``vision_transformer.py`` ``interpolate_pos_encoding``); DINOv2 with registers by size with
#: antialiasing (see :data:`PROXY_POS_EMBED_INTERP_MODES`); MAE by size at load time (ProxyCLIP
#: ``mae/pos_embed.py`` ``interpolate_pos_embed``: ``size=(new_size, new_size)``, bicubic).
PROXY_MODELS: Dict[str, Dict] = {
    "vit_base_patch8_224.dino": dict(input_size=0, pos_embed_interp="scale_factor"),
    "vit_base_patch16_224.dino": dict(input_size=0, pos_embed_interp="scale_factor"),
    "vit_base_patch14_reg4_dinov2": dict(input_size=0, pos_embed_interp="size_antialias"),
    "vit_base_patch16_224.mae": dict(input_size=-1, pos_embed_interp="size"),
    "samvit_base_patch16": dict(input_size=1024, pos_embed_interp="size"),
    # DINOv3 ViT-B/16 (timm 1.0.31 ``models/eva.py`` ``vit_base_patch16_dinov3``: RoPE
    # ``rope_type='dinov3'``, CLS + 4 register tokens, layer scale, ``use_abs_pos_emb=False``): no
    # absolute position embedding to resize (``pos_embed_interp`` None); the window as it is.
    # No upstream method of the field publishes code on it (docs/methods.md, "DINOv3 as the second backbone").
    "vit_base_patch16_dinov3": dict(input_size=0, pos_embed_interp=None),
}
# ImageNet mean/std on the 0-1 scale: what ProxyCLIP feeds every VFM
# (proxyclip_segmentor.py: transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_PRECISIONS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class ProxyOptions:
    """The validated ``MODEL.SPARSECLIP.PROXY.*`` keys that build a :class:`ProxyBackbone`.

    Fields: name (timm model name), weights (``none``, ``timm`` or a file), layer (block index,
    negative = from the end), feature (:data:`PROXY_FEATURES`), input_size (0 = the window,
    -1 = the crop size, N = N x N pixels), pos_embed_interp (:data:`PROXY_POS_EMBED_INTERP_MODES`),
    precision (fp32, fp16, bf16).
    """

    name: str = key_field(MISSING, "NAME", "timm model name: vit_base_patch8_224.dino, vit_base_patch16_224.dino, "
                          "vit_base_patch14_reg4_dinov2, vit_base_patch16_dinov3, vit_base_patch16_224.mae, "
                          'samvit_base_patch16 (or another timm ViT); "" disables the proxy.')
    weights: str = key_field("none", "WEIGHTS", '"none" (random weights: a smoke run, logged loudly), "timm" (timm\'s '
                             "own pretrained tag of NAME), or a local weights file in timm's layout or the upstream "
                             "release's (torch hub DINO / DINOv2, DINOv3, MAE {'model': ...}, SAM image_encoder.*).")
    layer: int = key_field(-1, "LAYER", "Block whose feature is used (0-based; -1 = the last; blocks after it do not "
                           "run).")
    feature: str = key_field("tokens", "FEATURE", '"tokens" (the block\'s output through the final norm; ProxyCLIP), '
                             '"keys", "queries" or "values" (that block\'s k / q / v, heads concatenated), '
                             '"queries+keys" (their sum; CorrCLIP).')
    input_size: int = key_field(0, "INPUT_SIZE", "Pixels the proxy sees per window: 0 = the window itself, -1 = "
                                "resized to TEST.SLIDING_WINDOW.CROP_SIZE (ProxyCLIP's MAE), N = N x N (SAM: 1024).")
    pos_embed_interp: str = key_field(_DEFAULT_POS_EMBED_INTERP, "POS_EMBED_INTERP", 'Position embeddings resized '
                                      '(bicubic) by "scale_factor" (torch hub DINO), "size" (MAE) or "size_antialias" '
                                      "(torch hub DINOv2 with registers); a model without an absolute position "
                                      "embedding (DINOv3: RoPE) resizes nothing and takes only the default.")
    precision: str = key_field("fp32", "PRECISION", "Proxy weights dtype: fp32, fp16 (ProxyCLIP runs its VFM in "
                               "fp16), bf16; scores are fp32.")

    @property
    def random_weights(self) -> bool:
        return str(self.weights).strip().lower() in _RANDOM


def _timm():
    import timm

    return timm


def key_name(key: str, field: str) -> str:
    """The config key of ``field`` under ``key``: ``"<key>.<FIELD>"``, or ``"<key><FIELD>"`` when
    ``key`` ends with ``_`` (a prefix of flat keys, e.g. ``PROXY.TRIDENT.SAM_`` -> ``SAM_WEIGHTS``)."""
    return f"{key}{field}" if key.endswith("_") else f"{key}.{field}"


def check_proxy_options(opts: ProxyOptions, key: str = "MODEL.SPARSECLIP.PROXY") -> ProxyOptions:
    """Validate ``opts`` without building anything; returns them.

    Raises:
        ValueError: an unknown timm name, feature, interpolation, precision or a bad layer /
            input size, naming ``key.<FIELD>``, the value and the valid choices.
        FileNotFoundError: ``weights`` names a file that does not exist (naming the key and
            the path).
    """
    k = functools.partial(key_name, key)
    timm = _timm()
    if not isinstance(opts.name, str) or not timm.is_model(opts.name):
        raise ValueError(f"{k('NAME')} = {opts.name!r} is not a timm model; valid: {', '.join(PROXY_MODELS)} "
                         "(or another timm ViT name)")
    if opts.feature not in PROXY_FEATURES:
        raise ValueError(f"{k('FEATURE')} = {opts.feature!r} is invalid; valid: {', '.join(PROXY_FEATURES)}")
    if opts.name.startswith("samvit") and (opts.feature != "tokens" or opts.layer != -1):
        raise ValueError(f"{key.rstrip('._')}: the SAM image encoder ({opts.name}) gives its neck output only: "
                         f"FEATURE tokens and LAYER -1, got FEATURE {opts.feature!r}, LAYER {opts.layer!r}")
    if isinstance(opts.layer, bool) or not isinstance(opts.layer, int):
        raise ValueError(f"{k('LAYER')} = {opts.layer!r} is invalid; valid: a block index (0-based; -1 = the last)")
    if isinstance(opts.input_size, bool) or not isinstance(opts.input_size, int) or opts.input_size < -1:
        raise ValueError(f"{k('INPUT_SIZE')} = {opts.input_size!r} is invalid; valid: 0 (the window as it is), "
                         "-1 (resized to TEST.SLIDING_WINDOW.CROP_SIZE) or a side in pixels")
    if opts.pos_embed_interp not in PROXY_POS_EMBED_INTERP_MODES:
        raise ValueError(f"{k('POS_EMBED_INTERP')} = {opts.pos_embed_interp!r} is invalid; valid: "
                         f"{', '.join(PROXY_POS_EMBED_INTERP_MODES)}")
    if opts.precision not in _PRECISIONS:
        raise ValueError(f"{k('PRECISION')} = {opts.precision!r} is invalid; valid: {', '.join(_PRECISIONS)}")
    depth = _architecture_depth(opts.name, key)
    if not is_sam_encoder(opts.name) and not has_abs_pos_embed(meta_model(opts.name)) \
            and opts.pos_embed_interp != _DEFAULT_POS_EMBED_INTERP:
        raise ValueError(f"{k('POS_EMBED_INTERP')} = {opts.pos_embed_interp!r} changes nothing for {opts.name}: it has "
                         "no absolute position embedding to resize (its rotary embeddings are built for each grid); "
                         f"valid: leave it at its default {_DEFAULT_POS_EMBED_INTERP!r}")
    if not -depth <= opts.layer < depth:
        raise ValueError(f"{k('LAYER')} = {opts.layer} is outside [{-depth}, {depth - 1}] for {opts.name} "
                         f"(depth {depth}; 0-based, -1 = the last block)")
    w = str(opts.weights).strip()
    if w.lower() not in _RANDOM + ("timm",):
        path = os.path.expanduser(w)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{k('WEIGHTS')} = {w!r}: no such file ({os.path.abspath(path)}); valid: none "
                                    "(random weights), timm (timm's own pretrained tag) or a local weights file")
    return opts


@functools.lru_cache(maxsize=None)
def meta_model(name: str) -> nn.Module:
    """An instance of timm model ``name`` on the ``meta`` device (no memory, no weights): its
    architecture, read before anything is built for real. Do not run or change it (it is shared)."""
    with torch.device("meta"):
        return _timm().create_model(name, pretrained=False, num_classes=0)


def has_abs_pos_embed(model: nn.Module) -> bool:
    """Whether timm ViT ``model`` adds an absolute position embedding to its tokens (DINO, DINOv2,
    MAE); False for a RoPE-only model such as DINOv3 (timm's ``Eva`` with ``use_abs_pos_emb=False``)."""
    return getattr(model, "pos_embed", None) is not None


def is_sam_encoder(name: str) -> bool:
    """Whether timm model ``name`` is SAM's image encoder (timm's ``VisionTransformerSAM``)."""
    return type(meta_model(name)).__name__ == "VisionTransformerSAM"


@functools.lru_cache(maxsize=None)
def _architecture_depth(name: str, key: str) -> int:
    """The number of blocks of timm model ``name`` (:func:`meta_model`); ``ValueError`` unless it is a
    timm VisionTransformer with a fused qkv attention or SAM's image encoder."""
    k = functools.partial(key_name, key)
    model = meta_model(name)
    if not is_sam_encoder(name):
        problem = vit_problem(model)
        if problem:
            raise ValueError(f"{k('NAME')} = {name!r}: {problem}; valid: {', '.join(PROXY_MODELS)} (or another timm "
                             "ViT)")
    return len(model.blocks)


def vit_problem(model: nn.Module) -> str:
    """Why timm model ``model`` cannot be a proxy ViT (``""`` when it can): it needs timm's
    ``patch_embed``, ``blocks``, ``norm``, a fused ``qkv`` attention projection, and position
    information the proxy can follow at every grid: an absolute embedding (resized) and / or one
    rotary embedding for all blocks whose ``get_embed(shape=grid)`` builds it for that grid
    (timm's ``Eva`` with ``dynamic_img_size``, as DINOv3; timm 1.0.31 ``models/eva.py``
    ``Eva._pos_embed``). Depth-dependent rotary embeddings (``rope_mixed``) are not supported."""
    missing = [a for a in ("patch_embed", "blocks", "norm") if not hasattr(model, a)]
    if missing:
        return f"a {type(model).__name__} is not a timm VisionTransformer (no {', '.join(map(repr, missing))})"
    if getattr(model.blocks[0].attn, "qkv", None) is None:
        return f"a {type(model).__name__} whose attention has no fused qkv projection"
    if getattr(model, "rope", None) is not None:
        if getattr(model, "rope_mixed", False):
            return (f"a {type(model).__name__} with depth-dependent ('mixed') rotary embeddings, which the proxy does "
                    "not support")
        if not hasattr(model.rope, "get_embed"):
            return f"a {type(model).__name__} whose rotary embedding cannot be built for another grid"
    return ""


#: SAM's LayerNorms: ``norm_layer=partial(torch.nn.LayerNorm, eps=1e-6)`` for every image encoder
#: (facebookresearch/segment-anything, as vendored in YuHengsss/Trident @ a93b346 and mc-lan/ProxyCLIP
#: @ e7b767f, ``segment_anything/build_sam.py`` ``_build_sam``). timm's ``VisionTransformerSAM``
#: (timm 1.0.31 ``vision_transformer_sam.py``) means to default to that too (``norm_layer or
#: partial(nn.LayerNorm, eps=1e-6)``) but its argument's default is ``nn.LayerNorm`` (eps 1e-5), so
#: the fallback never applies: its blocks' norms would differ from SAM's by the eps.
SAM_LAYER_NORM_EPS = 1e-6


def _arch_kwargs(name: str) -> Dict[str, object]:
    """``timm.create_model`` keyword arguments that make timm model ``name`` compute as its upstream:
    a SAM image encoder (:func:`is_sam_encoder`) gets SAM's LayerNorm eps
    (:data:`SAM_LAYER_NORM_EPS`); others none."""
    if is_sam_encoder(name):
        return {"norm_layer": functools.partial(nn.LayerNorm, eps=SAM_LAYER_NORM_EPS)}
    return {}


def load_proxy_state_dict(path: str, model: nn.Module) -> Dict[str, torch.Tensor]:
    """The weights in ``path`` converted to ``model``'s timm key layout.

    Reads ``.safetensors`` or a ``torch.load`` file (``weights_only``); a checkpoint that
    wraps its weights in ``{'model': ...}`` (MAE's releases, ProxyCLIP ``proxyclip_segmentor.py``
    ``torch.load(checkpoint)['model']``), ``{'state_dict': ...}`` or ``{'teacher': ...}`` (DINO
    training checkpoints, ``module.``/``backbone.`` prefixes dropped) is unwrapped; then
    timm's own ``checkpoint_filter_fn`` of the model's family maps the upstream layouts
    (DINOv2 hub ``register_tokens`` / ``pos_embed`` with CLS, SAM ``image_encoder.*``) to
    timm's, and DINOv3's release (``storage_tokens``, ``ls1.gamma``, ``qkv.bias``, ``mask_token``,
    the ``rope_embed.periods`` buffer) to timm's ``Eva``.
    """
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        sd = load_file(path)
    else:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    for wrapper in ("model", "state_dict", "teacher"):
        if isinstance(sd, dict) and isinstance(sd.get(wrapper), dict):
            sd = sd[wrapper]
            break
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise ValueError(f"{path}: not a state dict of tensors")
    for prefix in ("module.", "backbone."):
        if sd and all(k.startswith(prefix) for k in sd):
            sd = {k[len(prefix):]: v for k, v in sd.items()}
    import importlib

    # the converter of the timm module that defines the model (vision_transformer,
    # vision_transformer_sam, eva: DINOv3's release layout ``storage_tokens``, ``ls1.gamma``, ...)
    module = importlib.import_module(type(model).__module__)
    if not hasattr(module, "checkpoint_filter_fn"):
        raise ValueError(f"{path}: timm's {module.__name__} has no checkpoint_filter_fn to convert the weights of a "
                         f"{type(model).__name__}; save them in timm's layout (model.state_dict())")
    return module.checkpoint_filter_fn(sd, model)


def resize_pos_grid(patches: torch.Tensor, src: Tuple[int, int], dst: Tuple[int, int], mode: str) -> torch.Tensor:
    """Patch position embeddings ``(gh*gw, C)`` resized bicubically to ``dst`` in float32 (one of
    :data:`PROXY_POS_EMBED_INTERP_MODES`); ``(h*w, C)``, a float32 copy when the grids are equal."""
    if mode not in PROXY_POS_EMBED_INTERP_MODES:
        raise ValueError(f"unknown proxy position-embedding interpolation {mode!r}; valid: "
                         f"{', '.join(PROXY_POS_EMBED_INTERP_MODES)}")
    if mode != "size_antialias":  # the CLIP encoder's resize, with a dummy CLS row
        return interpolate_pos_embed(torch.cat([patches[:1], patches]), src, dst, mode=mode)[1:]
    if tuple(src) == tuple(dst):
        return patches.detach().float().clone()
    C = patches.shape[-1]
    g = patches.detach().float().reshape(1, src[0], src[1], C).permute(0, 3, 1, 2)
    g = F.interpolate(g, size=tuple(dst), mode="bicubic", align_corners=False, antialias=True)
    return g.permute(0, 2, 3, 1).reshape(dst[0] * dst[1], C)


class ProxyBackbone(nn.Module):
    """A frozen timm ViT (DINO, DINOv2, MAE) or SAM image encoder as the proxy of the last CLIP block.

    ``forward(images)``: ``(B, 3, H, W)`` images normalised with :attr:`image_mean` /
    :attr:`image_std` (ImageNet's), H and W multiples of :attr:`patch_size` (or any size when
    ``input_size`` resizes them) -> ``(B, C, h, w)`` float32 features of the patch grid
    (prefix tokens dropped): ``feature`` of block ``layer``.

    ViTs run through timm's public modules (``patch_embed.proj``, ``cls_token``, ``reg_token``,
    ``pos_embed``, ``rope``, ``norm_pre``, ``blocks``, ``norm``) so that any grid works: the position
    embeddings are resized with ``pos_embed_interp`` (cached per grid, device and dtype), as the
    upstream hub models do; a model with rotary embeddings (DINOv3) gets timm's own rotation for
    the window's grid (``rope.get_embed(shape=grid)``, as timm's ``Eva._pos_embed``) passed to
    every block, and its prefix tokens (CLS and registers: :attr:`num_prefix_tokens`, 5 for
    DINOv3) are not rotated (timm's ``EvaAttention``); blocks after ``layer`` do not run. SAM runs timm's
    ``forward_features`` at its native 1024 px (its neck output, 256 channels, 64 x 64).
    """

    def __init__(self, model: nn.Module, opts: ProxyOptions):
        super().__init__()
        self.model = model
        self.opts = opts
        self.name = opts.name
        self.feature = opts.feature
        self.is_sam = type(model).__name__ == "VisionTransformerSAM"
        if not self.is_sam:
            problem = vit_problem(model)
            if problem:
                raise ValueError(f"MODEL.SPARSECLIP.PROXY.NAME = {opts.name!r}: {problem}; valid: "
                                 f"{', '.join(PROXY_MODELS)}")
        depth = len(model.blocks)
        if not -depth <= opts.layer < depth:
            raise ValueError(f"MODEL.SPARSECLIP.PROXY.LAYER = {opts.layer} is outside [{-depth}, {depth - 1}] for "
                             f"{opts.name} (depth {depth})")
        self.layer = opts.layer % depth
        self.depth = depth
        ps = model.patch_embed.patch_size
        self.patch = tuple(int(p) for p in (ps if isinstance(ps, (tuple, list)) else (ps, ps)))
        self.patch_size = self.patch[0] if self.patch[0] == self.patch[1] else self.patch
        self.image_mean, self.image_std = IMAGENET_MEAN, IMAGENET_STD
        if self.is_sam:
            self.native_grid = tuple(int(g) for g in model.patch_embed.grid_size)
        else:
            gs = model.patch_embed.grid_size
            self.native_grid = (int(gs[0]), int(gs[1]))
            self.num_prefix_tokens = int(model.num_prefix_tokens)
        #: whether the blocks take a rotary embedding (DINOv3); ``abs_pos_embed``: whether an absolute
        #: one is added (and resized with ``pos_embed_interp``).
        self.rope = (not self.is_sam) and getattr(model, "rope", None) is not None
        self.abs_pos_embed = (not self.is_sam) and has_abs_pos_embed(model)
        self.num_heads = int(model.blocks[0].attn.num_heads)
        self._pos_cache: "LRUCache[torch.Tensor]" = LRUCache(32)
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.model.eval()

    def extra_repr(self) -> str:
        return (f"name={self.name}, feature={self.feature}, layer={self.layer}, patch={self.patch}, "
                f"input_size={self.opts.input_size}")

    @property
    def dtype(self) -> torch.dtype:
        return self.model.patch_embed.proj.weight.dtype

    def input_size(self, height: int, width: int, crop_size: Optional[int] = None) -> Tuple[int, int]:
        """The pixel size the proxy sees for a ``height x width`` window."""
        s = self.opts.input_size
        if s == 0:
            return height, width
        if s == -1:
            if not crop_size:
                raise ValueError(f"MODEL.SPARSECLIP.PROXY.INPUT_SIZE = -1 (the crop size) needs sliding-window "
                                 "inference (TEST.SLIDING_WINDOW.ENABLED True)")
            return int(crop_size), int(crop_size)
        return s, s

    def _pos_embed(self, grid: Tuple[int, int], device, dtype) -> torch.Tensor:
        m = self.model
        pe = m.pos_embed
        key = (tuple(grid), str(device), dtype, pe.data_ptr(), int(pe._version))

        def make():
            with torch.no_grad():
                # rows of the prefix tokens that have positions (none with no_embed_class,
                # as timm stores DINOv2), then the patch grid, resized with a dummy head row
                P = 0 if m.no_embed_class else m.num_prefix_tokens
                patches = pe[0, P:]
                grid_pe = resize_pos_grid(patches, self.native_grid, tuple(grid), self.opts.pos_embed_interp)
                out = torch.cat([pe[0, :P].float(), grid_pe])
                return out.unsqueeze(0).to(device=device, dtype=dtype)

        return self._pos_cache.get_or_create(key, make)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, 3, H, W)`` ImageNet-normalised -> ``(B, C, h, w)`` float32 (see the class)."""
        m = self.model
        images = images.to(self.dtype)
        if self.is_sam:
            out = m.forward_features(images)  # (B, 256, 64, 64): the neck output
            return out.float()
        B, _, H, W = images.shape
        ph, pw = self.patch
        if H % ph or W % pw:
            raise ValueError(f"proxy {self.name}: input {H}x{W} is not a multiple of its {ph}x{pw} patch")
        grid = (H // ph, W // pw)
        x = m.patch_embed.proj(images).flatten(2).transpose(1, 2)  # (B, h*w, C)
        x = m.patch_embed.norm(x)
        prefix = []
        if m.cls_token is not None:
            prefix.append(m.cls_token.expand(B, -1, -1).to(x.dtype))
        if getattr(m, "reg_token", None) is not None:
            prefix.append(m.reg_token.expand(B, -1, -1).to(x.dtype))
        if not self.abs_pos_embed:  # RoPE only (DINOv3): nothing is added to the tokens
            x = torch.cat(prefix + [x], dim=1)
        elif m.no_embed_class:
            x = torch.cat(prefix + [x + self._pos_embed(grid, x.device, x.dtype)], dim=1)
        else:
            x = torch.cat(prefix + [x], dim=1) + self._pos_embed(grid, x.device, x.dtype)
        x = m.norm_pre(x)
        # timm's rotation of this grid (sin | cos per patch, prefix tokens excluded), for every block
        kw = {"rope": m.rope.get_embed(shape=list(grid))} if self.rope else {}
        P = self.num_prefix_tokens
        for i, blk in enumerate(m.blocks):
            if i == self.layer and self.feature != "tokens":
                attn = blk.attn
                y = blk.norm1(x)
                qkv = qkv_projection(attn, y).reshape(B, x.shape[1], 3, attn.num_heads, -1)
                q, k = attn.q_norm(qkv[:, :, 0].transpose(1, 2)), attn.k_norm(qkv[:, :, 1].transpose(1, 2))
                which = {"queries": q.transpose(1, 2), "keys": k.transpose(1, 2), "values": qkv[:, :, 2]}
                which["queries+keys"] = which["queries"] + which["keys"]
                f = which[self.feature].reshape(B, x.shape[1], -1)[:, P:]
                break
            x = blk(x, **kw)
            if i == self.layer:
                f = m.norm(x)[:, P:]
                break
        return f.float().transpose(1, 2).reshape(B, -1, grid[0], grid[1])


def qkv_projection(attn: nn.Module, y: torch.Tensor) -> torch.Tensor:
    """The fused q | k | v projection ``(B, N, 3 C)`` of the normed tokens ``y`` by a timm attention
    module, with its bias: timm's ``Attention`` holds it in ``qkv``; timm's ``EvaAttention`` (DINOv3's
    ``_qkvb`` variants) keeps separate ``q_bias`` / ``k_bias`` (zero) / ``v_bias`` and adds them as
    its ``forward`` does (timm 1.0.31 ``models/eva.py`` ``EvaAttention.forward``: in ``F.linear``,
    or after the projection when ``qkv_bias_separate``)."""
    q_bias = getattr(attn, "q_bias", None)
    if q_bias is None:
        return attn.qkv(y)
    bias = torch.cat((q_bias, attn.k_bias, attn.v_bias))
    if getattr(attn, "qkv_bias_separate", False):
        return attn.qkv(y) + bias
    return F.linear(y, weight=attn.qkv.weight, bias=bias)


def build_proxy(opts: ProxyOptions, device="cpu", key: str = "MODEL.SPARSECLIP.PROXY") -> ProxyBackbone:
    """Validate ``opts``, build the timm model, load its weights, cast it to ``precision`` on
    ``device``: a frozen :class:`ProxyBackbone`.

    Raises:
        ValueError / FileNotFoundError: see :func:`check_proxy_options`; a weights file whose
            keys or shapes do not fit the model (the message names both).
        RuntimeError: timm could not fetch its pretrained weights (offline).
    """
    k = functools.partial(key_name, key)
    check_proxy_options(opts, key)
    timm = _timm()
    w = str(opts.weights).strip()
    if opts.random_weights:
        logger.warning("RANDOM WEIGHTS: proxy %s (%s none) is built with random weights: a smoke run, every "
                       "number it produces is meaningless.", opts.name, k("WEIGHTS"))
    try:
        model = timm.create_model(opts.name, pretrained=w.lower() == "timm", num_classes=0, **_arch_kwargs(opts.name))
    except Exception as e:  # timm / huggingface_hub raise many kinds when offline
        if w.lower() != "timm":
            raise
        raise RuntimeError(f"could not fetch timm's pretrained weights for {k('NAME')} {opts.name!r} "
                           f"({type(e).__name__}: {e}); offline? pass a local file: {k('WEIGHTS')} /path/to/file, "
                           f"or {k('WEIGHTS')} none for random weights") from e
    if not opts.random_weights and w.lower() != "timm":
        path = os.path.expanduser(w)
        sd = load_proxy_state_dict(path, model)
        target = model.state_dict()
        missing, unexpected = sorted(set(target) - set(sd)), sorted(set(sd) - set(target))
        if missing or unexpected:
            raise ValueError(f"{k('WEIGHTS')} = {w!r} does not fit {opts.name}: missing keys {missing[:8]}, "
                             f"unexpected keys {unexpected[:8]}")
        shapes = [f"{n} {tuple(sd[n].shape)} (the model's {tuple(target[n].shape)})" for n in target
                  if tuple(sd[n].shape) != tuple(target[n].shape)]
        if shapes:
            raise ValueError(f"{k('WEIGHTS')} = {w!r} does not fit {opts.name}: {len(shapes)} tensors of another "
                             f"shape, first {', '.join(shapes[:3])}; choose the {k('NAME')} the file was saved from")
        model.load_state_dict(sd, strict=True)
    model = model.to(device=device, dtype=_PRECISIONS[opts.precision])
    return ProxyBackbone(model, opts)


def lcm(a: int, b: int) -> int:
    """Least common multiple of two positive integers."""
    return a * b // math.gcd(a, b)


def uint8_image(rgb: torch.Tensor) -> np.ndarray:
    """``(3, H, W)`` float RGB on the 0-255 scale -> the ``(H, W, 3)`` uint8 image that holds it
    (rounded, clamped), as an upstream that reads an image file or casts with ``astype('uint8')``
    gives it (Trident's SAM input, CASS's DINO input)."""
    return np.ascontiguousarray(rgb.detach().float().round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).cpu().numpy())


def to_proxy_input(images: torch.Tensor, clip_mean, clip_std, proxy: ProxyBackbone,
                   size: Tuple[int, int]) -> torch.Tensor:
    """CLIP-normalised images -> the proxy's input: un-normalised with the CLIP model's own
    mean/std, re-normalised with the proxy's (ImageNet), then resized bilinearly
    (``align_corners=False``) when ``size`` differs - ProxyCLIP's
    ``self.norm(self.unnorm(img))`` (``proxyclip_segmentor.py``), where padding zeros of the
    normalised window become CLIP's mean colour.

    Args:
        images: ``(B, 3, H, W)`` float.
        clip_mean, clip_std: the CLIP model's 0-1 RGB mean and std.
        size: the proxy's ``(height, width)``.
    Returns:
        ``(B, 3, *size)`` float32.
    """
    dev = images.device
    cm = torch.tensor(clip_mean, dtype=torch.float32, device=dev).view(1, 3, 1, 1)
    cs = torch.tensor(clip_std, dtype=torch.float32, device=dev).view(1, 3, 1, 1)
    pm = torch.tensor(proxy.image_mean, dtype=torch.float32, device=dev).view(1, 3, 1, 1)
    ps = torch.tensor(proxy.image_std, dtype=torch.float32, device=dev).view(1, 3, 1, 1)
    x = ((images.float() * cs + cm) - pm) / ps
    if tuple(x.shape[-2:]) != tuple(size):
        x = F.interpolate(x, size=tuple(size), mode="bilinear", align_corners=False)
    return x
