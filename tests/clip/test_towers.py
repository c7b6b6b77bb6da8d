"""DenseCLIPEncoder on timm towers (SigLIP-style ViT, EVA02, PE-Core, CLIP-style timm ViT).

- The unmodified spec reproduces the tower: timm's ``forward_features`` tokens and open_clip's
  pooled embedding at the native size, and at other sizes a copy of the trunk built with
  timm's ``dynamic_img_size=True`` (timm's own position-embedding / rope resampling).
- Every modified variant matches a float64 reference written here from the formula: q, k, v
  from the block's weights with plain matmuls, rotary embeddings applied by hand
  (interleaved pairs), scores, normaliser (the ``entmax`` package), residual / FFN switches,
  final norm and the per-patch head (MAP value path by hand).
- The per-patch MAP path equals timm's own ``AttentionPoolLatent`` run on one-token sequences.
- Real architectures (SigLIP B/16, SigLIP2 B/16, EVA02 B/16, PE-Core B/16, MobileCLIP-B)
  are built on the meta device from open_clip's configs and give the expected shapes.
"""
import copy
import math

import pytest
import torch
import torch.nn.functional as F

import open_clip
import timm
from sparseclip_d2.clip import AttentionSpec, DenseCLIPEncoder, build_clip
from sparseclip_d2.clip.model_configs import get_local_model_config
from tiny_models import TINY_TIMM_MODEL_NAMES
from sparseclip_d2.clip.towers import check_tower

entmax_pkg = pytest.importorskip("entmax")


