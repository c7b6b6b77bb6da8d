"""The parallel-path block mode (GEM, CLIP Surgery) and GEM's cosine scores.

- A two-block toy (float64 weights; attention in float32 as the house computes it) (the 2-block tiny open_clip ViT, both blocks parallel) against the
  accumulation written out by hand: main stream, branch residual / FFN switches, CLS from
  either path; GEM's cosine scores with the adaptive temperature and one self-self iteration,
  with softmax and with entmax 1.2 (the ``entmax`` package's bisection as reference).
- Known answers: GEM's inverse temperature, the sum / mean of softmaxes.
- Every tower kind: a parallel path with the plain block (qk, softmax, residual, FFN) is the
  unmodified tower, and one parallel block without FFN equals the in-sequence last block.
- Validation of the new fields and config keys, with the valid choices in the errors.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from sparseclip_d2.attention import attention_weights, cosine_attention_weights, adaptive_inverse_temperature
from sparseclip_d2.clip import AttentionSpec, DenseCLIPEncoder, ParallelOptions, build_clip
from tiny_models import TINY_TIMM_MODEL_NAMES

from conftest import build_tiny_clip, tiny_cfg

entmax_pkg = pytest.importorskip("entmax")


def _images(B=2, H=64, W=64, seed=0, dtype=torch.float64):
    return torch.randn(B, 3, H, W, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.fixture(scope="module")
def tiny64():
    """The 2-block tiny open_clip ViT in float64, biases and norms perturbed (seeded)."""
    m = build_tiny_clip(0).double()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in m.visual.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return m


# ------------------------------------------------------------- the hand-written reference
def _ln(x, mod):
    return F.layer_norm(x, (x.shape[-1],), mod.weight, mod.bias, mod.eps)


def _heads(t, nh):
    B, L, C = t.shape
    return t.reshape(B, L, nh, C // nh).transpose(1, 2)


def _merge(t):
    B, H, L, d = t.shape
    return t.transpose(1, 2).reshape(B, L, H * d)


def _qkv(blk, y):
    W, b = blk.attn.in_proj_weight, blk.attn.in_proj_bias
    C = y.shape[-1]
    nh = blk.attn.num_heads
    return [_heads(y @ W[i * C:(i + 1) * C].T + b[i * C:(i + 1) * C], nh) for i in range(3)]


def _out(blk, o):
    return _merge(o) @ blk.attn.out_proj.weight.T + blk.attn.out_proj.bias


def _mlp(blk, x):
    h = _ln(x, blk.ln_2) @ blk.mlp.c_fc.weight.T + blk.mlp.c_fc.bias
    h = F.gelu(h) if isinstance(blk.mlp.gelu, torch.nn.GELU) else h * torch.sigmoid(1.702 * h)
    return h @ blk.mlp.c_proj.weight.T + blk.mlp.c_proj.bias


def _norm_rows(s, normalizer):
    if normalizer == "softmax":
        return torch.softmax(s, dim=-1)
    return entmax_pkg.entmax_bisect(s, alpha=1.2, dim=-1, n_iter=200)


def _gem_weights(q, k, v, y, normalizer):
    """GEM's three cosine self terms by hand: one self-self iteration, adaptive temperature, mean."""
    d = q.shape[-1]
    s = (y.norm(dim=-1).mean(dim=-1) / math.sqrt(d)).view(-1, 1, 1, 1)
    out = 0
    for f in (v, k, q):
        a = f / f.norm(dim=-1, keepdim=True)
        a = _norm_rows(a @ a.transpose(-1, -2) * s, normalizer) @ a  # the loop, once
        a = a / a.norm(dim=-1, keepdim=True)
        out = out + _norm_rows(a @ a.transpose(-1, -2) * s, normalizer)
    return out / 3


