"""Tower adapters: one uniform view of every ViT vision tower open_clip builds.

:class:`DenseCLIPEncoder` runs a tower through an adapter that reads the tower's own
submodules (never copies nor edits them) and exposes the pieces the encoder needs:
patch embedding with position embeddings for any grid, the blocks, each block's q/k/v
exactly as the tower computes them (q/k norms, rotary embeddings), the attention output
path, the FFN branch, the final norm and the per-patch head into the joint space.

Three kinds (``tower_kind(visual)``):

- ``open_clip_vit``: ``open_clip.transformer.VisionTransformer`` (OpenAI / LAION CLIP).
- ``timm_vit``: ``open_clip.timm_model.TimmModel`` whose trunk is a timm
  ``VisionTransformer`` with standard ``Block``/``Attention`` (SigLIP, SigLIP 2,
  MobileCLIP-B / MobileCLIP2-B/L, ViTamin, ...).
- ``timm_eva``: a ``TimmModel`` whose trunk is a timm ``Eva`` with ``EvaBlock`` and
  ``EvaAttention``/``AttentionRope`` (EVA01, EVA02, PE-Core), rotary embeddings
  ``RotaryEmbeddingCat``.

:func:`check_tower` says why a tower is not supported (ResNet, ConvNeXt, FastViT, Swin,
relative-position ViTs, CoCa's attentional pool, ...). The dense-feature definitions
per kind are in docs/architecture.md ("Dense features per tower kind").
"""
import logging
from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from open_clip.transformer import ResidualAttentionBlock, VisionTransformer

from ..common.cache import LRUCache

__all__ = ["TOWER_KINDS", "ATTN_POOL_DENSE_MODES", "tower_kind", "check_tower", "make_tower", "CACHE_SIZE"]

logger = logging.getLogger(__name__)

TOWER_KINDS = ("open_clip_vit", "timm_vit", "timm_eva")
#: Per-patch paths through an attention-pooling (MAP) head, see docs/architecture.md.
#: ``value``: each patch's value vector through the pooling head's output projection and
#: its residual MLP (what the head returns for a one-token sequence: MaskCLIP's value path
#: applied to the pooling attention). ``value_no_mlp``: the value path and the output
#: projection only, without the head's residual MLP.
ATTN_POOL_DENSE_MODES = ("value", "value_no_mlp")
CACHE_SIZE = 32


def _timm():
    try:
        import timm  # noqa: F401
        from timm.layers import Attention, AttentionPoolLatent, AttentionRope, RotaryEmbeddingCat
        from timm.models.eva import Eva, EvaAttention, EvaBlock, EvaBlockPostNorm
        from timm.models.vision_transformer import Block, VisionTransformer as TimmViT
    except ImportError:  # pragma: no cover - timm is a dependency of the project
        return None
    return dict(Attention=Attention, AttentionPoolLatent=AttentionPoolLatent, AttentionRope=AttentionRope,
                RotaryEmbeddingCat=RotaryEmbeddingCat, Eva=Eva, EvaAttention=EvaAttention, EvaBlock=EvaBlock,
                EvaBlockPostNorm=EvaBlockPostNorm,
                Block=Block, TimmViT=TimmViT)


def _trunk(visual: nn.Module) -> Optional[nn.Module]:
    """The timm trunk of an open_clip ``TimmModel`` (``visual.trunk``), else None."""
    try:
        from open_clip.timm_model import TimmModel
    except ImportError:  # pragma: no cover
        return None
    return visual.trunk if isinstance(visual, TimmModel) else None


