"""The second frozen backbone (``sparseclip_d2.proxy``) and ProxyCLIP's last block.

Every computation is checked against a hand-written float64 reference: the proxy cosine
scores, the bilinear resampling of CLIP's values, the whole proxy last block (with
``NORMALIZER entmax`` alpha 1.2, against a float64 bisection), the proxy features against
timm's own ``forward_features``, the loading of the upstream (torch hub DINOv2, MAE) key
layouts; the ``MODEL.SPARSECLIP.PROXY`` keys take effect or are refused. Tiny timm towers
(``tests/tiny_models.py``), random weights, fixed seeds. The comparison with ProxyCLIP's own
code (which cannot be imported here) is in docs/upstream_agreement.md.
"""
import copy
import math

import pytest
import torch
import torch.nn.functional as F

from sparseclip_d2.attention import NORMALIZER_REGISTRY
from sparseclip_d2.clip import AttentionSpec
from sparseclip_d2.methods.proxyclip import ProxyCLIPEncoder
from sparseclip_d2.proxy import (ProxyOptions, build_proxy, load_proxy_state_dict, proxy_cosine_scores, resample_grid,
                                 to_proxy_input)

from conftest import build_tiny_clip, tiny_cfg
from test_entmax import entmax_bisect_reference  # noqa: E402  (float64 bisection, independent of the kernel)

DINO = "sparseclip_tiny_dino8"  # patch 8, native 32 px (4 x 4), CLS
DINOV2 = "sparseclip_tiny_dinov2"  # patch 14, 4 registers, no_embed_class, layer scale


def _proxy(name=DINO, seed=0, **kw):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build_proxy(ProxyOptions(name=name, **kw))


@pytest.fixture(scope="module")
def clip():
    return build_tiny_clip(0)


def bilinear_reference(g, out_h, out_w):
    """Bilinear resize of a (h, w, d) float64 grid, align_corners=False (half-pixel centres,
    source coordinates clamped at 0), written out point by point."""
    h, w, _ = g.shape
    out = torch.zeros(out_h, out_w, g.shape[2], dtype=torch.float64)
    for i in range(out_h):
        for j in range(out_w):
            y = max((i + 0.5) * h / out_h - 0.5, 0.0)
            x = max((j + 0.5) * w / out_w - 0.5, 0.0)
            y0, x0 = int(math.floor(y)), int(math.floor(x))
            y1, x1 = min(y0 + 1, h - 1), min(x0 + 1, w - 1)
            dy, dx = y - y0, x - x0
            out[i, j] = ((1 - dy) * (1 - dx) * g[y0, x0] + (1 - dy) * dx * g[y0, x1]
                         + dy * (1 - dx) * g[y1, x0] + dy * dx * g[y1, x1])
    return out


def scores_reference(feats, beta, gamma):
    """ProxyCLIP's scores of one image (C, h, w), float64, by loops over patch pairs."""
    C = feats.shape[0]
    f = feats.double().reshape(C, -1)
    n = f.shape[1]
    s = torch.zeros(n, n, dtype=torch.float64)
    for a in range(n):
        for b in range(n):
            s[a, b] = float(f[:, a] @ f[:, b]) / (float(f[:, a].norm()) * float(f[:, b].norm()))
    s = (s - beta * s.mean()) * gamma
    return torch.where(s < 0, torch.full_like(s, float("-inf")), s)


def test_proxy_cosine_scores_match_float64_loops():
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(2, 5, 3, 4, generator=g) + 0.3  # a shared offset: positive mean similarity
    s = proxy_cosine_scores(feats, beta=1.2, gamma=3.0)
    assert s.shape == (2, 12, 12) and s.dtype == torch.float32
    for b in range(2):
        ref = scores_reference(feats[b], 1.2, 3.0)
        assert torch.equal(torch.isneginf(s[b]), torch.isneginf(ref))  # the same entries masked
        fin = torch.isfinite(ref)
        assert 0 < int(fin.sum()) < 144
        torch.testing.assert_close(s[b][fin].double(), ref[fin], rtol=0, atol=1e-5)


def test_fully_masked_row_is_an_error_naming_beta():
    feats = torch.ones(1, 4, 2, 2)  # every similarity 1: 1 - 1.5 * 1 < 0 everywhere
    with pytest.raises(ValueError, match="PROXY.BETA"):
        proxy_cosine_scores(feats, beta=1.5, gamma=3.0)


