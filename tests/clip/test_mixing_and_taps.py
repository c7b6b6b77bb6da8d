"""Parts of the 2025 training-free methods: attention mixed across layers (ITACLIP,
ResCLIP's RCS), taps on intermediate blocks, the CLS-token residual weight; their spec keys,
presets and validation; each checked against float64 computations written here."""
import math

import pytest
import torch
import torch.nn.functional as F

from sparseclip_d2.attention import mix_attention
from sparseclip_d2.clip import AttentionSpec, DenseCLIPEncoder, MixOptions, parse_attention_spec
from sparseclip_d2.clip.spec import PRESETS


# ----------------------------------------------------------------------------- references
def _entmax64(z, alpha, iters=200):
    """alpha-entmax of the rows of ``z`` (float64) by bisection on tau:
    p_i = [(alpha - 1) z_i - tau]_+ ** (1 / (alpha - 1)), sum_i p_i = 1; alpha = 1 is softmax."""
    z = z.double()
    if alpha == 1.0:
        return torch.softmax(z, -1)
    y = (alpha - 1.0) * z
    y = torch.where(torch.isfinite(y), y, torch.full_like(y, -1e300))
    hi = y.max(-1, keepdim=True).values  # sum at tau = max is 0
    lo = hi - 1.0  # sum at tau = max - 1 is >= 1
    for _ in range(iters):
        mid = (lo + hi) / 2
        s = ((y - mid).clamp(min=0) ** (1.0 / (alpha - 1.0))).sum(-1, keepdim=True)
        lo = torch.where(s >= 1, mid, lo)
        hi = torch.where(s >= 1, hi, mid)
    p = (y - lo).clamp(min=0) ** (1.0 / (alpha - 1.0))
    return p / p.sum(-1, keepdim=True)


def _stem64(visual, images):
    """float64: patch embedding (stride 16), CLS, position embedding, ln_pre: the first block's input."""
    B = images.shape[0]
    x = F.conv2d(images.double(), visual.conv1.weight.double(), stride=16).flatten(2).transpose(1, 2)
    x = torch.cat([visual.class_embedding.double().expand(B, 1, -1), x], 1) + visual.positional_embedding.double()
    return _ln(x, visual.ln_pre)


def _ln(x, ln):
    return F.layer_norm(x, x.shape[-1:], ln.weight.double(), ln.bias.double(), ln.eps)