def _reference(visual, images, *, kind, residual, ffn, cls_main, normalizer="softmax"):
    """Both blocks of the 2-block ViT as a parallel path, the accumulation written out."""
    v = visual
    B = images.shape[0]
    x = F.conv2d(images, v.conv1.weight, stride=16).flatten(2).transpose(1, 2)
    x = torch.cat([v.class_embedding.view(1, 1, -1).expand(B, 1, -1), x], 1) + v.positional_embedding
    x0 = _ln(x, v.ln_pre)
    b0, b1 = v.transformer.resblocks
    d = x0.shape[-1] // b0.attn.num_heads

    def branch_attn(blk, y):
        q, k, vv = _qkv(blk, y)
        if kind == "vv":
            w = _norm_rows(vv @ vv.transpose(-1, -2) / math.sqrt(d), normalizer)
        else:
            w = _gem_weights(q, k, vv, y, normalizer)
        return _out(blk, w @ vv)

    def main_block(blk, x):
        q, k, vv = _qkv(blk, _ln(x, blk.ln_1))
        x = x + _out(blk, torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), -1) @ vv)
        return x + _mlp(blk, x)

    # block 1: the branch starts as the main stream's input x0
    a0 = branch_attn(b0, _ln(x0, b0.ln_1))
    p1 = x0 + a0 if residual else a0
    if ffn:
        p1 = p1 + _mlp(b0, p1)
    x1 = main_block(b0, x0)
    # block 2: the branch reads the main stream's ln_1(x1)
    a1 = branch_attn(b1, _ln(x1, b1.ln_1))
    p2 = p1 + a1 if residual else a1
    if ffn:
        p2 = p2 + _mlp(b1, p2)
    x2 = main_block(b1, x1)
    if cls_main:
        p2 = torch.cat([x2[:, :1], p2[:, 1:]], 1)
    out = _ln(p2, v.ln_post)[:, 1:] @ v.proj
    return out.reshape(B, 4, 4, -1).permute(0, 3, 1, 2)


@pytest.mark.parametrize("residual,ffn,cls_main", [(True, False, True), (True, True, False), (False, False, False)])
def test_two_block_parallel_path_vv_by_hand(tiny64, residual, ffn, cls_main):
    spec = AttentionSpec(source="vv", residual=residual, ffn=ffn,
                         parallel=ParallelOptions(layers=2, cls="main" if cls_main else "parallel"))
    x = _images()
    with torch.no_grad():
        ours = DenseCLIPEncoder(tiny64.visual, spec)(x)
        ref = _reference(tiny64.visual, x, kind="vv", residual=residual, ffn=ffn, cls_main=cls_main)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)  # attention runs in float32 (the house rule)


@pytest.mark.parametrize("normalizer", ["softmax", "entmax"])
def test_two_block_gem_by_hand(tiny64, normalizer):
    spec = AttentionSpec.preset("gem", parallel_layers=2, normalizer=normalizer, alpha=1.2)
    x = _images(seed=1)
    with torch.no_grad():
        ours = DenseCLIPEncoder(tiny64.visual, spec)(x)
        ref = _reference(tiny64.visual, x, kind="gem", residual=True, ffn=False, cls_main=False,
                         normalizer=normalizer)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)  # attention runs in float32 (the house rule)


def test_clipsurgery_entmax_by_hand(tiny64):
    spec = AttentionSpec.preset("clipsurgery", parallel_layers=2, normalizer="entmax", alpha=1.2)
    x = _images(seed=2)
    with torch.no_grad():
        ours = DenseCLIPEncoder(tiny64.visual, spec)(x)
        ref = _reference(tiny64.visual, x, kind="vv", residual=True, ffn=False, cls_main=True, normalizer="entmax")
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_main_stream_is_unchanged(tiny64):
    """The taps of a parallel run are the unmodified tower's residual stream (tower.run_native)."""
    x = _images(seed=4)
    plain = DenseCLIPEncoder(tiny64.visual).forward_pass(x, tap_layers=[0, 1, 2])
    par = DenseCLIPEncoder(tiny64.visual, AttentionSpec.preset("gem", parallel_layers=2)).forward_pass(
        x, tap_layers=[0, 1, 2])
    torch.testing.assert_close(par.taps[0], plain.taps[0], rtol=0, atol=0)
    # block 0 recomposed from its q, k, v with the attention in float32 (the house rule)
    torch.testing.assert_close(par.taps[1], plain.taps[1], rtol=1e-5, atol=1e-5)
    assert (par.taps[2] - plain.taps[2]).abs().max() > 1e-3  # the output is the branch
    torch.testing.assert_close(par.attn.sum(-1), torch.ones_like(par.attn.sum(-1)), rtol=0, atol=1e-5)


