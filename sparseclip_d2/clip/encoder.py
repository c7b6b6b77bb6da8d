"""``DenseCLIPEncoder``: an open_clip ViT whose last blocks run a configurable attention
and which returns dense patch embeddings in CLIP's joint space at any resolution."""
import logging
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from open_clip.constants import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD
from open_clip.transformer import ResidualAttentionBlock, VisionTransformer

from ..attention import apply_attention, attention_weights, build_prior
from ..common.cache import LRUCache
from .spec import AttentionSpec

__all__ = ["DenseCLIPEncoder", "interpolate_pos_embed", "POS_EMBED_INTERP_MODES"]

logger = logging.getLogger(__name__)

_CACHE_SIZE = 32


#: How the position-embedding grid is resized (``interpolate_pos_embed(mode=...)``).
POS_EMBED_INTERP_MODES = ("size", "scale_factor")


def interpolate_pos_embed(pos_embed: torch.Tensor, src_grid: Tuple[int, int],
                          dst_grid: Tuple[int, int], mode: str = "size") -> torch.Tensor:
    """Resize ViT position embeddings to another patch grid (protocol section 2).

    The CLS embedding (row 0) is kept; the ``src_grid`` rows are reshaped to a grid,
    bicubically interpolated (``align_corners=False``) in float32 to ``dst_grid`` and
    concatenated back. ``mode`` selects how the bicubic resize is asked for:

    - ``"size"``: ``F.interpolate(size=(h, w))``; source coordinates use the ratio
      ``gh / h`` (MMSeg / MaskCLIP ``resize_pos_embed``).
    - ``"scale_factor"``: ``F.interpolate(scale_factor=((h + 0.1) / gh, (w + 0.1) / gw))``
      as SCLIP / ClearCLIP / NACLIP do (their ``interpolate_pos_encoding``); PyTorch then
      maps output pixels with ``1 / scale_factor`` instead of ``gh / h``, which samples the
      grid at slightly different points. Equal grids are returned unchanged in both modes
      (upstream also resizes a native-size grid when the input's pixel height and width
      differ, e.g. 224 x 230; that corner case is not reproduced).

    Args:
        pos_embed: ``(1 + gh*gw, C)``.
        src_grid, dst_grid: ``(gh, gw)`` and ``(h, w)``.
        mode: one of :data:`POS_EMBED_INTERP_MODES`.
    Returns:
        ``(1 + h*w, C)`` float32 (a float32 copy when the grids are equal).
    """
    if mode not in POS_EMBED_INTERP_MODES:
        raise ValueError(f"unknown position-embedding interpolation {mode!r}; valid: "
                         f"{', '.join(POS_EMBED_INTERP_MODES)}")
    gh, gw = src_grid
    h, w = dst_grid
    if pos_embed.shape[0] != 1 + gh * gw:
        raise ValueError(f"position embeddings of shape {tuple(pos_embed.shape)} do not match a "
                         f"{gh}x{gw} grid plus CLS")
    pe = pos_embed.detach().float()
    if (gh, gw) == (h, w):
        return pe.clone()
    C = pe.shape[1]
    grid = pe[1:].reshape(1, gh, gw, C).permute(0, 3, 1, 2)
    if mode == "size":
        grid = F.interpolate(grid, size=(h, w), mode="bicubic", align_corners=False)
    else:
        grid = F.interpolate(grid, scale_factor=((h + 0.1) / gh, (w + 0.1) / gw), mode="bicubic",
                             align_corners=False)
        if tuple(grid.shape[-2:]) != (h, w):  # floor(g * (n + 0.1) / g) is n for any sane grid
            raise RuntimeError(f"scale_factor interpolation gave a {tuple(grid.shape[-2:])} grid, expected {(h, w)}")
    grid = grid.permute(0, 2, 3, 1).reshape(h * w, C)
    return torch.cat([pe[:1], grid], dim=0)


def _check_visual(visual: nn.Module) -> None:
    if not isinstance(visual, VisionTransformer):
        raise TypeError(
            f"DenseCLIPEncoder supports open_clip VisionTransformer towers only, got {type(visual).__name__} "
            "(ModifiedResNet / timm towers have no token attention to modify)")
    if getattr(visual, "attn_pool", None) is not None:
        raise ValueError("DenseCLIPEncoder does not support towers with attentional pooling (CoCa-style "
                         "attn_pool): their tokens are not in the joint space")
    if getattr(visual, "proj", None) is None:
        raise ValueError("DenseCLIPEncoder needs the tower's output projection `proj`, which is None "
                         "(pruned head?)")
    blocks = visual.transformer.resblocks
    for i, blk in enumerate(blocks):
        if not isinstance(blk, ResidualAttentionBlock):
            raise ValueError(
                f"block {i} is a {type(blk).__name__}; only open_clip ResidualAttentionBlock with "
                "nn.MultiheadAttention is supported (custom blocks: qk-norm / scaled-cosine attention)")
        attn = blk.attn
        if not isinstance(attn, nn.MultiheadAttention):
            raise ValueError(f"block {i} attention is a {type(attn).__name__}, not nn.MultiheadAttention")
        if attn.bias_k is not None or attn.add_zero_attn or hasattr(blk, "ln_1_kv"):
            raise ValueError(f"block {i}: add_bias_kv / add_zero_attn / cross-attention blocks are unsupported")


