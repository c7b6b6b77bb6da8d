"""Layer 2: AttentionSpec, build_clip and DenseCLIPEncoder against hand-written references.

The references below recompute the embedding, the modified blocks, ln_post and proj with
plain matmuls from the model's weights; only the unmodified blocks are run through the
model's own block modules.
"""
import copy
import logging
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import open_clip
from sparseclip_d2.clip import AttentionSpec, DenseCLIPEncoder, build_clip, get_tokenizer, is_random_weights

entmax_pkg = pytest.importorskip("entmax")


@pytest.fixture(scope="module")
def peaky_clip(tiny_clip):
    """A private copy of the tiny CLIP whose attention projections are scaled up (x2),
    so that entmax / sparsemax attention is really sparse."""
    model = copy.deepcopy(tiny_clip[0])
    with torch.no_grad():
        for blk in model.visual.transformer.resblocks:
            blk.attn.in_proj_weight.mul_(2.0)
    return model


def _images(B=2, H=64, W=64, seed=0):
    return torch.randn(B, 3, H, W, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- hand-written reference
def _ln(x, ln):
    return F.layer_norm(x.double(), ln.normalized_shape, ln.weight.double(), ln.bias.double(), ln.eps)


def _embed(visual, images):
    """conv1 -> CLS -> position embeddings (hand-interpolated) -> ln_pre, float64, (B, L, C)."""
    B, _, H, W = images.shape
    p = visual.patch_size[0]
    h, w = H // p, W // p
    x = F.conv2d(images.double(), visual.conv1.weight.double(), stride=p)  # (B, C, h, w)
    x = x.reshape(B, x.shape[1], h * w).permute(0, 2, 1)
    cls = visual.class_embedding.double().reshape(1, 1, -1).repeat(B, 1, 1)
    pe = visual.positional_embedding.double()
    gh, gw = visual.grid_size
    if (h, w) != (gh, gw):
        grid = pe[1:].reshape(gh, gw, -1).permute(2, 0, 1)[None]
        grid = F.interpolate(grid, size=(h, w), mode="bicubic", align_corners=False)[0]
        pe = torch.cat([pe[:1], grid.permute(1, 2, 0).reshape(h * w, -1)])
    return _ln(torch.cat([cls, x], 1) + pe, visual.ln_pre)


def _normalise(s, normalizer, alpha):
    if normalizer == "softmax":
        return torch.softmax(s, -1)
    if normalizer == "entmax":
        return entmax_pkg.entmax15(s, dim=-1) if alpha == 1.5 else entmax_pkg.entmax_bisect(s, alpha, dim=-1, n_iter=100)
    if normalizer == "sparsemax":
        return entmax_pkg.sparsemax(s, dim=-1)
    raise AssertionError(normalizer)


def _gaussian_prior(h, w, std):
    r = torch.tensor([i // w for i in range(h * w)], dtype=torch.float64)
    c = torch.tensor([i % w for i in range(h * w)], dtype=torch.float64)
    g = torch.exp(-((r[:, None] - r[None]) ** 2 + (c[:, None] - c[None]) ** 2) / (2 * std * std))
    out = torch.zeros(1 + h * w, 1 + h * w, dtype=torch.float64)
    out[1:, 1:] = g
    return out


def _ref_block(blk, x, source="qk", normalizer="softmax", alpha=1.5, temperature=1.0, prior=None,
               residual=True, ffn=True):
    """One transformer block by hand (float64). Returns (x_out (B, L, C), weights (B, h, L, L))."""
    B, L, C = x.shape
    nh = blk.attn.num_heads
    d = C // nh
    y = _ln(x, blk.ln_1)
    qkv = y @ blk.attn.in_proj_weight.double().T + blk.attn.in_proj_bias.double()
    q, k, v = (t.reshape(B, L, nh, d).permute(0, 2, 1, 3) for t in qkv.split(C, dim=-1))
    proj = {"q": q, "k": k, "v": v}
    if source == "identity":
        weights = torch.eye(L, dtype=torch.float64).expand(B, nh, L, L)
    else:
        weights = 0
        for term in source.split("+"):
            a, b = proj[term[0]], proj[term[1]]
            s = (a @ b.transpose(-1, -2)) / math.sqrt(d) / temperature
            if prior is not None:
                s = s + prior
            weights = weights + _normalise(s, normalizer, alpha)
    o = (weights @ v).permute(0, 2, 1, 3).reshape(B, L, C)
    o = o @ blk.attn.out_proj.weight.double().T + blk.attn.out_proj.bias.double()
    x = x + o if residual else o
    if ffn:
        hdn = _ln(x, blk.ln_2) @ blk.mlp.c_fc.weight.double().T + blk.mlp.c_fc.bias.double()
        hdn = hdn * torch.sigmoid(1.702 * hdn)  # QuickGELU
        x = x + hdn @ blk.mlp.c_proj.weight.double().T + blk.mlp.c_proj.bias.double()
    return x, weights


def _reference(model, images, spec):
    visual = model.visual
    B, _, H, W = images.shape
    p = visual.patch_size[0]
    h, w = H // p, W // p
    x = _embed(visual, images)
    blocks = visual.transformer.resblocks
    depth = len(blocks)
    weights = None
    for i, blk in enumerate(blocks):
        if i < depth - spec.num_layers:
            with torch.no_grad():  # an unmodified block: run open_clip's own module
                x = blk(x.float()).double()
        elif i < depth - 1:
            x, weights = _ref_block(blk, x, "qk", spec.normalizer, spec.alpha, spec.temperature)
        else:
            prior = _gaussian_prior(h, w, spec.prior_std) if spec.prior == "gaussian" else None
            x, weights = _ref_block(blk, x, spec.source, spec.normalizer, spec.alpha, spec.temperature, prior,
                                    spec.residual, spec.ffn)
    x = _ln(x, visual.ln_post)[:, 1:] @ visual.proj.double()
    return x.reshape(B, h, w, -1).permute(0, 3, 1, 2), weights


# ---------------------------------------------------------------- the unmodified tower
def test_unmodified_spec_equals_open_clip_tokens(tiny_clip):
    model = copy.deepcopy(tiny_clip[0])  # we set output_tokens on this private copy only
    images = _images()
    enc = DenseCLIPEncoder(model.visual, AttentionSpec())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        feats = enc(images)
        model.visual.output_tokens = True
        _, tokens = model.visual(images)  # ln_post(x)[:, 1:] from open_clip's own forward
    ref = (tokens @ model.visual.proj).reshape(2, 4, 4, -1).permute(0, 3, 1, 2)
    assert feats.shape == (2, 32, 4, 4)
    torch.testing.assert_close(feats, ref, atol=1e-5, rtol=0)
    # the encoder mutated nothing
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert enc.visual is model.visual


def _sequence_first_block(blk, x):
    """OpenAI CLIP's block as the upstream code of the field vendors it (``clip/model.py``
    ``ResidualAttentionBlock``): sequence-first tokens, ``attn(x, x, x, need_weights=False)``,
    written here with the block's own weights through ``F.multi_head_attention_forward``."""
    x = x.transpose(0, 1)
    y = blk.ln_1(x)
    a = blk.attn
    out = F.multi_head_attention_forward(y, y, y, a.embed_dim, a.num_heads, a.in_proj_weight, a.in_proj_bias,
                                         None, None, False, 0.0, a.out_proj.weight, a.out_proj.bias,
                                         training=False, need_weights=False)[0]
    x = x + out
    x = x + blk.mlp(blk.ln_2(x))
    return x.transpose(0, 1)


@pytest.mark.parametrize("shape", [(2, 17, 64), (3, 5, 64)])
def test_unmodified_blocks_equal_the_sequence_first_block_bit_for_bit(tiny_clip, shape):
    """The unmodified blocks run as upstream's vendored OpenAI CLIP runs them (the scaled-dot-product
    attention path of ``nn.MultiheadAttention``), bit for bit, not through the module's fused
    batch-first fast path, which differs in the last bits (docs/efficiency.md, "The change: the unmodified blocks
    compute attention as upstream's do")."""
    from sparseclip_d2.clip.towers import OpenCLIPViTTower

    model = tiny_clip[0]
    tower = OpenCLIPViTTower(model.visual, lambda pe, a, b: pe)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for blk in tower.blocks:
            assert blk.attn.batch_first  # open_clip's module: blk(x) would take the fused fast path
            ours = tower.run_native(blk, x, None)
            assert torch.equal(ours, _sequence_first_block(blk, x))
            torch.testing.assert_close(ours, blk(x), atol=1e-5, rtol=0)  # the module itself, to rounding
            x = ours


def _resclip_block(blk, x):
    """ResCLIP's blocks before the last as its upstream writes them (yvhangyang/ResCLIP @ 0e085f7
    ``clip/model.py`` ``custom_attn`` without ``use_custom_attn``, then ``x + mlp(ln_2(x))``), on
    one image's sequence-first tokens: the in-projection chunked, heads folded into the batch,
    ``bmm(q * scale, k^T)``, softmax, ``bmm(., v)``, ``out_proj``."""
    x = x.transpose(0, 1)
    a = blk.attn
    L, bsz, D = x.shape
    h, d = a.num_heads, D // a.num_heads
    q, k, v = F.linear(blk.ln_1(x), a.in_proj_weight, a.in_proj_bias).chunk(3, dim=-1)
    q, k, v = (t.contiguous().view(-1, bsz * h, d).transpose(0, 1) for t in (q, k, v))
    w = F.softmax(torch.bmm(q * d ** -0.5, k.transpose(1, 2)), dim=-1)
    out = a.out_proj(torch.bmm(w, v).transpose(0, 1).contiguous().view(-1, bsz, D))
    x = x + out
    x = x + blk.mlp(blk.ln_2(x))
    return x.transpose(0, 1)


def test_explicit_unmodified_blocks_equal_resclips_blocks_bit_for_bit(tiny_clip):
    """``unmodified_blocks='explicit'`` (ResCLIP's configs): the blocks before the last give the
    tokens of ResCLIP's own explicit attention bit for bit, image by image as its window loop runs
    them; the default ``sdpa`` path gives them only to rounding (a first segmentation taken from
    them can then flip a near-tie: docs/agreement/resclip.md)."""
    model = tiny_clip[0]
    images = _images(B=3)
    depth = len(model.visual.transformer.resblocks)
    blocks = model.visual.transformer.resblocks
    with torch.no_grad():
        explicit = DenseCLIPEncoder(model.visual, AttentionSpec(unmodified_blocks="explicit"))
        sdpa = DenseCLIPEncoder(model.visual, AttentionSpec())
        for b in range(3):
            one = images[b:b + 1]
            p = explicit.forward_pass(one, tap_layers=[0, depth - 1])
            x = p.taps[0]
            for blk in blocks[:-1]:
                x = _resclip_block(blk, x)
            assert torch.equal(p.taps[depth - 1], x)
            s = sdpa.forward_pass(one, tap_layers=[depth - 1]).taps[depth - 1]
            torch.testing.assert_close(s, x, atol=1e-5, rtol=0)
        batched = explicit.forward_pass(images, tap_layers=[depth - 1]).taps[depth - 1]
        singles = torch.cat([explicit.forward_pass(images[b:b + 1], tap_layers=[depth - 1]).taps[depth - 1]
                             for b in range(3)])
        torch.testing.assert_close(batched, singles, atol=1e-6, rtol=0)
    assert AttentionSpec.preset("resclip").unmodified_blocks == "explicit"
    with pytest.raises(ValueError, match="unknown unmodified_blocks 'fast'; valid: sdpa, explicit"):
        AttentionSpec(unmodified_blocks="fast")


def test_unmodified_spec_depth_sweep_softmax_equals_open_clip(tiny_clip):
    model = tiny_clip[0]
    images = _images()
    with torch.no_grad():
        a = DenseCLIPEncoder(model.visual, AttentionSpec(num_layers=1))(images)
        b = DenseCLIPEncoder(model.visual, AttentionSpec(num_layers=2))(images)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


# ---------------------------------------------------------------- modified attention vs references
SPECS = {
    "qk-entmax": AttentionSpec(source="qk", normalizer="entmax", alpha=1.5),
    "qq-softmax": AttentionSpec(source="qq"),
    "kk-entmax1.2": AttentionSpec(source="kk", normalizer="entmax", alpha=1.2),
    "vv-sparsemax": AttentionSpec(source="vv", normalizer="sparsemax"),
    "identity": AttentionSpec(source="identity"),
    "qq+kk+vv-entmax-T0.5": AttentionSpec(source="qq+kk+vv", normalizer="entmax", alpha=1.5, temperature=0.5),
    "sclip": AttentionSpec.preset("sclip"),
    "clearclip": AttentionSpec.preset("clearclip"),
    "naclip": AttentionSpec.preset("naclip"),
    "naclip-std1": AttentionSpec.preset("naclip", prior_std=1.0),
    "maskclip": AttentionSpec.preset("maskclip"),
    "no-ffn-only": AttentionSpec(source="qq", normalizer="entmax", alpha=1.5, ffn=False),
    "no-residual-only": AttentionSpec(source="qq", residual=False),
    "depth2-qq-entmax": AttentionSpec(source="qq", normalizer="entmax", alpha=1.5, num_layers=2),
    "depth2-temperature": AttentionSpec(source="kk", temperature=0.5, num_layers=2),
}


@pytest.mark.parametrize("name", list(SPECS))
def test_encoder_matches_hand_reference(peaky_clip, name):
    spec = SPECS[name]
    images = _images()
    enc = DenseCLIPEncoder(peaky_clip.visual, spec)
    with torch.no_grad():
        feats, attn = enc(images, return_attention=True)
    ref, ref_w = _reference(peaky_clip, images, spec)
    torch.testing.assert_close(feats.double(), ref, atol=1e-5, rtol=1e-5)
    assert attn.dtype == torch.float32 and attn.shape == (2, 4, 17, 17)
    torch.testing.assert_close(attn.double(), ref_w.double(), atol=1e-5, rtol=0)
    n_terms = len(spec.source.split("+"))
    torch.testing.assert_close(attn.sum(-1), torch.full((2, 4, 17), float(n_terms)), atol=1e-5, rtol=0)


def test_entmax_attention_is_sparse_on_peaky_model(peaky_clip):
    enc = DenseCLIPEncoder(peaky_clip.visual, AttentionSpec(source="qq", normalizer="entmax", alpha=1.5))
    with torch.no_grad():
        _, attn = enc(_images(), return_attention=True)
    assert (attn == 0).float().mean() > 0.1


def test_presets_are_the_documented_baselines():
    p = AttentionSpec.preset
    assert p("clip") == AttentionSpec()
    assert (p("sclip").source, p("sclip").normalizer, p("sclip").residual, p("sclip").ffn) == ("qq+kk", "softmax", True, True)
    assert (p("clearclip").source, p("clearclip").residual, p("clearclip").ffn) == ("qq", False, False)
    n = p("naclip")
    assert (n.source, n.prior, n.prior_std, n.residual, n.ffn) == ("kk", "gaussian", 5.0, False, False)
    assert p("maskclip").source == "identity"
    assert p("sclip", normalizer="entmax").normalizer == "entmax"
    with pytest.raises(ValueError, match="unknown attention preset 'foo'; valid: clip, sclip, clearclip, naclip, maskclip"):
        p("foo")


# ---------------------------------------------------------------- random_matched control
def test_random_matched_matches_entmax_support_and_is_reproducible(peaky_clip):
    images = _images()
    ent = DenseCLIPEncoder(peaky_clip.visual, AttentionSpec(source="qq", normalizer="entmax", alpha=1.2))
    rnd = DenseCLIPEncoder(peaky_clip.visual, AttentionSpec(source="qq", normalizer="random_matched", alpha=1.2, seed=3))
    with torch.no_grad():
        _, a_ent = ent(images, return_attention=True)
        f1, a_rnd = rnd(images, return_attention=True)
        f2, a_rnd2 = rnd(images, return_attention=True)
        f_other = DenseCLIPEncoder(peaky_clip.visual, AttentionSpec(
            source="qq", normalizer="random_matched", alpha=1.2, seed=4))(images)
        f_single = rnd(images[1:])
    assert torch.equal((a_ent > 0).sum(-1), (a_rnd > 0).sum(-1))
    assert ((a_ent > 0).sum(-1) < 17).any()
    assert not torch.equal(a_ent > 0, a_rnd > 0)
    assert torch.equal(f1, f2) and torch.equal(a_rnd, a_rnd2)
    assert not torch.allclose(f1, f_other)
    torch.testing.assert_close(f_single, f1[1:], atol=1e-5, rtol=0)


# ---------------------------------------------------------------- batches, dtypes, sizes
@pytest.mark.parametrize("spec", [AttentionSpec(source="qq+kk", normalizer="entmax", alpha=1.2),
                                  AttentionSpec.preset("naclip", normalizer="sparsemax")])
def test_batch_independence(peaky_clip, spec):
    images = _images(B=3)
    enc = DenseCLIPEncoder(peaky_clip.visual, spec)
    with torch.no_grad():
        together = enc(images)
        alone = torch.cat([enc(images[i:i + 1]) for i in range(3)])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("normalizer", ["softmax", "entmax", "random_matched"])
def test_bfloat16_model_gives_float32_attention_without_nan(normalizer):
    from conftest import build_tiny_clip

    model = build_tiny_clip(0, precision="bf16")
    assert model.visual.conv1.weight.dtype == torch.bfloat16
    enc = DenseCLIPEncoder(model.visual, AttentionSpec(source="qq+kk", normalizer=normalizer, num_layers=2))
    with torch.no_grad():
        feats, attn = enc(_images(H=32, W=48), return_attention=True)
    assert feats.dtype == torch.bfloat16 and torch.isfinite(feats.float()).all()
    assert attn.dtype == torch.float32 and torch.isfinite(attn).all()
    torch.testing.assert_close(attn.sum(-1), torch.full(attn.shape[:-1], 2.0), atol=1e-5, rtol=0)
    # close to the fp32 model (same seed, same weights up to rounding)
    from conftest import build_tiny_clip as b
    ref = DenseCLIPEncoder(b(0).visual, AttentionSpec(source="qq+kk", normalizer="softmax", num_layers=2))
    if normalizer == "softmax":
        with torch.no_grad():
            r = ref(_images(H=32, W=48))
        cos = F.cosine_similarity(feats.float().flatten(1), r.flatten(1))
        assert (cos > 0.98).all()


def test_any_resolution_and_position_embedding_cache(peaky_clip):
    spec = AttentionSpec(source="qq", normalizer="entmax", alpha=1.5)
    enc = DenseCLIPEncoder(peaky_clip.visual, spec)
    images = _images(B=1, H=32, W=48)
    with torch.no_grad():
        feats = enc(images)
    assert feats.shape == (1, 32, 2, 3)
    ref, _ = _reference(peaky_clip, images, spec)
    torch.testing.assert_close(feats.double(), ref, atol=1e-5, rtol=1e-5)
    pe1 = enc.positional_embedding((2, 3), torch.device("cpu"), torch.float32)
    assert pe1 is enc.positional_embedding((2, 3), torch.device("cpu"), torch.float32)  # cached
    pe16 = enc.positional_embedding((2, 3), torch.device("cpu"), torch.float16)
    assert pe16.dtype == torch.float16 and pe1.shape == (7, 64)
    torch.testing.assert_close(pe1[0], peaky_clip.visual.positional_embedding[0])  # CLS kept
    native = enc.positional_embedding((4, 4), torch.device("cpu"), torch.float32)
    assert torch.equal(native, peaky_clip.visual.positional_embedding)
    # the gaussian prior follows the input grid
    naclip = DenseCLIPEncoder(peaky_clip.visual, AttentionSpec.preset("naclip"))
    assert naclip.attention_prior((2, 3), torch.device("cpu")).shape == (7, 7)
    assert naclip.attention_prior((5, 4), torch.device("cpu")).shape == (21, 21)
    with torch.no_grad():
        assert naclip(_images(B=1, H=80, W=64)).shape == (1, 32, 5, 4)


def test_position_embedding_cache_follows_weights_loaded_in_place(tiny_clip):
    """load_state_dict copies into the same storage: the cached interpolation must not survive."""
    model = copy.deepcopy(tiny_clip[0])
    enc = DenseCLIPEncoder(model.visual, AttentionSpec())
    before = enc.positional_embedding((2, 3), torch.device("cpu"), torch.float32).clone()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["visual.positional_embedding"] = state["visual.positional_embedding"] * 2.0 + 1.0
    ptr = model.visual.positional_embedding.data_ptr()
    model.load_state_dict(state)
    assert model.visual.positional_embedding.data_ptr() == ptr  # same storage, new values
    after = enc.positional_embedding((2, 3), torch.device("cpu"), torch.float32)
    fresh = DenseCLIPEncoder(model.visual, AttentionSpec()).positional_embedding(
        (2, 3), torch.device("cpu"), torch.float32)
    assert not torch.allclose(after, before)
    torch.testing.assert_close(after, fresh, rtol=0, atol=0)


@pytest.mark.parametrize("shape", [(1, 3, 50, 64), (1, 3, 64, 8), (1, 3, 0, 64)])
def test_bad_sizes_raise(tiny_clip, shape):
    enc = DenseCLIPEncoder(tiny_clip[0].visual, AttentionSpec())
    with pytest.raises(ValueError, match=rf"{shape[2]}x{shape[3]}.*patch size 16"):
        enc(torch.zeros(shape))


def test_bad_channels_raise(tiny_clip):
    enc = DenseCLIPEncoder(tiny_clip[0].visual, AttentionSpec())
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\)"):
        enc(torch.zeros(1, 1, 64, 64))


def test_encoder_attributes(tiny_clip):
    enc = DenseCLIPEncoder(tiny_clip[0].visual, AttentionSpec())
    assert (enc.patch_size, enc.embed_dim, enc.width, enc.depth, enc.num_heads) == (16, 32, 64, 2, 4)
    assert enc.image_mean == pytest.approx(open_clip.OPENAI_DATASET_MEAN)
    assert enc.image_std == pytest.approx(open_clip.OPENAI_DATASET_STD)


def test_unsupported_towers_are_rejected():
    from open_clip.transformer import VisionTransformer

    common = dict(image_size=32, patch_size=16, width=32, layers=1, heads=2, mlp_ratio=2.0, output_dim=16)
    with pytest.raises(ValueError, match="CustomResidualAttentionBlock"):
        DenseCLIPEncoder(VisionTransformer(**common, qk_norm=True))
    with pytest.raises(ValueError, match="attentional pooling"):
        DenseCLIPEncoder(VisionTransformer(**common, attentional_pool=True, attn_pooler_heads=2))
    with pytest.raises(TypeError, match="Linear"):
        DenseCLIPEncoder(torch.nn.Linear(2, 2))


def test_num_layers_outside_depth_is_an_error(tiny_clip):
    with pytest.raises(ValueError, match=r"num_layers=3 is outside \[1, 2\]"):
        DenseCLIPEncoder(tiny_clip[0].visual, AttentionSpec(num_layers=3))


# ---------------------------------------------------------------- AttentionSpec
def test_spec_validation_and_hashing():
    s = AttentionSpec(source="QQV", normalizer="entmax", alpha=1.2)
    assert s.source == "qq" and hash(s) == hash(AttentionSpec(source="qq", normalizer="entmax", alpha=1.2))
    assert len({s, AttentionSpec(source="qq", normalizer="entmax", alpha=1.2)}) == 1
    with pytest.raises(Exception):
        s.alpha = 1.5  # frozen
    for bad, match in [
        (dict(alpha=2.5), r"alpha must be in \[1, 2\].*2.5"),
        (dict(alpha=0.9), r"0.9"),
        (dict(num_layers=0), r"num_layers must be >= 1.*0"),
        (dict(num_layers=1.5), r"num_layers must be an integer, got 1.5"),
        (dict(source="qx"), r"unknown attention source 'qx'"),
        (dict(normalizer="softmin"), r"unknown attention normalizer 'softmin'"),
        (dict(prior="box"), r"unknown attention prior 'box'"),
        (dict(sum_mode="mean"), r"unknown sum_mode 'mean'"),
        (dict(temperature=-1), r"temperature must be > 0"),
        (dict(residual="yes"), r"residual must be True or False"),
        (dict(prior_std=0), r"prior_std must be > 0"),
    ]:
        with pytest.raises(ValueError, match=match):
            AttentionSpec(**bad)
    AttentionSpec(num_layers=5).check_depth(12)
    with pytest.raises(ValueError, match=r"num_layers=13 is outside \[1, 12\]"):
        AttentionSpec(num_layers=13).check_depth(12)


def test_spec_from_config():
    from detectron2.config import get_cfg

    from sparseclip_d2.config import add_sparseclip_config

    cfg = add_sparseclip_config(get_cfg())
    assert AttentionSpec.from_config(cfg) == AttentionSpec()
    cfg.MODEL.SPARSECLIP.ATTENTION.SOURCE = "kk"
    cfg.MODEL.SPARSECLIP.ATTENTION.NORMALIZER = "random_matched"
    cfg.MODEL.SPARSECLIP.ATTENTION.ALPHA = 1.3
    cfg.MODEL.SPARSECLIP.ATTENTION.TEMPERATURE = 0.5
    cfg.MODEL.SPARSECLIP.ATTENTION.NUM_LAYERS = 3
    cfg.MODEL.SPARSECLIP.ATTENTION.PRIOR = "gaussian"
    cfg.MODEL.SPARSECLIP.ATTENTION.PRIOR_STD = 2.0
    cfg.MODEL.SPARSECLIP.ATTENTION.SUM_MODE = "sum_then_normalize"
    cfg.MODEL.SPARSECLIP.ATTENTION.SEED = 7
    cfg.MODEL.SPARSECLIP.BLOCK.RESIDUAL = False
    cfg.MODEL.SPARSECLIP.BLOCK.FFN = False
    assert AttentionSpec.from_config(cfg) == AttentionSpec(
        source="kk", normalizer="random_matched", alpha=1.3, temperature=0.5, num_layers=3, prior="gaussian",
        prior_std=2.0, sum_mode="sum_then_normalize", seed=7, residual=False, ffn=False)
    with pytest.raises(ValueError, match="add_sparseclip_config"):
        AttentionSpec.from_config(SimpleNamespace(MODEL=SimpleNamespace()))


# ---------------------------------------------------------------- build_clip
def test_build_clip_tiny_random(caplog, tiny_clip):
    with caplog.at_level(logging.WARNING, logger="sparseclip_d2.clip.builder"):
        torch.manual_seed(0)
        model = build_clip("sparseclip-tiny-vit", "none")
    assert "RANDOM WEIGHTS" in caplog.text and "meaningless" in caplog.text
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    assert isinstance(model.visual.transformer.resblocks[0].mlp.gelu, open_clip.transformer.QuickGELU)
    assert is_random_weights(None) and is_random_weights("") and is_random_weights("None")
    assert not is_random_weights("openai")
    tok = get_tokenizer("sparseclip-tiny-vit")
    assert tok(["a cat"]).shape == (1, 77)
    # same seed -> same weights as the session fixture
    assert torch.equal(model.visual.proj, tiny_clip[0].visual.proj)


def test_build_clip_local_checkpoint_and_precision(tmp_path, tiny_clip):
    path = tmp_path / "tiny.pt"
    torch.save(tiny_clip[0].state_dict(), path)
    loaded = build_clip("sparseclip-tiny-vit", str(path), precision="bf16")
    assert loaded.visual.proj.dtype == torch.bfloat16
    torch.testing.assert_close(loaded.visual.proj.float(), tiny_clip[0].visual.proj.bfloat16().float())
    with pytest.raises(FileNotFoundError, match="missing.pt"):
        build_clip("sparseclip-tiny-vit", str(tmp_path / "missing.pt"))
    with pytest.raises(FileNotFoundError, match=r"missing\.pt.*MODEL.SPARSECLIP.CLIP.PRETRAINED"):
        build_clip("ViT-B-16-quickgelu", str(tmp_path / "missing.pt"))


def test_build_clip_errors(monkeypatch, caplog):
    with pytest.raises(ValueError, match="unknown CLIP model name 'ViT-Q-99'"):
        build_clip("ViT-Q-99", "none")
    with pytest.raises(ValueError, match=r"unknown pretrained value 'notatag'.*openai.*local checkpoint"):
        build_clip("ViT-B-16-quickgelu", "notatag")
    with pytest.raises(ValueError, match="unknown precision 'fp8'; valid: fp32, fp16, bf16"):
        build_clip("sparseclip-tiny-vit", "none", precision="fp8")

    def offline(*args, **kwargs):
        raise RuntimeError("Network is unreachable")

    monkeypatch.setattr(open_clip.factory, "download_pretrained", offline)
    with caplog.at_level(logging.WARNING, logger="sparseclip_d2.clip.builder"):
        with pytest.raises(RuntimeError, match=r"no network here.*MODEL.SPARSECLIP.CLIP.PRETRAINED.*`none`"):
            build_clip("ViT-B-16", "openai")
    assert "forcing QuickGELU" in caplog.text


def test_real_vit_b16_quickgelu_shapes():
    torch.manual_seed(0)
    model = build_clip("ViT-B-16-quickgelu", "none")
    enc = DenseCLIPEncoder(model.visual, AttentionSpec(source="qq+kk", normalizer="entmax", alpha=1.2))
    assert (enc.patch_size, enc.embed_dim, enc.width, enc.depth, enc.num_heads) == (16, 512, 768, 12, 12)
    with torch.no_grad():
        feats, attn = enc(torch.randn(1, 3, 224, 224), return_attention=True)
    assert feats.shape == (1, 512, 14, 14) and attn.shape == (1, 12, 197, 197)
    assert torch.isfinite(feats).all()
