"""``ProxyCLIPEncoder``: a ``DenseCLIPEncoder`` whose last block attends with weights taken
from a second frozen backbone (:class:`~sparseclip_d2.proxy.second_backbone.ProxyBackbone`).

The last block (ProxyCLIP, mc-lan/ProxyCLIP @ e7b767f ``open_clip/transformer.py``
``VisionTransformer.forward`` / ``custom_attn``): the proxy's features of the same window give
scores :func:`~sparseclip_d2.proxy.attention.proxy_cosine_scores` (shared by every head), the
spec's normaliser (softmax upstream; entmax, sparsemax, random_matched alike) and temperature
turn them into weights on the proxy's patch grid; CLIP's values of the patch tokens (CLS
dropped) are resampled bilinearly to that grid, attended, and projected by the block's
``out_proj``; ``BLOCK.RESIDUAL`` / ``BLOCK.FFN`` add the block's input (resampled the same way)
and its FFN (upstream: neither). The output tokens are the proxy grid's patches, through the
tower's final norm and projection. Earlier blocks run as ``DenseCLIPEncoder`` runs them.
"""
import logging
from typing import Dict, Optional, Sequence, Tuple

import torch
from torch import nn

from ...attention import get_normalizer
from ...clip.encoder import DenseCLIPEncoder, EncoderPass, check_pass_inputs
from ...clip.spec import AttentionSpec
from ...proxy.attention import check_beta_gamma, proxy_cosine_scores, resample_grid
from ...proxy.second_backbone import ProxyBackbone, lcm, to_proxy_input

__all__ = ["ProxyCLIPEncoder", "check_proxy_spec", "describe_proxy_block", "normalize_proxy_scores"]

logger = logging.getLogger(__name__)


def check_proxy_spec(spec: AttentionSpec) -> None:
    """Refuse the spec fields the proxy last block replaces or cannot honour.

    Raises:
        ValueError: naming the ``MODEL.SPARSECLIP`` key and what to set.
    """
    bad = []
    if spec.source != "qk":
        bad.append(f"ATTENTION.SOURCE {spec.source!r} (the proxy similarity is the last block's score source; "
                   "leave it qk)")
    if spec.prior != "none":
        bad.append(f"ATTENTION.PRIOR {spec.prior!r} (priors act on CLIP's grid; valid with a proxy: none)")
    if spec.mix.layers:
        bad.append(f"ATTENTION.MIX.LAYERS {list(spec.mix.layers)} (mixing needs CLIP's grid; valid with a proxy: [])")
    if spec.cls_weight:
        bad.append(f"BLOCK.CLS_WEIGHT {spec.cls_weight:g} (the proxy block outputs patch tokens only; valid: 0)")
    if spec.feedback.enabled:
        bad.append("FEEDBACK.ENABLED True (the semantic feedback prior lives on CLIP's grid; valid with a proxy: False)")
    if spec.parallel.layers:
        bad.append(f"PARALLEL.LAYERS {spec.parallel.layers} (the proxy block replaces the last block on the main "
                   "stream; valid with a proxy: 0)")
    if bad:
        raise ValueError("MODEL.SPARSECLIP.PROXY.NAME is set, so the last block takes its attention from the proxy; "
                         "refused: " + "; ".join(bad))


def describe_proxy_block(opts, spec: AttentionSpec, beta: float, gamma: float) -> str:
    """``"proxy vit_base_patch8_224.dino tokens of block -1: cosine (S - 1.2 mean S) x 3, negatives
    -inf, softmax, no residual/FFN"`` (:func:`~sparseclip_d2.clip.describe_spec`'s style)."""
    from ...clip.spec import describe_spec

    rest = describe_spec(spec).split(", ", 1)[1]  # the normaliser onwards (the proxy replaces the source)
    return (f"proxy {opts.name} {opts.feature} of block {opts.layer}: cosine (S - {beta:g} mean S) x {gamma:g}, "
            f"negatives -inf, {rest}")



def normalize_proxy_scores(scores: torch.Tensor, spec: AttentionSpec) -> torch.Tensor:
    """``scores`` (any proxy score source) divided by ``spec.temperature`` and passed through
    ``spec.normalizer`` (alpha ``spec.alpha``; ``random_matched`` re-seeded with ``spec.seed``):
    the one place where the proxy blocks (ProxyCLIP, Trident, CorrCLIP) meet every normaliser.
    Returns float32 weights of the scores' shape."""
    if spec.temperature != 1.0:
        scores = scores / spec.temperature
    generator = None
    if spec.normalizer == "random_matched":
        generator = torch.Generator(device=scores.device).manual_seed(spec.seed)
    return get_normalizer(spec.normalizer)(scores, alpha=spec.alpha, generator=generator).float()