def _perturb(model, seed):
    """Add seeded noise to every parameter (timm zero-initialises biases, layer scales, ...)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


@pytest.fixture(scope="module", params=TINY_TIMM_MODEL_NAMES)
def timm_clip(request):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = build_clip(request.param, "none")
    return request.param, _perturb(model, 1)


def _timm_name(name):
    return get_local_model_config(name)["vision_cfg"]["timm_model_name"]


def _images(B=2, H=64, W=64, seed=0):
    return torch.randn(B, 3, H, W, generator=torch.Generator().manual_seed(seed))


def _dynamic_trunk(trunk, name):
    """A copy of ``trunk`` (timm model ``name``) built by timm with ``dynamic_img_size=True``
    and the same weights."""
    kwargs = dict(num_classes=trunk.num_classes, global_pool=trunk.global_pool, dynamic_img_size=True)
    other = timm.create_model(name, pretrained=False, **kwargs)
    other.load_state_dict(trunk.state_dict())
    return other.eval()


# ---------------------------------------------------------------- the unmodified tower
def test_tower_kinds(timm_clip):
    name, model = timm_clip
    expected = {"sparseclip-tiny-siglip": ("timm_vit", 0), "sparseclip-tiny-timm-vit": ("timm_vit", 2),
                "sparseclip-tiny-eva02": ("timm_eva", 1), "sparseclip-tiny-pe": ("timm_eva", 1),
                "sparseclip-tiny-eva-postnorm": ("timm_eva", 1)}[name]
    enc = DenseCLIPEncoder(model.visual)
    assert (enc.tower_kind, enc.num_prefix_tokens) == expected
    assert (enc.patch_size, enc.width, enc.depth, enc.num_heads) == (16, 64, 2, 4)
    assert enc.embed_dim == model.text_projection.shape[1] if hasattr(model, "text_projection") else True


@pytest.mark.parametrize("num_layers", [1, 2])
def test_unmodified_spec_reproduces_forward_features_and_pooled(timm_clip, num_layers):
    _, model = timm_clip
    enc = DenseCLIPEncoder(model.visual, AttentionSpec(num_layers=num_layers))
    images = _images()
    with torch.no_grad():
        tokens, grid, attn = enc.forward_tokens(images)
        ref_tokens = model.visual.trunk.forward_features(images)
        torch.testing.assert_close(tokens, ref_tokens, atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(enc.pooled_embedding(tokens), model.visual(images), atol=5e-5, rtol=1e-4)
        torch.testing.assert_close(enc.pooled_embedding(tokens), model.encode_image(images), atol=5e-5, rtol=1e-4)
    L = enc.num_prefix_tokens + 16
    assert grid == (4, 4) and attn.shape == (2, 4, L, L)
    torch.testing.assert_close(attn.sum(-1), torch.ones(2, 4, L))


@pytest.mark.parametrize("size", [(48, 80), (96, 64), (16, 32)])
def test_any_size_matches_timm_dynamic_img_size(timm_clip, size):
    name, model = timm_clip
    enc = DenseCLIPEncoder(model.visual)
    images = _images(H=size[0], W=size[1], seed=3)
    dyn = _dynamic_trunk(model.visual.trunk, _timm_name(name))
    with torch.no_grad():
        tokens, grid, _ = enc.forward_tokens(images)
        torch.testing.assert_close(tokens, dyn.forward_features(images), atol=2e-5, rtol=1e-5)
        feats = enc(images)
    assert feats.shape == (2, enc.embed_dim, size[0] // 16, size[1] // 16)


def test_native_rope_and_pos_embed_equal_the_trunks_own(timm_clip):
    _, model = timm_clip
    enc = DenseCLIPEncoder(model.visual)
    trunk = model.visual.trunk
    pe = enc.positional_embedding((4, 4), torch.device("cpu"), torch.float32)
    assert torch.equal(pe, trunk.pos_embed)
    assert pe is enc.positional_embedding((4, 4), torch.device("cpu"), torch.float32)  # cached
    if getattr(trunk, "rope", None) is not None:
        torch.testing.assert_close(enc._tower.rope_embed((4, 4), torch.device("cpu")), trunk.rope.get_embed(),
                                   atol=0, rtol=0)


def test_map_value_path_equals_the_pooling_head_on_one_token_sequences():
    """SigLIP's per-patch path is what timm's own MAP head returns for a sequence of one
    token (its attention over a single key is 1)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = _perturb(build_clip("sparseclip-tiny-siglip", "none"), 2)
    enc = DenseCLIPEncoder(model.visual)
    images = _images(H=48, W=64)
    trunk = model.visual.trunk
    with torch.no_grad():
        tokens, (h, w), _ = enc.forward_tokens(images)
        per_token = trunk.attn_pool(tokens.reshape(-1, 1, tokens.shape[-1]))  # (B*h*w, D)
        want = per_token.reshape(2, h, w, -1).permute(0, 3, 1, 2)
        torch.testing.assert_close(enc(images), want, atol=1e-5, rtol=1e-5)
        # the alternative path skips the head's residual MLP
        enc2 = DenseCLIPEncoder(model.visual, attn_pool_dense="value_no_mlp")
        pool = trunk.attn_pool
        v = F.linear(tokens, pool.kv.weight, pool.kv.bias)[..., tokens.shape[-1]:]
        want2 = F.linear(v, pool.proj.weight, pool.proj.bias).reshape(2, h, w, -1).permute(0, 3, 1, 2)
        torch.testing.assert_close(enc2(images), want2, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="unknown attn_pool_dense 'keys'; valid: value, value_no_mlp"):
        DenseCLIPEncoder(model.visual, attn_pool_dense="keys")


# ---------------------------------------------------------------- float64 reference
def _ln(x, m):
    if isinstance(m, torch.nn.Identity):
        return x
    return F.layer_norm(x, m.normalized_shape, m.weight.double(), m.bias.double(), m.eps)


def _lin(x, m):
    return F.linear(x, m.weight.double(), None if m.bias is None else m.bias.double())


def _rope(x, emb):
    """timm's interleaved rotary embedding by hand: pairs (x0, x1) -> (x0 cos - x1 sin, x1 cos + x0 sin)."""
    sin, cos = emb.double().chunk(2, -1)
    rot = torch.stack([-x[..., 1::2], x[..., ::2]], -1).reshape(x.shape)
    return x * cos + rot * sin


def _normalise(s, normalizer, alpha):
    if normalizer == "softmax":
        return torch.softmax(s, -1)
    if normalizer == "entmax":
        return entmax_pkg.entmax_bisect(s, alpha, dim=-1, n_iter=100)
    if normalizer == "sparsemax":
        return entmax_pkg.sparsemax(s, dim=-1)
    raise AssertionError(normalizer)