def test_resample_grid_matches_hand_written_bilinear():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 2 * 3, 5, generator=g)  # (B, heads, h*w, d) on a 2 x 3 grid
    out = resample_grid(x, (2, 3), (5, 7))
    assert out.shape == (2, 3, 35, 5)
    for b in range(2):
        for hd in range(3):
            ref = bilinear_reference(x[b, hd].double().reshape(2, 3, 5), 5, 7).reshape(35, 5)
            torch.testing.assert_close(out[b, hd].double(), ref, rtol=0, atol=1e-6)
    assert resample_grid(x, (2, 3), (2, 3)) is x


def test_proxy_tokens_equal_timm_forward_features_at_the_native_size():
    """At the native grid the proxy's ``tokens`` are timm's own ``forward_features`` (final norm,
    prefix tokens dropped): DINO (CLS) and DINOv2 (CLS + 4 registers, no_embed_class)."""
    for name, size in ((DINO, 32), (DINOV2, 56)):
        proxy = _proxy(name)
        x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(2))
        ours = proxy(x)
        with torch.no_grad():
            ref = proxy.model.forward_features(x)[:, proxy.num_prefix_tokens:]
        g = size // proxy.patch[0]
        torch.testing.assert_close(ours, ref.transpose(1, 2).reshape(2, -1, g, g), rtol=0, atol=1e-5)


def test_position_embedding_modes():
    """``size_antialias`` (torch hub DINOv2 with registers: bicubic by size, antialias=True) against
    PIL's antialiased bicubic resize of each channel (an independent implementation that
    PyTorch's antialiasing follows), on DINOv2's 37 x 37 -> 24 x 24 (336 px) and a strong downsample;
    ``size`` and ``scale_factor`` differ from it and from each other."""
    import numpy as np
    from PIL import Image

    from sparseclip_d2.proxy.second_backbone import resize_pos_grid

    p = torch.randn(37 * 37, 8, generator=torch.Generator().manual_seed(11))
    g = p.reshape(37, 37, 8).numpy()
    for dst in ((24, 24), (5, 7)):
        out = resize_pos_grid(p, (37, 37), dst, "size_antialias").reshape(*dst, 8).numpy()
        ref = np.stack([np.asarray(Image.fromarray(g[:, :, c], mode="F").resize((dst[1], dst[0]), Image.BICUBIC))
                        for c in range(8)], -1)
        assert np.abs(out - ref).max() < 2e-5, dst
    size, scale = (resize_pos_grid(p, (37, 37), (24, 24), m) for m in ("size", "scale_factor"))
    aa = resize_pos_grid(p, (37, 37), (24, 24), "size_antialias")
    assert min((size - aa).abs().max(), (scale - aa).abs().max(), (size - scale).abs().max()) > 1e-3
    torch.testing.assert_close(resize_pos_grid(p, (37, 37), (37, 37), "size_antialias"), p, rtol=0, atol=0)
    with pytest.raises(ValueError, match="valid: size, scale_factor, size_antialias"):
        resize_pos_grid(p, (37, 37), (4, 4), "bilinear")


def test_proxy_keys_and_layer_in_float64():
    """FEATURE keys / queries / values of LAYER 0: block 0's qkv projection of its normed input,
    heads concatenated, prefix dropped; tokens of LAYER 0: the final norm of block 0's output."""
    proxy = _proxy(DINO, layer=0)
    m = copy.deepcopy(proxy.model).double()
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        t = m.patch_embed.proj(x.double()).flatten(2).transpose(1, 2)
        t = torch.cat([m.cls_token, t], 1) + m.pos_embed
        qkv = m.blocks[0].attn.qkv(m.blocks[0].norm1(t))  # (1, 17, 3C): q | k | v
        C = t.shape[-1]
        refs = {"queries": qkv[..., :C], "keys": qkv[..., C:2 * C], "values": qkv[..., 2 * C:],
                "tokens": m.norm(m.blocks[0](t))}
    for feature, ref in refs.items():
        proxy.feature = feature
        out = proxy(x)
        torch.testing.assert_close(out.double(), ref[:, 1:].transpose(1, 2).reshape(1, C, 4, 4), rtol=0, atol=1e-5)