# ------------------------------------------------------------- known answers
def test_adaptive_inverse_temperature_known_answer():
    y = torch.tensor([[[3.0, 4.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], [[1.0, 0.0, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0]]])
    # mean norms 2.5 and 1.5, times 4 ** -0.5
    torch.testing.assert_close(adaptive_inverse_temperature(y, head_dim=4), torch.tensor([1.25, 0.75]))


def test_cosine_scores_known_answer():
    """Two tokens, one head: v = [[1, 0], [1, 1]], cos = [[1, 1/sqrt2], [1/sqrt2, 1]], s = 2."""
    v = torch.tensor([[1.0, 0.0], [1.0, 1.0]]).view(1, 1, 2, 2)
    w = cosine_attention_weights(v, v, v, source="vv", inverse_temperature=2.0, iterations=0)
    e = math.exp(2 * (1 - 1 / math.sqrt(2)))
    p = e / (1 + e)
    torch.testing.assert_close(w[0, 0], torch.tensor([[p, 1 - p], [1 - p, p]]))
    # the fixed scale and the temperature: s / T
    torch.testing.assert_close(cosine_attention_weights(v, v, v, source="vv", inverse_temperature=4.0,
                                                        temperature=2.0), w)


def test_sum_and_mean_of_softmaxes():
    """CLIPtrase's rows sum to 3 (normalize_then_sum over qq+kk+vv); GEM's mean rows sum to 1."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    total = attention_weights(q, k, v, source="qq+kk+vv", sum_mode="normalize_then_sum")
    by_hand = sum(torch.softmax(a @ a.transpose(-1, -2) / 2.0, -1) for a in (q, k, v))
    torch.testing.assert_close(total, by_hand.float())
    torch.testing.assert_close(total.sum(-1), torch.full((1, 2, 5), 3.0))
    mean = attention_weights(q, k, v, source="qq+kk+vv", sum_mode="normalize_then_mean")
    torch.testing.assert_close(mean, total / 3)


# ------------------------------------------------------------- every tower kind
@pytest.fixture(scope="module", params=TINY_TIMM_MODEL_NAMES + ("sparseclip-tiny-vit",))
def any_tower(request):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = build_clip(request.param, "none")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():  # timm zero-initialises biases and layer scales
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return request.param, model.visual


def test_every_tower_kind(any_tower):
    name, visual = any_tower
    x = _images(B=1, H=64, W=48, seed=5, dtype=torch.float32)
    plain = DenseCLIPEncoder(visual)
    depth = plain.depth
    with torch.no_grad():
        # the plain block as the branch reproduces the tower
        same = DenseCLIPEncoder(visual, AttentionSpec(parallel=ParallelOptions(layers=depth)))(x)
        want = plain(x)
        torch.testing.assert_close(same, want, rtol=1e-4, atol=2e-5 * float(want.abs().max()))
        # one parallel block without FFN is the in-sequence last block without FFN
        for spec in (AttentionSpec(source="vv", ffn=False), AttentionSpec(source="qq+kk", normalizer="entmax",
                                                                          residual=False, ffn=False)):
            seq = DenseCLIPEncoder(visual, spec)(x)
            par = DenseCLIPEncoder(visual, spec.replace(parallel_layers=1))(x)
            torch.testing.assert_close(par, seq, rtol=1e-4, atol=2e-5 * float(seq.abs().max()))
        gem = DenseCLIPEncoder(visual, AttentionSpec.preset("gem", parallel_layers=depth))(x)
        assert gem.shape == plain(x).shape and torch.isfinite(gem).all()
    if plain.num_prefix_tokens == 0:
        with pytest.raises(ValueError, match="no prefix tokens; use parallel_cls='parallel'"):
            DenseCLIPEncoder(visual, AttentionSpec.preset("clipsurgery", parallel_layers=depth))
    else:
        with torch.no_grad():
            cs = DenseCLIPEncoder(visual, AttentionSpec.preset("clipsurgery", parallel_layers=depth)).forward_pass(x)
            main = plain.forward_pass(x)
        P = plain.num_prefix_tokens
        torch.testing.assert_close(cs.tokens[:, :P], main.tokens[:, :P], rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------- validation
@pytest.mark.parametrize("kwargs,match", [
    (dict(parallel_cls="branch"), r"unknown parallel_cls \(PARALLEL.CLS\) 'branch'; valid: parallel, main"),
    (dict(qkv_norm="l1"), r"unknown qkv_norm \(ATTENTION.QKV_NORM\) 'l1'; valid: none, l2"),
    (dict(qkv_norm="l2"), "parallel path only; set parallel_layers > 0"),
    (dict(parallel_layers=-1), r"parallel_layers \(PARALLEL.LAYERS\) must be >= 0"),
    (dict(parallel_layers=2, num_layers=2, normalizer="entmax"), "num_layers=2 with parallel_layers=2"),
    (dict(parallel_layers=2, mix_layers=(0,)), "cannot be combined with a parallel path"),
    (dict(parallel_layers=2, qkv_norm="l2", source="qk", self_iterations=1), "need self terms"),
    (dict(parallel_layers=2, qkv_norm="l2", source="identity"), "valid terms: qk, qq, kk, vv"),
    (dict(parallel_layers=2, qkv_norm="l2", cosine_scale=-1.0), r"cosine_scale \(ATTENTION.COSINE_SCALE\) must be >= 0"),
    (dict(sum_mode="mean"), "valid: normalize_then_sum, sum_then_normalize, normalize_then_mean"),
])
def test_spec_refuses(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AttentionSpec.from_settings(**kwargs)


def test_depth_and_inert():
    with pytest.raises(ValueError, match=r"parallel_layers=13 is outside \[0, 12\]"):
        AttentionSpec(parallel=ParallelOptions(layers=13)).check_depth(12)
    inert = AttentionSpec(parallel=ParallelOptions(cls="main", cosine_scale=2.0, self_iterations=1)).inert_settings()
    assert len(inert) == 3 and "without a parallel path" in inert[0]
    assert "a branch with the plain block" in AttentionSpec(parallel=ParallelOptions(layers=2)).inert_settings()[0]
    with pytest.raises(ValueError, match="self_iterations=1 changes nothing without qkv_norm='l2'"):
        AttentionSpec.parse("clip:self_iterations=1")
    assert AttentionSpec.parse("gem:entmax:1.2:parallel=2") == AttentionSpec.preset(
        "gem", normalizer="entmax", alpha=1.2, parallel_layers=2)


def test_config_keys_reach_the_spec_and_are_validated():
    cfg = tiny_cfg(**{"MODEL.SPARSECLIP.PARALLEL.LAYERS": 2, "MODEL.SPARSECLIP.PARALLEL.CLS": "main",
                      "MODEL.SPARSECLIP.ATTENTION.QKV_NORM": "l2", "MODEL.SPARSECLIP.ATTENTION.SOURCE": "vv",
                      "MODEL.SPARSECLIP.ATTENTION.COSINE_SCALE": 3.0,
                      "MODEL.SPARSECLIP.ATTENTION.SELF_ITERATIONS": 2})
    spec = AttentionSpec.from_config(cfg)
    assert spec.parallel == ParallelOptions(layers=2, cls="main", qkv_norm="l2", cosine_scale=3.0, self_iterations=2)
    assert (spec.parallel.layers, spec.parallel.cls, spec.parallel.qkv_norm, spec.parallel.cosine_scale,
            spec.parallel.self_iterations) == (2, "main", "l2", 3.0, 2)
    bad = tiny_cfg(**{"MODEL.SPARSECLIP.PARALLEL.LAYERS": 2, "MODEL.SPARSECLIP.PARALLEL.CLS": "cls"})
    with pytest.raises(ValueError, match=r"ATTENTION/BLOCK: unknown parallel_cls \(PARALLEL.CLS\) 'cls'; valid: parallel, main"):
        AttentionSpec.from_config(bad)


# ------------------------------------------------------------- GEM's / CLIP Surgery's position-embedding resizes
def _pe(gh, gw, C=3, seed=0):
    return torch.randn(1 + gh * gw, C, generator=torch.Generator().manual_seed(seed))


def test_size_antialias_is_pil_bicubic():
    """GEM resizes with antialias=True bicubic, which is PIL's bicubic (a = -0.5) resize."""
    import numpy as np
    from PIL import Image

    from sparseclip_d2.clip import interpolate_pos_embed

    pe = _pe(3, 4)
    out = interpolate_pos_embed(pe, (3, 4), (5, 7), mode="size_antialias")
    grid = pe[1:].reshape(3, 4, -1).numpy()
    ref = np.stack([np.asarray(Image.fromarray(grid[..., c], mode="F").resize((7, 5), Image.BICUBIC))
                    for c in range(grid.shape[-1])], -1)
    torch.testing.assert_close(out[1:], torch.from_numpy(ref).reshape(35, -1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[:1], pe[:1])
    assert (out - interpolate_pos_embed(pe, (3, 4), (5, 7), mode="size")).abs().max() > 1e-3


def test_bilinear_by_hand():
    """CLIP Surgery's bilinear resize (align_corners=False): source coordinate (i + 0.5) * g / n - 0.5."""
    from sparseclip_d2.clip import interpolate_pos_embed

    gh, gw, h, w = 2, 3, 3, 5
    pe = _pe(gh, gw, C=2, seed=1).double()
    out = interpolate_pos_embed(pe, (gh, gw), (h, w), mode="bilinear")
    grid = pe[1:].reshape(gh, gw, -1)

    def src(i, n, g):
        c = min(max((i + 0.5) * g / n - 0.5, 0.0), g - 1)
        lo = int(math.floor(c))
        hi = min(lo + 1, g - 1)
        return lo, hi, c - lo

    ref = torch.zeros(h, w, grid.shape[-1], dtype=torch.float64)
    for i in range(h):
        y0, y1, fy = src(i, h, gh)
        for j in range(w):
            x0, x1, fx = src(j, w, gw)
            ref[i, j] = ((1 - fy) * ((1 - fx) * grid[y0, x0] + fx * grid[y0, x1])
                         + fy * ((1 - fx) * grid[y1, x0] + fx * grid[y1, x1]))
    torch.testing.assert_close(out[1:].double(), ref.reshape(h * w, -1), rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------- CLIP Surgery's feature surgery
def _surgery_elementwise(feats, text, t=2.0):
    """CLIP Surgery's clip_feature_surgery as it is written (element-wise products, the mean over
    the texts removed, summed over channels), batch 1: feats (1 + N, C) normalised, text (S, C)."""
    prob = torch.softmax((feats[:1] @ text.T) * t, -1)
    w = prob / prob.mean(-1, keepdim=True)
    prods = feats[:, None, :] * text[None, :, :] * w.reshape(1, -1, 1)
    return (prods - prods.mean(1, keepdim=True)).sum(-1)  # (1 + N, S)


def test_feature_surgery_matches_the_elementwise_form():
    from sparseclip_d2.methods.clip_surgery.surgery import feature_surgery

    g = torch.Generator().manual_seed(0)
    feats = F.normalize(torch.randn(1 + 6, 8, generator=g, dtype=torch.float64), dim=-1)
    text = F.normalize(torch.randn(5, 8, generator=g, dtype=torch.float64), dim=-1)
    ref = _surgery_elementwise(feats, text)[1:]  # (6, S)
    patch_cos = (feats[1:] @ text.T).T.reshape(1, 5, 2, 3)
    out = feature_surgery(patch_cos, feats[:1] @ text.T, 2.0)
    torch.testing.assert_close(out.double(), ref.T.reshape(1, 5, 2, 3), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"CLS_SCALE = 0 is invalid; valid: a number > 0"):
        feature_surgery(patch_cos, feats[:1] @ text.T, 0)


def test_feature_surgery_in_the_meta_arch():
    from detectron2.modeling import build_model

    from sparseclip_d2.methods import plan_from_config

    model = build_model(tiny_cfg(**{"MODEL.SPARSECLIP.FEATURE_SURGERY.ENABLED": True,
                                    "MODEL.SPARSECLIP.ATTENTION.SOURCE": "vv", "MODEL.SPARSECLIP.PARALLEL.LAYERS": 2,
                                    "MODEL.SPARSECLIP.PARALLEL.CLS": "main", "MODEL.SPARSECLIP.BLOCK.FFN": False}))
    assert model.head_name == "feature_surgery" and model.encoder.spec.parallel.cls == "main"
    images = _images(B=1, dtype=torch.float32)
    text = F.normalize(torch.randn(4, model.encoder.embed_dim, generator=torch.Generator().manual_seed(1)), dim=-1)
    with torch.no_grad():
        logits = model.encode_logits(images, text)
        tokens, grid, _ = model.encoder.forward_tokens(images)
        patches = F.normalize(model.encoder(images).float(), dim=1)[0].flatten(1).T  # (h*w, D)
        cls = F.normalize(model.encoder.pooled_embedding(tokens).float(), dim=-1)
    ref = _surgery_elementwise(torch.cat([cls, patches]).double(), text.double())[1:]  # (h*w, S)
    torch.testing.assert_close(logits[0].double(), model.logit_scale * ref.T.reshape(4, *grid), rtol=1e-4, atol=1e-4)
    bad = tiny_cfg(**{"MODEL.SPARSECLIP.FEATURE_SURGERY.ENABLED": True, "TEST.TTA.MODE": "itaclip"})
    with pytest.raises(ValueError, match="FEATURE_SURGERY.ENABLED cannot be combined with TEST.TTA.MODE"):
        plan_from_config(bad)
    with pytest.raises(ValueError, match=r"FEATURE_SURGERY.CLS_SCALE = -1.0 is invalid"):
        build_model(tiny_cfg(**{"MODEL.SPARSECLIP.FEATURE_SURGERY.CLS_SCALE": -1.0}))


def test_feedback_and_a_parallel_path_are_refused_together():
    """ResCLIP's SFR (a second run of the last block) and a parallel path (GEM, CLIP Surgery)
    are two ways of replacing the last block: one spec takes one of them, with a clear error."""
    from sparseclip_d2.clip import AttentionSpec

    with pytest.raises(ValueError, match=r"feedback .* cannot be combined with a parallel path \(parallel_layers=6\)"):
        AttentionSpec.preset("clipsurgery").replace(feedback=True)