def _gaussian_prior(h, w, std, P):
    r = torch.tensor([i // w for i in range(h * w)], dtype=torch.float64)
    c = torch.tensor([i % w for i in range(h * w)], dtype=torch.float64)
    g = torch.exp(-((r[:, None] - r[None]) ** 2 + (c[:, None] - c[None]) ** 2) / (2 * std * std))
    out = torch.zeros(P + h * w, P + h * w, dtype=torch.float64)
    out[P:, P:] = g
    return out


def _ref_block(kind, blk, x, rope, P, source, normalizer, alpha, temperature, prior, residual, ffn,
               sum_mode="normalize_then_sum"):
    """One timm Block / EvaBlock by hand in float64 (blk is a float64 copy)."""
    B, L, C = x.shape
    attn = blk.attn
    nh = attn.num_heads
    post_norm = kind == "timm_eva" and not hasattr(blk, "gamma_1")  # EvaBlockPostNorm
    y = x if post_norm else _ln(x, blk.norm1)
    if attn.qkv is not None:
        w = attn.qkv.weight.double()
        b = attn.qkv.bias
        if getattr(attn, "q_bias", None) is not None:
            b = torch.cat([attn.q_bias, attn.k_bias, attn.v_bias])
        qkv = y @ w.T + (0 if b is None else b.double())
        q, k, v = qkv.chunk(3, -1)
    else:
        q, k, v = _lin(y, attn.q_proj), _lin(y, attn.k_proj), _lin(y, attn.v_proj)
    d = q.shape[-1] // nh
    q, k, v = (t.reshape(B, L, nh, d).permute(0, 2, 1, 3) for t in (q, k, v))
    q, k = attn.q_norm(q), attn.k_norm(k)
    if rope is not None:
        q = torch.cat([q[:, :, :P], _rope(q[:, :, P:], rope)], 2)
        k = torch.cat([k[:, :, :P], _rope(k[:, :, P:], rope)], 2)
    proj = {"q": q, "k": k, "v": v}
    if source == "identity":
        weights = torch.eye(L, dtype=torch.float64).expand(B, nh, L, L)
    else:
        scores = []
        for term in source.split("+"):
            a, c = proj[term[0]], proj[term[1]]
            scores.append(a @ c.transpose(-1, -2))
        if sum_mode == "sum_then_normalize":
            scores = [sum(scores)]
        weights = 0
        for s in scores:
            s = s / math.sqrt(d) / temperature
            if prior is not None:
                s = s + prior
            weights = weights + _normalise(s, normalizer, alpha)
    o = (weights @ v).permute(0, 2, 1, 3).reshape(B, L, nh * d)
    o = _lin(_ln(o, attn.norm), attn.proj)
    if kind == "timm_vit":
        o = blk.ls1(o)
    elif post_norm:
        o = _ln(o, blk.norm1)
    elif blk.gamma_1 is not None:
        o = blk.gamma_1.double() * o
    x = x + o if residual else o
    if ffn:
        m = blk.mlp(x if post_norm else _ln(x, blk.norm2))  # the FFN module itself (float64 copy)
        if post_norm:
            m = _ln(m, blk.norm2)
        elif kind == "timm_vit":
            m = blk.ls2(m)
        elif blk.gamma_2 is not None:
            m = blk.gamma_2.double() * m
        x = x + m
    return x, weights


def _reference(name, enc, model, images, spec):
    kind = enc.tower_kind
    visual = copy.deepcopy(model.visual).double()
    trunk = visual.trunk
    B, _, H, W = images.shape
    h, w = H // 16, W // 16
    P = enc.num_prefix_tokens
    images = images.double()
    # embedding: timm's own dynamic-size trunk (checked against timm above), float64
    dyn = _dynamic_trunk(model.visual.trunk, _timm_name(name)).double()
    x = dyn.patch_embed(images)
    x = dyn._pos_embed(x)
    rope = None
    if isinstance(x, tuple):
        x, rope = x
    x = dyn.norm_pre(x)
    depth = len(trunk.blocks)
    weights = None
    for i, blk in enumerate(trunk.blocks):
        last = i == depth - 1
        if i < depth - spec.num_layers:
            with torch.no_grad():
                x = blk(x) if rope is None else blk(x, rope=rope)
            continue
        prior = _gaussian_prior(h, w, spec.prior_std, P) if (last and spec.prior == "gaussian") else None
        x, weights = _ref_block(kind, blk, x, rope, P, spec.source if last else "qk", spec.normalizer,
                                spec.alpha, spec.temperature, prior,
                                spec.residual if last else True, spec.ffn if last else True, spec.sum_mode)
    x = _ln(x, trunk.norm)[:, P:]
    if trunk.attn_pool is not None:  # MAP head: value path by hand, then the head's residual MLP
        pool = trunk.attn_pool
        v = _lin(x, pool.kv)[..., x.shape[-1]:]
        x = _lin(v, pool.proj)
        x = x + pool.mlp(_ln(x, pool.norm))
    x = _ln(x, trunk.fc_norm)
    if not isinstance(trunk.head, torch.nn.Identity):
        x = _lin(x, trunk.head)
    x = visual.head(x)
    return x.reshape(B, h, w, -1).permute(0, 3, 1, 2), weights


SPECS = [
    AttentionSpec(),
    AttentionSpec(normalizer="entmax", alpha=1.2),
    AttentionSpec(source="qq", normalizer="entmax", alpha=1.2),
    AttentionSpec(source="kk", normalizer="entmax", alpha=1.5, num_layers=2),
    AttentionSpec.preset("sclip"),
    AttentionSpec.preset("clearclip"),
    AttentionSpec.preset("naclip", prior_std=1.5),
    AttentionSpec.preset("maskclip"),
    AttentionSpec(source="qq+kk+vv", normalizer="sparsemax", sum_mode="sum_then_normalize"),
    AttentionSpec(source="qk", normalizer="softmax", temperature=0.5, residual=True, ffn=False),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.source}-{s.normalizer}-{s.num_layers}-{s.prior}"
                         f"-{int(s.residual)}{int(s.ffn)}-{s.temperature}")
def test_modified_variants_match_float64_reference(timm_clip, spec):
    name, model = timm_clip
    enc = DenseCLIPEncoder(model.visual, spec)
    images = _images(H=48, W=80, seed=5)
    with torch.no_grad():
        feats, attn = enc(images, return_attention=True)
        ref, ref_w = _reference(name, enc, model, images, spec)
    torch.testing.assert_close(attn.double(), ref_w, atol=2e-4, rtol=1e-3)  # weights in [0, 1]
    # float32 against float64: tolerance relative to the feature scale (perturbed weights give
    # large activations in the tiny PE tower)
    torch.testing.assert_close(feats.double(), ref, atol=2e-5 * float(ref.abs().max()), rtol=1e-4)


def test_entmax_is_sparse_on_timm_towers(timm_clip):
    _, model = timm_clip
    enc = DenseCLIPEncoder(model.visual, AttentionSpec(source="qq", normalizer="entmax", alpha=1.5))
    with torch.no_grad():
        _, attn = enc(_images(), return_attention=True)
    assert (attn == 0).float().mean() > 0.2


def test_bfloat16_timm_tower_is_finite(timm_clip):
    name, _ = timm_clip
    model = _perturb(build_clip(name, "none", precision="bf16"), 1)
    enc = DenseCLIPEncoder(model.visual, AttentionSpec(normalizer="entmax", alpha=1.2))
    with torch.no_grad():
        feats, attn = enc(_images(), return_attention=True)
    assert feats.dtype == torch.bfloat16 and attn.dtype == torch.float32
    assert torch.isfinite(feats.float()).all() and torch.isfinite(attn).all()


# ---------------------------------------------------------------- real architectures (meta device)
_TINY_TEXT = {"context_length": 8, "vocab_size": 16, "width": 8, "heads": 1, "layers": 1}


@pytest.mark.parametrize("name, kind, P, D, p", [
    ("ViT-B-16-SigLIP", "timm_vit", 0, 768, 16),
    ("ViT-B-16-SigLIP2", "timm_vit", 0, 768, 16),
    ("EVA02-B-16", "timm_eva", 1, 512, 16),
    ("PE-Core-B-16", "timm_eva", 1, 1024, 16),
    ("MobileCLIP-B", "timm_vit", 1, 512, 16),
    ("ViT-B-16", "open_clip_vit", 1, 512, 16),
    ("EVA02-E-14", "timm_eva", 1, 1024, 14),
])
def test_real_architecture_shapes_on_meta_device(name, kind, P, D, p):
    with torch.device("meta"):
        model = open_clip.create_model(name, pretrained=None, device="meta", text_cfg=_TINY_TEXT)
        enc = DenseCLIPEncoder(model.visual, AttentionSpec(source="qq", num_layers=2))
        feats, attn = enc(torch.empty(2, 3, 14 * p, 20 * p), return_attention=True)
    assert (enc.tower_kind, enc.num_prefix_tokens, enc.embed_dim, enc.patch_size) == (kind, P, D, p)
    assert feats.shape == (2, D, 14, 20)
    assert attn.shape == (2, enc.num_heads, P + 280, P + 280)


@pytest.mark.parametrize("name, why", [
    ("RN50", "convolutional tower"),
    ("convnext_base", "ConvNeXt: convolutional"),
    ("MobileCLIP-S1", "FastVit: convolutional"),
    ("vit_relpos_medium_patch16_cls_224", "VisionTransformerRelPos"),
])
def test_unsupported_real_towers_name_the_reason(name, why):
    with torch.device("meta"):
        model = open_clip.create_model(name, pretrained=None, device="meta", text_cfg=_TINY_TEXT)
    assert check_tower(model.visual)[0] is None
    with pytest.raises((TypeError, ValueError), match=why):
        DenseCLIPEncoder(model.visual)


# ---------------------------------------------------------------- text side and META_ARCH
def test_siglip_tokenizer_missing_transformers_is_a_clear_error(monkeypatch):
    import sys

    from sparseclip_d2.clip import get_tokenizer

    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    with pytest.raises(RuntimeError, match=r"ViT-B-16-SigLIP.*timm/ViT-B-16-SigLIP.*'transformers'.*TEXT.TOKENIZER"):
        get_tokenizer("ViT-B-16-SigLIP")
    tok = get_tokenizer("ViT-B-16-SigLIP", random_weights=True)  # smoke-run fallback, warned
    ids = tok(["a photo of a dog.", "an airplane"])
    assert ids.shape == (2, 64) and int(ids.max()) < 32000 and int(ids.min()) >= 0
    with pytest.raises(FileNotFoundError, match="MODEL.SPARSECLIP.TEXT.TOKENIZER '/no/such/dir' is not a directory"):
        get_tokenizer("ViT-B-16-SigLIP", "/no/such/dir")
    assert get_tokenizer("EVA02-B-16")(["a dog"]).shape == (1, 77)  # EVA-CLIP: CLIP BPE, no download


@pytest.mark.parametrize("name", ["sparseclip-tiny-siglip", "sparseclip-tiny-eva02"])
@pytest.mark.parametrize("sliding", [False, True])
def test_meta_arch_runs_on_timm_towers(name, sliding):
    from conftest import tiny_cfg

    from sparseclip_d2.modeling.meta_arch import SparseCLIP

    cfg = tiny_cfg(**{"MODEL.SPARSECLIP.CLIP.NAME": name, "MODEL.SPARSECLIP.ATTENTION.SOURCE": "qq",
                      "MODEL.SPARSECLIP.ATTENTION.NORMALIZER": "entmax", "MODEL.SPARSECLIP.LOGIT_SCALE": 0.0,
                      "TEST.SLIDING_WINDOW.ENABLED": sliding, "TEST.SLIDING_WINDOW.CROP_SIZE": 64,
                      "TEST.SLIDING_WINDOW.STRIDE": 32, "MODEL.SPARSECLIP.CLIP.ATTN_POOL_DENSE": "value_no_mlp"})
    torch.manual_seed(0)
    model = SparseCLIP(**SparseCLIP.from_config(cfg))
    assert model.logit_scale == pytest.approx(float(model.clip_model.logit_scale.exp()))
    assert model.encoder.attn_pool_dense == "value_no_mlp"
    image = torch.randint(0, 255, (3, 80, 112), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    out = model([{"image": image, "height": 40, "width": 56, "vocabulary": ["cat", "dog, puppy", "sky"]}])
    scores = out[0]["sem_seg"]
    assert scores.shape == (3, 40, 56) and torch.isfinite(scores).all()
