"""Trident (sparseclip_d2/methods/trident/encoder.py; YuHengsss/Trident @ a93b346) against float64
computations written by hand: the joint-mean proxy scores, the window splice, SAM's
thresholded aggregation, SAM's last global attention (SAM package layout loaded into timm's
SAM), SAM's input, the geometry, the whole encoder with entmax 1.2, and the config keys."""
import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sparseclip_d2.attention import NORMALIZER_REGISTRY
from sparseclip_d2.clip import AttentionSpec
from sparseclip_d2.proxy import ProxyOptions, build_proxy, proxy_cosine_scores, to_proxy_input
from sparseclip_d2.methods.trident.encoder import (GLOBAL_AGGREGATION_REGISTRY, WINDOW_SPLICE_REGISTRY, TridentEncoder,
                                         TridentSettings, joint_proxy_scores, overlap_mean, sam_input,
                                         sam_last_attention, sam_threshold, trident_resize, trident_windows)

from conftest import build_tiny_clip, tiny_cfg
from test_entmax import entmax_bisect_reference  # noqa: E402  (float64 bisection, independent of the kernel)
from test_proxyclip import bilinear_reference  # noqa: E402  (point-by-point bilinear, align_corners=False)

DINO16 = "sparseclip_tiny_mae"  # the vit_base_patch16_224 architecture (as timm's .dino) at 32 px, CLS
SAM = "sparseclip_tiny_samvit"  # samvit_base_patch16 at 128 px: 8 x 8, block 1 global


def _build(name, seed=0, **kw):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build_proxy(ProxyOptions(name=name, **kw))


def _sam(seed=3, **kw):
    sam = _build(SAM, seed, pos_embed_interp="size", **kw)
    with torch.no_grad():  # random relative positions (timm initialises them to zero)
        g = torch.Generator().manual_seed(seed)
        for p in (sam.model.blocks[-1].attn.rel_pos_h, sam.model.blocks[-1].attn.rel_pos_w):
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return sam


@pytest.fixture(scope="module")
def clip():
    return build_tiny_clip(0)


# ------------------------------------------------------------------ parts, by hand
def test_joint_proxy_scores_take_one_mean_over_all_windows():
    feats = torch.randn(3, 5, 2, 3, generator=torch.Generator().manual_seed(0))
    f = feats.double().reshape(3, 5, 6)
    sims = []
    for b in range(3):
        s = torch.zeros(6, 6, dtype=torch.float64)
        for i in range(6):
            for j in range(6):
                s[i, j] = float(f[b, :, i] @ f[b, :, j]) / (float(f[b, :, i].norm()) * float(f[b, :, j].norm()))
        sims.append(s)
    mean = sum(float(s.sum()) for s in sims) / (3 * 36)
    ours = joint_proxy_scores(feats, 0.4, 2.5)
    for b in range(3):
        ref = (sims[b] - 0.4 * mean) * 2.5
        ref = torch.where(ref < 0, torch.full_like(ref, float("-inf")), ref)
        assert torch.equal(torch.isneginf(ours[b]), torch.isneginf(ref))
        keep = ~torch.isneginf(ref)
        torch.testing.assert_close(ours[b].double()[keep], ref[keep], rtol=0, atol=1e-5)
    # ProxyCLIP's per-window mean gives other scores: the joint mean is a real difference
    assert not torch.allclose(ours, proxy_cosine_scores(feats, 0.4, 2.5), atol=1e-3)


def test_overlap_mean_averages_each_cell_over_its_windows():
    g = torch.Generator().manual_seed(1)
    tok = torch.randn(4, 2, 2, 3, generator=g)
    boxes = [(0, 0, 2, 3), (0, 2, 2, 5), (1, 0, 3, 3), (1, 2, 3, 5)]
    ours = overlap_mean(tok, boxes, (3, 5))
    ref = torch.zeros(2, 3, 5, dtype=torch.float64)
    for c in range(2):
        for y in range(3):
            for x in range(5):
                vals = [float(tok[i, c, y - b[0], x - b[1]]) for i, b in enumerate(boxes)
                        if b[0] <= y < b[2] and b[1] <= x < b[3]]
                ref[c, y, x] = sum(vals) / len(vals)
    torch.testing.assert_close(ours.double(), ref, rtol=0, atol=1e-6)
    assert WINDOW_SPLICE_REGISTRY.get("overlap_mean") is overlap_mean
    with pytest.raises(ValueError, match="uncovered"):
        overlap_mean(tok[:2], boxes[:2], (3, 5))
    with pytest.raises(ValueError, match=r"does not hold a 2x3 window"):
        overlap_mean(tok, [(0, 0, 2, 3), (0, 2, 2, 5), (1, 0, 3, 3), (2, 2, 4, 5)], (3, 5))


