"""CASS (CVPR 2025) on the last CLIP block: CLIP's key graph combined, head by head, with a
low-rank DINO key graph matched by its spectrum.

MICV-yonsei/CASS @ 228ecdd ``clip/model.py`` ``VisionTransformer.forward`` / ``custom_attn`` /
``_process_dino_key`` / ``_normalize_key_range`` / ``_apply_spectral_strategy``, with the parts
of :mod:`sparseclip_d2.attention.spectral`. Per window:

1. the proxy's keys of its last block (``PROXY.FEATURE keys``), seen on the proxy's input
   (:func:`cass_proxy_input`), split into CLIP's ``(heads, head_dim)``, resized bilinearly to
   CLIP's patch grid and mapped onto the [min, max] of CLIP's patch keys (all heads);
2. graphs: CLIP's ``C_i`` = the spec's score source of the last block (upstream ``kk``, patch
   tokens only) and the proxy's ``G_j = K'_j K'_j^T / sqrt(d)``;
3. a registered head matching (``spectral``: Hungarian on the spectra's cost) pairs each CLIP
   head ``i`` with a proxy head and a weight ``w_i``; the paired ``G`` is replaced by its
   rank-``RANK`` SVD approximation with rescaled singular values, diagonal 0, mapped onto
   ``C_i``'s range; scores ``(w_i G~ + C_i) / (w_i + 1)``;
4. temperature, the spec's prior (upstream: NACLIP's gaussian, std 5) and normaliser
   (upstream softmax) give the weights on CLIP's values (patches only); ``out_proj``; no
   residual, no FFN upstream.

The output tokens are ``[CLS of the unmodified last block, the patches of step 4]`` after the
final norm: :meth:`pooled_embedding` is upstream's ``x_last`` (the image-level embedding the
object-presence prompt reads), :meth:`dense_embedding` its ``image_features``.
"""
import math
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from ...attention import attention_weights, parse_source
from ...attention.priors import build_prior
from ...attention.spectral import SVD_METHODS, combine_graphs, get_head_matching, low_rank_graph, match_range
from ...clip.encoder import DenseCLIPEncoder, EncoderPass, check_pass_inputs
from ...clip.spec import AttentionSpec
from ...common.keys import key_field
from ...common.needs import Needs
from ...common.replay import replayed_value
from ...proxy.second_backbone import IMAGENET_MEAN, ProxyBackbone, to_proxy_input, uint8_image

__all__ = ["CASS_INPUTS", "CASS_KEY_PRECISIONS", "CASSSettings", "check_cass_settings", "check_cass_spec",
           "cass_proxy_input", "CASSEncoder"]

#: How the proxy sees a window (``PROXY.CASS.INPUT``): ``upstream`` = as CASS feeds DINO
#: (``cass_segmentor.py`` ``forward_feature``: ``inv_normalize`` with ImageNet's mean and std
#: (blue std 0.255) applied to the CLIP-normalised window, ``* 255``, ``astype('uint8')``;
#: ``clip/model.py`` ``forward``: PIL ``resize((min side, min side))``, bicubic; ``dino_attention.py``:
#: ``ToTensor``, ImageNet ``Normalize``, cropped to multiples of the patch); ``exact`` = the
#: window un-normalised with CLIP's mean/std and ImageNet-normalised at its own size
#: (:func:`~.second_backbone.to_proxy_input`).
CASS_INPUTS = ("upstream", "exact")
#: dtype of the proxy keys and their graph (``PROXY.CASS.KEY_PRECISION``): upstream casts DINO's
#: qkv to fp16 (``clip/model.py`` ``dino_attn = dino_attn.half()``) and builds the graph in it.
CASS_KEY_PRECISIONS = {"fp32": torch.float32, "fp16": torch.float16}
# cass_segmentor.py __init__: self.inv_normalize = transforms.Normalize(mean=[-0.485/0.229,
# -0.456/0.224, -0.406/0.255], std=[1/0.229, 1/0.224, 1/0.255]): x * std + mean
_UPSTREAM_INV_STD = (0.229, 0.224, 0.255)