class DenseCLIPEncoder(nn.Module):
    """Dense open-vocabulary features from a frozen open_clip ViT with a modified final attention.

    Wraps ``visual`` (an ``open_clip.transformer.VisionTransformer``; it is registered as a
    submodule, never copied nor modified). Blocks before the last ``spec.num_layers`` run
    as open_clip runs them; the last ``num_layers`` blocks compute q, k, v from the block's
    own ``in_proj``/``out_proj`` weights, with ``spec.normalizer``/``spec.temperature``; the
    very last block also uses ``spec.source``, ``spec.prior`` and the ``residual``/``ffn``
    switches. Attention scores and weights are float32 whatever the model dtype.

    Attributes:
        patch_size (int or (int, int)), embed_dim (D, joint space), width (C, tokens),
        depth (blocks), num_heads, image_mean / image_std (0-1 scale RGB tuples), spec,
        pos_embed_interp (``size`` or ``scale_factor``, see :func:`interpolate_pos_embed`).
    """

    def __init__(self, visual: nn.Module, spec: Optional[AttentionSpec] = None, *,
                 pos_embed_interp: str = "size"):
        super().__init__()
        if pos_embed_interp not in POS_EMBED_INTERP_MODES:
            raise ValueError(f"unknown position-embedding interpolation {pos_embed_interp!r}; valid: "
                             f"{', '.join(POS_EMBED_INTERP_MODES)}")
        self.pos_embed_interp = pos_embed_interp
        _check_visual(visual)
        spec = AttentionSpec() if spec is None else spec
        if not isinstance(spec, AttentionSpec):
            raise TypeError(f"spec must be an AttentionSpec, got {type(spec).__name__}")
        self.visual = visual
        self.spec = spec
        self.depth = len(visual.transformer.resblocks)
        spec.check_depth(self.depth)
        ph, pw = visual.patch_size if isinstance(visual.patch_size, (tuple, list)) else (visual.patch_size,) * 2
        self._patch = (int(ph), int(pw))
        self.patch_size: Union[int, Tuple[int, int]] = int(ph) if ph == pw else (int(ph), int(pw))
        self.width = int(visual.conv1.out_channels)
        self.embed_dim = int(visual.proj.shape[1])
        self.num_heads = int(visual.transformer.resblocks[-1].attn.num_heads)
        self._native_grid = tuple(int(g) for g in visual.grid_size)
        pp = getattr(visual, "preprocess_cfg", None) or {}
        self.image_mean = tuple(float(m) for m in (pp.get("mean") or getattr(visual, "image_mean", None)
                                                   or OPENAI_DATASET_MEAN))
        self.image_std = tuple(float(s) for s in (pp.get("std") or getattr(visual, "image_std", None)
                                                  or OPENAI_DATASET_STD))
        self._pos_cache: "LRUCache[torch.Tensor]" = LRUCache(_CACHE_SIZE)
        self._prior_cache: "LRUCache[Optional[torch.Tensor]]" = LRUCache(_CACHE_SIZE)

    def extra_repr(self) -> str:
        return f"spec={self.spec}, patch_size={self.patch_size}, depth={self.depth}, embed_dim={self.embed_dim}"

    # -- cached helpers ------------------------------------------------------------------
    def positional_embedding(self, grid: Tuple[int, int], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """Position embeddings for an ``(h, w)`` patch grid: ``(1 + h*w, C)`` in ``dtype`` on ``device``.

        Bicubically interpolated from the model's native grid (CLS kept) the
        ``pos_embed_interp`` way, cached per (grid, device, dtype, version of the parameter).
        """
        pe = self.visual.positional_embedding
        key = (tuple(grid), str(device), dtype, pe.data_ptr(), pe._version, self.pos_embed_interp)

        def make():
            with torch.no_grad():
                return interpolate_pos_embed(pe, self._native_grid, tuple(grid),
                                             mode=self.pos_embed_interp).to(device=device, dtype=dtype)

        return self._pos_cache.get_or_create(key, make)

    def attention_prior(self, grid: Tuple[int, int], device: torch.device) -> Optional[torch.Tensor]:
        """The last block's additive prior for an ``(h, w)`` grid: ``(1 + h*w, 1 + h*w)`` float32 or None."""
        key = (tuple(grid), str(device), self.spec.prior, self.spec.prior_std)
        return self._prior_cache.get_or_create(
            key,
            lambda: build_prior(self.spec.prior, grid, std=self.spec.prior_std, num_prefix_tokens=1, device=device))

    # -- blocks --------------------------------------------------------------------------
    @staticmethod
    def _run_native(blk: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """Run an open_clip block unchanged on ``x`` (B, L, C)."""
        if blk.attn.batch_first:
            return blk(x)
        return blk(x.transpose(0, 1)).transpose(0, 1)

    def _qkv(self, attn: nn.MultiheadAttention, y: torch.Tensor):
        """(B, L, C) -> q, k, v of shape (B, heads, L, C/heads) from the module's own projections."""
        B, L, C = y.shape
        if attn.in_proj_weight is not None:
            q, k, v = F.linear(y, attn.in_proj_weight, attn.in_proj_bias).chunk(3, dim=-1)
        else:
            b = attn.in_proj_bias
            bq, bk, bv = (None, None, None) if b is None else b.chunk(3)
            q = F.linear(y, attn.q_proj_weight, bq)
            k = F.linear(y, attn.k_proj_weight, bk)
            v = F.linear(y, attn.v_proj_weight, bv)
        nh = attn.num_heads
        split = lambda t: t.reshape(B, L, nh, C // nh).transpose(1, 2)  # noqa: E731
        return split(q), split(k), split(v)

    def _run_modified(self, blk: nn.Module, x: torch.Tensor, last: bool, grid: Tuple[int, int],
                      generator: Optional[torch.Generator]):
        """One block with the spec's attention; returns ((B, L, C), weights (B, heads, L, L) float32)."""
        spec = self.spec
        B, L, C = x.shape
        q, k, v = self._qkv(blk.attn, blk.ln_1(x))
        weights = attention_weights(
            q, k, v,
            source=spec.source if last else "qk",
            normalizer=spec.normalizer,
            alpha=spec.alpha,
            temperature=spec.temperature,
            prior=self.attention_prior(grid, x.device) if last else None,
            sum_mode=spec.sum_mode,
            generator=generator,
        )
        out = apply_attention(weights, v).transpose(1, 2).reshape(B, L, C)
        out = blk.ls_1(F.linear(out, blk.attn.out_proj.weight, blk.attn.out_proj.bias))
        residual = spec.residual if last else True
        ffn = spec.ffn if last else True
        x = x + out if residual else out
        if ffn:
            x = x + blk.ls_2(blk.mlp(blk.ln_2(x)))
        return x, weights

    # -- forward -------------------------------------------------------------------------
    def grid_for(self, height: int, width: int) -> Tuple[int, int]:
        """Patch grid ``(h, w)`` of an ``height x width`` input; raises when not a multiple of the patch."""
        ph, pw = self._patch
        if height < ph or width < pw or height % ph or width % pw:
            raise ValueError(
                f"input size {height}x{width} is not a (positive) multiple of the patch size "
                f"{ph}x{pw}; resize or pad the images to multiples of {ph}")
        return height // ph, width // pw

    def forward(self, images: torch.Tensor, return_attention: bool = False):
        """Dense patch embeddings.

        Args:
            images: ``(B, 3, H, W)`` normalised with ``image_mean``/``image_std``; H and W
                multiples of ``patch_size``.
            return_attention: also return the last block's attention weights.
        Returns:
            features ``(B, D, H/p, W/p)`` in the model dtype (ln_post + proj of every patch
            token of the final block, CLS dropped, not L2-normalised); with
            ``return_attention`` a tuple ``(features, attn)`` where ``attn`` is
            ``(B, heads, 1 + h*w, 1 + h*w)`` float32, CLS first.
        """
        if images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"images must be (B, 3, H, W), got shape {tuple(images.shape)}")
        B, _, H, W = images.shape
        h, w = self.grid_for(H, W)
        visual = self.visual
        dtype = visual.conv1.weight.dtype
        x = visual.conv1(images.to(dtype))  # (B, C, h, w)
        x = x.flatten(2).transpose(1, 2)  # (B, h*w, C)
        cls = visual.class_embedding.to(x.dtype).view(1, 1, -1).expand(B, 1, -1)
        x = torch.cat([cls, x], dim=1) + self.positional_embedding((h, w), x.device, x.dtype)
        x = visual.ln_pre(x)

        generator = None
        if self.spec.normalizer == "random_matched":
            generator = torch.Generator(device=x.device).manual_seed(self.spec.seed)
        first_modified = self.depth - self.spec.num_layers
        attn = None
        for i, blk in enumerate(visual.transformer.resblocks):
            if i < first_modified:
                x = self._run_native(blk, x)
            else:
                x, attn = self._run_modified(blk, x, i == self.depth - 1, (h, w), generator)
        x = visual.ln_post(x)
        feats = x[:, 1:] @ visual.proj  # (B, h*w, D)
        feats = feats.reshape(B, h, w, -1).permute(0, 3, 1, 2).contiguous()
        if return_attention:
            return feats, attn
        return feats