def check_tower(visual: nn.Module) -> Tuple[Optional[str], str]:
    """``(kind, "")`` for a supported tower, ``(None, reason)`` otherwise.

    Args:
        visual: ``clip_model.visual``.
    Returns:
        the tower kind (one of :data:`TOWER_KINDS`) or None, and the reason it is refused.
    """
    name = type(visual).__name__
    if isinstance(visual, VisionTransformer):
        if getattr(visual, "attn_pool", None) is not None:
            return None, ("open_clip VisionTransformer with attentional pooling (CoCa attn_pool): its pooled "
                          "outputs are several latent queries, not per-patch tokens in the joint space")
        if getattr(visual, "proj", None) is None:
            return None, "open_clip VisionTransformer without the output projection `proj` (pruned head?)"
        for i, blk in enumerate(visual.transformer.resblocks):
            if not isinstance(blk, ResidualAttentionBlock):
                return None, (f"block {i} is a {type(blk).__name__}; only open_clip ResidualAttentionBlock with "
                              "nn.MultiheadAttention is supported (custom blocks: qk-norm / scaled-cosine attention)")
            attn = blk.attn
            if not isinstance(attn, nn.MultiheadAttention):
                return None, f"block {i} attention is a {type(attn).__name__}, not nn.MultiheadAttention"
            if attn.bias_k is not None or attn.add_zero_attn or hasattr(blk, "ln_1_kv"):
                return None, f"block {i}: add_bias_kv / add_zero_attn / cross-attention blocks are unsupported"
        return "open_clip_vit", ""
    trunk = _trunk(visual)
    if trunk is None:
        why = ("a convolutional tower: no token self-attention to modify" if "ResNet" in name
               else "not an open_clip VisionTransformer nor an open_clip TimmModel")
        return None, f"{name}: {why}"
    t = _timm()
    if t is None:  # pragma: no cover
        return None, "timm is not importable"
    tname = type(trunk).__name__
    head = getattr(visual, "head", None)
    if head is not None and any(k in ("pool",) for k, _ in head.named_children()):
        return None, f"timm {tname} with an open_clip attention-pool head (abs_attn/rot_attn): a 2-D CNN pooling"
    if type(trunk) is t["TimmViT"]:
        kind, block_cls, attn_cls = "timm_vit", (t["Block"],), (t["Attention"],)
    elif type(trunk) is t["Eva"]:
        kind, block_cls = "timm_eva", (t["EvaBlock"], t["EvaBlockPostNorm"])
        attn_cls = (t["EvaAttention"], t["AttentionRope"])
        rope = getattr(trunk, "rope", None)
        if rope is not None and type(rope) is not t["RotaryEmbeddingCat"]:
            return None, f"timm Eva with {type(rope).__name__} rotary embeddings (only RotaryEmbeddingCat)"
        if getattr(trunk, "rope_mixed", False):
            return None, "timm Eva with depth-dependent (mixed) rotary embeddings"
    else:
        why = ("convolutional / hierarchical stages, no global token self-attention"
               if any(k in tname for k in ("ConvNeXt", "FastVit", "SwinTransformer", "ResNet", "MbConv"))
               else "not a timm VisionTransformer or Eva")
        return None, f"timm {tname}: {why}"
    pe = trunk.patch_embed
    if not hasattr(pe, "proj") or not hasattr(pe, "feat_ratio"):
        return None, f"timm {tname} patch embedding {type(pe).__name__} has no proj / feat_ratio"
    if getattr(pe, "dynamic_img_pad", False):
        return None, f"timm {tname} with dynamic_img_pad (the encoder needs inputs that are multiples of the patch)"
    for i, blk in enumerate(trunk.blocks):
        if type(blk) not in block_cls:
            return None, (f"timm {tname} block {i} is a {type(blk).__name__}; supported: "
                          f"{', '.join(c.__name__ for c in block_cls)}")
        if type(blk.attn) not in attn_cls:
            return None, (f"timm {tname} block {i} attention is a {type(blk.attn).__name__}; supported: "
                          f"{', '.join(c.__name__ for c in attn_cls)}")
    pool = getattr(trunk, "attn_pool", None)
    if pool is not None:
        if type(pool) is not t["AttentionPoolLatent"]:
            return None, f"timm {tname} with a {type(pool).__name__} pooling head (only AttentionPoolLatent)"
        if pool.pos_embed is not None:
            return None, f"timm {tname}: attention-pool head with its own position embedding is unsupported"
        if getattr(trunk, "pool_include_prefix", False):
            return None, f"timm {tname}: attention pool over prefix tokens is unsupported"
    elif getattr(trunk, "global_pool", "") not in ("token", "avg"):
        return None, f"timm {tname} with global_pool={trunk.global_pool!r}; supported: token, avg, map"
    return kind, ""