def _heads(t, nh):
    B, L, C = t.shape
    return t.reshape(B, L, nh, C // nh).transpose(1, 2)


def _qkv64(blk, x):
    C = x.shape[-1]
    y = _ln(x, blk.ln_1) @ blk.attn.in_proj_weight.double().T + blk.attn.in_proj_bias.double()
    q, k, v = y.split(C, -1)
    nh = blk.attn.num_heads
    return _heads(q, nh), _heads(k, nh), _heads(v, nh)


def _weights64(q, k, v, source, alpha, prior=None):
    """sum over the terms of ``source`` of entmax_alpha(a b^T / sqrt(d) (+ prior))."""
    d = q.shape[-1]
    pick = {"q": q, "k": k, "v": v}
    out = 0
    for term in source.split("+"):
        a, b = pick[term[0]], pick[term[1]]
        s = a @ b.transpose(-1, -2) / math.sqrt(d)
        if prior is not None:
            s = s + prior
        out = out + _entmax64(s, alpha)
    return out


def _mlp64(blk, x):
    h = _ln(x, blk.ln_2) @ blk.mlp.c_fc.weight.double().T + blk.mlp.c_fc.bias.double()
    h = F.gelu(h) if isinstance(blk.mlp.gelu, torch.nn.GELU) else h * torch.sigmoid(1.702 * h)
    return h @ blk.mlp.c_proj.weight.double().T + blk.mlp.c_proj.bias.double()


def _gaussian_prior64(h, w, std):
    r = torch.arange(h, dtype=torch.float64).repeat_interleave(w)
    c = torch.arange(w, dtype=torch.float64).repeat(h)
    p = torch.exp(-((r[:, None] - r[None]) ** 2 + (c[:, None] - c[None]) ** 2) / (2 * std ** 2))
    out = torch.zeros(1 + h * w, 1 + h * w, dtype=torch.float64)
    out[1:, 1:] = p
    return out


def _tower64(visual, images, *, source, mix_layers, mix_source, mix_weight, mix_scale, residual, ffn,
             alpha=1.0, tap_alpha=None, prior_std=None, cls_weight=0.0):
    """The whole tower in float64: native blocks, the tapped blocks' attention from their
    inputs, the last block mixed: scale * ((1 - w) W_last + w mean W_l); returns the dense
    features (B, D, h, w) and the block inputs {i: (B, L, C)}."""
    tap_alpha = alpha if tap_alpha is None else tap_alpha
    B, _, H, W = images.shape
    gh, gw = H // 16, W // 16
    x = _stem64(visual, images)
    blocks = visual.transformer.resblocks
    taps, inputs = [], {}
    for i, blk in enumerate(blocks):
        inputs[i] = x
        q, k, v = _qkv64(blk, x)
        if i in mix_layers:
            taps.append(_weights64(q, k, v, mix_source, tap_alpha))
        nh = blk.attn.num_heads
        if i < len(blocks) - 1:
            a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1)
            keep_res, keep_ffn = True, True
        else:
            prior = _gaussian_prior64(gh, gw, prior_std) if prior_std else None
            a = _weights64(q, k, v, source, alpha, prior)
            if taps:
                a = mix_scale * ((1 - mix_weight) * a + mix_weight * sum(taps) / len(taps))
            keep_res, keep_ffn = residual, ffn
        o = (a @ v).transpose(1, 2).reshape(B, -1, x.shape[-1])
        o = o @ blk.attn.out_proj.weight.double().T + blk.attn.out_proj.bias.double()
        cls = x[:, :1]
        x = x + o if keep_res else o
        if keep_ffn:
            x = x + _mlp64(blk, x)
        if i == len(blocks) - 1 and cls_weight:
            x = x + cls_weight * cls
    inputs[len(blocks)] = x
    feats = (_ln(x, visual.ln_post)[:, 1:] @ visual.proj.double()).reshape(B, gh, gw, -1).permute(0, 3, 1, 2)
    return feats, inputs


@pytest.fixture(scope="module")
def deep_visual():
    """A random-weight (seed 0) 4-block open_clip ViT: width 64, 4 heads, patch 16, 64 px, D 32."""
    from open_clip.transformer import VisionTransformer

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        v = VisionTransformer(image_size=64, patch_size=16, width=64, layers=4, heads=4, mlp_ratio=4.0, output_dim=32)
        # LayerNorm gains/biases away from 1/0 so that every term is exercised
        for m in v.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.data.uniform_(0.5, 1.5)
                m.bias.data.normal_(0, 0.1)
    return v.eval()


def _images(seed=1, b=2, h=64, w=64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, 3, h, w, generator=g)


# ----------------------------------------------------------------------------- layer 1
def test_mix_attention_by_hand():
    final = torch.tensor([[[[0.6, 0.4], [0.1, 0.9]]]])
    t1 = torch.tensor([[[[1.0, 0.0], [0.5, 0.5]]]])
    t2 = torch.tensor([[[[0.0, 1.0], [0.5, 0.5]]]])
    # 2 * (0.7 * final + 0.3 * mean(t1, t2)); mean = [[0.5, 0.5], [0.5, 0.5]]
    expected = torch.tensor([[[[2 * (0.42 + 0.15), 2 * (0.28 + 0.15)], [2 * (0.07 + 0.15), 2 * (0.63 + 0.15)]]]])
    torch.testing.assert_close(mix_attention(final, [t1, t2], 0.3, 2.0), expected)
    torch.testing.assert_close(mix_attention(final, [t1], 0.0), final)
    torch.testing.assert_close(mix_attention(final, [t1], 1.0), t1)
    with pytest.raises(ValueError, match="at least one"):
        mix_attention(final, [], 0.5)
    with pytest.raises(ValueError, match=r"shape \(1, 1, 1, 2\)"):
        mix_attention(final, [final[..., :1, :]], 0.5)
    with pytest.raises(ValueError, match="mix_weight must be in \\[0, 1\\].*1.5"):
        mix_attention(final, [t1], 1.5)
    with pytest.raises(ValueError, match="mix_scale must be a finite number > 0.*0"):
        mix_attention(final, [t1], 0.5, 0.0)