@dataclass(frozen=True)
class CASSSettings:
    """CASS's values (``MODEL.SPARSECLIP.PROXY.CASS.*``), defaults from MICV-yonsei/CASS @ 228ecdd.

    Fields: matching (a :data:`~sparseclip_d2.attention.spectral.HEAD_MATCHING_REGISTRY` name;
    ``cass_segmentor.py`` ``attn_strategy='spectral'``), k_eigen (``custom_attn`` config
    ``'k_eigen': 20``), scale_factor (``'scale_factor': 10.0``), rank (``optimal_q(...,
    initial_q=10)``: its 95 % energy test is taken over the q computed values, whose last
    cumulative share is 1, so it always returns at q = 10), svd (:data:`SVD_METHODS`), seed (of
    the randomized SVD, re-seeded per window), singular_low / singular_high
    (``_scale_singular_values``: 0.5 / 1.5, 1 / 1 for voc20 and city_scapes), key_precision,
    input (:data:`CASS_INPUTS`).
    """

    matching: str = key_field("spectral", "MATCHING", "Head matching (attention/spectral.py "
                              "HEAD_MATCHING_REGISTRY): spectral (Hungarian on the eigenvalue spectra; "
                              "cass_segmentor.py attn_strategy='spectral') or sequential.")
    k_eigen: int = key_field(20, "K_EIGEN", "Eigenvalues per graph in the spectra (custom_attn 'k_eigen': 20).")
    scale_factor: float = key_field(10.0, "SCALE_FACTOR", "The proxy graph weighs SCALE_FACTOR * (1 - cost) "
                                    "against CLIP's 1 (custom_attn 'scale_factor': 10.0).")
    rank: int = key_field(10, "RANK", "Rank of the proxy graph's SVD approximation (optimal_q initial_q=10: its "
                          "95 % energy test always stops at q = 10).")
    svd: str = key_field("randomized", "SVD", '"randomized" (torch.svd_lowrank(q=RANK, niter=2) as upstream, '
                         'seeded with SEED per window) or "exact" (the first RANK triplets of the full SVD).')
    seed: int = key_field(0, "SEED", "Seed of the randomized SVD, re-seeded per window.")
    singular_low: float = key_field(0.5, "SINGULAR_SCALE", "Singular values stretched linearly so that min -> [0] "
                                    "* min and max -> [1] * max (_scale_singular_values: [0.5, 1.5]; [1.0, 1.0], "
                                    "no change, for voc20 and city_scapes).", index=0)
    singular_high: float = key_field(1.5, "SINGULAR_SCALE", index=1)
    key_precision: str = key_field("fp32", "KEY_PRECISION", "dtype of the proxy keys and their graph: fp32, or fp16 "
                                   "as upstream (dino_attn.half()).")
    input: str = key_field("upstream", "INPUT", 'What the proxy sees: "upstream" (CASS\'s inverse normalisation '
                           "with ImageNet's values, uint8, squashed to a square of the short side) or \"exact\" "
                           "(the window as ProxyCLIP feeds it).")