def tower_kind(visual: nn.Module) -> Optional[str]:
    """The tower kind of ``visual`` or None when unsupported (see :func:`check_tower`)."""
    return check_tower(visual)[0]


def _version_key(t: Optional[torch.Tensor]):
    """Cache-key part of a parameter: its storage, shape, dtype and a float64 checksum of its
    values, so weights loaded in place (``load_state_dict`` keeps the storage) never meet a
    stale interpolation (public API only; the sum costs microseconds next to a forward)."""
    if t is None:
        return None
    if t.is_meta:  # no values (shape checks on the meta device)
        return (tuple(t.shape), t.dtype)
    with torch.no_grad():
        return (t.data_ptr(), tuple(t.shape), t.dtype, float(t.detach().sum(dtype=torch.float64)))


# ----------------------------------------------------------------------------- base
class _Tower:
    """Common interface. Shapes: ``x`` (B, L, C) tokens (prefix tokens first, then the
    ``h*w`` patches row-major); q, k, v (B, heads, L, d)."""

    kind = ""

    def __init__(self, visual: nn.Module):
        self.visual = visual
        self._pos_cache: "LRUCache[torch.Tensor]" = LRUCache(CACHE_SIZE)

    # attributes filled by subclasses: blocks, patch (ph, pw), native_grid, width, embed_dim,
    # num_heads, num_prefix_tokens, dtype_param
    def embed(self, images: torch.Tensor, grid: Tuple[int, int]):
        """``(B, 3, H, W)`` -> ``(x (B, L, C), rope or None)``."""
        raise NotImplementedError

    def run_native(self, blk: nn.Module, x: torch.Tensor, rope) -> torch.Tensor:
        raise NotImplementedError

    def norm1(self, blk, x):
        raise NotImplementedError

    def qkv(self, blk, y, rope):
        raise NotImplementedError

    def attn_out(self, blk, y, out):
        """``out`` (B, L, heads*d) attention result -> the block's attention branch (B, L, C)."""
        raise NotImplementedError

    def ffn(self, blk, x):
        """The FFN branch (B, L, C) added to ``x``."""
        raise NotImplementedError

    def final_norm(self, x):
        raise NotImplementedError

    def dense(self, x):
        """Final tokens (after :meth:`final_norm`) -> per-patch embeddings (B, h*w, D)."""
        raise NotImplementedError

    def pooled(self, x):
        """Final tokens -> the tower's own pooled embedding (B, D)."""
        raise NotImplementedError


def _plain_self_attention_block(blk: nn.Module) -> bool:
    """An open_clip ``ResidualAttentionBlock`` that is the plain pre-norm self-attention block:
    no attention mask, no cross-attention inputs, ``ln_1`` / ``ln_2`` / ``mlp`` / ``ls_1`` / ``ls_2``, and
    an ``nn.MultiheadAttention`` without dropout, bias_k / bias_v or zero-attention."""
    attn = blk.attn
    return (all(hasattr(blk, name) for name in ("ln_1", "ln_2", "mlp", "ls_1", "ls_2"))
            and not hasattr(blk, "ln_1_kv") and attn.bias_k is None and attn.bias_v is None
            and not attn.add_zero_attn and attn.dropout == 0.0 and attn._qkv_same_embed_dim)