def sam_threshold_reference(attn, v, cos_fac, refine_neg_cos):
    """Trident's get_sam_sim in float64, as upstream writes it: (heads, N, N) similarities, the
    mean over heads then keys, 0.6 for negatives (refine_neg_cos False), 0.9 cap, mask, head mean,
    row sums."""
    vn = F.normalize(v.double(), dim=-1)[None]  # (1, heads, N, d)
    sim = torch.einsum("bhmc,bhnc->bhmn", vn, vn)
    thr = cos_fac * sim.mean(dim=1, keepdim=True).mean(dim=-1, keepdim=True)
    if not refine_neg_cos:
        thr = torch.where(thr < 0.0, torch.tensor(0.6, dtype=torch.float64), thr)
    thr = torch.where(thr > 0.9, torch.tensor(0.9, dtype=torch.float64), thr)
    kept = torch.where(sim > thr, attn.double()[None], torch.zeros((), dtype=torch.float64)).mean(dim=1)
    return (kept / kept.sum(dim=-1, keepdim=True))[0]


@pytest.mark.parametrize("cos_fac,refine", [(1.2, True), (3.0, False), (-2.0, False), (-2.0, True), (0.0, True)])
def test_sam_threshold_matches_upstreams_formula_in_float64(cos_fac, refine):
    g = torch.Generator().manual_seed(2)
    v = torch.randn(4, 12, 5, generator=g) + 0.3
    attn = torch.softmax(torch.randn(4, 12, 12, generator=g) * 2, dim=-1)
    ref = sam_threshold_reference(attn, v, cos_fac, refine)
    ours = sam_threshold(attn, v, cos_fac=cos_fac, refine_neg_cos=refine)
    torch.testing.assert_close(ours.double(), ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(sam_threshold(iter(attn.unbind(0)), v, cos_fac=cos_fac, refine_neg_cos=refine), ours)
    assert GLOBAL_AGGREGATION_REGISTRY.get("sam_threshold") is sam_threshold
    if cos_fac == 1.2:
        assert bool((ours == 0).any()) and bool((ours > 0).any())  # the threshold cuts entries
    with pytest.raises(ValueError, match="3 heads of attention for 4 heads"):
        sam_threshold(attn[:3], v)


def test_trident_resize_and_windows_known_answers():
    x = torch.randn(1, 3, 70, 100)
    assert tuple(trident_resize(x, 16, 48).shape[-2:]) == (80, 112)  # 100 -> 112; int(70 * 1.12) = 78 -> 80
    assert tuple(trident_resize(torch.randn(1, 3, 20, 30), 16, 48).shape[-2:]) == (48, 48)  # at least the crop
    assert trident_resize(x[..., :64, :96], 16, 336) is not None
    same = x[..., :64, :96]
    assert trident_resize(same, 16, 336) is same  # multiples of 16 stay, even below the crop
    assert trident_windows(80, 112, 48, 32) == [(0, 0, 48, 48), (0, 32, 48, 80), (0, 64, 48, 112),
                                                (32, 0, 80, 48), (32, 32, 80, 80), (32, 64, 80, 112)]
    assert trident_windows(32, 40, 48, 32) == [(0, 0, 32, 40)]


def test_sam_input_is_upstreams_cv2_then_pil_recipe_bit_for_bit():
    """SAM's input against upstream's recipe written here with cv2 / PIL / numpy (Trident a93b346
    trident.py get_trident_seg: the uint8 image, cv2.resize to multiples of 16 with INTER_LINEAR;
    segment_anything/utils/transforms.py ResizeLongestSide.apply_image: int(x * scale + 0.5) and
    PIL's bilinear Image.resize, uint8; modeling/sam.py preprocess: (x - mean) / std in float32,
    zero padding bottom / right): equal bit for bit, from an RGB that is not exactly integer (an
    image that went through a float normalisation and back)."""
    import cv2
    from PIL import Image

    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, size=(40, 57, 3), dtype=np.uint8)
    wobble = torch.from_numpy(rng.uniform(-0.3, 0.3, size=(3, 40, 57))).float()
    x, valid = sam_input(torch.from_numpy(img).permute(2, 0, 1).float() + wobble, side=128, patch=16)
    step1 = cv2.resize(img, (64, 48), interpolation=cv2.INTER_LINEAR)  # multiples of 16, uint8
    nh, nw = int(48 * (128 * 1.0 / 64) + 0.5), int(64 * (128 * 1.0 / 64) + 0.5)
    step2 = np.asarray(Image.fromarray(step1).resize((nw, nh), Image.BILINEAR))  # uint8
    assert step2.dtype == np.uint8
    mean = np.array([123.675, 116.28, 103.53], dtype=np.float32)
    std = np.array([58.395, 57.12, 57.375], dtype=np.float32)
    ref = np.zeros((3, 128, 128), dtype=np.float32)
    ref[:, :nh, :nw] = ((step2.astype(np.float32) - mean) / std).transpose(2, 0, 1)
    assert valid == (nh // 16, nw // 16) == (6, 8) and tuple(x.shape) == (1, 3, 128, 128)
    assert x.dtype == torch.float32
    assert np.array_equal(x[0].numpy(), ref)
    # the first resize is a real one: a torch bilinear resize of the same image differs
    torch_step1 = F.interpolate(torch.from_numpy(img).permute(2, 0, 1)[None].double(), (48, 64), mode="bilinear",
                                align_corners=False).round()[0].permute(1, 2, 0).numpy()
    assert (torch_step1 != step1).any()

    # an image already at multiples of 16 (cv2 copies it) and the longest side already 'side'
    img2 = rng.integers(0, 256, size=(64, 128, 3), dtype=np.uint8)
    x2, valid2 = sam_input(torch.from_numpy(img2).permute(2, 0, 1).float(), side=128, patch=16)
    ref2 = np.zeros((3, 128, 128), dtype=np.float32)
    ref2[:, :64] = ((img2.astype(np.float32) - mean) / std).transpose(2, 0, 1)
    assert valid2 == (4, 8) and np.array_equal(x2[0].numpy(), ref2)


def rel_pos_bias_reference(q, rel_h, rel_w, H, W):
    """SAM's add_decomposed_rel_pos for equal query / key grids by loops: bias[(i, j), (k, l)] =
    q[(i, j)] . rel_h[i - k + H - 1] + q[(i, j)] . rel_w[j - l + W - 1]."""
    n = H * W
    b = torch.zeros(n, n, dtype=torch.float64)
    for i in range(H):
        for j in range(W):
            qi = q[i * W + j]
            for k in range(H):
                for m in range(W):
                    b[i * W + j, k * W + m] = float(qi @ rel_h[i - k + H - 1]) + float(qi @ rel_w[j - m + W - 1])
    return b


def test_sam_layer_norms_use_sams_eps():
    """Every LayerNorm of the project's SAM has SAM's eps 1e-6 (segment_anything/build_sam.py
    norm_layer=partial(torch.nn.LayerNorm, eps=1e-6), Trident a93b346; timm's VisionTransformerSAM
    builds eps 1e-5 unless told): on tokens of variance ~1e-6, where the eps matters, norm1 equals
    the layer norm written here in float64 with eps 1e-6, and not the one with 1e-5."""
    sam = _sam(seed=3)
    norms = [m for m in sam.model.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert len(norms) >= 5 and all(m.eps == 1e-6 for m in norms)
    blk = sam.model.blocks[0]
    t = torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(4)).double() * 1e-3
    with torch.no_grad():
        w = torch.randn(64, generator=torch.Generator().manual_seed(5)).double()
        blk.norm1.weight.copy_(w.float())
        got = blk.norm1(t.float()).double()

    def layer_norm(x, eps):
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + eps) * blk.norm1.weight.double() + blk.norm1.bias.double()
    torch.testing.assert_close(got, layer_norm(t, 1e-6), rtol=0, atol=1e-4)
    assert float((got - layer_norm(t, 1e-5)).abs().max()) > 0.1


