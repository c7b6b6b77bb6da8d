"""DINOv3 as the second backbone (``sparseclip_d2.proxy``): timm's ``Eva`` with RoPE
(``rope_type='dinov3'``), CLS + 4 register tokens, layer scale and no absolute position embedding.

No upstream ProxyCLIP / CASS / Trident / LPOSS / FSA code runs on DINOv3, so what is proven here
is: the proxy's tokens / keys / queries / values equal timm's own computation at two window
sizes (one non-square); timm's rotation for a grid equals DINOv3's definition in float64 at
grids other than the native one; the whole tiny model written out by hand in float64 (RoPE on
the patches, not on the 5 prefix tokens) gives the proxy's tokens; ProxyCLIP's scores on DINOv3
tokens and its last block with entmax on a non-square grid equal float64 references; the weights
load from files in timm's and in DINOv3's release layout; random weights are said loudly. Tiny
DINOv3 (``tests/tiny_models.py`` ``sparseclip_tiny_dinov3``: the real ``Eva`` class, width 64,
depth 2, 4 heads), random weights with a fixed seed; the layer scales are redrawn around 1 so
that every block changes the tokens (DINOv3's 1e-5 init would leave them nearly the input).
"""
import copy
import logging
import math

import pytest
import torch
import torch.nn.functional as F

from sparseclip_d2.clip import AttentionSpec
from sparseclip_d2.methods.proxyclip import ProxyCLIPEncoder
from sparseclip_d2.proxy import ProxyOptions, build_proxy, proxy_cosine_scores, to_proxy_input
from sparseclip_d2.proxy.second_backbone import ProxyBackbone, check_proxy_options

from conftest import build_tiny_clip
from test_entmax import entmax_bisect_reference  # noqa: E402  (float64 bisection, independent of the kernel)

DINOV3 = "sparseclip_tiny_dinov3"  # patch 16, native 32 px (2 x 2), CLS + 4 registers, RoPE
PREFIX = 5
# facebookresearch/dinov3 @ 6876159 dinov3/hub/backbones.py dinov3_vitb16: pos_embed_rope_base=100,
# normalize_coords="separate" (timm 1.0.31 eva.py vit_base_patch16_dinov3: rope_temperature=100)
ROPE_BASE = 100.0