def check_cass_settings(s: CASSSettings, key: str = "MODEL.SPARSECLIP.PROXY.CASS") -> CASSSettings:
    """Validate ``s``; ``ValueError`` naming ``key.<FIELD>``, the value and the valid choices."""
    try:
        get_head_matching(s.matching)
    except ValueError as e:
        raise ValueError(f"{key}.MATCHING: {e}") from None
    for name, value in (("K_EIGEN", s.k_eigen), ("RANK", s.rank)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key}.{name} = {value!r} is invalid; valid: an integer >= 1")
    if isinstance(s.seed, bool) or not isinstance(s.seed, int) or s.seed < 0:
        raise ValueError(f"{key}.SEED = {s.seed!r} is invalid; valid: an integer >= 0")
    for name, value in (("SCALE_FACTOR", s.scale_factor), ("SINGULAR_SCALE[0]", s.singular_low),
                        ("SINGULAR_SCALE[1]", s.singular_high)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)) \
                or float(value) < 0:
            raise ValueError(f"{key}.{name} = {value!r} is invalid; valid: a finite number >= 0")
    if s.svd not in SVD_METHODS:
        raise ValueError(f"{key}.SVD = {s.svd!r} is invalid; valid: {', '.join(SVD_METHODS)}")
    if s.key_precision not in CASS_KEY_PRECISIONS:
        raise ValueError(f"{key}.KEY_PRECISION = {s.key_precision!r} is invalid; valid: "
                         f"{', '.join(CASS_KEY_PRECISIONS)}")
    if s.input not in CASS_INPUTS:
        raise ValueError(f"{key}.INPUT = {s.input!r} is invalid; valid: {', '.join(CASS_INPUTS)}")
    return s


def check_cass_spec(spec: AttentionSpec) -> None:
    """Refuse the spec fields the CASS last block cannot honour (``ValueError`` naming the keys)."""
    bad = []
    try:
        terms = parse_source(spec.source)
    except ValueError as e:
        terms = ()
        bad.append(f"ATTENTION.SOURCE: {e}")
    if len(terms) != 1 or terms == ("identity",):
        if terms:
            bad.append(f"ATTENTION.SOURCE {spec.source!r} (CASS combines one pair graph with the proxy's; valid: qk, "
                       "qq, kk, vv; upstream kk)")
    if spec.mix.layers:
        bad.append(f"ATTENTION.MIX.LAYERS {list(spec.mix.layers)} (valid with CASS: [])")
    if spec.cls_weight:
        bad.append(f"BLOCK.CLS_WEIGHT {spec.cls_weight:g} (the CASS block attends among patches; valid: 0)")
    if spec.feedback.enabled:
        bad.append("FEEDBACK.ENABLED True (valid with CASS: False)")
    if spec.parallel.layers:
        bad.append(f"PARALLEL.LAYERS {spec.parallel.layers} (valid with CASS: 0)")
    if bad:
        raise ValueError("MODEL.SPARSECLIP.PROXY.CASS.ENABLED is set, so the last block is CASS's; refused: "
                         + "; ".join(bad))


def cass_proxy_input(window: torch.Tensor, clip_mean, clip_std, proxy: ProxyBackbone, mode: str) -> torch.Tensor:
    """One CLIP-normalised window ``(3, H, W)`` -> the proxy's ImageNet-normalised input ``(1, 3, h, w)``.

    ``upstream``: the pixels ``floor(255 * (x * (0.229, 0.224, 0.255) + ImageNet mean))``
    (CASS's inverse normalisation of CLIP-normalised pixels with ImageNet's values, then
    ``astype('uint8')``), resized to a square of the short side by PIL's bicubic on those uint8
    pixels, as upstream calls it (the identity for square windows), ``/ 255``,
    ImageNet-normalised, cropped at the bottom/right to multiples of the proxy's patch.
    ``exact``: :func:`~.second_backbone.to_proxy_input` at the window's size.
    """
    if mode == "exact":
        return to_proxy_input(window[None], clip_mean, clip_std, proxy, tuple(window.shape[-2:]))
    if mode != "upstream":
        raise ValueError(f"MODEL.SPARSECLIP.PROXY.CASS.INPUT = {mode!r} is invalid; valid: {', '.join(CASS_INPUTS)}")
    dev = window.device
    s = torch.tensor(_UPSTREAM_INV_STD, dtype=torch.float32, device=dev).view(3, 1, 1)
    m = torch.tensor(IMAGENET_MEAN, dtype=torch.float32, device=dev).view(3, 1, 1)
    px = torch.floor((window.float() * s + m) * 255).clamp(0, 255)
    H, W = px.shape[-2:]
    side = min(H, W)
    if (H, W) != (side, side):  # clip/model.py: inv_image.resize((small_v, small_v)), PIL's default bicubic
        img = Image.fromarray(uint8_image(px)).resize((side, side), Image.BICUBIC)
        px = torch.from_numpy(np.array(img)).permute(2, 0, 1).to(device=dev, dtype=torch.float32)
    pm = torch.tensor(proxy.image_mean, dtype=torch.float32, device=dev).view(3, 1, 1)
    ps = torch.tensor(proxy.image_std, dtype=torch.float32, device=dev).view(3, 1, 1)
    x = (px / 255 - pm) / ps
    ph, pw = proxy.patch
    return x[None, :, :side - side % ph, :side - side % pw]