def sam_attention_reference(sam, x, valid):
    """The last block of SAM's image encoder as the SAM package's Attention.forward computes it,
    in float64 (timm's earlier blocks), cropped to the valid grid: ((heads, n, n), (heads, n, d))."""
    import copy

    m = copy.deepcopy(sam.model).double()
    with torch.no_grad():
        t = m.patch_embed(x.double()) + m.pos_embed
        for b in m.blocks[:-1]:
            t = b(t)
        blk = m.blocks[-1]
        y = blk.norm1(t)[0]
        H, W, C = y.shape
        heads = blk.attn.num_heads
        qkv = y.reshape(H * W, C) @ blk.attn.qkv.weight.T + blk.attn.qkv.bias
        q, k, v = qkv.reshape(H * W, 3, heads, C // heads).permute(1, 2, 0, 3)
        idx = [i * W + j for i in range(valid[0]) for j in range(valid[1])]
        attn = []
        for h in range(heads):
            s = (q[h] * (C // heads) ** -0.5) @ k[h].T + rel_pos_bias_reference(
                q[h], blk.attn.rel_pos_h, blk.attn.rel_pos_w, H, W)
            attn.append(torch.softmax(s, dim=-1)[idx][:, idx])
        return torch.stack(attn), v[:, idx]


def test_sam_package_layout_loads_and_last_attention_matches_float64(tmp_path):
    """One state dict in the SAM package's layout (``image_encoder.*``, ``mlp.lin1`` / ``lin2``, the
    prompt encoder and mask decoder beside it) loads into timm's SAM as the same tensors; the last
    block's attention and values :func:`sam_last_attention` gives match the SAM package's
    computation written in float64."""
    src = _sam(seed=3)
    sd = {f"image_encoder.{k.replace('mlp.fc', 'mlp.lin')}": v for k, v in src.model.state_dict().items()}
    assert any(".mlp.lin1." in k for k in sd)
    sd["prompt_encoder.pe_layer.positional_encoding_gaussian_matrix"] = torch.randn(2, 128)
    sd["mask_decoder.iou_token.weight"] = torch.randn(1, 256)
    path = tmp_path / "sam_package_layout.pth"
    torch.save(sd, path)
    sam = build_proxy(ProxyOptions(name=SAM, weights=str(path), pos_embed_interp="size"))
    loaded = sam.model.state_dict()
    assert set(loaded) == set(src.model.state_dict())
    assert all(torch.equal(loaded[k], v) for k, v in src.model.state_dict().items())
    x = torch.randn(1, 3, 128, 128, generator=torch.Generator().manual_seed(4))
    attn, v = sam_last_attention(sam, x, (6, 7))
    attn = torch.stack(list(attn))
    ref_attn, ref_v = sam_attention_reference(sam, x, (6, 7))
    torch.testing.assert_close(v.double(), ref_v, rtol=0, atol=1e-5)
    torch.testing.assert_close(attn.double(), ref_attn, rtol=0, atol=1e-6)
    assert float(attn.sum(-1).max()) < 1 - 1e-3  # softmax over the padded grid, then cropped (not renormalised)


# ------------------------------------------------------------------ the whole encoder
def test_trident_encoder_with_entmax_matches_float64_composition(clip):
    """NORMALIZER entmax 1.2 on the window attention (upstream: softmax), against float64 by hand:
    a 40 x 56 image resized to 48 x 64, six 32 px windows (stride 16; CLIP and DINO B/16 2 x 2 each),
    one score mean over the windows, out_proj, the splice on the 3 x 4 grid, bilinear to SAM's
    6 x 8 grid, SAM's thresholded aggregation, ln_post and proj."""
    dino, sam = _build(DINO16, 1), _sam(seed=5)
    settings = TridentSettings(cos_fac=1.2, crop_size=32, stride=16)
    enc = TridentEncoder(clip.visual, AttentionSpec(normalizer="entmax", alpha=1.2, residual=False, ffn=False),
                         dino, sam=sam, settings=settings, pos_embed_interp="scale_factor")
    img = torch.randn(1, 3, 40, 56, generator=torch.Generator().manual_seed(6)) * 0.5
    with torch.no_grad():
        ours = enc(img)
    assert tuple(ours.shape) == (1, clip.visual.proj.shape[1], 6, 8) and enc.patch_size == 1

    import copy

    v64 = copy.deepcopy(clip.visual).double()
    rs = bilinear_reference(img[0].permute(1, 2, 0).double(), 48, 64).permute(2, 0, 1)  # (3, 48, 64)
    boxes = [(y, x) for y in (0, 16) for x in (0, 16, 32)]
    crops = torch.stack([rs[:, y:y + 32, x:x + 32] for y, x in boxes])
    pos = enc.positional_embedding((2, 2), "cpu", torch.float32).double()
    mean, std = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
    px = ((crops * torch.tensor(std).view(3, 1, 1) + torch.tensor(mean).view(3, 1, 1))
          - torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)) / torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
    with torch.no_grad():
        pf = dino.model.forward_features(px.float())[:, 1:].double()  # (6, 4, C') timm's own forward, 32 px native
        t = v64.conv1(crops).flatten(2).transpose(1, 2)
        t = torch.cat([v64.class_embedding.view(1, 1, -1).expand(6, 1, -1), t], 1) + pos
        t = v64.ln_pre(t)
        for blk in v64.transformer.resblocks[:-1]:
            t = blk(t)
        blk = v64.transformer.resblocks[-1]
        y = blk.ln_1(t)[:, 1:]
        C = y.shape[-1]
        v = y @ blk.attn.in_proj_weight[2 * C:].T + blk.attn.in_proj_bias[2 * C:]  # (6, 4, C)
    fn = F.normalize(pf, dim=-1)
    sims = fn @ fn.transpose(1, 2)
    s = (sims - 1.2 * sims.mean()) * 3.0
    s = torch.where(s < 0, torch.full_like(s, float("-inf")), s)
    w = torch.stack([entmax_bisect_reference(s[i], 1.2) for i in range(6)])
    o = (w @ v) @ blk.attn.out_proj.weight.T + blk.attn.out_proj.bias  # heads share the weights
    dst = torch.zeros(3, 4, C, dtype=torch.float64)
    cnt = torch.zeros(3, 4, 1, dtype=torch.float64)
    for i, (yy, xx) in enumerate(boxes):
        dst[yy // 16:yy // 16 + 2, xx // 16:xx // 16 + 2] += o[i].reshape(2, 2, C)
        cnt[yy // 16:yy // 16 + 2, xx // 16:xx // 16 + 2] += 1
    dst = bilinear_reference(dst / cnt, 6, 8).reshape(48, C)
    rgb = (img[0] * torch.tensor(std).view(3, 1, 1) + torch.tensor(mean).view(3, 1, 1)) * 255.0
    x_sam, valid = sam_input(rgb, 128, 16)
    assert valid == (6, 8)
    a_ref, v_ref = sam_attention_reference(sam, x_sam, valid)
    out = sam_threshold_reference(a_ref, v_ref, 1.2, True) @ dst
    ref = v64.ln_post(out) @ v64.proj  # (48, D)
    torch.testing.assert_close(ours[0].double(), ref.T.reshape(-1, 6, 8), rtol=0, atol=1e-4)
    assert bool((w == 0).any()), "entmax 1.2 on the joint proxy scores gave no exact zeros"


@pytest.mark.parametrize("normalizer", sorted(n for n, _ in NORMALIZER_REGISTRY))
def test_every_normaliser_composes_with_the_joint_proxy_scores(clip, normalizer):
    """Window weights of every registered normaliser: rows sum to 1, entries the joint cut masked
    (-inf) get exactly 0, and the whole encoder stays finite."""
    dino, sam = _build(DINO16, 1), _sam(seed=5)
    enc = TridentEncoder(clip.visual, AttentionSpec(normalizer=normalizer, residual=False, ffn=False), dino, sam=sam,
                         settings=TridentSettings(crop_size=32, stride=16), pos_embed_interp="scale_factor")
    crops = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(10)) * 0.5
    with torch.no_grad():
        w, grid = enc.proxy_weights(crops)
        masked = torch.isneginf(joint_proxy_scores(dino(to_proxy_input(crops, enc.image_mean, enc.image_std, dino,
                                                                       (32, 32)))))
        feats = enc(torch.randn(1, 3, 40, 56, generator=torch.Generator().manual_seed(11)) * 0.5)
    assert grid == (2, 2)
    torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)), rtol=0, atol=1e-5)
    assert bool(masked.any()) and bool((w[masked] == 0).all())
    assert bool(torch.isfinite(feats).all())