# ----------------------------------------------------------------------------- spec
def test_presets_are_the_published_settings():
    ita = AttentionSpec.preset("itaclip")
    # ITACLIP clip/model.py: layers 7, 8, 10 counted from 1; attn_self: softmax(QQ) + softmax(KK)
    assert ita.source == "qq+kk" and ita.mix == MixOptions(layers=(6, 7, 9), source="qq+kk", weight=0.5, scale=1.0)
    assert (ita.mix.source, ita.mix.layers, ita.mix.weight, ita.mix.scale) == ("qq+kk", (6, 7, 9), 0.5, 1.0)
    assert (ita.residual, ita.ffn, ita.prior, ita.cls_weight) == (True, False, "none", 0.0)
    assert ita.rows_sum_to == 2.0
    res = AttentionSpec.preset("resclip_rcs")
    # ResCLIP clip/model.py: range(5, 9) = layers 6-9; cfg_voc21.py attn_rcs_weights=[2.0, 0.3]
    assert (res.source, res.prior, res.prior_std, res.mix.source, res.mix.layers) == (
        "kk", "gaussian", 5.0, "qk", (5, 6, 7, 8))
    assert (res.mix.scale, res.mix.weight, res.residual, res.ffn) == (2.0, 0.3, False, False)
    assert res.rows_sum_to == pytest.approx(2.0)
    assert AttentionSpec.preset("itaclip", normalizer="entmax").tap_normalizer == "entmax"
    assert AttentionSpec.preset("itaclip", normalizer="entmax", mix_normalizer="softmax").tap_normalizer == "softmax"
    for name, spec in PRESETS.items():
        assert spec.inert_settings() == [], name


