"""Trident (ICCV 2025): ProxyCLIP-style attention on sub-windows spliced onto the whole-image
grid, then a global aggregation with SAM's last global-attention map.

YuHengsss/Trident @ a93b346 (``trident.py`` ``get_trident_seg`` / ``get_windowed_imgs`` /
``get_sam_feat``; ``open_clip/transformer.py`` ``VisionTransformer.forward`` / ``custom_attn``
/ ``guidance_attn`` / ``get_sam_sim``), per image:

1. the normalised image is resized so both sides are multiples of CLIP's patch (at least the
   crop) (:func:`trident_resize`, upstream ``seg_utils/utils.py`` ``preprocess_image``) and cut
   into ``crop`` x ``crop`` windows every ``stride`` pixels (:func:`trident_windows`);
2. the last CLIP block of every window attends with the proxy's (DINO B/16) cosine scores
   ``(S - beta mean S) gamma``, negatives ``-inf``, **the mean taken over all windows of the
   image at once** (:func:`joint_proxy_scores`; upstream batches the windows), then the spec's
   normaliser (softmax upstream; entmax alike); ``out_proj``, no residual, no FFN;
3. the windows' outputs are spliced onto the whole-image grid, overlaps averaged
   (:func:`overlap_mean`, registered in :data:`WINDOW_SPLICE_REGISTRY`);
4. the spliced map is resized bilinearly to SAM's grid of the image and aggregated globally
   with SAM's last global-attention map, each entry kept where the cosine of SAM's values
   exceeds ``cos_fac`` x its row's mean (:func:`sam_threshold`, registered in
   :data:`GLOBAL_AGGREGATION_REGISTRY` as ``sam_threshold``); the tower's final norm and
   projection follow.

SAM (timm ``samvit_base_patch16``, the key layout of the SAM package ``image_encoder.*`` loads
through :func:`~.second_backbone.load_proxy_state_dict`) sees the image as ``SamPredictor.set_image``
prepares it (:func:`sam_input`); its last block's attention and values come from
:func:`sam_last_attention`, head by head.
"""
import logging
import math
from dataclasses import dataclass
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from fvcore.common.registry import Registry
from torch import nn

from ...clip.spec import AttentionSpec
from ...common.keys import key_field
from ...proxy.second_backbone import ProxyBackbone, to_proxy_input, uint8_image
from ..proxyclip.encoder import ProxyCLIPEncoder, normalize_proxy_scores

__all__ = ["WINDOW_SPLICE_REGISTRY", "GLOBAL_AGGREGATION_REGISTRY", "TridentSettings", "check_trident_settings",
           "trident_resize", "trident_windows", "joint_proxy_scores", "overlap_mean", "sam_threshold",
           "sam_input", "sam_last_attention", "TridentEncoder"]

logger = logging.getLogger(__name__)

#: How the windows' token maps become one map of the whole image:
#: ``fn(tokens (N, C, h, w), boxes [(y1, x1, y2, x2)], size (H, W)) -> (C, H, W)``.
WINDOW_SPLICE_REGISTRY = Registry("WINDOW_SPLICE")
#: Global aggregation weights over a whole-image grid from a second model's attention:
#: ``fn(attn: iterable of per-head (N, N), v (heads, N, d), **settings) -> (N, N)`` rows summing to 1.
GLOBAL_AGGREGATION_REGISTRY = Registry("GLOBAL_AGGREGATION")

# SAM's pixel mean / std (0-255 RGB): facebookresearch/segment-anything, as vendored in
# YuHengsss/Trident @ a93b346 segment_anything/modeling/sam.py (pixel_mean / pixel_std defaults).
SAM_PIXEL_MEAN = (123.675, 116.28, 103.53)
SAM_PIXEL_STD = (58.395, 57.12, 57.375)
# Trident open_clip/transformer.py get_sam_sim: with refine_neg_cos False a negative threshold
# becomes 0.6; every threshold is capped at 0.9 ("avoid too large sim_thresh").
NEG_THRESHOLD = 0.6
MAX_THRESHOLD = 0.9