def test_sam_tiles_split_the_image_and_the_spliced_map(clip):
    """SAM_TILES 2 (upstream's Cityscapes case): each half of the image gets its own SAM pass and
    aggregation on its own grid; the outputs sit side by side."""
    dino, sam = _build(DINO16, 1), _sam(seed=5)
    enc = TridentEncoder(clip.visual, AttentionSpec(residual=False, ffn=False), dino, sam=sam,
                         settings=TridentSettings(crop_size=32, stride=16, sam_tiles=2), pos_embed_interp="scale_factor")
    img = torch.randn(1, 3, 48, 64, generator=torch.Generator().manual_seed(7)) * 0.5
    with torch.no_grad():
        dst = enc.spliced(img)  # (C, 3, 4)
        tokens, grid, _ = enc.forward_tokens(img)
        halves = []
        for half, sl in ((img[..., :32], slice(0, 2)), (img[..., 32:], slice(2, 4))):
            one = TridentEncoder(clip.visual, AttentionSpec(residual=False, ffn=False), dino, sam=sam,
                                 settings=TridentSettings(crop_size=32, stride=16), pos_embed_interp="scale_factor")
            out, g = one.aggregate(dst[:, :, sl].contiguous(), half)
            halves.append(out.reshape(g[0], g[1], -1))
    assert grid == (8, 10)  # each 48 x 32 half: 128 x 85 at SAM's side -> 8 x 5
    ref = enc._tower.final_norm(torch.cat(halves, dim=1).reshape(1, -1, halves[0].shape[-1]))
    torch.testing.assert_close(tokens, ref, rtol=0, atol=1e-6)