def test_dinov2_hub_and_mae_layouts_load(tmp_path):
    """Weights in torch hub DINOv2's layout (``register_tokens``, ``mask_token``, ``pos_embed`` with
    the CLS row, the CLS position folded out of ``cls_token``) and in MAE's ``{'model': ...}`` wrapper load
    into the timm model as the same tensors (hub layout written by hand from timm's)."""
    src = _proxy(DINOV2, seed=5).model.state_dict()
    cls_pos = torch.randn(1, 1, src["pos_embed"].shape[-1], generator=torch.Generator().manual_seed(6))
    hub = {k: v for k, v in src.items() if k not in ("reg_token", "cls_token", "pos_embed")}
    hub["register_tokens"] = src["reg_token"]
    hub["cls_token"] = src["cls_token"] - cls_pos  # hub adds pos_embed[:, 0] to the CLS token
    hub["pos_embed"] = torch.cat([cls_pos, src["pos_embed"]], dim=1)
    hub["mask_token"] = torch.zeros(1, src["pos_embed"].shape[-1])  # the hub model's (unused at inference)
    path = tmp_path / "dinov2_hub.pth"
    torch.save(hub, path)
    loaded = build_proxy(ProxyOptions(name=DINOV2, weights=str(path))).model.state_dict()
    assert set(loaded) == set(src)
    for k in src:
        torch.testing.assert_close(loaded[k], src[k], rtol=0, atol=1e-6)
    mae_src = _proxy("sparseclip_tiny_mae", seed=7).model
    path = tmp_path / "mae.pth"
    torch.save({"model": mae_src.state_dict(), "epoch": 3}, path)
    got = load_proxy_state_dict(str(path), mae_src)
    assert all(torch.equal(got[k], v) for k, v in mae_src.state_dict().items())


def proxy_block_inputs64(clip, proxy, x):
    """The inputs of the ProxyCLIP last block, by hand in float64 for a 32 px window (CLIP 2 x 2
    grid, DINO B/8 4 x 4): ``(pf, v64, v, blk)`` = the proxy's patch features (timm's own forward
    of the image re-normalised from CLIP's mean / std to ImageNet's), the float64 tower, the last
    block's values ``(B, 5, C)`` and that block."""
    mean, std = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)  # CLIP's (tiny tower's)
    px = ((x.double() * torch.tensor(std).view(3, 1, 1) + torch.tensor(mean).view(3, 1, 1))
          - torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)) / torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
    with torch.no_grad():
        pf = proxy.model.forward_features(px.float())[:, 1:]  # (B, 16, C'), timm's own forward
    v64 = copy.deepcopy(clip.visual).double()
    pos = ProxyCLIPEncoder(clip.visual, AttentionSpec(), proxy).positional_embedding((2, 2), "cpu", torch.float32)
    B = x.shape[0]
    with torch.no_grad():  # CLIP's position embeddings resized to 2 x 2 (tested in test_encoder.py)
        t = v64.conv1(x.double()).flatten(2).transpose(1, 2)
        t = torch.cat([v64.class_embedding.view(1, 1, -1).expand(B, 1, -1), t], 1) + pos.double()
        t = v64.ln_pre(t)
        for blk in v64.transformer.resblocks[:-1]:
            t = blk(t)
        blk = v64.transformer.resblocks[-1]
        y = blk.ln_1(t)
        W, bias = blk.attn.in_proj_weight, blk.attn.in_proj_bias
        C = y.shape[-1]
        v = y @ W[2 * C:].T + bias[2 * C:]  # (B, 5, C)
    return pf, v64, v, blk