def _randomise_layer_scale(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for blk in model.blocks:
            blk.gamma_1.copy_(1 + 0.5 * torch.randn(blk.gamma_1.shape, generator=g))
            blk.gamma_2.copy_(1 + 0.5 * torch.randn(blk.gamma_2.shape, generator=g))
    return model


def _proxy(seed=0, **kw):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        proxy = build_proxy(ProxyOptions(name=DINOV3, **kw))
    _randomise_layer_scale(proxy.model, seed + 100)
    return proxy


def rope64(h, w, head_dim, base=ROPE_BASE):
    """DINOv3's rotary embedding of an h x w grid in float64, as facebookresearch/dinov3 @ 6876159
    ``dinov3/layers/rope_position_encoding.py`` defines it: patch centres ``(i + 0.5) / h`` mapped
    to [-1, 1] per axis ("separate"), periods ``base ** (2 j / (D / 2))`` for ``j < D / 4``,
    angles ``2 pi c / period`` (rows first, then columns), tiled twice. Returns ``(sin, cos)``,
    each ``(h*w, D)``."""
    n_freq = head_dim // 4
    periods = [base ** (2 * j / (head_dim // 2)) for j in range(n_freq)]
    sin = torch.zeros(h * w, head_dim, dtype=torch.float64)
    cos = torch.zeros(h * w, head_dim, dtype=torch.float64)
    for i in range(h):
        for j in range(w):
            coords = (2 * (i + 0.5) / h - 1, 2 * (j + 0.5) / w - 1)
            angles = [2 * math.pi * c / p for c in coords for p in periods]  # (D / 2,)
            angles = angles + angles  # tile(2)
            sin[i * w + j] = torch.tensor([math.sin(a) for a in angles], dtype=torch.float64)
            cos[i * w + j] = torch.tensor([math.cos(a) for a in angles], dtype=torch.float64)
    return sin, cos


def rotate64(x, sin, cos):
    """``x cos + rotate_half(x) sin`` (dinov3/layers/attention.py rope_apply, rope_rotate_half:
    ``[-x2, x1]`` of the two halves of the head's channels)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def dinov3_forward64(model, x, last=None):
    """The tiny DINOv3 written out in float64 (pre-norm blocks, layer scale, RoPE on the patch
    tokens' q and k only, softmax attention, GELU MLP, final LayerNorm), up to block ``last``.
    Returns ``(tokens after the final norm (B, N, C), the block-``last`` q, k, v before RoPE
    (B, N, C) each)``."""
    m = copy.deepcopy(model).double()
    B, _, H, W = x.shape
    h, w = H // 16, W // 16
    with torch.no_grad():
        t = m.patch_embed.proj(x.double()).flatten(2).transpose(1, 2)  # (B, h*w, C)
        t = torch.cat([m.cls_token.expand(B, -1, -1), m.reg_token.expand(B, -1, -1), t], 1)
        N, C = t.shape[1:]
        last = len(m.blocks) - 1 if last is None else last
        for i, blk in enumerate(m.blocks[:last + 1]):
            a = blk.attn
            heads, d = a.num_heads, C // a.num_heads
            y = F.layer_norm(t, (C,), blk.norm1.weight, blk.norm1.bias, blk.norm1.eps)
            qkv = y @ a.qkv.weight.T
            q, k, v = qkv[..., :C], qkv[..., C:2 * C], qkv[..., 2 * C:]
            qkv_i = (q, k, v)
            sin, cos = rope64(h, w, d)
            out = torch.zeros_like(q)
            for hd in range(heads):
                sl = slice(hd * d, (hd + 1) * d)
                qh, kh, vh = q[..., sl].clone(), k[..., sl].clone(), v[..., sl]
                qh[:, PREFIX:] = rotate64(qh[:, PREFIX:], sin, cos)
                kh[:, PREFIX:] = rotate64(kh[:, PREFIX:], sin, cos)
                out[..., sl] = torch.softmax(qh @ kh.transpose(1, 2) / math.sqrt(d), -1) @ vh
            t = t + blk.gamma_1 * (out @ a.proj.weight.T + a.proj.bias)
            y = F.layer_norm(t, (C,), blk.norm2.weight, blk.norm2.bias, blk.norm2.eps)
            hid = F.gelu(y @ blk.mlp.fc1.weight.T + blk.mlp.fc1.bias)
            t = t + blk.gamma_2 * (hid @ blk.mlp.fc2.weight.T + blk.mlp.fc2.bias)
        t = F.layer_norm(t, (C,), m.norm.weight, m.norm.bias, m.norm.eps)
    return t, qkv_i


def _grid(tokens, h, w):
    """``(B, N, C)`` tokens with the prefix -> ``(B, C, h, w)``."""
    return tokens[:, PREFIX:].transpose(1, 2).reshape(tokens.shape[0], -1, h, w)


# ------------------------------------------------------------------------------- the proxy itself
@pytest.mark.parametrize("size", [(32, 32), (48, 80)], ids=["native-2x2", "non-square-3x5"])
def test_tokens_equal_timms_own_forward(size):
    """FEATURE tokens equal timm's ``forward_features`` (LAYER -1) and ``forward_intermediates``
    (LAYER 0, ``norm=True``) exactly, the 5 prefix tokens dropped, at the native grid and at a
    non-square one (timm builds the rotation for the grid in both)."""
    H, W = size
    x = torch.randn(2, 3, H, W, generator=torch.Generator().manual_seed(1))
    last, first = _proxy(), _proxy(layer=0)
    assert last.num_prefix_tokens == PREFIX and last.rope and not last.abs_pos_embed
    with torch.no_grad():
        ref_last = last.model.forward_features(x)
        ref_first = first.model.forward_intermediates(x, indices=[0], norm=True, intermediates_only=True)[0]
    assert torch.equal(last(x), _grid(ref_last, H // 16, W // 16))
    assert torch.equal(first(x), ref_first)  # forward_intermediates drops the prefix itself (NCHW)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_tokens_equal_timms_own_forward_at_half_precision(precision):
    """``PRECISION fp16`` / ``bf16`` (ProxyCLIP's upstream runs its VFM in fp16): the tokens equal timm's
    own forward of the cast model on a 3 x 5 grid, and timm keeps the RoPE periods in float32."""
    proxy = _proxy(precision=precision)
    x = torch.randn(1, 3, 48, 80, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        ref = proxy.model.forward_features(x.to(proxy.dtype)).float()
    out = proxy(x)
    assert out.dtype == torch.float32 and proxy.dtype != torch.float32
    assert proxy.model.rope.periods.dtype == torch.float32
    assert torch.equal(out, _grid(ref, 3, 5))


@pytest.mark.parametrize("size", [(32, 32), (48, 80)], ids=["native-2x2", "non-square-3x5"])
def test_keys_queries_values_equal_timms_own_projection(size):
    """FEATURE keys / queries / values of LAYER 1 equal what timm's own forward feeds block 1's
    attention (its ``qkv`` projection, caught by a forward hook), before RoPE, heads concatenated."""
    H, W = size
    x = torch.randn(1, 3, H, W, generator=torch.Generator().manual_seed(2))
    proxy = _proxy(layer=1)
    caught = []
    hook = proxy.model.blocks[1].attn.qkv.register_forward_hook(lambda mod, inp, out: caught.append(out))
    try:
        with torch.no_grad():
            proxy.model.forward_features(x)
    finally:
        hook.remove()
    C = proxy.model.embed_dim
    qkv = caught[0]
    for feature, sl in (("queries", slice(0, C)), ("keys", slice(C, 2 * C)), ("values", slice(2 * C, 3 * C))):
        proxy.feature = feature
        assert torch.equal(proxy(x), _grid(qkv[..., sl], H // 16, W // 16)), feature


def test_rope_of_any_grid_is_dinov3s_definition():
    """timm's rotation (``rope.get_embed(shape=grid)``, what the proxy passes to the blocks) equals
    DINOv3's definition in float64 at the native grid and at grids it was not built for."""
    proxy = _proxy()
    d = proxy.model.embed_dim // proxy.num_heads
    for h, w in ((2, 2), (3, 5), (7, 4), (21, 21)):
        sin, cos = proxy.model.rope.get_embed(shape=[h, w]).double().chunk(2, -1)
        rs, rc = rope64(h, w, d)
        torch.testing.assert_close(sin, rs, rtol=0, atol=2e-6)
        torch.testing.assert_close(cos, rc, rtol=0, atol=2e-6)


def test_whole_model_by_hand_in_float64_on_a_non_square_grid():
    """The tokens of both layers and the pre-RoPE keys of block 1 equal the tiny DINOv3 written
    out in float64 (RoPE of the 3 x 5 grid on the patches, none on the 5 prefix tokens, layer
    scale, no position embedding added), on a 48 x 80 window; without RoPE the tokens differ."""
    x = torch.randn(2, 3, 48, 80, generator=torch.Generator().manual_seed(3))
    for layer in (0, 1):
        proxy = _proxy(layer=layer)
        ref, (q, k, v) = dinov3_forward64(proxy.model, x, last=layer)
        torch.testing.assert_close(proxy(x).double(), _grid(ref, 3, 5), rtol=0, atol=2e-5)
        proxy.feature = "keys"
        torch.testing.assert_close(proxy(x).double(), _grid(k, 3, 5), rtol=0, atol=2e-5)
    # the rotation matters: the same weights without it give other tokens
    with torch.no_grad():
        plain = proxy.model.forward_features(x)  # with RoPE
        proxy.model.rope.periods.fill_(float("inf"))  # every angle 0: cos 1, sin 0
        no_rope = proxy.model.forward_features(x)
    assert (plain - no_rope).abs().max() > 1e-2


def test_qkv_biases_of_the_qkvb_variant_are_added():
    """DINOv3's ``_qkvb`` variants keep q / v biases outside the ``qkv`` Linear (timm's
    ``EvaAttention``): the proxy's queries / keys / values include them (float64 by hand)."""
    import timm

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(4)
        model = timm.create_model(DINOV3, qkv_bias=True, num_classes=0)
    attn = model.blocks[0].attn
    with torch.no_grad():
        attn.q_bias.normal_()
        attn.v_bias.normal_()
    proxy = ProxyBackbone(_randomise_layer_scale(model, 5), ProxyOptions(name=DINOV3, layer=0))
    x = torch.randn(1, 3, 32, 48, generator=torch.Generator().manual_seed(5))
    m = copy.deepcopy(model).double()
    with torch.no_grad():
        t = m.patch_embed.proj(x.double()).flatten(2).transpose(1, 2)
        t = torch.cat([m.cls_token, m.reg_token, t], 1)
        y = m.blocks[0].norm1(t)
    C = t.shape[-1]
    w = m.blocks[0].attn.qkv.weight
    bias = {"queries": m.blocks[0].attn.q_bias, "keys": torch.zeros(C, dtype=torch.float64),
            "values": m.blocks[0].attn.v_bias}
    for n, feature in enumerate(("queries", "keys", "values")):
        proxy.feature = feature
        ref = y @ w[n * C:(n + 1) * C].T + bias[feature]
        torch.testing.assert_close(proxy(x).double(), _grid(ref, 2, 3), rtol=0, atol=1e-5)


def test_weights_load_from_timm_and_dinov3_release_layouts(tmp_path, caplog):
    """A state dict in timm's layout (``.safetensors``) and one in DINOv3's release layout
    (facebookresearch/dinov3 @ 6876159 ``models/vision_transformer.py`` / ``layers/block.py`` /
    ``layers/attention.py``: ``storage_tokens``, ``blocks.N.ls1.gamma`` / ``ls2.gamma``,
    ``qkv.bias`` with its ``bias_mask``, ``mask_token``, ``rope_embed.periods``) load as the same
    tensors; random weights are logged loudly."""
    from safetensors.torch import save_file

    src = _proxy(seed=6).model.state_dict()
    path = tmp_path / "dinov3_timm.safetensors"
    save_file({k: v.contiguous() for k, v in src.items()}, str(path))
    release = {"mask_token": torch.zeros(1, src["cls_token"].shape[-1]), "rope_embed.periods": torch.ones(4)}
    for k, v in src.items():
        k = k.replace("reg_token", "storage_tokens").replace("gamma_1", "ls1.gamma").replace("gamma_2", "ls2.gamma")
        release[k] = v
        if k.endswith("attn.qkv.weight"):  # the release's zero q / k / v biases and their mask
            release[k.replace("weight", "bias")] = torch.zeros(v.shape[0])
            release[k.replace("weight", "bias_mask")] = torch.ones(v.shape[0])
    path2 = tmp_path / "dinov3_release.pth"
    torch.save(release, path2)
    for p in (path, path2):
        with caplog.at_level(logging.WARNING, logger="sparseclip_d2.proxy.second_backbone"):
            caplog.clear()
            loaded = build_proxy(ProxyOptions(name=DINOV3, weights=str(p))).model.state_dict()
        assert "RANDOM WEIGHTS" not in caplog.text
        assert set(loaded) == set(src)
        assert all(torch.equal(loaded[k], src[k]) for k in src), p
    with caplog.at_level(logging.WARNING, logger="sparseclip_d2.proxy.second_backbone"):
        caplog.clear()
        build_proxy(ProxyOptions(name=DINOV3, weights="none"))
    assert "RANDOM WEIGHTS" in caplog.text and DINOV3 in caplog.text


def test_refusals_name_the_key():
    """``POS_EMBED_INTERP`` other than its default changes nothing for a RoPE-only model and is
    refused; depth-dependent ('mixed') rotary embeddings are refused by name."""
    with pytest.raises(ValueError, match=r"MODEL\.SPARSECLIP\.PROXY\.POS_EMBED_INTERP = 'size'.*no absolute"):
        check_proxy_options(ProxyOptions(name="vit_base_patch16_dinov3", pos_embed_interp="size"))
    check_proxy_options(ProxyOptions(name="vit_base_patch16_dinov3"))  # the real B/16's architecture
    with pytest.raises(ValueError, match=r"PROXY\.NAME = 'vit_base_patch16_rope_mixed_224'.*'mixed'"):
        check_proxy_options(ProxyOptions(name="vit_base_patch16_rope_mixed_224"))


# ------------------------------------------------------------------ ProxyCLIP's block on DINOv3
@pytest.fixture(scope="module")
def clip():
    return build_tiny_clip(0)


def scores64(tokens, beta, gamma):
    """ProxyCLIP's scores of one image's ``(N, C)`` tokens in float64, pair by pair: cosine,
    ``(S - beta mean S) gamma``, negatives ``-inf``."""
    f = tokens.double()
    n = f.shape[0]
    s = torch.zeros(n, n, dtype=torch.float64)
    for a in range(n):
        for b in range(n):
            s[a, b] = float(f[a] @ f[b]) / (float(f[a].norm()) * float(f[b].norm()))
    s = (s - beta * s.mean()) * gamma
    return torch.where(s < 0, torch.full_like(s, float("-inf")), s)


def _imagenet_input(x):
    """CLIP-normalised ``x`` re-normalised to ImageNet's mean / std, in float64 by hand."""
    mean, std = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)  # the tiny CLIP's
    px = x.double() * torch.tensor(std).view(3, 1, 1) + torch.tensor(mean).view(3, 1, 1)
    return ((px - torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1))
            / torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)).float()


def test_proxyclip_scores_on_dinov3_tokens_equal_float64():
    """``proxy_cosine_scores`` of the proxy's DINOv3 tokens equals the float64 pair-by-pair
    computation on timm's own tokens, on a 3 x 5 grid."""
    proxy = _proxy()
    x = torch.randn(2, 3, 48, 80, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        tokens = proxy.model.forward_features(x)[:, PREFIX:]
    s = proxy_cosine_scores(proxy(x), 1.2, 3.0)
    for b in range(2):
        ref = scores64(tokens[b], 1.2, 3.0)
        assert torch.equal(torch.isneginf(s[b]), torch.isneginf(ref))
        fin = torch.isfinite(ref)
        assert bool(fin.any()) and bool((~fin).any())
        torch.testing.assert_close(s[b].double()[fin], ref[fin], rtol=0, atol=1e-5)


@pytest.mark.parametrize("normalizer,alpha", [("entmax", 1.5), ("softmax", 1.0)])
def test_proxyclip_block_on_dinov3_with_entmax_matches_float64(clip, normalizer, alpha):
    """ProxyCLIP's last block on DINOv3 with NORMALIZER entmax 1.5 (and softmax), no residual /
    FFN, on a non-square 48 x 80 window (CLIP and DINOv3 grids both 3 x 5): the attention equals
    the float64 bisection of the float64 scores of timm's own DINOv3 tokens; the output equals
    ``ln_post((A V) W_o + b_o) proj`` in float64 by hand."""
    proxy = _proxy()
    x = torch.randn(2, 3, 48, 80, generator=torch.Generator().manual_seed(8)) * 0.5
    enc = ProxyCLIPEncoder(clip.visual, AttentionSpec(normalizer=normalizer, alpha=alpha, residual=False, ffn=False),
                           proxy)
    ours, attn = enc(x, return_attention=True)
    assert ours.shape == (2, clip.visual.proj.shape[1], 3, 5)
    with torch.no_grad():
        tokens = proxy.model.forward_features(_imagenet_input(x))[:, PREFIX:]
    v64 = copy.deepcopy(clip.visual).double()
    pos = enc.positional_embedding((3, 5), "cpu", torch.float32).double()
    with torch.no_grad():
        t = v64.conv1(x.double()).flatten(2).transpose(1, 2)
        t = torch.cat([v64.class_embedding.view(1, 1, -1).expand(2, 1, -1), t], 1) + pos
        t = v64.ln_pre(t)
        for blk in v64.transformer.resblocks[:-1]:
            t = blk(t)
        blk = v64.transformer.resblocks[-1]
        y = blk.ln_1(t)
        C = y.shape[-1]
        v = y @ blk.attn.in_proj_weight[2 * C:].T + blk.attn.in_proj_bias[2 * C:]  # (B, 16, C)
        for b in range(2):
            s = scores64(tokens[b], 1.2, 3.0)
            w = entmax_bisect_reference(s, alpha) if normalizer == "entmax" else torch.softmax(s, -1)
            for h in range(attn.shape[1]):  # one map shared by every head
                torch.testing.assert_close(attn[b, h].double(), w, rtol=0, atol=1e-5)
            o = (w @ v[b, 1:]) @ blk.attn.out_proj.weight.T + blk.attn.out_proj.bias  # heads share w
            ref = v64.ln_post(o) @ v64.proj  # (15, D)
            torch.testing.assert_close(ours[b].double(), ref.T.reshape(-1, 3, 5), rtol=0, atol=1e-4)
    if normalizer == "entmax":
        assert bool((attn == 0).any()), "entmax 1.5 on the DINOv3 scores gave no exact zeros"
        masked = torch.isneginf(proxy_cosine_scores(proxy(to_proxy_input(x, enc.image_mean, enc.image_std, proxy,
                                                                         (48, 80)))))
        assert bool((attn[:, 0][masked] == 0).all())