# ------------------------------------------------------------------ config keys
def _model(**opts):
    from detectron2.modeling import build_model

    return build_model(tiny_cfg(**opts))


TRIDENT_ON = {"MODEL.SPARSECLIP.PROXY.NAME": DINO16, "MODEL.SPARSECLIP.PROXY.TRIDENT.ENABLED": "True",
              "MODEL.SPARSECLIP.PROXY.TRIDENT.SAM_NAME": SAM, "MODEL.SPARSECLIP.BLOCK.RESIDUAL": "False",
              "MODEL.SPARSECLIP.BLOCK.FFN": "False", "TEST.SLIDING_WINDOW.ENABLED": "False",
              "MODEL.SPARSECLIP.PROXY.TRIDENT.CROP_SIZE": "32", "MODEL.SPARSECLIP.PROXY.TRIDENT.STRIDE": "16"}


def test_trident_keys_take_effect_through_the_meta_arch(tmp_path):
    sam_file = tmp_path / "sam.pth"
    torch.save({f"image_encoder.{k.replace('mlp.fc', 'mlp.lin')}": v
                for k, v in _sam(seed=8).model.state_dict().items()}, sam_file)
    m = _model(**TRIDENT_ON, **{"MODEL.SPARSECLIP.PROXY.TRIDENT.COS_FAC": "3.0",
                                "MODEL.SPARSECLIP.PROXY.TRIDENT.REFINE_NEG_COS": "False",
                                "MODEL.SPARSECLIP.PROXY.TRIDENT.SAM_TILES": "2",
                                "MODEL.SPARSECLIP.PROXY.TRIDENT.SAM_WEIGHTS": str(sam_file),
                                "MODEL.SPARSECLIP.PROXY.TRIDENT.SAM_PRECISION": "bf16"})
    enc = m.encoder
    assert isinstance(enc, TridentEncoder) and m.random_weights
    assert enc.settings == TridentSettings(cos_fac=3.0, refine_neg_cos=False, crop_size=32, stride=16, sam_tiles=2)
    assert enc.sam.dtype == torch.bfloat16 and enc.sam.name == SAM
    assert torch.equal(enc.sam.model.blocks[0].attn.qkv.weight.float(),
                       _sam(seed=8).model.blocks[0].attn.qkv.weight.to(torch.bfloat16).float())
    image = (torch.rand(3, 40, 56, generator=torch.Generator().manual_seed(9)) * 255).to(torch.uint8)
    out = m([{"image": image, "vocabulary": ["cat", "dog", "sky"]}])[0]["sem_seg"]
    assert tuple(out.shape) == (3, 40, 56) and bool(torch.isfinite(out).all())