# ----------------------------------------------------------------------------- open_clip ViT
class OpenCLIPViTTower(_Tower):
    """open_clip ``VisionTransformer``: conv1 -> CLS -> interpolated position embeddings ->
    ln_pre -> ``ResidualAttentionBlock`` s -> ln_post -> proj."""

    kind = "open_clip_vit"

    def __init__(self, visual: nn.Module, interpolate: Callable):
        super().__init__(visual)
        self.blocks = list(visual.transformer.resblocks)
        ps = visual.patch_size
        ph, pw = ps if isinstance(ps, (tuple, list)) else (ps, ps)
        self.patch = (int(ph), int(pw))
        self.native_grid = tuple(int(g) for g in visual.grid_size)
        self.width = int(visual.conv1.out_channels)
        self.embed_dim = int(visual.proj.shape[1])
        self.num_heads = int(self.blocks[-1].attn.num_heads)
        self.num_prefix_tokens = 1
        self._interpolate = interpolate

    @property
    def dtype(self):
        return self.visual.conv1.weight.dtype

    def positional_embedding(self, grid, device, dtype):
        pe = self.visual.positional_embedding
        key = (tuple(grid), str(device), dtype, _version_key(pe))

        def make():
            with torch.no_grad():
                return self._interpolate(pe, self.native_grid, tuple(grid)).to(device=device, dtype=dtype)

        return self._pos_cache.get_or_create(key, make)

    def embed(self, images, grid):
        v = self.visual
        B = images.shape[0]
        x = v.conv1(images.to(self.dtype)).flatten(2).transpose(1, 2)  # (B, h*w, C)
        cls = v.class_embedding.to(x.dtype).view(1, 1, -1).expand(B, 1, -1)
        x = torch.cat([cls, x], dim=1) + self.positional_embedding(grid, x.device, x.dtype)
        return v.ln_pre(x), None

    def run_native(self, blk, x, rope):
        """The unmodified block. Its attention is computed as ``nn.MultiheadAttention`` computes it
        with ``need_weights=False`` outside its fused inference fast path (the packed in-projection,
        ``F.scaled_dot_product_attention``, the out-projection): the path of OpenAI CLIP's
        sequence-first blocks, which the upstream code of the field vendors (``clip/model.py``
        ``ResidualAttentionBlock.attention``: ``self.attn(x, x, x, need_weights=False)``), so the
        tokens here equal theirs bit for bit where ``blk(x)`` on open_clip's batch-first module would
        take the fused kernel and differ by about 2e-6 (and be slower on long token sequences;
        docs/efficiency.md). A block of another kind (open_clip's scaled-cosine ``Attention``, a
        cross-attention block) runs as it is."""
        attn = getattr(blk, "attn", None)
        if not isinstance(attn, nn.MultiheadAttention) or not _plain_self_attention_block(blk):
            if getattr(attn, "batch_first", True):
                return blk(x)
            return blk(x.transpose(0, 1)).transpose(0, 1)
        y = self.norm1(blk, x)
        q, k, v = self.qkv(blk, y, rope)
        out = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)
        x = x + self.attn_out(blk, y, out)
        return x + self.ffn(blk, x)

    def norm1(self, blk, x):
        return blk.ln_1(x)

    def qkv(self, blk, y, rope):
        attn = blk.attn
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

    def attn_out(self, blk, y, out):
        return blk.ls_1(F.linear(out, blk.attn.out_proj.weight, blk.attn.out_proj.bias))

    def ffn(self, blk, x):
        return blk.ls_2(blk.mlp(blk.ln_2(x)))

    def final_norm(self, x):
        return self.visual.ln_post(x)

    def dense(self, x):
        return x[:, 1:] @ self.visual.proj

    def pooled(self, x):
        v = self.visual
        if v.pool_type != "tok" or getattr(v, "final_ln_after_pool", False):
            raise ValueError(f"pooled embedding reproduced for pool_type='tok' without final_ln_after_pool only; "
                             f"this tower has pool_type={v.pool_type!r}")
        return x[:, 0] @ v.proj