@dataclass(frozen=True)
class TridentSettings:
    """Trident's values (``MODEL.SPARSECLIP.PROXY.TRIDENT.*``), defaults from YuHengsss/Trident @
    a93b346 ``configs/base_config.py``.

    Fields: cos_fac (``cos_fac = 1.2``), refine_neg_cos (``refine_neg_cos = True``), crop_size
    and stride of the sub-windows (``slide_crop=336``, ``slide_stride=224``), sam_tiles (SAM sees
    the image in this many side-by-side tiles; ``trident.py``: 2 for Cityscapes, else 1),
    splice and aggregation (names in :data:`WINDOW_SPLICE_REGISTRY` /
    :data:`GLOBAL_AGGREGATION_REGISTRY`).
    """

    cos_fac: float = key_field(1.2, "COS_FAC", "Threshold of SAM's value cosine in units of its row mean "
                               "(base_config.py cos_fac = 1.2).")
    refine_neg_cos: bool = key_field(True, "REFINE_NEG_COS", "Whether a negative threshold stays (refine_neg_cos "
                                     "= True) or becomes 0.6.")
    crop_size: int = key_field(336, "CROP_SIZE", "Sub-window side (base_config.py slide_crop=336).")
    stride: int = key_field(224, "STRIDE", "Sub-window stride (base_config.py slide_stride=224).")
    sam_tiles: int = key_field(1, "SAM_TILES", "SAM sees the image in this many side-by-side tiles (trident.py: 2 "
                               "for Cityscapes).")
    splice: str = key_field("overlap_mean", "SPLICE", "A WINDOW_SPLICE_REGISTRY name (methods/trident/encoder.py).")
    aggregation: str = key_field("sam_threshold", "AGGREGATION", "A GLOBAL_AGGREGATION_REGISTRY name "
                                 "(methods/trident/encoder.py).")


def _registry_names(reg: Registry) -> List[str]:
    return sorted(n for n, _ in reg)


def check_trident_settings(s: TridentSettings, key: str = "MODEL.SPARSECLIP.PROXY.TRIDENT") -> TridentSettings:
    """Validate ``s``; ``ValueError`` naming ``key.<FIELD>``, the value and the valid choices."""
    if isinstance(s.cos_fac, bool) or not isinstance(s.cos_fac, (int, float)) or not math.isfinite(float(s.cos_fac)):
        raise ValueError(f"{key}.COS_FAC = {s.cos_fac!r} is invalid; valid: a finite number (the SAM value-cosine "
                         "threshold in units of its row mean)")
    if not isinstance(s.refine_neg_cos, bool):
        raise ValueError(f"{key}.REFINE_NEG_COS = {s.refine_neg_cos!r} is invalid; valid: True, False")
    for name, value in (("CROP_SIZE", s.crop_size), ("STRIDE", s.stride), ("SAM_TILES", s.sam_tiles)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key}.{name} = {value!r} is invalid; valid: a positive integer")
    if s.stride > s.crop_size:
        raise ValueError(f"{key}.STRIDE = {s.stride} is larger than {key}.CROP_SIZE = {s.crop_size}: pixels between "
                         "windows would be left out; valid: 1 <= STRIDE <= CROP_SIZE")
    for name, value, reg in (("SPLICE", s.splice, WINDOW_SPLICE_REGISTRY),
                             ("AGGREGATION", s.aggregation, GLOBAL_AGGREGATION_REGISTRY)):
        if value not in _registry_names(reg):
            raise ValueError(f"{key}.{name} = {value!r} is not registered; valid: {', '.join(_registry_names(reg))}")
    return s