def test_proxy_last_block_with_entmax_matches_float64_reference(clip):
    """The whole ProxyCLIP last block with NORMALIZER entmax 1.2 (and ProxyCLIP's softmax), no
    residual / FFN, against float64 by hand: CLIP 2 x 2 grid on a 32 px window, DINO B/8 4 x 4."""
    proxy = _proxy(DINO)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(4)) * 0.5
    pf, v64, v, blk = proxy_block_inputs64(clip, proxy, x)
    C, H = v.shape[-1], blk.attn.num_heads
    for normalizer in ("entmax", "softmax"):
        enc = ProxyCLIPEncoder(clip.visual, AttentionSpec(normalizer=normalizer, alpha=1.2, residual=False,
                                                         ffn=False), proxy)
        ours, attn = enc(x, return_attention=True)
        assert ours.shape == (2, clip.visual.proj.shape[1], 4, 4)
        for b in range(2):
            s = scores_reference(pf[b].T.reshape(-1, 4, 4), 1.2, 3.0)
            w = entmax_bisect_reference(s, 1.2) if normalizer == "entmax" else torch.softmax(s, -1)
            torch.testing.assert_close(attn[b, 0].double(), w, rtol=0, atol=1e-5)
            heads = []
            for h in range(H):
                vh = v[b, 1:, h * C // H:(h + 1) * C // H].reshape(2, 2, -1)
                heads.append(w @ bilinear_reference(vh, 4, 4).reshape(16, -1))
            o = torch.cat(heads, -1) @ blk.attn.out_proj.weight.T + blk.attn.out_proj.bias
            ref = v64.ln_post(o) @ v64.proj  # (16, D)
            torch.testing.assert_close(ours[b].double(), ref.T.reshape(-1, 4, 4), rtol=0, atol=1e-4)
        if normalizer == "entmax":
            assert bool((attn == 0).any()), "entmax 1.2 on the proxy scores gave no exact zeros"


@pytest.mark.parametrize("normalizer", sorted(n for n, _ in NORMALIZER_REGISTRY))
def test_every_normaliser_composes_with_the_proxy_scores(clip, normalizer):
    """Rows sum to 1 and entries the proxy masked (-inf) get exactly 0, with every normaliser."""
    proxy = _proxy(DINO)
    enc = ProxyCLIPEncoder(clip.visual, AttentionSpec(normalizer=normalizer, residual=False, ffn=False), proxy)
    x = torch.randn(1, 3, 32, 48, generator=torch.Generator().manual_seed(8)) * 0.5
    feats, attn = enc(x, return_attention=True)
    assert feats.shape[-2:] == (4, 6) and torch.isfinite(feats).all()
    torch.testing.assert_close(attn.sum(-1), torch.ones_like(attn.sum(-1)), rtol=0, atol=1e-5)
    masked = torch.isneginf(proxy_cosine_scores(proxy(to_proxy_input(x, enc.image_mean, enc.image_std, proxy,
                                                                     (32, 48)))))
    assert bool(masked.any()) and bool((attn[:, 0][masked] == 0).all())


def test_residual_and_ffn_switches_take_effect(clip):
    proxy = _proxy(DINO)
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(9)) * 0.5
    outs = {}
    for residual in (False, True):
        for ffn in (False, True):
            enc = ProxyCLIPEncoder(clip.visual, AttentionSpec(residual=residual, ffn=ffn), proxy)
            p = enc.forward_pass(x, tap_layers=(enc.depth,))
            outs[residual, ffn] = p.taps[enc.depth]
    base = outs[False, False]
    enc = ProxyCLIPEncoder(clip.visual, AttentionSpec(residual=False, ffn=False), proxy)
    block_in = enc.forward_pass(x, tap_layers=(enc.depth - 1,)).taps[enc.depth - 1][:, 1:]  # CLIP grid 2 x 2
    torch.testing.assert_close(outs[True, False] - base, resample_grid(block_in, (2, 2), (4, 4)), rtol=0, atol=1e-5)
    blk = clip.visual.transformer.resblocks[-1]
    with torch.no_grad():
        torch.testing.assert_close(outs[False, True], base + blk.mlp(blk.ln_2(base)), rtol=0, atol=1e-5)


def test_spec_fields_the_proxy_replaces_are_refused(clip):
    proxy = _proxy(DINO)
    for kw, key in ((dict(source="qq"), "ATTENTION.SOURCE"), (dict(prior="gaussian"), "ATTENTION.PRIOR"),
                    (dict(mix_layers=(0,)), "ATTENTION.MIX.LAYERS"), (dict(cls_weight=0.3), "BLOCK.CLS_WEIGHT")):
        with pytest.raises(ValueError, match=key.replace(".", r"\.")):
            ProxyCLIPEncoder(clip.visual, AttentionSpec.from_settings(**kw), proxy)
    enc = ProxyCLIPEncoder(clip.visual, AttentionSpec(), proxy)
    assert enc.patch_size == 16  # lcm(CLIP 16, DINO 8)
    with pytest.raises(ValueError, match="multiple of 16x16"):
        enc(torch.zeros(1, 3, 24, 32))


# ------------------------------------------------------------------ MODEL.SPARSECLIP.PROXY keys
def _model(**opts):
    from detectron2.modeling import build_model

    return build_model(tiny_cfg(**opts))


