"""``DenseCLIPEncoder``: an open_clip ViT tower (open_clip, timm ViT or timm Eva) whose last
blocks run a configurable attention and which returns dense patch embeddings in the joint
space at any resolution."""
import functools
import logging
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from open_clip.constants import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD

from ..attention import apply_attention, attention_weights, build_prior, mix_attention
from ..attention.feedback import blend_feedback
from ..common.cache import LRUCache
from ..common.needs import Needs
from .parallel import check_parallel, run_parallel
from .calibrated import check_calibrated, is_calibrated, run_calibrated
from .spec import AttentionSpec
from .towers import make_tower

__all__ = ["DenseCLIPEncoder", "EncoderPass", "interpolate_pos_embed", "POS_EMBED_INTERP_MODES"]

logger = logging.getLogger(__name__)

_CACHE_SIZE = 32


#: How the position-embedding grid is resized (``interpolate_pos_embed(mode=...)``).
POS_EMBED_INTERP_MODES = ("size", "scale_factor", "size_antialias", "bilinear")


def interpolate_pos_embed(pos_embed: torch.Tensor, src_grid: Tuple[int, int],
                          dst_grid: Tuple[int, int], mode: str = "size") -> torch.Tensor:
    """Resize ViT position embeddings to another patch grid (``POS_EMBED_INTERP``: by size, or
    SCLIP/ClearCLIP/NACLIP's ``scale_factor`` convention).

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
    - ``"size_antialias"``: bicubic by size with ``antialias=True`` (GEM's
      ``resample_abs_pos_embed``, WalBouss/GEM @ 5fa677c ``gem/gem_utils.py``; PyTorch's
      antialiased bicubic uses the kernel a = -0.5, not -0.75, so it differs even upsampling).
    - ``"bilinear"``: ``F.interpolate(size=(h, w), mode="bilinear")`` (CLIP Surgery's
      ``VisionTransformer.forward``, xmed-lab/CLIP_Surgery @ d4696d4 ``clip/clip_surgery_model.py``).

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
    elif mode == "size_antialias":
        grid = F.interpolate(grid, size=(h, w), mode="bicubic", align_corners=False, antialias=True)
    elif mode == "bilinear":
        grid = F.interpolate(grid, size=(h, w), mode="bilinear", align_corners=False)
    else:
        grid = F.interpolate(grid, scale_factor=((h + 0.1) / gh, (w + 0.1) / gw), mode="bicubic",
                             align_corners=False)
        if tuple(grid.shape[-2:]) != (h, w):  # floor(g * (n + 0.1) / g) is n for any sane grid
            raise RuntimeError(f"scale_factor interpolation gave a {tuple(grid.shape[-2:])} grid, expected {(h, w)}")
    grid = grid.permute(0, 2, 3, 1).reshape(h * w, C)
    return torch.cat([pe[:1], grid], dim=0)


# Pixels normalised with any CLIP / ImageNet mean and std lie within about [-2.2, 2.7]
# ((0 - 0.48) / 0.22 .. (1 - 0.41) / 0.26); raw 0..255 pixels exceed this bound.
_NORMALIZED_BOUND = 20.0


def check_normalized(images: torch.Tensor) -> None:
    """Raise ValueError for images that are not normalised floats: an integer tensor (raw
    ``uint8`` pixels) or float values beyond +-20 (raw 0..255 pixels cast to float);
    normalised CLIP inputs lie within about [-2.2, 2.7]."""
    if not images.is_floating_point():
        raise ValueError(
            f"DenseCLIPEncoder takes normalised float images (pixels / 255 - image_mean) / image_std, got "
            f"dtype {images.dtype}; normalise them first (SparseCLIP and the tools do this)")
    if images.numel() and images.device.type != "meta":  # meta tensors (shape checks) hold no values
        peak = float(images.detach().abs().amax())
        if peak > _NORMALIZED_BOUND:
            raise ValueError(
                f"DenseCLIPEncoder takes normalised images (values within about [-2.2, 2.7]), got values up to "
                f"{peak:g}: raw pixels? normalise them with (pixels / 255 - image_mean) / image_std first")


def check_pass_inputs(images: torch.Tensor, tap_layers: Sequence[int], depth: int) -> set:
    """The checks of a ``forward_pass``: ``images`` a normalised ``(B, 3, H, W)`` batch
    (:func:`check_normalized`) and every ``tap_layers`` index a block of a ``depth``-block
    tower (0-based; ``depth`` = the last block's output). Returns the indices as a set."""
    if images.dim() != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be (B, 3, H, W), got shape {tuple(images.shape)}")
    check_normalized(images)
    want = set()
    for i in tap_layers:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i <= depth:
            raise ValueError(f"tap_layers {list(tap_layers)}: {i!r} is not a block index; valid: 0..{depth} "
                             f"(0-based; {depth} = the last block's output)")
        want.add(i)
    return want


class EncoderPass(NamedTuple):
    """What one forward of :meth:`DenseCLIPEncoder.forward_pass` returns.

    Fields:
        tokens: ``(B, P + h*w, C)`` final tokens after the tower's final norm.
        grid: ``(h, w)`` patch grid.
        attn: ``(B, heads, P + h*w, P + h*w)`` float32 weights of the last block (after
            mixing, when the spec mixes layers).
        taps: ``{block index: (B, P + h*w, C)}`` the *input* tokens of each block asked for in
            ``tap_layers`` (the residual stream before that block; index ``depth`` = the last
            block's output before the final norm), from the same forward pass.
        tap_attention: ``{block index: (B, heads, L, L) float32}`` the attention the spec's
            ``mix_source`` / ``tap_normalizer`` gives at each ``mix_layers`` block.
    """

    tokens: torch.Tensor
    grid: Tuple[int, int]
    attn: torch.Tensor
    taps: Dict[int, torch.Tensor]
    tap_attention: Dict[int, torch.Tensor]


class DenseCLIPEncoder(nn.Module):
    """Dense open-vocabulary features from a frozen open_clip ViT tower with a modified final attention.

    Wraps ``visual`` (it is registered as a submodule, never copied nor modified): an open_clip
    ``VisionTransformer``, or an open_clip ``TimmModel`` whose trunk is a timm
    ``VisionTransformer`` (SigLIP, SigLIP 2, MobileCLIP-B, ...) or a timm ``Eva`` (EVA01/EVA02,
    PE-Core); see ``towers.check_tower``. Blocks before the last ``spec.num_layers`` run as
    the tower runs them; the last ``num_layers`` blocks compute q, k, v from the block's own
    projections exactly as the tower does (q/k norms, rotary embeddings on q and k), with
    ``spec.normalizer``/``spec.temperature``; the very last block also uses ``spec.source``,
    ``spec.prior`` and the ``residual``/``ffn`` switches. With ``spec.mix.layers`` the last
    block's weights are mixed with attention computed from the inputs of those earlier blocks
    in the same forward pass (``attention.mix_attention``); with ``spec.cls_weight`` that much
    of the last block's input CLS token is added to its output tokens. Attention scores and
    weights are float32 whatever the model dtype.

    Args:
        visual: ``clip_model.visual``.
        spec: the attention spec (default: unmodified).
        pos_embed_interp: how open_clip ViTs resize their position embeddings, ``size`` or
            ``scale_factor`` (see :func:`interpolate_pos_embed`); timm towers always resample
            as timm's dynamic image size does (the value is recorded, not used).
        attn_pool_dense: per-patch path through an attention-pooling (MAP) head (SigLIP,
            PE-Core): ``value`` or ``value_no_mlp`` (see ``towers.ATTN_POOL_DENSE_MODES`` and
            docs/architecture.md); ignored by towers without one.

    Attributes:
        patch_size (int or (int, int)), embed_dim (D, joint space), width (C, tokens),
        depth (blocks), num_heads, num_prefix_tokens (P: 1 for a CLS token, 0 for SigLIP),
        tower_kind (``open_clip_vit``, ``timm_vit``, ``timm_eva``), image_mean / image_std
        (0-1 scale RGB tuples), spec, pos_embed_interp.
    """

    def __init__(self, visual: nn.Module, spec: Optional[AttentionSpec] = None, *,
                 pos_embed_interp: str = "size", attn_pool_dense: str = "value"):
        super().__init__()
        if pos_embed_interp not in POS_EMBED_INTERP_MODES:
            raise ValueError(f"unknown position-embedding interpolation {pos_embed_interp!r}; valid: "
                             f"{', '.join(POS_EMBED_INTERP_MODES)}")
        self.pos_embed_interp = pos_embed_interp
        spec = AttentionSpec() if spec is None else spec
        if not isinstance(spec, AttentionSpec):
            raise TypeError(f"spec must be an AttentionSpec, got {type(spec).__name__}")
        tower = make_tower(visual, interpolate=functools.partial(interpolate_pos_embed, mode=pos_embed_interp),
                           attn_pool_dense=attn_pool_dense)
        self.visual = visual
        self.spec = spec
        self._tower = tower
        self.tower_kind = tower.kind
        self.attn_pool_dense = attn_pool_dense
        self.depth = len(tower.blocks)
        spec.check_depth(self.depth)
        if spec.cls_weight and tower.num_prefix_tokens < 1:
            raise ValueError(f"cls_weight={spec.cls_weight:g} needs a CLS token, but this {tower.kind} tower has no "
                             "prefix tokens; use cls_weight 0")
        check_parallel(spec, tower.kind, tower.num_prefix_tokens, self.depth)
        check_calibrated(spec, tower.kind, self.depth)
        ph, pw = tower.patch
        self._patch = (ph, pw)
        self.patch_size: Union[int, Tuple[int, int]] = ph if ph == pw else (ph, pw)
        self.width = tower.width
        self.embed_dim = tower.embed_dim
        self.num_heads = tower.num_heads
        self.num_prefix_tokens = tower.num_prefix_tokens
        self._native_grid = tower.native_grid
        pp = getattr(visual, "preprocess_cfg", None) or {}
        self.image_mean = tuple(float(m) for m in (pp.get("mean") or getattr(visual, "image_mean", None)
                                                   or OPENAI_DATASET_MEAN))
        self.image_std = tuple(float(s) for s in (pp.get("std") or getattr(visual, "image_std", None)
                                                  or OPENAI_DATASET_STD))
        self._prior_cache: "LRUCache[Optional[torch.Tensor]]" = LRUCache(_CACHE_SIZE)

    def extra_repr(self) -> str:
        return (f"spec={self.spec}, tower={self.tower_kind}, patch_size={self.patch_size}, depth={self.depth}, "
                f"embed_dim={self.embed_dim}")

    # -- cached helpers ------------------------------------------------------------------
    def positional_embedding(self, grid: Tuple[int, int], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """Absolute position embeddings for an ``(h, w)`` patch grid, in ``dtype`` on ``device``.

        open_clip ViTs: ``(1 + h*w, C)`` bicubically interpolated from the native grid (CLS
        kept, :func:`interpolate_pos_embed` the ``pos_embed_interp`` way). timm towers: ``(1, P + h*w, C)`` (or
        ``(1, h*w, C)`` with ``no_embed_class``) resampled as timm's dynamic image size does,
        or None for towers without them. Cached per (grid, device, dtype, parameter version).
        """
        if self.tower_kind == "open_clip_vit":
            return self._tower.positional_embedding(grid, device, dtype)
        return self._tower.abs_pos_embed(grid, device, dtype)

    def attention_prior(self, grid: Tuple[int, int], device: torch.device) -> Optional[torch.Tensor]:
        """The last block's additive prior for an ``(h, w)`` grid: ``(P + h*w, P + h*w)`` float32 or None."""
        key = (tuple(grid), str(device), self.spec.prior, self.spec.prior_std)
        return self._prior_cache.get_or_create(
            key,
            lambda: build_prior(self.spec.prior, grid, std=self.spec.prior_std,
                                num_prefix_tokens=self.num_prefix_tokens, device=device))

    # -- blocks --------------------------------------------------------------------------
    def _tap_attention(self, blk: nn.Module, x: torch.Tensor, rope, generator: Optional[torch.Generator]
                       ) -> torch.Tensor:
        """The spec's ``mix_source`` attention computed from ``x``, the input of ``blk``:
        ``(B, heads, L, L)`` float32 (the block's own q/k/v, ``tap_normalizer``, no temperature
        or prior)."""
        spec = self.spec
        q, k, v = self._tower.qkv(blk, self._tower.norm1(blk, x), rope)
        return attention_weights(q, k, v, source=spec.mix.source, normalizer=spec.tap_normalizer,
                                 alpha=spec.alpha, sum_mode=spec.sum_mode, generator=generator,
                                 source_options=spec.source_options(self.num_prefix_tokens))

    def _run_explicit(self, blk: nn.Module, x: torch.Tensor, rope) -> torch.Tensor:
        """An unmodified block (``unmodified_blocks='explicit'``) whose attention is computed one
        product after the other: ``softmax((q d^-1/2) k^T)``, then the product with ``v``, as
        ResCLIP's ``custom_attn`` computes its blocks before the last (yvhangyang/ResCLIP @ 0e085f7
        ``clip/model.py``: ``torch.bmm(q * scale, k.transpose(1, 2))``, ``F.softmax``,
        ``torch.bmm(attn_weights, v)``, ``out_proj``; then ``x + mlp(ln_2(x))``)."""
        tower = self._tower
        y = tower.norm1(blk, x)
        q, k, v = tower.qkv(blk, y, rope)
        B, _, L, d = q.shape
        weights = torch.softmax(torch.matmul(q * d ** -0.5, k.transpose(-2, -1)), dim=-1)
        out = torch.matmul(weights, v).transpose(1, 2).reshape(B, L, -1)
        x = x + tower.attn_out(blk, y, out)
        return x + tower.ffn(blk, x)

    def _run_modified(self, blk: nn.Module, x: torch.Tensor, rope, last: bool, grid: Tuple[int, int],
                      generator: Optional[torch.Generator], mixed: Sequence[torch.Tensor] = (),
                      feedback_prior: Optional[torch.Tensor] = None):
        """One block with the spec's attention; returns ((B, L, C), weights (B, heads, L, L) float32).
        ``mixed``: tapped layers' weights blended into the last block's (``mix_attention``);
        ``feedback_prior``: ``(B, L, L)`` prior blended into the last block's scores
        (``attention.feedback.blend_feedback`` with the spec's ``feedback_*``)."""
        spec = self.spec
        hook = None
        if last and feedback_prior is not None:
            def hook(s, _p=feedback_prior):
                return blend_feedback(s, _p, spec.feedback.weight, spec.feedback.scale, spec.feedback.precision)
        tower = self._tower
        B, L, _ = x.shape
        y = tower.norm1(blk, x)
        q, k, v = tower.qkv(blk, y, rope)
        weights = attention_weights(
            q, k, v,
            source=spec.source if last else "qk",
            normalizer=spec.normalizer,
            alpha=spec.alpha,
            temperature=spec.temperature,
            prior=self.attention_prior(grid, x.device) if last else None,
            sum_mode=spec.sum_mode,
            generator=generator,
            score_hook=hook,
            source_options=spec.source_options(self.num_prefix_tokens) if last else None,
        )
        if last and mixed:
            weights = mix_attention(weights, mixed, spec.mix.weight, spec.mix.scale)
        out = apply_attention(weights, v).transpose(1, 2).reshape(B, L, -1)
        out = tower.attn_out(blk, y, out)
        residual = spec.residual if last else True
        ffn = spec.ffn if last else True
        cls = x[:, :1] if last and spec.cls_weight else None
        x = x + out if residual else out
        if ffn:
            x = x + tower.ffn(blk, x)
        if cls is not None:
            x = x + spec.cls_weight * cls
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

    def forward_pass(self, images: torch.Tensor, tap_layers: Sequence[int] = (),
                     feedback: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> EncoderPass:
        """One forward through the tower with the spec's attention, recording the input tokens
        of the blocks named in ``tap_layers`` (no second pass of the blocks before the last).

        Args:
            images: ``(B, 3, H, W)`` normalised, H and W multiples of ``patch_size``.
            tap_layers: 0-based block indices whose input tokens are returned in
                ``EncoderPass.taps`` (``depth`` = the last block's output).
            feedback: with ``spec.feedback.enabled`` (and only then), ``(B, D, h, w)`` dense features
                of a first run of the last block -> ``(B, P + h*w, P + h*w)`` prior; the last
                block then runs again on the same input with the prior blended into its
                scores (``attention.feedback``; ``SparseCLIP`` builds the callable).
        Returns:
            an :class:`EncoderPass` (of the second run with feedback).
        Raises:
            ValueError: bad images, a tap index outside ``[0, depth]``, a missing or
                unexpected ``feedback``, or a prior of the wrong shape.
        """
        if self.spec.feedback.enabled and feedback is None:
            raise ValueError("the attention spec has feedback=True (ResCLIP's SFR second pass) but no feedback "
                             "callable was given: run it through SparseCLIP (MODEL.SPARSECLIP.FEEDBACK.*), or use "
                             "a spec with feedback=False")
        if feedback is not None and not self.spec.feedback.enabled:
            raise ValueError("a feedback callable was given but the attention spec has feedback=False")
        want = check_pass_inputs(images, tap_layers, self.depth)
        _, _, H, W = images.shape
        grid = self.grid_for(H, W)
        tower = self._tower
        x, rope = tower.embed(images, grid)
        if x.shape[1] != self.num_prefix_tokens + grid[0] * grid[1]:
            raise ValueError(f"the patch embedding of a {H}x{W} input gave {x.shape[1]} tokens, expected "
                             f"{self.num_prefix_tokens} + {grid[0]}x{grid[1]}")
        generator = None
        if "random_matched" in (self.spec.normalizer, self.spec.tap_normalizer):
            generator = torch.Generator(device=x.device).manual_seed(self.spec.seed)
        if self.spec.parallel.layers:  # the parallel-path block mode (GEM, CLIP Surgery): clip/parallel.py
            x, attn, taps = run_parallel(tower, self.spec, tower.blocks, x, rope,
                                         self.attention_prior(grid, x.device), generator, want)
            return EncoderPass(tower.final_norm(x), grid, attn, taps, {})
        if is_calibrated(self.spec):  # outlier repair / similarity layers / fusion (SC-CLIP): clip/calibrated.py
            x, attn, taps = run_calibrated(tower, self.spec, tower.blocks, x, rope, grid, generator, want)
            return EncoderPass(tower.final_norm(x), grid, attn, taps, {})
        first_modified = self.depth - self.spec.num_layers
        explicit = self.spec.unmodified_blocks == "explicit"
        mix_layers = set(self.spec.mix.layers)
        taps: Dict[int, torch.Tensor] = {}
        tap_attention: Dict[int, torch.Tensor] = {}
        attn = None
        for i, blk in enumerate(tower.blocks):
            if i in want:
                taps[i] = x
            if i in mix_layers:
                tap_attention[i] = self._tap_attention(blk, x, rope, generator)
            if i < first_modified:
                x = self._run_explicit(blk, x, rope) if explicit else tower.run_native(blk, x, rope)
            else:
                last = i == self.depth - 1
                mixed: List[torch.Tensor] = [tap_attention[j] for j in self.spec.mix.layers] if last else []
                prior = None
                if last and feedback is not None:
                    first, _ = self._run_modified(blk, x, rope, last, grid, generator, mixed)
                    prior = feedback(self._dense_from_tokens(tower.final_norm(first), grid))
                    L = x.shape[1]
                    if not isinstance(prior, torch.Tensor) or tuple(prior.shape) != (x.shape[0], L, L):
                        raise ValueError(f"the feedback callable must return a ({x.shape[0]}, {L}, {L}) prior, got "
                                         f"{tuple(prior.shape) if isinstance(prior, torch.Tensor) else type(prior)}")
                x, attn = self._run_modified(blk, x, rope, last, grid, generator, mixed, feedback_prior=prior)
        if self.depth in want:
            taps[self.depth] = x
        return EncoderPass(tower.final_norm(x), grid, attn, taps, tap_attention)

    def block_qkv(self, layer: int, x: torch.Tensor, grid: Tuple[int, int]):
        """The per-head ``q, k, v`` ``(B, heads, L, d)`` that block ``layer`` (0-based; negative
        counts from the end) computes from ``x``, its input tokens ``(B, L, C)`` (e.g.
        ``forward_pass(..., tap_layers=[layer]).taps[layer]``), with the block's own norm and
        projections (and rotary embeddings for ``grid`` on EVA towers). Used by CLIPtrase's
        self-correlation map (``methods/cliptrase/cluster_vote.py``)."""
        index = self.block_index(layer)
        blk = self._tower.blocks[index]
        rope = self._tower.rope_embed(grid, x.device) if hasattr(self._tower, "rope_embed") else None
        return self._tower.qkv(blk, self._tower.norm1(blk, x), rope)

    def block_index(self, layer: int) -> int:
        """``layer`` as a 0-based block index (negative counts from the end: -1 = the last block);
        ``ValueError`` naming the valid range otherwise."""
        if isinstance(layer, bool) or not isinstance(layer, int) or not -self.depth <= layer < self.depth:
            raise ValueError(f"block {layer!r} is not a block of this {self.depth}-block tower; valid: "
                             f"{-self.depth}..{self.depth - 1} (0-based, negative from the end)")
        return layer % self.depth

    def _dense_from_tokens(self, tokens: torch.Tensor, grid: Tuple[int, int]) -> torch.Tensor:
        """``(B, P + h*w, C)`` final-normed tokens -> ``(B, D, h, w)`` dense features."""
        h, w = grid
        feats = self._tower.dense(tokens)
        return feats.reshape(tokens.shape[0], h, w, -1).permute(0, 3, 1, 2).contiguous()

    # ------------------------------------------------------------------ what the pipeline reads
    @property
    def needs(self) -> Needs:
        """What this encoder's forward needs besides the windows (:class:`~sparseclip_d2.common.needs.Needs`):
        a feedback spec (ResCLIP's SFR) takes the first-segmentation callable."""
        return Needs(first_segmentation=bool(self.spec.feedback.enabled))

    def with_spec(self, spec: AttentionSpec) -> "DenseCLIPEncoder":
        """The same tower (not copied) with another attention spec (the Predictor's variants)."""
        return DenseCLIPEncoder(self.visual, spec, pos_embed_interp=self.pos_embed_interp,
                                attn_pool_dense=self.attn_pool_dense)

    def describe(self) -> str:
        """One line for titles and logs: the attention spec (an encoder with a second backbone
        names it too)."""
        from .spec import describe_spec

        return describe_spec(self.spec)

    def second_backbones(self) -> List[nn.Module]:
        """The frozen second backbones this encoder reads (none for CLIP alone); each has
        ``opts.random_weights``."""
        return []

    def forward_tokens(self, images: torch.Tensor, feedback=None):
        """All final tokens after the tower's final norm (what timm's ``forward_features``
        returns; for open_clip ViTs after ``ln_post``).

        Args:
            images: ``(B, 3, H, W)`` normalised, H and W multiples of ``patch_size``.
            feedback: see :meth:`forward_pass`.
        Returns:
            ``(tokens (B, P + h*w, C), (h, w), attn)`` with ``attn`` the last block's
            weights ``(B, heads, P + h*w, P + h*w)`` float32 (prefix tokens first).
        """
        p = self.forward_pass(images, feedback=feedback)
        return p.tokens, p.grid, p.attn

    def pooled_embedding(self, tokens: torch.Tensor) -> torch.Tensor:
        """The tower's own pooled image embedding ``(B, D)`` from :meth:`forward_tokens`'
        tokens (with the unmodified spec this is ``visual(images)``)."""
        return self._tower.pooled(tokens)

    def dense_embedding(self, tokens: torch.Tensor, grid: Tuple[int, int]) -> torch.Tensor:
        """Per-patch embeddings ``(B, D, h, w)`` from :meth:`forward_tokens`' tokens and grid
        (what :meth:`forward` returns; with :meth:`pooled_embedding` both from one pass)."""
        h, w = grid
        feats = self._tower.dense(tokens)
        return feats.reshape(tokens.shape[0], h, w, -1).permute(0, 3, 1, 2).contiguous()

    def forward(self, images: torch.Tensor, return_attention: bool = False, feedback=None):
        """Dense patch embeddings.

        Args:
            images: ``(B, 3, H, W)`` normalised with ``image_mean``/``image_std``; H and W
                multiples of ``patch_size``.
            return_attention: also return the last block's attention weights.
            feedback: the first-segmentation callable of a ``spec.feedback.enabled`` spec (see
                :meth:`forward_pass`).
        Returns:
            features ``(B, D, H/p, W/p)`` in the model dtype (every patch token of the final
            block through the tower's final norm and its per-patch head, prefix tokens
            dropped, not L2-normalised; definitions per tower kind in docs/architecture.md);
            with ``return_attention`` a tuple ``(features, attn)`` where ``attn`` is
            ``(B, heads, P + h*w, P + h*w)`` float32, prefix (CLS) tokens first (P =
            ``num_prefix_tokens``: 1 for CLS towers, 0 for SigLIP).
        """
        tokens, (h, w), attn = self.forward_tokens(images, feedback=feedback)
        B = tokens.shape[0]
        feats = self._tower.dense(tokens)  # (B, h*w, D)
        feats = feats.reshape(B, h, w, -1).permute(0, 3, 1, 2).contiguous()
        if return_attention:
            return feats, attn
        return feats