# ----------------------------------------------------------------------------- geometry
def trident_resize(image: torch.Tensor, multiple: int, crop_size: int) -> torch.Tensor:
    """Trident's ``preprocess_image`` (``seg_utils/utils.py``): ``(B, 3, H, W)`` returned as it is
    when both sides are multiples of ``multiple``; else resized bilinearly (``align_corners=False``)
    so that the longer side is the next multiple, the shorter scaled alike (``int``) and rounded
    up to a multiple, each side at least ``crop_size``."""
    h, w = image.shape[-2:]
    if h % multiple == 0 and w % multiple == 0:
        return image
    longer = max(h, w)
    dst = -(-longer // multiple) * multiple
    new_h, new_w = int(h * dst / longer), int(w * dst / longer)
    new_h, new_w = -(-new_h // multiple) * multiple, -(-new_w // multiple) * multiple
    new_h, new_w = max(new_h, crop_size), max(new_w, crop_size)
    return F.interpolate(image, (new_h, new_w), mode="bilinear", align_corners=False)


def trident_windows(height: int, width: int, crop_size: int, stride: int) -> List[Tuple[int, int, int, int]]:
    """Trident's ``get_windowed_imgs`` grid (MMSeg's slide grid): ``(y1, x1, y2, x2)`` pixel boxes,
    row-major, each ``min(crop, side)`` long, the last of a row / column ending at the edge."""
    hg = max(height - crop_size + stride - 1, 0) // stride + 1
    wg = max(width - crop_size + stride - 1, 0) // stride + 1
    boxes = []
    for hi in range(hg):
        for wi in range(wg):
            y2, x2 = min(hi * stride + crop_size, height), min(wi * stride + crop_size, width)
            boxes.append((max(y2 - crop_size, 0), max(x2 - crop_size, 0), y2, x2))
    return boxes


# ----------------------------------------------------------------------------- parts
def joint_proxy_scores(feats: torch.Tensor, beta: float = 1.2, gamma: float = 3.0) -> torch.Tensor:
    """ProxyCLIP's proxy scores with one mean over all windows of an image (Trident's
    ``custom_attn``: ``torch.mean(similarity)`` over the batch of windows).

    Args:
        feats: ``(N, C, h, w)`` proxy features of the N windows of one image.
    Returns:
        ``(N, h*w, h*w)`` float32 ``(S - beta * mean(S)) * gamma`` with ``S`` each window's
        cosine similarity, ``mean`` over every entry of every window, negatives ``-inf``.
    Raises:
        ValueError: a row entirely ``-inf`` (no normaliser can weight it).
    """
    if feats.dim() != 4:
        raise ValueError(f"proxy features must be (N, C, h, w), got shape {tuple(feats.shape)}")
    f = F.normalize(feats.float().flatten(2), dim=1)
    s = torch.einsum("bcm,bcn->bmn", f, f)
    mean = s.mean()
    s = (s - mean * beta) * gamma
    s = s.masked_fill(s < 0, float("-inf"))
    if bool(torch.isneginf(s).all(dim=-1).any()):
        raise ValueError(f"Trident proxy scores: a patch has no similarity above beta x mean (beta={beta:g}, mean "
                         f"similarity {float(mean):.3f}); lower MODEL.SPARSECLIP.PROXY.BETA")
    return s


@WINDOW_SPLICE_REGISTRY.register()
def overlap_mean(tokens: torch.Tensor, boxes: Sequence[Tuple[int, int, int, int]],
                size: Tuple[int, int]) -> torch.Tensor:
    """Windows' token maps placed on the whole-image grid, overlaps averaged (Trident's
    ``guidance_attn``: ``dst_v[..., y1:y2, x1:x2] += raw_v``, ``count_mat += 1``, ``dst_v / count_mat``).

    Args:
        tokens: ``(N, C, h, w)``, window ``i`` covering ``boxes[i]``.
        boxes: ``(y1, x1, y2, x2)`` on the target grid (end-exclusive), ``y2 - y1 == h``, ``x2 - x1 == w``.
        size: ``(H, W)`` of the target grid.
    Returns:
        ``(C, H, W)`` float32.
    Raises:
        ValueError: a box does not match its window or a cell of the grid is covered by none.
    """
    N, C, h, w = tokens.shape
    if len(boxes) != N:
        raise ValueError(f"{N} windows but {len(boxes)} boxes")
    H, W = size
    out = tokens.new_zeros((C, H, W), dtype=torch.float32)
    count = tokens.new_zeros((1, H, W), dtype=torch.float32)
    for t, (y1, x1, y2, x2) in zip(tokens, boxes):
        if (y2 - y1, x2 - x1) != (h, w) or y1 < 0 or x1 < 0 or y2 > H or x2 > W:
            raise ValueError(f"box {(y1, x1, y2, x2)} does not hold a {h}x{w} window inside the {H}x{W} grid")
        out[:, y1:y2, x1:x2] += t.float()
        count[:, y1:y2, x1:x2] += 1
    if not bool((count > 0).all()):
        raise ValueError(f"the windows leave cells of the {H}x{W} grid uncovered")
    return out / count


@GLOBAL_AGGREGATION_REGISTRY.register()
def sam_threshold(attn: Iterable[torch.Tensor], v: torch.Tensor, cos_fac: float = 1.2,
                          refine_neg_cos: bool = True) -> torch.Tensor:
    """Trident's SAM aggregation weights (``open_clip/transformer.py`` ``get_sam_sim``).

    With ``v_h`` the L2-normalised values of head ``h`` and ``S_h = v_h v_h^T``, the threshold of
    query ``i`` is ``t_i = cos_fac * mean_h mean_j S_h[i, j]`` (with ``refine_neg_cos`` False a
    negative ``t_i`` becomes 0.6), capped at 0.9; each head's attention keeps the entries with
    ``S_h[i, j] > t_i`` (others 0), the heads are averaged and each row divided by its sum.

    Args:
        attn: the attention probabilities of each head, an iterable of ``(N, N)`` (a ``(heads, N,
            N)`` tensor or a generator, so that one head at a time need be held).
        v: ``(heads, N, d)`` the same block's values.
    Returns:
        ``(N, N)`` float32, rows summing to 1.
    """
    if v.dim() != 3:
        raise ValueError(f"SAM values must be (heads, N, d), got shape {tuple(v.shape)}")
    heads, n = v.shape[0], v.shape[1]
    vn = F.normalize(v.float(), dim=-1)
    # mean_j S_h[i, j] = v_h[i] . mean_j v_h[j]: the row means without the (N, N) matrices
    thr = cos_fac * torch.einsum("hnd,hd->hn", vn, vn.mean(dim=1)).mean(dim=0)  # (N,)
    if not refine_neg_cos:
        thr = torch.where(thr < 0.0, torch.full_like(thr, NEG_THRESHOLD), thr)
    thr = torch.clamp(thr, max=MAX_THRESHOLD)
    total = torch.zeros((n, n), dtype=torch.float32, device=v.device)
    seen = 0
    for h, a in enumerate(attn):
        if h >= heads or tuple(a.shape) != (n, n):
            raise ValueError(f"head {h}'s attention has shape {tuple(a.shape)}; expected ({n}, {n}) for each of "
                             f"{heads} heads")
        keep = (vn[h] @ vn[h].T) > thr[:, None]
        total += torch.where(keep, a.float(), torch.zeros((), device=a.device))
        seen += 1
    if seen != heads:
        raise ValueError(f"{seen} heads of attention for {heads} heads of values")
    total = total / heads
    return total / total.sum(dim=-1, keepdim=True)


# ----------------------------------------------------------------------------- SAM
def _multiple_resize(img: np.ndarray, multiple: int = 16) -> np.ndarray:
    """Trident ``trident.py`` ``get_trident_seg``: both sides rounded up to multiples of ``multiple``
    with ``cv2.resize(tmp_img, (tmp_w, tmp_h))`` (its default ``INTER_LINEAR``, uint8 in and out;
    called even when the size does not change, where cv2 copies)."""
    H, W = img.shape[:2]
    H16, W16 = -(-H // multiple) * multiple, -(-W // multiple) * multiple
    return cv2.resize(img, (W16, H16), interpolation=cv2.INTER_LINEAR)


def sam_input(rgb: torch.Tensor, side: int, patch: int, multiple: int = 16) -> Tuple[torch.Tensor, Tuple[int, int]]:
    """SAM's input of one image as Trident prepares it.

    The image as a uint8 file holds it (the float RGB rounded and clamped), then ``trident.py``
    ``get_trident_seg``'s ``cv2.resize`` to multiples of ``multiple`` (``INTER_LINEAR``, uint8), then
    :func:`sam_normalise` (``SamPredictor.set_image``).

    Args:
        rgb: ``(3, H, W)`` float RGB on the 0-255 scale.
    Returns:
        ``((1, 3, side, side) float32, (h, w))`` on ``rgb``'s device, ``(h, w)`` = the grid of
        SAM's patches that cover the image (``input_size // patch``).
    """
    x, valid = sam_normalise(_multiple_resize(uint8_image(rgb), multiple), side, patch)
    return x.to(rgb.device), valid


def sam_normalise(img: np.ndarray, side: int, patch: int) -> Tuple[torch.Tensor, Tuple[int, int]]:
    """``SamPredictor.set_image`` of an ``(h, w, 3)`` uint8 RGB image, as Trident's vendored
    ``segment_anything`` does it: ``ResizeLongestSide.apply_image`` (``utils/transforms.py``:
    ``get_preprocess_shape``'s ``int(x * scale + 0.5)``, then torchvision's ``resize`` of a PIL image,
    i.e. PIL's ``Image.resize(..., BILINEAR)``, uint8 out), then ``Sam.preprocess``
    (``modeling/sam.py``: ``(x - pixel_mean) / pixel_std`` in float32, zero padding bottom / right to
    ``side x side``). Returns ``((1, 3, side, side) float32 on the CPU, (nh // patch, nw // patch))``."""
    if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
        raise ValueError(f"SAM's input image must be (h, w, 3) uint8, got {img.dtype} {tuple(img.shape)}")
    h, w = img.shape[:2]
    scale = side * 1.0 / max(h, w)
    nh, nw = int(h * scale + 0.5), int(w * scale + 0.5)
    resized = np.array(Image.fromarray(img).resize((nw, nh), Image.BILINEAR))  # apply_image: np.array(...)
    x = torch.from_numpy(resized).permute(2, 0, 1)[None]
    mean = torch.tensor(SAM_PIXEL_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(SAM_PIXEL_STD).view(1, 3, 1, 1)
    x = F.pad((x - mean) / std, (0, side - nw, 0, side - nh))
    return x, (nh // patch, nw // patch)


def sam_last_attention(sam: ProxyBackbone, x: torch.Tensor,
                       valid: Tuple[int, int]) -> Tuple[Iterator[torch.Tensor], torch.Tensor]:
    """The last block's attention and values of SAM's image encoder on the ``valid`` top-left grid.

    Runs timm's public modules (``patch_embed``, ``pos_embed``, ``norm_pre``, the blocks but the
    last), then the last block's ``norm1`` and ``attn.qkv``; the attention of each head is
    ``softmax(q k^T / sqrt(d) + rel_pos_bias)`` over **all** keys of the padded grid (as the SAM
    package's ``Attention.forward``, timm's ``get_decomposed_rel_pos_bias``), then cropped to the
    valid queries and keys (Trident ``get_sam_feat``).

    Args:
        sam: a :class:`ProxyBackbone` around timm's ``VisionTransformerSAM``.
        x: ``(1, 3, S, S)`` SAM input (:func:`sam_input`).
        valid: ``(h, w)`` valid grid.
    Returns:
        ``(per-head attention: a generator of (h*w, h*w) float32, v (heads, h*w, d) float32)``.
    """
    from timm.layers import resample_abs_pos_embed_nhwc
    from timm.models.vision_transformer_sam import get_decomposed_rel_pos_bias

    m = sam.model
    blk = m.blocks[-1]
    if blk.window_size != 0:
        raise ValueError(f"{sam.name}: its last block attends in windows of {blk.window_size}; Trident needs a "
                         "global-attention last block")
    with torch.no_grad():
        t = m.patch_embed(x.to(sam.dtype))  # (1, H, W, C)
        if m.pos_embed is not None:
            t = t + resample_abs_pos_embed_nhwc(m.pos_embed, t.shape[1:3])
        t = m.norm_pre(m.patch_drop(m.pos_drop(t)))
        for b in m.blocks[:-1]:
            t = b(t)
        y = blk.norm1(t)
        _, H, W, _ = y.shape
        hv, wv = valid
        if not (0 < hv <= H and 0 < wv <= W):
            raise ValueError(f"valid SAM grid {valid} outside its {H}x{W} grid")
        attn_mod = blk.attn
        heads = attn_mod.num_heads
        qkv = attn_mod.qkv(y.reshape(1, H * W, -1)).view(1, H * W, 3, heads, -1).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.reshape(3, heads, H * W, -1).unbind(0)
        q, k = attn_mod.q_norm(q), attn_mod.k_norm(k)
        q, k, v = q.float(), k.float(), v.float()
        idx = (torch.arange(hv, device=x.device)[:, None] * W + torch.arange(wv, device=x.device)[None]).flatten()
        v_valid = v[:, idx]

    def per_head() -> Iterator[torch.Tensor]:
        with torch.no_grad():
            for h in range(heads):
                s = (q[h] * attn_mod.scale) @ k[h].T
                if attn_mod.use_rel_pos:
                    s = s + get_decomposed_rel_pos_bias(q[h:h + 1], attn_mod.rel_pos_h.float(),
                                                        attn_mod.rel_pos_w.float(), (H, W), (H, W))[0]
                yield s[idx].softmax(dim=-1)[:, idx]

    return per_head(), v_valid


# ----------------------------------------------------------------------------- encoder
class TridentEncoder(ProxyCLIPEncoder):
    """Trident's dense features of whole images (see the module docstring).

    Args:
        visual, spec, proxy, beta, gamma, pos_embed_interp, attn_pool_dense: as for
            :class:`~.proxyclip.ProxyCLIPEncoder` (``proxy``: DINO B/16 upstream; its scores use
            one mean over all windows of an image); the spec's normaliser / alpha /
            temperature act on the window attention, ``residual`` / ``ffn`` on the last block.
        sam: the frozen SAM :class:`ProxyBackbone` (``samvit_*``) of the global aggregation.
        settings: :class:`TridentSettings`.

    ``forward(images)`` takes whole images ``(B, 3, H, W)`` of any size (``patch_size`` is 1:
    the encoder resizes and windows them itself) and returns ``(B, D, h_s, w_s)`` on SAM's grid
    of each image (all images of a batch must give the same grid; the META_ARCH passes one).
    """

    def __init__(self, visual: nn.Module, spec: Optional[AttentionSpec], proxy: ProxyBackbone, *,
                 sam: ProxyBackbone, settings: TridentSettings = TridentSettings(), beta: float = 1.2,
                 gamma: float = 3.0, crop_size: Optional[int] = None, pos_embed_interp: str = "size",
                 attn_pool_dense: str = "value"):
        super().__init__(visual, spec, proxy, beta=beta, gamma=gamma, crop_size=crop_size,
                         pos_embed_interp=pos_embed_interp, attn_pool_dense=attn_pool_dense)
        if proxy.opts.input_size != 0 or proxy.is_sam:
            raise ValueError("MODEL.SPARSECLIP.PROXY with Trident: the proxy sees each sub-window as it is "
                             f"(INPUT_SIZE 0, a ViT such as vit_base_patch16_224.dino), got {proxy.name} with "
                             f"INPUT_SIZE {proxy.opts.input_size}")
        if not isinstance(sam, ProxyBackbone) or not sam.is_sam:
            raise ValueError("MODEL.SPARSECLIP.PROXY.TRIDENT.SAM_NAME must name a SAM image encoder (timm samvit_*), "
                             f"got {getattr(sam, 'name', type(sam).__name__)!r}")
        self.sam = sam
        self.settings = check_trident_settings(settings)
        wp = self._window_patch
        if self.settings.crop_size % wp[0] or self.settings.stride % wp[0] or wp[0] != wp[1]:
            raise ValueError(f"MODEL.SPARSECLIP.PROXY.TRIDENT.CROP_SIZE {self.settings.crop_size} and STRIDE "
                             f"{self.settings.stride} must be multiples of {wp[0]} (CLIP's and the proxy's patch)")
        self.patch_size = 1

    def extra_repr(self) -> str:
        s = self.settings
        return (super().extra_repr() + f", sam={self.sam.name}, cos_fac={s.cos_fac:g}, crop={s.crop_size}, "
                f"stride={s.stride}, sam_tiles={s.sam_tiles}")

    def _init_kwargs(self):
        return dict(super()._init_kwargs(), sam=self.sam, settings=self.settings)

    def second_backbones(self):
        return [self.proxy, self.sam]

    def describe(self) -> str:
        s = self.settings
        return (f"Trident: {super().describe()} on {s.crop_size} px windows every {s.stride} px (one mean over "
                f"the windows), {s.splice} splice, {self.sam.name} {s.aggregation} aggregation (cos_fac "
                f"{s.cos_fac:g})")

    def proxy_weights(self, images: torch.Tensor):
        """The windows' proxy weights with one mean over the batch (all windows of an image)."""
        _, _, H, W = images.shape
        feats = self.proxy(to_proxy_input(images, self.image_mean, self.image_std, self.proxy, (H, W)))
        scores = joint_proxy_scores(feats, self.beta, self.gamma)
        weights = normalize_proxy_scores(scores, self.spec)
        return weights, (int(feats.shape[-2]), int(feats.shape[-1]))

    def spliced(self, image: torch.Tensor) -> torch.Tensor:
        """``(1, 3, H, W)`` normalised image -> ``(C, H', W')`` float32: the last block's outputs of
        the sub-windows spliced on the whole (resized) image's grid, before the final norm
        (``H'`` = the resized height / CLIP's patch x the proxy-to-CLIP grid ratio)."""
        s = self.settings
        p = self._patch[0]
        x = trident_resize(image, p, s.crop_size)
        H, W = x.shape[-2:]
        boxes = trident_windows(H, W, s.crop_size, s.stride)
        crops = torch.cat([x[:, :, y1:y2, x1:x2] for (y1, x1, y2, x2) in boxes])
        out = self.forward_pass(crops, tap_layers=(self.depth,))
        tok = out.taps[self.depth]  # (N, h'*w', C) on the proxy grid, before the final norm
        ph, pw = out.grid
        ch, cw = crops.shape[-2] // p, crops.shape[-1] // p
        maps = tok.float().transpose(1, 2).reshape(len(boxes), -1, ph, pw)
        if pw % cw == 0:  # guidance_attn: ratio = vfm_w // clip_w
            r = pw // cw
        else:  # guidance_attn: ratio = round(vfm_h / clip_h), windows resized to clip grid x ratio
            r = int(round(ph / ch))
            maps = F.interpolate(maps, size=(ch * r, cw * r), mode="bilinear", align_corners=False)
        grid_boxes = [(y1 // p * r, x1 // p * r, y2 // p * r, x2 // p * r) for (y1, x1, y2, x2) in boxes]
        return WINDOW_SPLICE_REGISTRY.get(s.splice)(maps, grid_boxes, (H // p * r, W // p * r))

    def sam_tiles(self, image: torch.Tensor) -> List[Tuple[torch.Tensor, Tuple[int, int]]]:
        """SAM's inputs and valid grids of the image's ``sam_tiles`` side-by-side tiles (Trident's
        Cityscapes case: the image rounded to multiples of 16 split at ``W // 2``)."""
        rgb = ((image[0].float() * torch.tensor(self.image_std, device=image.device).view(3, 1, 1)
                + torch.tensor(self.image_mean, device=image.device).view(3, 1, 1)) * 255.0)
        n = self.settings.sam_tiles
        side = int(self.sam.native_grid[0] * self.sam.patch[0])
        img = _multiple_resize(uint8_image(rgb))  # sam_input's steps; trident.py: the halves of the image rounded to 16
        W16 = img.shape[1]
        cuts = [k * W16 // n for k in range(n + 1)]
        tiles = [sam_normalise(np.ascontiguousarray(img[:, a:b]), side, self.sam.patch[0])
                 for a, b in zip(cuts[:-1], cuts[1:])]
        return [(x.to(image.device), valid) for x, valid in tiles]

    def aggregate(self, dst: torch.Tensor, image: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int]]:
        """The spliced ``(C, H', W')`` map aggregated with SAM's attention: ``((h_s*w_s, C) float32,
        (h_s, w_s))``; with tiles, the map is cut at the same fractions of its width, each part
        aggregated on its tile's grid, the results side by side."""
        s = self.settings
        tiles = self.sam_tiles(image)
        n = len(tiles)
        Wd = dst.shape[-1]
        cuts = [k * Wd // n for k in range(n + 1)]
        outs, heights = [], set()
        for (x, valid), a, b in zip(tiles, cuts[:-1], cuts[1:]):
            attn, v = sam_last_attention(self.sam, x, valid)
            weights = GLOBAL_AGGREGATION_REGISTRY.get(s.aggregation)(attn, v, cos_fac=s.cos_fac,
                                                                     refine_neg_cos=s.refine_neg_cos)
            part = F.interpolate(dst[None, :, :, a:b], size=valid, mode="bilinear", align_corners=False)[0]
            outs.append((weights @ part.flatten(1).T).reshape(valid[0], valid[1], -1))
            heights.add(valid[0])
        if len(heights) != 1:
            raise ValueError(f"SAM tiles of unequal grid heights {sorted(heights)}: lower "
                             "MODEL.SPARSECLIP.PROXY.TRIDENT.SAM_TILES")
        out = torch.cat(outs, dim=1)
        return out.reshape(-1, out.shape[-1]), (out.shape[0], out.shape[1])

    def forward_tokens(self, images: torch.Tensor, **block_kw):
        """``(tokens (B, h_s*w_s, C) after the final norm, (h_s, w_s), None)`` of whole images."""
        if block_kw:
            raise ValueError(f"Trident's encoder takes no block arguments, got {sorted(block_kw)}")
        toks, grid = [], None
        for i in range(images.shape[0]):
            img = images[i:i + 1]
            out, g = self.aggregate(self.spliced(img), img)
            if grid is not None and g != grid:
                raise ValueError(f"images of one batch give SAM grids {grid} and {g}; pass one image at a time")
            grid = g
            toks.append(out)
        x = torch.stack(toks).to(self._tower_dtype())
        return self._tower.final_norm(x), grid, None

    def _tower_dtype(self) -> torch.dtype:
        return next(self.visual.parameters()).dtype

    def forward(self, images: torch.Tensor, return_attention: bool = False, **block_kw):
        """Dense patch embeddings ``(B, D, h_s, w_s)`` on SAM's grid (model dtype)."""
        if return_attention:
            raise ValueError("Trident's encoder does not return one attention map (windows, then SAM's global "
                             "aggregation); TEST.ATTENTION_STATS is refused with a proxy")
        tokens, (h, w), _ = self.forward_tokens(images, **block_kw)
        B = tokens.shape[0]
        return self._dense_patches(tokens).reshape(B, h, w, -1).permute(0, 3, 1, 2).contiguous()