@pytest.mark.parametrize("opts,match", [
    ({"MODEL.SPARSECLIP.PROXY.TRIDENT.COS_FAC": "2.0"}, r"TRIDENT\.COS_FAC = 2\.0 changes nothing while "
                                                        r"MODEL\.SPARSECLIP\.PROXY\.TRIDENT\.ENABLED is False"),
    ({"MODEL.SPARSECLIP.PROXY.TRIDENT.ENABLED": "True"}, r"TRIDENT\.ENABLED = True changes nothing without a proxy"),
    (dict(TRIDENT_ON, **{"TEST.SLIDING_WINDOW.ENABLED": "True"}), r"TEST\.SLIDING_WINDOW\.ENABLED True with "
                                                                 r"MODEL\.SPARSECLIP\.PROXY\.TRIDENT\.ENABLED"),
    (dict(TRIDENT_ON, **{"MODEL.SPARSECLIP.PROXY.TRIDENT.SAM_WEIGHTS": "/no/such/sam.pth"}),
     r"TRIDENT\.SAM_WEIGHTS = '/no/such/sam\.pth': no such file \(/no/such/sam\.pth\)"),
    (dict(TRIDENT_ON, **{"MODEL.SPARSECLIP.PROXY.TRIDENT.SAM_NAME": "vit_base_patch16_224.dino"}),
     r"SAM_NAME = 'vit_base_patch16_224\.dino' is not a SAM image encoder; valid: samvit_base_patch16"),
    (dict(TRIDENT_ON, **{"MODEL.SPARSECLIP.PROXY.TRIDENT.SPLICE": "max"}),
     r"TRIDENT\.SPLICE = 'max' is not registered; valid: overlap_mean"),
    (dict(TRIDENT_ON, **{"MODEL.SPARSECLIP.PROXY.TRIDENT.AGGREGATION": "x"}),
     r"TRIDENT\.AGGREGATION = 'x' is not registered; valid: sam_threshold"),
    (dict(TRIDENT_ON, **{"MODEL.SPARSECLIP.PROXY.TRIDENT.STRIDE": "64"}), r"STRIDE = 64 is larger than"),
    (dict(TRIDENT_ON, **{"MODEL.SPARSECLIP.PROXY.TRIDENT.SAM_TILES": "0"}), r"SAM_TILES = 0 is invalid"),
    (dict(TRIDENT_ON, **{"MODEL.SPARSECLIP.PROXY.TRIDENT.SAM_PRECISION": "fp8"}), r"TRIDENT\.SAM_PRECISION = 'fp8' is invalid; valid: fp32, fp16, bf16"),
    (dict(TRIDENT_ON, **{"MODEL.SPARSECLIP.PROXY.FSA.ENABLED": "True"}), r"FSA\.ENABLED and .*TRIDENT\.ENABLED are two different last blocks"),
    (dict(TRIDENT_ON, **{"MODEL.SPARSECLIP.PROXY.INPUT_SIZE": "64"}), r"the proxy sees each sub-window as it is"),
])
def test_bad_trident_keys_are_refused_before_any_model_is_built(opts, match, monkeypatch):
    import sparseclip_d2.modeling.backbone as mb
    from sparseclip_d2.config import check_sparseclip_config

    def no_build(cfg):
        raise AssertionError("a model was built before the config was checked")

    monkeypatch.setattr(mb, "build_clip_from_config", no_build)
    with pytest.raises((ValueError, FileNotFoundError), match=match):
        check_sparseclip_config(tiny_cfg(**opts))