def test_random_proxy_weights_mark_the_run_random(monkeypatch):
    """A random proxy (WEIGHTS none) beside real CLIP weights still labels the model random."""
    import sparseclip_d2.modeling.backbone as mb

    real = mb.build_clip_from_config
    monkeypatch.setattr(mb, "build_clip_from_config", lambda cfg: (real(cfg)[0], False))  # as if CLIP were real
    assert not _model().random_weights
    assert _model(**{"MODEL.SPARSECLIP.PROXY.NAME": DINO, "MODEL.SPARSECLIP.BLOCK.FFN": "False"}).random_weights


def test_proxy_keys_take_effect_through_the_meta_arch(tmp_path):
    torch.manual_seed(0)
    w = tmp_path / "dino.pth"
    torch.save(_proxy(DINO, seed=3).model.state_dict(), w)
    m = _model(**{"MODEL.SPARSECLIP.PROXY.NAME": DINO, "MODEL.SPARSECLIP.PROXY.WEIGHTS": str(w),
                  "MODEL.SPARSECLIP.PROXY.LAYER": "0", "MODEL.SPARSECLIP.PROXY.FEATURE": "keys",
                  "MODEL.SPARSECLIP.PROXY.INPUT_SIZE": "48", "MODEL.SPARSECLIP.PROXY.POS_EMBED_INTERP": "size",
                  "MODEL.SPARSECLIP.PROXY.PRECISION": "bf16", "MODEL.SPARSECLIP.PROXY.BETA": "0.5",
                  "MODEL.SPARSECLIP.PROXY.GAMMA": "2.0", "MODEL.SPARSECLIP.ATTENTION.NORMALIZER": "entmax",
                  "MODEL.SPARSECLIP.BLOCK.RESIDUAL": "False", "MODEL.SPARSECLIP.BLOCK.FFN": "False"})
    enc = m.encoder
    assert isinstance(enc, ProxyCLIPEncoder)
    assert m.random_weights  # CLIP's PRETRAINED none (the proxy's file is real weights here)
    p = enc.proxy
    assert (p.name, p.layer, p.feature, p.opts.input_size, p.opts.pos_embed_interp) == (DINO, 0, "keys", 48, "size")
    assert p.dtype == torch.bfloat16 and (enc.beta, enc.gamma) == (0.5, 2.0)
    assert torch.equal(p.model.blocks[0].attn.qkv.weight.float(),
                       torch.load(w)["blocks.0.attn.qkv.weight"].to(torch.bfloat16).float())
    assert enc.patch_size == 16  # the proxy resizes its input: CLIP's patch alone
    feats = enc(torch.zeros(1, 3, 32, 64))
    assert feats.shape[-2:] == (6, 6)  # 48 x 48 px through patch 8
    out = m([{"image": torch.randint(0, 255, (3, 40, 56), dtype=torch.uint8), "vocabulary": ["a", "b", "c"]}])
    assert out[0]["sem_seg"].shape == (3, 40, 56)


@pytest.mark.parametrize("opts, match", [
    ({"MODEL.SPARSECLIP.PROXY.BETA": "1.0"}, r"PROXY\.BETA = 1\.0 changes nothing without a proxy"),
    ({"MODEL.SPARSECLIP.PROXY.NAME": "no_such_vit"}, r"PROXY\.NAME = 'no_such_vit' is not a timm model"),
    ({"MODEL.SPARSECLIP.PROXY.NAME": DINO, "MODEL.SPARSECLIP.PROXY.FEATURE": "attn"}, r"PROXY\.FEATURE = 'attn'"),
    ({"MODEL.SPARSECLIP.PROXY.NAME": DINO, "MODEL.SPARSECLIP.PROXY.WEIGHTS": "/nowhere/dino.pth"},
     r"PROXY\.WEIGHTS = '/nowhere/dino\.pth': no such file"),
    ({"MODEL.SPARSECLIP.PROXY.NAME": DINO, "MODEL.SPARSECLIP.PROXY.LAYER": "7"}, r"PROXY\.LAYER = 7 is outside"),
    ({"MODEL.SPARSECLIP.PROXY.NAME": DINO, "MODEL.SPARSECLIP.PROXY.GAMMA": "0.0"}, r"PROXY\.GAMMA = 0\.0"),
    ({"MODEL.SPARSECLIP.PROXY.NAME": DINO, "MODEL.SPARSECLIP.ATTENTION.SOURCE": "qq"}, r"ATTENTION\.SOURCE 'qq'"),
    ({"MODEL.SPARSECLIP.PROXY.NAME": DINO, "TEST.ATTENTION_STATS.ENABLED": "True"}, r"ATTENTION_STATS"),
    ({"MODEL.SPARSECLIP.PROXY.NAME": DINO, "MODEL.META_ARCHITECTURE": "SparseCLIPFGOVD"}, r"SparseCLIPFGOVD with"),
    ({"MODEL.SPARSECLIP.PROXY.NAME": DINO, "MODEL.SPARSECLIP.PROXY.INPUT_SIZE": "-1"}, r"INPUT_SIZE = -1"),
    ({"MODEL.SPARSECLIP.PROXY.NAME": "samvit_base_patch16"}, r"INPUT_SIZE = 0 for samvit"),
])
def test_bad_proxy_keys_are_refused_before_any_model_is_built(opts, match, monkeypatch):
    import sparseclip_d2.modeling.backbone as mb

    def no_build(cfg):
        raise AssertionError("a model was built before the keys were checked")

    monkeypatch.setattr(mb, "build_clip_from_config", no_build)
    with pytest.raises((ValueError, FileNotFoundError), match=match):
        _model(**opts)