class CASSEncoder(DenseCLIPEncoder):
    """Dense CLIP features whose last block is CASS's (see the module docstring).

    Args:
        visual: ``clip_model.visual`` (an open_clip ViT or a timm tower ``DenseCLIPEncoder`` takes).
        spec: attention spec: ``source`` (CLIP's graph; upstream ``kk``), ``prior`` /
            ``prior_std`` (upstream gaussian, 5), ``normalizer`` / ``alpha`` / ``temperature``
            (upstream softmax, 1), ``residual`` / ``ffn`` (upstream neither); see
            :func:`check_cass_spec`.
        proxy: the frozen :class:`~.second_backbone.ProxyBackbone` (``feature`` ``keys``; its channel
            count must equal CLIP's width: upstream splits them into CLIP's heads).
        cass: :class:`CASSSettings`.
        pos_embed_interp, attn_pool_dense: as for ``DenseCLIPEncoder``.

    ``forward(images)``: ``(B, D, h, w)`` on CLIP's grid; ``return_attention``: ``(B, heads,
    h*w, h*w)`` float32 (patches only).
    """

    def __init__(self, visual: nn.Module, spec: Optional[AttentionSpec], proxy: ProxyBackbone, *,
                 cass: Optional[CASSSettings] = None, pos_embed_interp: str = "size", attn_pool_dense: str = "value"):
        super().__init__(visual, spec, pos_embed_interp=pos_embed_interp, attn_pool_dense=attn_pool_dense)
        check_cass_spec(self.spec)
        if not isinstance(proxy, ProxyBackbone):
            raise TypeError(f"proxy must be a ProxyBackbone, got {type(proxy).__name__}")
        if proxy.is_sam or proxy.feature != "keys":
            raise ValueError(f"CASS reads the proxy's keys: MODEL.SPARSECLIP.PROXY.FEATURE keys of a timm ViT, got "
                             f"{proxy.name} with FEATURE {proxy.feature!r}")
        if self.num_prefix_tokens < 1:
            raise ValueError(f"CASS needs a CLS token (its pooled embedding); this {self.tower_kind} tower has none")
        self.proxy = proxy
        self.cass = check_cass_settings(cass if cass is not None else CASSSettings())
        self._matching = get_head_matching(self.cass.matching)

    def extra_repr(self) -> str:
        c = self.cass
        return super().extra_repr() + (f", proxy={self.proxy.name}, cass(matching={c.matching}, rank={c.rank}, "
                                       f"svd={c.svd}, singular=[{c.singular_low:g}, {c.singular_high:g}])")

    def second_backbones(self):
        return [self.proxy]

    #: the whole windows (``windows=``): the proxy sees the whole window, as upstream's DINO sees
    #: the whole image while CLIP's stride-16 conv1 drops the remainder (``clip/model.py`` forward:
    #: ``inv_image`` of the whole ``x``, ``conv1(x)``); under ``PATCH_REMAINDER truncate`` the crops
    #: are only the window's top-left multiple of the patch
    needs = Needs(whole_windows=True)

    def with_spec(self, spec: AttentionSpec) -> "CASSEncoder":
        """The same encoder (tower and proxy shared) with another attention spec."""
        return type(self)(self.visual, spec, self.proxy, cass=self.cass, pos_embed_interp=self.pos_embed_interp,
                          attn_pool_dense=self.attn_pool_dense)

    def describe(self) -> str:
        from ...clip.spec import describe_spec

        c = self.cass
        return (f"CASS: {self.spec.source} graph + {self.proxy.name} key graph ({c.matching} head matching, rank "
                f"{c.rank} {c.svd} SVD, singular values x [{c.singular_low:g}, {c.singular_high:g}]), "
                + describe_spec(self.spec).split(", ", 1)[1])

    # -- the proxy's graph ---------------------------------------------------------------
    def proxy_keys(self, window: torch.Tensor, grid: Tuple[int, int], clip_keys: torch.Tensor) -> torch.Tensor:
        """The proxy's keys of one window on CLIP's grid, mapped onto ``clip_keys``' range.

        Args:
            window: ``(3, H, W)`` CLIP-normalised.
            grid: CLIP's ``(h, w)``.
            clip_keys: ``(heads, h*w, d)`` CLIP's patch keys of the last block.
        Returns:
            ``(heads, h*w, d)`` in ``KEY_PRECISION``.
        """
        heads, n, d = clip_keys.shape
        x = cass_proxy_input(window, self.image_mean, self.image_std, self.proxy, self.cass.input)
        feats = self.proxy(x)  # (1, C, h', w') float32
        if feats.shape[1] != heads * d:
            raise ValueError(f"CASS splits the proxy's {feats.shape[1]} key channels into CLIP's {heads} heads x {d}: "
                             f"they must be equal ({self.proxy.name} with this CLIP)")
        dt = CASS_KEY_PRECISIONS[self.cass.key_precision]
        k = feats.to(dt).reshape(heads, d, *feats.shape[-2:])
        k = F.interpolate(k, size=tuple(grid), mode="bilinear", align_corners=False)
        k = k.reshape(heads, d, n).transpose(1, 2)
        return match_range(k, clip_keys)

    def cass_scores(self, clip_scores: torch.Tensor, proxy_keys: torch.Tensor) -> torch.Tensor:
        """CASS's scores of one window from CLIP's ``(heads, N, N)`` float32 graph and the proxy's
        ``(heads, N, d)`` keys (:meth:`proxy_keys`): ``(heads, N, N)`` float32."""
        c = self.cass
        d = proxy_keys.shape[-1]
        g = torch.matmul(proxy_keys, proxy_keys.transpose(1, 2)) * d ** -0.5  # in the keys' dtype, as upstream
        pairs, mix = self._matching(clip_scores, g, k_eigen=c.k_eigen, scale_factor=c.scale_factor)
        out = torch.empty_like(clip_scores)
        devices = [clip_scores.device] if clip_scores.device.type == "cuda" else []
        state = replayed_value("random state")  # the agreement driver's: upstream's generator (common/replay.py)
        with torch.random.fork_rng(devices=devices):
            if state is None:
                torch.manual_seed(c.seed)
            else:
                torch.set_rng_state(torch.tensor(state, dtype=torch.uint8))
            for i in range(clip_scores.shape[0]):
                approx = low_rank_graph(g[int(pairs[i])], c.rank, method=c.svd, low=c.singular_low,
                                        high=c.singular_high)
                approx = match_range(approx, clip_scores[i])
                out[i] = combine_graphs(clip_scores[i], approx, float(mix[i])).float()
        return out

    # -- the pass ------------------------------------------------------------------------
    def forward_pass(self, images: torch.Tensor, tap_layers=(), windows: Optional[torch.Tensor] = None) -> EncoderPass:
        """One pass: earlier blocks as ``DenseCLIPEncoder`` runs them, the CASS last block.
        ``windows``: ``(B, 3, H', W')`` the whole windows the ``images`` are the top-left crops of
        (:attr:`needs`), which the proxy sees; None: the ``images``.

        ``EncoderPass.tokens``: ``(B, P + h*w, C)``, the prefix from the unmodified last block;
        ``attn``: ``(B, heads, h*w, h*w)``; ``taps`` as ``DenseCLIPEncoder`` (index ``depth``:
        the CASS block's patch output before the final norm, with the native prefix)."""
        want = check_pass_inputs(images, tap_layers, self.depth)
        B, _, H, W = images.shape
        grid = self.grid_for(H, W)
        tower = self._tower
        x, rope = tower.embed(images, grid)
        spec = self.spec
        generator = None
        if spec.normalizer == "random_matched":
            generator = torch.Generator(device=x.device).manual_seed(spec.seed)
        first_modified = self.depth - spec.num_layers
        taps = {}
        for i, blk in enumerate(tower.blocks[:-1]):
            if i in want:
                taps[i] = x
            x = tower.run_native(blk, x, rope) if i < first_modified else \
                self._run_modified(blk, x, rope, False, grid, generator)[0]
        if self.depth - 1 in want:
            taps[self.depth - 1] = x
        blk = tower.blocks[-1]
        P = self.num_prefix_tokens
        prefix = tower.run_native(blk, x, rope)[:, :P]  # upstream x_last = blk(x)
        y = tower.norm1(blk, x)
        q, k, v = tower.qkv(blk, y, rope)
        q, k, v = q[:, :, P:], k[:, :, P:], v[:, :, P:]
        if windows is not None and (windows.shape[0] != B or windows.shape[-2] < H or windows.shape[-1] < W):
            raise ValueError(f"windows {tuple(windows.shape)} are not the whole windows of the crops {tuple(images.shape)}")
        seen = images if windows is None else windows
        keys = [self.proxy_keys(seen[b], grid, k[b]) for b in range(B)]

        def hook(s: torch.Tensor) -> torch.Tensor:
            return torch.stack([self.cass_scores(s[b], keys[b]) for b in range(B)])

        prior = build_prior(spec.prior, grid, std=spec.prior_std, num_prefix_tokens=0, device=x.device)
        weights = attention_weights(q, k, v, source=spec.source, normalizer=spec.normalizer, alpha=spec.alpha,
                                    temperature=spec.temperature, prior=prior, generator=generator, score_hook=hook,
                                    source_options=spec.source_options(0))  # patch tokens only
        n = v.shape[2]
        out = torch.matmul(weights, v.float()).transpose(1, 2).reshape(B, n, -1).to(v.dtype)
        out = tower.attn_out(blk, y[:, P:], out)
        x = x[:, P:] + out if spec.residual else out
        if spec.ffn:
            x = x + tower.ffn(blk, x)
        x = torch.cat([prefix, x], dim=1)
        if self.depth in want:
            taps[self.depth] = x
        return EncoderPass(tower.final_norm(x), grid, weights, taps, {})

    def forward_tokens(self, images: torch.Tensor, feedback=None, windows: Optional[torch.Tensor] = None):
        """``(tokens (B, P + h*w, C), (h, w), attn (B, heads, h*w, h*w))``: see :meth:`forward_pass`."""
        if feedback is not None:
            raise ValueError("CASS has no feedback pass (FEEDBACK.ENABLED must be False)")
        p = self.forward_pass(images, windows=windows)
        return p.tokens, p.grid, p.attn

    def forward(self, images: torch.Tensor, return_attention: bool = False, feedback=None,
                windows: Optional[torch.Tensor] = None):
        """Dense patch embeddings ``(B, D, h, w)`` (model dtype, not L2-normalised); with
        ``return_attention`` also the ``(B, heads, h*w, h*w)`` float32 weights; ``windows``: see
        :meth:`forward_pass`."""
        tokens, grid, attn = self.forward_tokens(images, feedback, windows)
        feats = self.dense_embedding(tokens, grid)
        return (feats, attn) if return_attention else feats