def test_trident_configs_select_upstreams_values():
    """configs/baselines/trident_b16*.yaml: Trident's protocol (YuHengsss/Trident @ a93b346
    configs/base_config.py and cfg_*.py), each accepted by the checks run before any model is built."""
    import glob

    from sparseclip_d2.config import check_sparseclip_config

    from conftest import baseline_cfg

    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "baselines")
    got = {}
    for path in sorted(glob.glob(os.path.join(root, "trident_b16*.yaml"))):
        cfg = baseline_cfg(path)
        check_sparseclip_config(cfg)
        sc, t = cfg.MODEL.SPARSECLIP, cfg.MODEL.SPARSECLIP.PROXY.TRIDENT
        assert (sc.ATTENTION.SOURCE, sc.ATTENTION.NORMALIZER, sc.BLOCK.RESIDUAL, sc.BLOCK.FFN) == (
            "qk", "softmax", False, False)
        assert (sc.PROXY.NAME, sc.PROXY.INPUT_SIZE, sc.PROXY.POS_EMBED_INTERP, sc.PROXY.BETA, sc.PROXY.GAMMA) == (
            "vit_base_patch16_224.dino", 0, "scale_factor", 1.2, 3.0)
        names = "" if path.endswith("_ade847.yaml") else "proxyclip"  # ade847: the project's names
        assert (sc.LOGIT_SCALE, sc.TEXT.TEMPLATES, sc.CLASS_NAMES, sc.PIXEL_NORM, sc.CLIP.POS_EMBED_INTERP) == (
            40.0, "openai_imagenet", names, "clip_mmseg", "scale_factor")
        assert (t.ENABLED, t.SAM_NAME, t.CROP_SIZE, cfg.TEST.SLIDING_WINDOW.ENABLED, cfg.INPUT.RESIZE_MODE) == (
            True, "samvit_base_patch16", 336, False, "mmseg")
        assert (sc.PROXY.PRECISION, sc.CLIP.PRECISION, t.SAM_PRECISION) == ("fp32", "fp32", "fp32")
        got[os.path.basename(path)[len("trident_b16"):-5] or "base"] = (
            tuple(cfg.DATASETS.TEST), sc.PROB_THRESHOLD, cfg.INPUT.MIN_SIZE_TEST, t.STRIDE, t.COS_FAC,
            t.REFINE_NEG_COS, t.SAM_TILES)
    assert got == {  # (datasets, prob_thd, Resize short side, slide_stride, cos_fac, refine_neg_cos, SAM tiles)
        "base": (("sparseclip_coco_stuff_val",), 0.0, 448, 224, 1.2, True, 1),  # cfg_coco_stuff164k.py
        "_voc21": (("sparseclip_voc21_val",), 0.2, 448, 224, 1.2, True, 1),
        "_voc20": (("sparseclip_voc20_val",), 0.0, 336, 112, 0.0, True, 1),
        "_context60": (("sparseclip_context60_val",), 0.15, 576, 224, 1.2, True, 1),
        "_context59": (("sparseclip_context59_val",), 0.0, 576, 224, 1.2, True, 1),
        "_coco_object": (("sparseclip_coco_object_val",), 0.25, 448, 224, 1.2, True, 1),
        "_ade20k": (("sparseclip_ade20k_val",), 0.0, 576, 224, 1.2, False, 1),
        "_ade847": (("sparseclip_ade847_val",), 0.0, 448, 224, 1.2, True, 1),  # cfg_ade847.py: base_config.py
        "_context459": (("sparseclip_context459_val",), 0.0, 448, 224, 1.2, True, 1),  # cfg_context459.py
        "_cityscapes": (("sparseclip_cityscapes_val",), 0.0, 688, 224, 3.0, False, 2),
    }