# ----------------------------------------------------------------------------- timm towers
class _TimmTower(_Tower):
    """Shared parts of timm ``VisionTransformer`` and ``Eva`` trunks inside open_clip's ``TimmModel``."""

    def __init__(self, visual: nn.Module, attn_pool_dense: str = "value"):
        super().__init__(visual)
        if attn_pool_dense not in ATTN_POOL_DENSE_MODES:
            raise ValueError(f"unknown attn_pool_dense {attn_pool_dense!r}; valid: {', '.join(ATTN_POOL_DENSE_MODES)}")
        self.attn_pool_dense = attn_pool_dense
        trunk = visual.trunk
        self.trunk = trunk
        self.blocks = list(trunk.blocks)
        ratio = trunk.patch_embed.feat_ratio()
        ph, pw = ratio if isinstance(ratio, (tuple, list)) else (ratio, ratio)
        self.patch = (int(ph), int(pw))
        self.native_grid = tuple(int(g) for g in trunk.patch_embed.grid_size)
        self.width = int(trunk.embed_dim)
        self.num_heads = int(self.blocks[-1].attn.num_heads)
        self.num_prefix_tokens = int(trunk.num_prefix_tokens)
        param = next(trunk.patch_embed.parameters())
        with torch.no_grad():  # D from a dry run of the head on one zero token (shape only)
            z = torch.zeros(1, 1, self.width, dtype=param.dtype, device=param.device)
            self.embed_dim = int(self.dense_from_patches(z).shape[-1])

    @property
    def dtype(self):
        return next(self.trunk.patch_embed.parameters()).dtype

    # -- embedding
    def _patch_tokens(self, images):
        """Patch embedding as the trunk's ``patch_embed`` computes it, for any size: (B, h, w, C)."""
        pe = self.trunk.patch_embed
        x = images.to(self.dtype)
        backbone = getattr(pe, "backbone", None)
        if backbone is not None:  # HybridEmbed: CNN stem then proj
            x = backbone(x)
            if isinstance(x, (list, tuple)):
                x = x[-1]
        x = pe.proj(x)  # (B, C, h, w)
        x = x.permute(0, 2, 3, 1)
        norm = getattr(pe, "norm", None)
        return norm(x) if norm is not None else x

    def abs_pos_embed(self, grid, device, dtype):
        """The trunk's absolute position embeddings resampled to ``grid`` as timm's dynamic
        image size does (``timm.layers.resample_abs_pos_embed``, bicubic, antialiased):
        ``(1, P + h*w, C)`` or ``(1, h*w, C)`` (``no_embed_class``), or None."""
        from timm.layers import resample_abs_pos_embed

        t = self.trunk
        pe = t.pos_embed
        if pe is None:
            return None
        key = ("abs", tuple(grid), str(device), dtype, _version_key(pe))

        def make():
            with torch.no_grad():
                out = resample_abs_pos_embed(
                    pe, new_size=list(grid), old_size=list(self.native_grid),
                    num_prefix_tokens=0 if t.no_embed_class else self.num_prefix_tokens)
                return out.detach().to(device=device, dtype=dtype)

        return self._pos_cache.get_or_create(key, make)

    def _prefix_and_pos(self, x, grid):
        """(B, h, w, C) patch tokens -> prefix tokens + position embeddings, (B, L, C)."""
        t = self.trunk
        B = x.shape[0]
        x = x.reshape(B, -1, x.shape[-1])
        to_cat = []
        if t.cls_token is not None:
            to_cat.append(t.cls_token.expand(B, -1, -1).to(x.dtype))
        if t.reg_token is not None:
            to_cat.append(t.reg_token.expand(B, -1, -1).to(x.dtype))
        pos = self.abs_pos_embed(grid, x.device, x.dtype)
        if t.no_embed_class:
            if pos is not None:
                x = x + pos
            if to_cat:
                x = torch.cat(to_cat + [x], dim=1)
        else:
            if to_cat:
                x = torch.cat(to_cat + [x], dim=1)
            if pos is not None:
                x = x + pos
        return x

    # -- blocks: shared attention pieces of timm Attention / EvaAttention / AttentionRope
    def attn_out(self, blk, y, out):
        attn = blk.attn
        out = attn.norm(out)
        gate = getattr(attn, "gate", None)
        if gate is not None:
            out = out * gate(y).sigmoid()
        return self._ls1(blk, attn.proj(out))

    def final_norm(self, x):
        return self.trunk.norm(x)

    # -- head
    def _head(self, z):
        """fc_norm -> trunk head -> open_clip head, per token: (B, N, C) -> (B, N, D)."""
        t = self.trunk
        z = t.head(t.fc_norm(z))
        return self.visual.head(z)

    def _attn_pool_value(self, p):
        """The MAP head's value path for each token alone: (B, N, C) -> (B, N, C)."""
        pool = self.trunk.attn_pool
        B, N, _ = p.shape
        v = pool.kv(p).reshape(B, N, 2, -1)[:, :, 1]  # the value half of the fused k/v projection
        z = pool.proj_drop(pool.proj(v))
        if self.attn_pool_dense == "value" and pool.mlp is not None:
            z = z + pool.mlp(pool.norm(z))
        return z

    def dense_from_patches(self, p):
        """Patch tokens after the final norm (B, N, C) -> joint-space embeddings (B, N, D)."""
        if self.trunk.attn_pool is not None:
            p = self._attn_pool_value(p)
        return self._head(p)

    def dense(self, x):
        return self.dense_from_patches(x[:, self.num_prefix_tokens:])

    def pooled(self, x):
        return self.visual.head(self.trunk.forward_head(x))