class ProxyCLIPEncoder(DenseCLIPEncoder):
    """Dense CLIP features whose last block attends with a second backbone's similarity.

    Args:
        visual: ``clip_model.visual`` (any tower ``DenseCLIPEncoder`` takes).
        spec: attention spec; its ``normalizer``, ``alpha``, ``temperature``, ``seed`` act on
            the proxy scores, ``residual`` / ``ffn`` on the last block, ``num_layers`` > 1 on the
            earlier blocks as usual; ``source``, ``prior``, ``mix_*`` and ``cls_weight`` must be
            at their defaults (:func:`check_proxy_spec`).
        proxy: the frozen :class:`ProxyBackbone` (registered as a submodule).
        beta, gamma: ProxyCLIP's shift and scale (``PROXY.BETA`` / ``PROXY.GAMMA``).
        crop_size: the sliding-window crop (for a proxy whose ``input_size`` is -1), or None.
        pos_embed_interp, attn_pool_dense: as for ``DenseCLIPEncoder``.

    ``forward(images)`` returns ``(B, D, h', w')`` on the **proxy's** patch grid of the window
    (DINO B/8 on a 336 px window: 42 x 42), which the sliding window upsamples like any
    logits. ``patch_size`` is the least common multiple of CLIP's and the proxy's patch
    (windows are padded to it) unless the proxy resizes its input. Attention returned with
    ``return_attention``: ``(B, heads, h'*w', h'*w')`` float32, no prefix tokens.
    """

    def __init__(self, visual: nn.Module, spec: Optional[AttentionSpec], proxy: ProxyBackbone, *,
                 beta: float = 1.2, gamma: float = 3.0, crop_size: Optional[int] = None,
                 pos_embed_interp: str = "size", attn_pool_dense: str = "value"):
        super().__init__(visual, spec, pos_embed_interp=pos_embed_interp, attn_pool_dense=attn_pool_dense)
        check_proxy_spec(self.spec)
        if not isinstance(proxy, ProxyBackbone):
            raise TypeError(f"proxy must be a ProxyBackbone, got {type(proxy).__name__}")
        self.proxy = proxy
        self.beta, self.gamma = check_beta_gamma(beta, gamma)
        self.crop_size = crop_size
        if proxy.opts.input_size == -1 and not crop_size:
            raise ValueError("MODEL.SPARSECLIP.PROXY.INPUT_SIZE = -1 resizes each window to the sliding-window crop: "
                             "set TEST.SLIDING_WINDOW.ENABLED True (or give INPUT_SIZE in pixels)")
        ph, pw = self._patch
        if proxy.opts.input_size == 0 and not proxy.is_sam:
            qh, qw = proxy.patch
            ph, pw = lcm(ph, qh), lcm(pw, qw)
        self.clip_patch_size = self.patch_size
        self.patch_size = ph if ph == pw else (ph, pw)
        self._window_patch = (ph, pw)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", proxy={self.proxy.name}, beta={self.beta:g}, gamma={self.gamma:g}"

    def _init_kwargs(self) -> Dict:
        """The keyword arguments (besides visual, spec, proxy) this encoder was built with."""
        return dict(beta=self.beta, gamma=self.gamma, crop_size=self.crop_size, pos_embed_interp=self.pos_embed_interp,
                    attn_pool_dense=self.attn_pool_dense)

    def with_spec(self, spec: AttentionSpec) -> "ProxyCLIPEncoder":
        """The same encoder (the same tower and proxy, not copied) with another attention spec
        (the demo's and the Predictor's variants)."""
        return type(self)(self.visual, spec, self.proxy, **self._init_kwargs())

    def describe(self) -> str:
        """One line for titles and logs: the proxy, its scores, the normaliser, the block."""
        return describe_proxy_block(self.proxy.opts, self.spec, self.beta, self.gamma)

    def second_backbones(self):
        return [self.proxy]

    def grid_for(self, height: int, width: int) -> Tuple[int, int]:
        """CLIP's patch grid of a window; raises unless its sides are multiples of ``patch_size``."""
        ph, pw = self._window_patch
        if height < ph or width < pw or height % ph or width % pw:
            raise ValueError(f"input size {height}x{width} is not a (positive) multiple of {ph}x{pw} (CLIP's and the "
                             f"proxy's patch); resize or pad the images to multiples of {ph}")
        return height // self._patch[0], width // self._patch[1]

    def proxy_weights(self, images: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int]]:
        """The proxy attention of CLIP-normalised ``images``: ``((B, N', N') float32, (h', w'))``."""
        _, _, H, W = images.shape
        size = self.proxy.input_size(H, W, self.crop_size)
        feats = self.proxy(to_proxy_input(images, self.image_mean, self.image_std, self.proxy, size))
        scores = proxy_cosine_scores(feats, self.beta, self.gamma)
        weights = normalize_proxy_scores(scores, self.spec)
        return weights, (int(feats.shape[-2]), int(feats.shape[-1]))

    def forward_pass(self, images: torch.Tensor, tap_layers: Sequence[int] = (), **block_kw) -> EncoderPass:
        """One forward: the proxy's weights, CLIP's blocks, the proxy last block.

        Returns an :class:`~sparseclip_d2.clip.encoder.EncoderPass` whose ``tokens`` are
        ``(B, h'*w', C)`` (the proxy grid's patches, **no** prefix tokens, after the final
        norm), ``grid`` the proxy grid, ``attn`` ``(B, heads, h'*w', h'*w')``, ``taps`` as for
        ``DenseCLIPEncoder`` (index ``depth``: the last block's output on the proxy grid) and
        no tap attention. ``block_kw`` go to :meth:`attend` (none for ProxyCLIP; a subclass's
        last block may take more, e.g. FSA's ``text_emb``).
        """
        want = check_pass_inputs(images, tap_layers, self.depth)
        B, _, H, W = images.shape
        grid = self.grid_for(H, W)
        weights, pgrid = self.proxy_weights(images)
        tower = self._tower
        x, rope = tower.embed(images, grid)
        spec = self.spec
        generator = None
        if spec.normalizer == "random_matched":
            generator = torch.Generator(device=x.device).manual_seed(spec.seed)
        first_modified = self.depth - spec.num_layers
        taps: Dict[int, torch.Tensor] = {}
        for i, blk in enumerate(tower.blocks[:-1]):
            if i in want:
                taps[i] = x
            if i < first_modified:
                x = tower.run_native(blk, x, rope)
            else:
                x, _ = self._run_modified(blk, x, rope, False, grid, generator)
        if self.depth - 1 in want:
            taps[self.depth - 1] = x
        blk = tower.blocks[-1]
        P = self.num_prefix_tokens
        y = tower.norm1(blk, x)
        _, _, v = tower.qkv(blk, y, rope)
        v = resample_grid(v[:, :, P:], grid, pgrid)  # (B, heads, N', d)
        out, attn = self.attend(blk, resample_grid(y[:, P:], grid, pgrid), v, weights, **block_kw)
        x = resample_grid(x[:, P:], grid, pgrid) + out if spec.residual else out
        if spec.ffn:
            x = x + tower.ffn(blk, x)
        if self.depth in want:
            taps[self.depth] = x
        return EncoderPass(tower.final_norm(x), pgrid, attn, taps, {})

    def attend(self, blk: nn.Module, y: torch.Tensor, v: torch.Tensor,
               weights: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The last block's attention branch on the proxy grid (ProxyCLIP's ``attend_v``).

        Args:
            blk: the tower's last block.
            y: ``(B, N', C)`` its normed input resampled to the proxy grid (for towers whose
                output projection reads it).
            v: ``(B, heads, N', d)`` CLIP's values resampled to the proxy grid.
            weights: ``(B, N', N')`` float32 proxy weights, shared by every head.
        Returns:
            ``((B, N', C) branch output, (B, heads, N', N') float32 weights)``.
        """
        B, heads, n = v.shape[0], v.shape[1], v.shape[2]
        # one (N', N') matrix per image is shared by every head: weights @ (v of all heads side
        # by side) is the heads' outputs concatenated, in float32, without an (N', N') per head
        out = torch.matmul(weights, v.float().transpose(1, 2).reshape(B, n, -1)).to(v.dtype)
        attn = weights.unsqueeze(1).expand(B, heads, n, n)  # a view, for return_attention
        return self._tower.attn_out(blk, y, out), attn

    def forward_tokens(self, images: torch.Tensor, **block_kw):
        """``(tokens (B, h'*w', C), (h', w'), attn)``: see :meth:`forward_pass` (no prefix tokens)."""
        p = self.forward_pass(images, **block_kw)
        return p.tokens, p.grid, p.attn

    def pooled_embedding(self, tokens: torch.Tensor) -> torch.Tensor:
        raise ValueError("the proxy last block outputs patch tokens only (no CLS token): no pooled embedding; "
                         "use a DenseCLIPEncoder without MODEL.SPARSECLIP.PROXY for it")

    def _dense_patches(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.tower_kind == "open_clip_vit":
            return tokens @ self.visual.proj
        return self._tower.dense_from_patches(tokens)

    def forward(self, images: torch.Tensor, return_attention: bool = False, **block_kw):
        """Dense patch embeddings ``(B, D, h', w')`` on the proxy grid (model dtype, not
        L2-normalised); with ``return_attention`` also ``(B, heads, h'*w', h'*w')`` float32.
        ``block_kw``: see :meth:`forward_pass`."""
        tokens, (h, w), attn = self.forward_tokens(images, **block_kw)
        B = tokens.shape[0]
        feats = self._dense_patches(tokens).reshape(B, h, w, -1).permute(0, 3, 1, 2).contiguous()
        if return_attention:
            return feats, attn
        return feats