def test_sam_messages_name_the_trident_keys(tmp_path, caplog):
    """SAM's own keys are PROXY.TRIDENT.SAM_*: the random-weights warning and a weights file that
    does not fit name them (``key_name`` joins a ``_`` prefix without a dot)."""
    import logging

    from sparseclip_d2.proxy.second_backbone import key_name

    assert key_name("MODEL.SPARSECLIP.PROXY", "WEIGHTS") == "MODEL.SPARSECLIP.PROXY.WEIGHTS"
    assert key_name("MODEL.SPARSECLIP.PROXY.TRIDENT.SAM_", "WEIGHTS") == "MODEL.SPARSECLIP.PROXY.TRIDENT.SAM_WEIGHTS"
    with caplog.at_level(logging.WARNING, logger="sparseclip_d2"):
        _model(**TRIDENT_ON)
    assert "(MODEL.SPARSECLIP.PROXY.TRIDENT.SAM_WEIGHTS none) is built with random weights" in caplog.text
    wrong = tmp_path / "dino.pth"
    torch.save(_build(DINO16, 1).model.state_dict(), wrong)
    with pytest.raises(ValueError, match=r"^MODEL\.SPARSECLIP\.PROXY\.TRIDENT\.SAM_WEIGHTS = '.*dino\.pth' does not fit "
                                         r"sparseclip_tiny_samvit: missing keys \['blocks\.0\.attn\.rel_pos_h'"):
        _model(**TRIDENT_ON, **{"MODEL.SPARSECLIP.PROXY.TRIDENT.SAM_WEIGHTS": str(wrong)})
    sd = _sam(seed=8).model.state_dict()
    sd["neck.1.weight"] = torch.ones(sd["neck.1.weight"].numel() + 1)  # the same keys, one tensor of another shape
    torch.save(sd, wrong)
    with pytest.raises(ValueError, match=r"SAM_WEIGHTS = '.*dino\.pth' does not fit sparseclip_tiny_samvit: 1 tensors "
                                         r"of another shape, first neck\.1\.weight \((\d+),\) \(the model's \(\d+,\)\); "
                                         r"choose the MODEL\.SPARSECLIP\.PROXY\.TRIDENT\.SAM_NAME"):
        _model(**TRIDENT_ON, **{"MODEL.SPARSECLIP.PROXY.TRIDENT.SAM_WEIGHTS": str(wrong)})


def test_logits_stay_on_sams_grid_and_reach_the_output_size_in_one_resize():
    # trident.py get_trident_seg: logits on SAM's valid grid -> one F.interpolate(..., ori_shape, bilinear);
    # the generic loop resized to the working size first (two bilinear steps)
    import torch.nn.functional as F

    m = _model(**TRIDENT_ON).eval()
    assert [type(s).__name__ for s in m.stages] == ["TridentGridStage"]
    image = (torch.rand(3, 40, 56, generator=torch.Generator().manual_seed(9)) * 255).to(torch.uint8)
    x = {"image": image, "vocabulary": ["cat", "dog", "sky"], "height": 30, "width": 45}
    with torch.no_grad():
        inputs = m.image_inputs(x)
        grid = m.window_logits_fn(inputs)(inputs.image[None])[0]  # the head's logits on SAM's grid
        logits, _ = m.working_logits(inputs)
        scores = m.predict(x).score_maps.scores()
    assert torch.equal(logits, grid.float()) and tuple(grid.shape[-2:]) != (40, 56)
    one = F.interpolate(grid[None].double(), size=(30, 45), mode="bilinear", align_corners=False)[0]
    two = F.interpolate(F.interpolate(grid[None].double(), size=(40, 56), mode="bilinear", align_corners=False),
                        size=(30, 45), mode="bilinear", align_corners=False)[0]
    # the head's logits are scaled already: the scores are their softmax over the 3 classes (one synonym
    # each) after the one resize, in float32
    assert torch.allclose(scores.double(), one.softmax(0), atol=1e-6)
    assert not torch.allclose(one, two, atol=1e-6)