class TimmViTTower(_TimmTower):
    """timm ``VisionTransformer`` trunk: patch_embed -> cls/reg tokens -> pos_embed
    (resampled) -> norm_pre -> ``Block`` s -> norm -> pooling head."""

    kind = "timm_vit"

    def embed(self, images, grid):
        x = self._prefix_and_pos(self._patch_tokens(images), grid)
        return self.trunk.norm_pre(x), None

    def run_native(self, blk, x, rope):
        return blk(x)

    def norm1(self, blk, x):
        return blk.norm1(x)

    def qkv(self, blk, y, rope):
        attn = blk.attn
        B, N, _ = y.shape
        qkv = attn.qkv(y).reshape(B, N, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        return attn.q_norm(q), attn.k_norm(k), v

    def _ls1(self, blk, out):
        return blk.ls1(out)

    def ffn(self, blk, x):
        return blk.ls2(blk.mlp(blk.norm2(x)))


class TimmEvaTower(_TimmTower):
    """timm ``Eva`` trunk (EVA01/EVA02/PE-Core): as :class:`TimmViTTower` plus rotary
    embeddings on the patch tokens' q and k, built for any grid like timm's dynamic image
    size (``timm.layers.build_rotary_pos_embed`` with the rope module's own settings).
    Post-norm blocks (``EvaBlockPostNorm``, EVA02-E): ``x + norm1(attn(x))`` and
    ``x + norm2(mlp(x))``; the residual / FFN switches act on those branches."""

    kind = "timm_eva"

    @staticmethod
    def _post_norm(blk) -> bool:
        return not hasattr(blk, "gamma_1")

    def rope_embed(self, grid, device):
        """``(h*w, 2 * dim)`` concatenated sin/cos rotary embedding for ``grid``, or None."""
        from timm.layers import build_rotary_pos_embed

        rope = self.trunk.rope
        if rope is None:
            return None
        cached = getattr(rope, "pos_embed", None)
        dtype = cached.dtype if cached is not None else torch.float32
        key = ("rope", tuple(grid), str(device), dtype, _version_key(rope.bands))

        def make():
            with torch.no_grad():
                sin, cos = build_rotary_pos_embed(
                    list(grid), bands=rope.bands.to(device), in_pixels=rope.in_pixels,
                    ref_feat_shape=rope.ref_feat_shape, grid_offset=rope.grid_offset,
                    grid_indexing=rope.grid_indexing, rotate_half=rope.rotate_half, device=device,
                    dtype=torch.float32, grid_type=rope.grid_type, normalize_coords=rope.normalize_coords)
                return torch.cat([sin, cos], -1).to(dtype)

        return self._pos_cache.get_or_create(key, make)

    def embed(self, images, grid):
        x = self._prefix_and_pos(self._patch_tokens(images), grid)
        rope = self.rope_embed(grid, x.device)
        return self.trunk.norm_pre(x), rope

    def run_native(self, blk, x, rope):
        return blk(x, rope=rope)

    def norm1(self, blk, x):
        return x if self._post_norm(blk) else blk.norm1(x)

    def qkv(self, blk, y, rope):
        from timm.layers import apply_rot_embed_cat

        attn = blk.attn
        B, N, _ = y.shape
        nh = attn.num_heads
        kvh = getattr(attn, "num_kv_heads", nh)
        if attn.qkv is not None:
            q_bias = getattr(attn, "q_bias", None)
            if q_bias is not None:  # EvaAttention: q and v biases, k bias a zero buffer
                qkv = F.linear(y, attn.qkv.weight, torch.cat((attn.q_bias, attn.k_bias, attn.v_bias)))
            else:
                qkv = attn.qkv(y)
            q, k, v = qkv.reshape(B, N, 3, nh, -1).permute(2, 0, 3, 1, 4).unbind(0)
        else:
            q = attn.q_proj(y).reshape(B, N, nh, -1).transpose(1, 2)
            k = attn.k_proj(y).reshape(B, N, kvh, -1).transpose(1, 2)
            v = attn.v_proj(y).reshape(B, N, kvh, -1).transpose(1, 2)
        q, k = attn.q_norm(q), attn.k_norm(k)
        if rope is not None:
            npt = attn.num_prefix_tokens
            half = getattr(attn, "rotate_half", False)
            q = torch.cat([q[:, :, :npt], apply_rot_embed_cat(q[:, :, npt:], rope, half=half)], dim=2).type_as(v)
            k = torch.cat([k[:, :, :npt], apply_rot_embed_cat(k[:, :, npt:], rope, half=half)], dim=2).type_as(v)
        groups = getattr(attn, "num_kv_groups", 1)
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        return q, k, v

    def _ls1(self, blk, out):
        if self._post_norm(blk):
            return blk.norm1(out)
        return out if blk.gamma_1 is None else blk.gamma_1 * out

    def ffn(self, blk, x):
        if self._post_norm(blk):
            return blk.norm2(blk.mlp(x))
        out = blk.mlp(blk.norm2(x))
        return out if blk.gamma_2 is None else blk.gamma_2 * out


def make_tower(visual: nn.Module, *, interpolate: Callable, attn_pool_dense: str = "value") -> _Tower:
    """The adapter of a supported tower; ``TypeError``/``ValueError`` naming why otherwise.

    Args:
        visual: ``clip_model.visual``.
        interpolate: position-embedding interpolation of open_clip ViTs
            (``fn(pos_embed (1 + gh*gw, C), src_grid, dst_grid) -> (1 + h*w, C)``).
        attn_pool_dense: per-patch path through an attention-pool head, one of
            :data:`ATTN_POOL_DENSE_MODES` (ignored by towers without one).
    """
    kind, why = check_tower(visual)
    if kind is None:
        err = ValueError if isinstance(visual, VisionTransformer) else TypeError
        raise err(f"DenseCLIPEncoder cannot wrap this vision tower: {why}. Supported: open_clip "
                  "VisionTransformer, timm VisionTransformer (SigLIP, SigLIP 2, MobileCLIP-B, ...) and timm Eva "
                  "(EVA01/EVA02, PE-Core) towers")
    if kind == "open_clip_vit":
        return OpenCLIPViTTower(visual, interpolate)
    if attn_pool_dense not in ATTN_POOL_DENSE_MODES:
        raise ValueError(f"unknown attn_pool_dense {attn_pool_dense!r}; valid: {', '.join(ATTN_POOL_DENSE_MODES)}")
    if kind == "timm_vit":
        return TimmViTTower(visual, attn_pool_dense)
    return TimmEvaTower(visual, attn_pool_dense)