@pytest.mark.parametrize("kwargs, message", [
    (dict(mix_layers="6,7"), "mix_layers must be a list of 0-based block indices, got '6,7'"),
    (dict(mix_layers=(1, -2)), "mix_layers must hold 0-based block indices >= 0"),
    (dict(mix_layers=(1, 1)), "mix_layers names a block twice"),
    (dict(mix_layers=(1.5,)), "mix_layers must be an integer, got 1.5"),
    (dict(mix_layers=(1,), mix_source="qx"), "mix_source: unknown attention source 'qx'.*valid: "),
    (dict(mix_layers=(1,), mix_normalizer="softmin"), "mix_normalizer: unknown attention normalizer 'softmin'; "
                                                        "valid: .*softmax.*or '' = normalizer"),
    (dict(mix_layers=(1,), mix_weight=1.5), "mix_weight must be in \\[0, 1\\].*1.5"),
    (dict(mix_layers=(1,), mix_weight="a"), "mix_weight must be a number, got 'a'"),
    (dict(mix_layers=(1,), mix_scale=-1), "mix_scale must be a finite number > 0.*-1"),
    (dict(cls_weight=float("nan")), "cls_weight must be a finite number, got nan"),
])
def test_bad_mix_values_name_the_field_and_the_choices(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AttentionSpec.from_settings(**kwargs)


def test_mix_layers_checked_against_the_depth_and_inert_mix_keys_reported(deep_visual):
    with pytest.raises(ValueError, match=r"mix_layers \[1, 3\]: \[3\] not earlier blocks of a tower of depth 4; "
                                         r"valid: 0-based indices 0..2"):
        DenseCLIPEncoder(deep_visual, AttentionSpec(mix=MixOptions(layers=(1, 3))))
    inert = AttentionSpec(mix=MixOptions(weight=0.2, source="kk")).inert_settings()
    assert any("mix_source='kk' changes nothing without mix_layers" in m for m in inert)
    assert any("mix_weight=0.2 changes nothing without mix_layers" in m for m in inert)
    with pytest.raises(ValueError, match="mix_scale=2.0 changes nothing without mix_layers"):
        parse_attention_spec("naclip:mix_scale=2")


def test_grammar_reads_the_mix_keys():
    s = parse_attention_spec("itaclip:entmax:1.2:mix_layers=1,2:mix_weight=0.25:cls_weight=0.3")
    assert (s.normalizer, s.alpha, s.mix.layers, s.mix.weight, s.cls_weight, s.mix.source) == (
        "entmax", 1.2, (1, 2), 0.25, 0.3, "qq+kk")
    with pytest.raises(ValueError, match="mix_layers='1;2' is not a comma-separated list"):
        parse_attention_spec("itaclip:mix_layers=1;2")
    # alpha reaches the tapped layers' normaliser even when the last block is softmax
    s = parse_attention_spec("clip:mix_layers=0:mix_normalizer=entmax:alpha=1.5")
    assert (s.tap_normalizer, s.alpha) == ("entmax", 1.5)


def test_config_keys_reach_the_spec_and_errors_name_the_config_section():
    from detectron2.config import get_cfg

    import sparseclip_d2

    cfg = get_cfg()
    sparseclip_d2.add_sparseclip_config(cfg)
    cfg.merge_from_list(["MODEL.SPARSECLIP.ATTENTION.MIX.LAYERS", "[5, 6, 7, 8]",
                         "MODEL.SPARSECLIP.ATTENTION.MIX.SCALE", "2.0", "MODEL.SPARSECLIP.ATTENTION.MIX.WEIGHT", "0.3",
                         "MODEL.SPARSECLIP.BLOCK.CLS_WEIGHT", "0.3"])
    s = AttentionSpec.from_config(cfg)
    assert (s.mix.layers, s.mix.scale, s.mix.weight, s.cls_weight) == ((5, 6, 7, 8), 2.0, 0.3, 0.3)
    cfg.merge_from_list(["MODEL.SPARSECLIP.ATTENTION.MIX.NORMALIZER", "softmin"])
    with pytest.raises(ValueError, match="MODEL.SPARSECLIP.ATTENTION/BLOCK: mix_normalizer: unknown attention "
                                         "normalizer 'softmin'"):
        AttentionSpec.from_config(cfg)


# ----------------------------------------------------------------------------- layer 2
ITACLIP_SMALL = dict(source="qq+kk", mix_layers=(0, 2), mix_source="qq+kk", mix_weight=0.5, mix_scale=1.0,
                     residual=True, ffn=False)
RESCLIP_SMALL = dict(source="kk", prior_std=5.0, mix_layers=(0, 1, 2), mix_source="qk", mix_weight=0.3,
                     mix_scale=2.0, residual=False, ffn=False)


def _spec(d, **extra):
    kw = {k: v for k, v in d.items() if k != "prior_std"}
    if "prior_std" in d:
        kw.update(prior="gaussian", prior_std=d["prior_std"])
    return AttentionSpec.from_settings(**kw, **extra)


@pytest.mark.parametrize("name, small", [("itaclip", ITACLIP_SMALL), ("resclip_rcs", RESCLIP_SMALL)])
@pytest.mark.parametrize("alpha", [1.0, 1.2])
def test_mixed_methods_match_float64_reference_with_softmax_and_entmax(deep_visual, name, small, alpha):
    """Each preset's layout on a 4-block tower (taps on earlier blocks), with its softmaxes as
    published and with ``NORMALIZER entmax`` alpha 1.2 (one override reaches the tapped layers
    too), against the float64 computation of that composition."""
    preset = AttentionSpec.preset(name)
    for field in ("source", "mix_source", "residual", "ffn", "prior", "mix_weight", "mix_scale"):
        if field in small or field == "prior":
            want = ("gaussian" if "prior_std" in small else "none") if field == "prior" else small[field]
            assert preset.settings()[field] == want, field  # the small layout is the preset's but for depth
    extra = {} if alpha == 1.0 else dict(normalizer="entmax", alpha=alpha)
    spec = _spec(small, **extra)
    images = _images()
    with torch.no_grad():
        feats = DenseCLIPEncoder(deep_visual, spec)(images)
    ref, _ = _tower64(deep_visual, images, alpha=alpha, **{k: v for k, v in small.items()})
    torch.testing.assert_close(feats.double(), ref, atol=2e-5, rtol=2e-5)
    # the mixing matters: without it the features differ
    ref_plain, _ = _tower64(deep_visual, images, alpha=alpha, **{**small, "mix_layers": ()})
    assert (ref - ref_plain).abs().max() > 1e-3


def test_tap_normalizer_can_differ_from_the_last_blocks(deep_visual):
    small = dict(RESCLIP_SMALL)
    spec = _spec(small, normalizer="entmax", alpha=1.2, mix_normalizer="softmax")
    images = _images(2)
    with torch.no_grad():
        feats = DenseCLIPEncoder(deep_visual, spec)(images)
    ref, _ = _tower64(deep_visual, images, alpha=1.2, tap_alpha=1.0, **small)
    torch.testing.assert_close(feats.double(), ref, atol=2e-5, rtol=2e-5)


def test_cls_weight_adds_the_last_blocks_input_cls_token(deep_visual):
    small = dict(source="kk", mix_layers=(), mix_source="qk", mix_weight=0.5, mix_scale=1.0, residual=False, ffn=False)
    spec = AttentionSpec(source="kk", residual=False, ffn=False, cls_weight=0.3)
    images = _images(3)
    with torch.no_grad():
        feats = DenseCLIPEncoder(deep_visual, spec)(images)
    ref, _ = _tower64(deep_visual, images, cls_weight=0.3, **small)
    torch.testing.assert_close(feats.double(), ref, atol=2e-5, rtol=2e-5)
    ref0, _ = _tower64(deep_visual, images, **small)
    assert (ref - ref0).abs().max() > 1e-3


def test_forward_pass_taps_block_inputs_in_one_pass_and_batch_rows_are_independent(deep_visual):
    spec = _spec(ITACLIP_SMALL)
    enc = DenseCLIPEncoder(deep_visual, spec)
    images = _images(4, b=3)
    with torch.no_grad():
        p = enc.forward_pass(images, tap_layers=(1, 3, 4))
        single = enc.forward_pass(images[1:2], tap_layers=(1,))
    _, inputs = _tower64(deep_visual, images, **ITACLIP_SMALL)
    assert sorted(p.taps) == [1, 3, 4] and sorted(p.tap_attention) == [0, 2]
    for i in (1, 3, 4):
        torch.testing.assert_close(p.taps[i].double(), inputs[i], atol=2e-5, rtol=2e-5)
    assert p.attn.shape == (3, 4, 17, 17)
    torch.testing.assert_close(p.attn.sum(-1), torch.full((3, 4, 17), float(spec.rows_sum_to)), atol=1e-5, rtol=0)
    torch.testing.assert_close(single.taps[1], p.taps[1][1:2], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(single.tokens, p.tokens[1:2], atol=1e-5, rtol=1e-5)
    tokens, grid, attn = enc.forward_tokens(images)
    torch.testing.assert_close(tokens, p.tokens) and torch.testing.assert_close(attn, p.attn)
    with pytest.raises(ValueError, match=r"tap_layers \[5\]: 5 is not a block index; valid: 0..4"):
        enc.forward_pass(images, tap_layers=(5,))


# ----------------------------------------------------------------------------- the zoo page
def test_zoo_page_matches_the_presets():
    """docs/methods.md has one row per preset, and its "last block" cell is describe_spec of it."""
    import os
    import re

    from sparseclip_d2.clip import describe_spec

    path = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "methods.md")
    rows = {}
    for line in open(path, encoding="utf-8"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and cells[1].startswith("`"):
            rows[cells[1].strip("`")] = cells
    assert set(rows) == set(PRESETS), sorted(set(rows) ^ set(PRESETS))
    for name, cells in rows.items():
        assert cells[2] == describe_spec(PRESETS[name]), name
        commit = cells[4]
        assert commit == "-" or re.search(r"@ [0-9a-f]{7}\b", commit), (name, commit)