# ------------------------------------------------------------------ configs and vocabularies
def test_proxyclip_configs_select_upstreams_values():
    """configs/baselines/proxyclip_b16*.yaml: ProxyCLIP's protocol (mc-lan/ProxyCLIP @ e7b767f) and
    its four VFMs, each accepted by the PROXY checks (run before any model is built)."""
    import glob
    import os

    from sparseclip_d2.methods.encoders import check_proxy_config

    from conftest import baseline_cfg

    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "baselines")
    got = {}
    for path in sorted(glob.glob(os.path.join(root, "proxyclip_b16*.yaml"))):
        cfg = baseline_cfg(path)
        opts = check_proxy_config(cfg)
        sc, sw = cfg.MODEL.SPARSECLIP, cfg.TEST.SLIDING_WINDOW
        assert (sc.ATTENTION.SOURCE, sc.ATTENTION.NORMALIZER, sc.BLOCK.RESIDUAL, sc.BLOCK.FFN) == (
            "qk", "softmax", False, False)
        # ade847: the project's names (upstream's cls_ade20k847.txt keeps commas inside one prompt)
        names = "" if path.endswith("_ade847.yaml") else "proxyclip"
        assert (sc.PROXY.BETA, sc.PROXY.GAMMA, sc.LOGIT_SCALE, sc.TEXT.TEMPLATES, sc.CLASS_NAMES, sc.PIXEL_NORM) == (
            1.2, 3.0, 40.0, "openai_imagenet", names, "clip_mmseg")
        got[os.path.basename(path)[len("proxyclip_b16"):-5] or "base"] = (
            opts.name, opts.input_size, opts.pos_embed_interp, sc.PROB_THRESHOLD, cfg.INPUT.MIN_SIZE_TEST,
            sw.CROP_SIZE, sw.STRIDE)
    dino = "vit_base_patch8_224.dino"
    assert got == {
        "base": (dino, 0, "scale_factor", 0.0, 336, 336, 112),
        "_voc21": (dino, 0, "scale_factor", 0.2, 336, 336, 112),
        "_context60": (dino, 0, "scale_factor", 0.15, 336, 336, 112),
        "_coco_object": (dino, 0, "scale_factor", 0.25, 336, 336, 112),
        "_ade20k": (dino, 0, "scale_factor", 0.0, 448, 336, 112),
        "_ade847": (dino, 0, "scale_factor", 0.0, 448, 336, 112),       # cfg_ade847.py
        "_context459": (dino, 0, "scale_factor", 0.0, 448, 336, 112),   # cfg_context459.py
        "_cityscapes": (dino, 0, "scale_factor", 0.0, 448, 224, 112),
        "_dinov2": ("vit_base_patch14_reg4_dinov2", 0, "size_antialias", 0.0, 336, 336, 112),
        "_mae": ("vit_base_patch16_224.mae", -1, "size", 0.0, 336, 336, 112),
        "_sam": ("samvit_base_patch16", 1024, "size", 0.0, 336, 336, 112),
    }


def test_proxyclip_class_names_are_upstreams():
    from sparseclip_d2.data.class_names import load_class_names

    voc = load_class_names("voc21", class_set="proxyclip")  # configs/cls_voc21.txt, "; " -> ", "
    assert voc[0].startswith("sky, wall, tree, wood, grass") and voc[0].endswith("rail, fence")
    assert voc[15] == "person" and len(voc) == 21
    assert load_class_names("context60", class_set="proxyclip")[59] == "wood"
