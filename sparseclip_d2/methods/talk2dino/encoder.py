"""The dense encoder of Talk2DINO: DINOv2 with registers (timm ``vit_base_patch14_reg4_dinov2``, the
layout of torch hub's ``dinov2_vitb14_reg`` that upstream loads, lorebianchi98/Talk2DINO @ 4918c2d
``dinotext.py`` ``torch.hub.load('facebookresearch/dinov2', 'dinov2_vitb14_reg')``) on a square
resize of each window. CLIP's vision tower is not used (the project builds it, as upstream's
``clip.load`` does); only its text tower, through the learned projection (:mod:`.maths`)."""
from typing import Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ...clip.encoder import DenseCLIPEncoder
from ...clip.spec import AttentionSpec
from ...proxy.second_backbone import ProxyBackbone
from .maths import cls_attention_maps

__all__ = ["Talk2DINOEncoder"]


class Talk2DINOEncoder(DenseCLIPEncoder):
    """DINOv2-reg patch tokens of each window resized to ``size x size``, with the last block's CLS
    scores per head.

    ``patch_size`` is 1: any window is taken as it is (upstream resizes each window to the square,
    ``T.Resize((448, 448))``, and the masks back to the window), so the window loop never pads.
    ``image_mean`` / ``image_std`` are ImageNet's (``dinotext.py`` ``T.Normalize``), which the
    pipeline's pixel normalisation (``PIXEL_NORM clip``) then uses.
    """

    def __init__(self, visual: nn.Module, spec: AttentionSpec, proxy: ProxyBackbone, *, size: int = 448):
        super().__init__(visual, spec)
        if not isinstance(proxy, ProxyBackbone) or proxy.is_sam:
            raise TypeError(f"the Talk2DINO encoder needs a timm ViT proxy (DINOv2-reg), got {type(proxy).__name__}")
        if proxy.layer != proxy.depth - 1 or proxy.feature != "tokens":
            raise ValueError("Talk2DINO reads the final tokens of the last block: MODEL.SPARSECLIP.PROXY.LAYER -1 and "
                             "FEATURE tokens")
        self.proxy = proxy
        self.size = int(size)
        self.patch_size = 1
        self.image_mean, self.image_std = proxy.image_mean, proxy.image_std

    def extra_repr(self) -> str:
        return f"proxy={self.proxy.name}, size={self.size}"

    def with_spec(self, spec: AttentionSpec) -> "Talk2DINOEncoder":
        return type(self)(self.visual, spec, self.proxy, size=self.size)

    def describe(self) -> str:
        return f"Talk2DINO: {self.proxy.name} tokens at {self.size} px, learned text projection"

    def second_backbones(self):
        return [self.proxy]

    def forward_pass(self, images, *a, **k):
        raise ValueError("the Talk2DINO encoder has no CLIP pass: its logits come from the talk2dino head "
                         "(MODEL.SPARSECLIP.PROXY.TALK2DINO.ENABLED)")

    def dino_tokens(self, images: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(B, 3, H, W)`` ImageNet-normalised windows -> ``(feats (B, C, s/p, s/p) float32, CLS scores
        (B, heads, (s/p)^2) float32)``: the windows resized to ``s x s`` (bilinear, antialiased, as
        torchvision's ``Resize`` on tensors; unchanged when already that size), DINOv2's tokens after
        the final norm without the 5 prefix tokens (hub ``x_norm_patchtokens``), and the last block's
        ``(q * d^-1/2) k^T`` of the CLS row (:func:`~.maths.cls_attention_maps`)."""
        px = self.proxy
        m = px.model
        x = images.to(px.dtype)
        if tuple(x.shape[-2:]) != (self.size, self.size):
            x = F.interpolate(x, size=(self.size, self.size), mode="bilinear", align_corners=False, antialias=True)
        B = x.shape[0]
        ph, pw = px.patch
        grid = (self.size // ph, self.size // pw)
        t = m.patch_embed.proj(x).flatten(2).transpose(1, 2)
        t = m.patch_embed.norm(t)
        pos = px._pos_embed(grid, t.device, t.dtype)
        prefix = [m.cls_token.expand(B, -1, -1).to(t.dtype)]
        if getattr(m, "reg_token", None) is not None:
            prefix.append(m.reg_token.expand(B, -1, -1).to(t.dtype))
        if m.no_embed_class:
            t = torch.cat(prefix + [t + pos], dim=1)
        else:
            t = torch.cat(prefix + [t], dim=1) + pos
        t = m.norm_pre(t)
        for blk in m.blocks[:-1]:
            t = blk(t)
        last = m.blocks[-1]
        attn = last.attn
        qkv = attn.qkv(last.norm1(t))
        # upstream hard-codes self.scale = 0.125 = 64 ** -0.5, the head dim of ViT-B/L
        scores = cls_attention_maps(qkv.float(), attn.num_heads, px.num_prefix_tokens, attn.head_dim ** -0.5)
        t = m.norm(last(t))[:, px.num_prefix_tokens:]
        feats = t.float().transpose(1, 2).reshape(B, -1, grid[0], grid[1])
        return feats, scores
