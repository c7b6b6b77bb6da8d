"""The baselines' upstream conventions, each against a hand computation.

Position-embedding interpolation, MMSeg/cv2 resize, pixel normalisation, patch remainders,
MaskCLIP's last block (and its GELU / eps-1e-6 tower), PAMR, the 85 MaskCLIP templates and
the upstream class-name sets.
"""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_cfg

from sparseclip_d2.clip import (
    OPENAI_IMAGENET_TEMPLATES, AttentionSpec, DenseCLIPEncoder, TextClassifier, get_templates,
    interpolate_pos_embed, vision_tower_variant,
)
from sparseclip_d2.clip.templates import MASKCLIP_TEMPLATES
from sparseclip_d2.data.class_names import CLASS_NAME_SETS, available_class_name_files, load_class_names
from sparseclip_d2.data.mapper import (
    MMSegRescale, build_resize, mmseg_rescale_size, pixel_normalization,
)
from sparseclip_d2.dense.pamr import pamr, pamr_offsets
from sparseclip_d2.dense.windows import dense_logits


# ---------------------------------------------------------------- position embeddings
def _cubic_matrix(n_in, n_out, inv_scale):
    """(n_out, n_in) float64 weights of PyTorch's 1-D bicubic resize (A = -0.75, indices
    clamped, align_corners=False): source x = inv_scale * (dst + 0.5) - 0.5."""
    A = -0.75

    def k(t):
        t = abs(t)
        if t <= 1:
            return ((A + 2) * t - (A + 3)) * t * t + 1
        if t < 2:
            return ((A * t - 5 * A) * t + 8 * A) * t - 4 * A
        return 0.0

    M = torch.zeros(n_out, n_in, dtype=torch.float64)
    for o in range(n_out):
        x = inv_scale * (o + 0.5) - 0.5
        x0 = math.floor(x)
        for i in range(x0 - 1, x0 + 3):
            M[o, min(max(i, 0), n_in - 1)] += k(x - i)
    return M


def test_scale_factor_pos_embed_grid_21x28_by_hand():
    torch.manual_seed(0)
    gh = gw = 14
    pe = torch.randn(1 + gh * gw, 5)
    grid = pe[1:].double().reshape(gh, gw, 5)

    def ref(inv_h, inv_w, h, w):
        Mh, Mw = _cubic_matrix(gh, h, inv_h), _cubic_matrix(gw, w, inv_w)
        return torch.einsum("ai,ijc,bj->abc", Mh, grid, Mw).reshape(h * w, 5)

    # upstream: scale_factor = ((21 + 0.1) / 14, (28 + 0.1) / 14): x_src = 14/21.1 (x + 0.5) - 0.5
    sf = interpolate_pos_embed(pe, (gh, gw), (21, 28), mode="scale_factor")
    size = interpolate_pos_embed(pe, (gh, gw), (21, 28), mode="size")
    assert sf.shape == size.shape == (1 + 21 * 28, 5)
    torch.testing.assert_close(sf[0], pe[0])
    torch.testing.assert_close(sf[1:].double(), ref(14 / 21.1, 14 / 28.1, 21, 28), atol=1e-5, rtol=0)
    torch.testing.assert_close(size[1:].double(), ref(14 / 21, 14 / 28, 21, 28), atol=1e-5, rtol=0)
    # the first output row samples x = -0.16825 (scale_factor) instead of -0.16667 (size)
    assert 14 / 21.1 * 0.5 - 0.5 == pytest.approx(-0.168246, abs=1e-6)
    assert (sf - size).abs().max() > 1e-3
    # equal grids are returned unchanged in both modes
    for mode in ("size", "scale_factor"):
        torch.testing.assert_close(interpolate_pos_embed(pe, (14, 14), (14, 14), mode=mode), pe)
    with pytest.raises(ValueError, match="unknown position-embedding interpolation 'nearest'; valid: size, scale_factor, size_antialias, bilinear"):
        interpolate_pos_embed(pe, (14, 14), (21, 28), mode="nearest")


def test_encoder_uses_the_pos_embed_mode(tiny_clip):
    visual = tiny_clip[0].visual
    a = DenseCLIPEncoder(visual, pos_embed_interp="scale_factor").positional_embedding((5, 7), "cpu", torch.float32)
    b = interpolate_pos_embed(visual.positional_embedding, (4, 4), (5, 7), mode="scale_factor")
    torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="'bicubic'; valid: size, scale_factor, size_antialias, bilinear"):
        DenseCLIPEncoder(visual, pos_embed_interp="bicubic")


# ---------------------------------------------------------------- MMSeg / cv2 resize
@pytest.mark.parametrize("hw, short, long, expected", [
    ((375, 500), 336, 2048, (336, 448)),   # scale 336/375
    ((333, 500), 336, 2048, (336, 505)),   # 500 * 336/333 = 504.5045 -> int(505.0045) = 505
    ((375, 500), 520, 520, (390, 520)),    # MaskCLIP Context59 (520, 520): long side 520
    ((1024, 2048), 512, 1024, (512, 1024)),  # MaskCLIP Cityscapes (1024, 512)
    ((100, 5000), 336, 2048, (41, 2048)),  # the long side caps: 2048/5000 -> int(40.96 + 0.5)
])
def test_mmseg_rescale_sizes(hw, short, long, expected):
    assert mmseg_rescale_size(*hw, short, long) == expected


def test_cv2_resize_values_by_hand_and_differs_from_detectron2():
    down = np.array([[0, 40, 80, 120], [0, 40, 80, 120]], dtype=np.uint8)[:, :, None].repeat(3, axis=2)
    # (2, 4) -> short side 1: scale 0.5 -> (1, 2); bilinear at x = 0.5 and 2.5, no antialias
    out = MMSegRescale(1, 2048).get_transform(down).apply_image(down)
    assert out.shape == (1, 2, 3) and out[..., 0].tolist() == [[20, 100]]
    d2 = build_resize("detectron2", 1, 2048)[0].get_transform(down).apply_image(down)
    assert d2.shape == (1, 2, 3) and d2[..., 0].tolist() != [[20, 100]]  # PIL antialiases
    up = np.array([[0, 100]], dtype=np.uint8)[:, :, None].repeat(3, axis=2)
    # (1, 2) -> short side 2: scale 2 -> (2, 4); x = -0.25 (clamped), 0.25, 0.75, 1.25 (clamped)
    out = MMSegRescale(2, 2048).get_transform(up).apply_image(up)
    assert out[..., 1].tolist() == [[0, 25, 75, 100], [0, 25, 75, 100]]
    seg = np.array([[1, 2]], dtype=np.uint8)
    assert MMSegRescale(2, 2048).get_transform(up).apply_segmentation(seg).tolist() == [[1, 1, 2, 2]] * 2
    with pytest.raises(ValueError, match="unknown INPUT.RESIZE_MODE 'pil'; valid: detectron2, mmseg"):
        build_resize("pil", 336, 2048)


def test_mapper_uses_the_resize_mode(tmp_path):
    from PIL import Image

    from sparseclip_d2.data.mapper import SparseCLIPTestMapper

    img = (np.arange(30 * 50 * 3) % 251).astype(np.uint8).reshape(30, 50, 3)
    Image.fromarray(img).save(tmp_path / "x.png")
    cfg = tiny_cfg(**{"INPUT.RESIZE_MODE": "mmseg", "INPUT.MIN_SIZE_TEST": 20})
    d = SparseCLIPTestMapper(cfg, "x")({"file_name": str(tmp_path / "x.png")})
    import cv2

    expected = cv2.resize(img, (33, 20), interpolation=cv2.INTER_LINEAR)  # 50 * 20/30 = 33.33 -> 33
    assert (d["height"], d["width"]) == (30, 50)
    assert torch.equal(d["image"], torch.as_tensor(expected.transpose(2, 0, 1).copy()))


# ---------------------------------------------------------------- pixel normalisation
def test_pixel_normalisation_by_hand():
    from detectron2.modeling import build_model

    pixel = torch.tensor([[[255]], [[0]], [[128]]], dtype=torch.uint8)
    model = build_model(tiny_cfg(**{"MODEL.SPARSECLIP.PIXEL_NORM": "imagenet"}))
    # (255 - 123.675) / 58.395, (0 - 116.28) / 57.12, (128 - 103.53) / 57.375
    torch.testing.assert_close(model.normalize_image(pixel).flatten(),
                               torch.tensor([2.2489083, -2.0357143, 0.4264924]), atol=1e-6, rtol=0)
    mean, std = pixel_normalization("clip_mmseg", (0.5,) * 3, (0.5,) * 3)
    assert (mean, std) == ([122.771, 116.746, 104.094], [68.501, 66.632, 70.323])
    assert pixel_normalization("clip", (0.5, 0.25, 0.1), (0.2, 0.2, 0.2))[0] == [127.5, 63.75, 25.5]
    with pytest.raises(ValueError, match="unknown MODEL.SPARSECLIP.PIXEL_NORM 'bgr'; valid: clip, clip_mmseg, imagenet"):
        pixel_normalization("bgr", (0.5,) * 3, (0.5,) * 3)


# ---------------------------------------------------------------- patch remainder
def _pooled(x):  # (N, 3, h, w) -> (N, 3, h/16, w/16) patch means
    return F.avg_pool2d(x, 16)


def test_patch_remainder_modes_by_hand():
    torch.manual_seed(0)
    img = torch.randn(3, 20, 37)
    trunc = dense_logits(img, _pooled, patch_size=16, patch_remainder="truncate")
    ref = F.interpolate(_pooled(img[None, :, :16, :32]), size=(20, 37), mode="bilinear", align_corners=False)[0]
    torch.testing.assert_close(trunc, ref)
    corner = dense_logits(img, _pooled, patch_size=16, patch_remainder="pad_corner")
    padded = F.pad(img[None], (0, 11, 0, 12))  # to 32 x 48, zeros bottom/right
    ref = F.interpolate(_pooled(padded), size=(20, 37), mode="bilinear", align_corners=False)[0]
    torch.testing.assert_close(corner, ref)
    sym = dense_logits(img, _pooled, patch_size=16, patch_remainder="pad_crop")
    padded = F.pad(img[None], (5, 6, 6, 6))  # symmetric: extra pixel right/bottom
    ref = F.interpolate(_pooled(padded), size=(32, 48), mode="bilinear", align_corners=False)[0, :, 6:26, 5:42]
    torch.testing.assert_close(sym, ref)
    # multiples of the patch: all modes agree
    even = torch.randn(3, 32, 48)
    outs = [dense_logits(even, _pooled, patch_size=16, patch_remainder=m) for m in ("pad_crop", "truncate", "pad_corner")]
    torch.testing.assert_close(outs[0], outs[1])
    torch.testing.assert_close(outs[0], outs[2])
    with pytest.raises(ValueError, match="unknown patch_remainder 'crop'; valid: pad_crop, truncate, pad_corner"):
        dense_logits(img, _pooled, patch_size=16, patch_remainder="crop")
    with pytest.raises(ValueError, match="smaller than one 16x16 patch"):
        dense_logits(torch.randn(3, 10, 40), _pooled, patch_size=16, patch_remainder="truncate")


# ---------------------------------------------------------------- MaskCLIP
def _ln64(x, ln, eps):
    x = x.double()
    return F.layer_norm(x, x.shape[-1:], ln.weight.double(), ln.bias.double(), eps)


def _tower64(visual, images, *, act, eps, maskclip_last):
    """The whole vision tower by hand in float64: standard pre-LN blocks, and MaskCLIP's last
    block when ``maskclip_last``: v = out_proj(v_proj(ln_1 x)); v = v + x; v = v + mlp(ln_2 v)."""
    gelu = (lambda h: h * torch.sigmoid(1.702 * h)) if act == "quick_gelu" else (lambda h: F.gelu(h))
    x = F.conv2d(images.double(), visual.conv1.weight.double(), stride=16).flatten(2).transpose(1, 2)
    B = x.shape[0]
    x = torch.cat([visual.class_embedding.double().expand(B, 1, -1), x], 1) + visual.positional_embedding.double()
    x = _ln64(x, visual.ln_pre, eps)
    blocks = visual.transformer.resblocks
    for i, blk in enumerate(blocks):
        C = x.shape[-1]
        nh = blk.attn.num_heads
        y = _ln64(x, blk.ln_1, eps) @ blk.attn.in_proj_weight.double().T + blk.attn.in_proj_bias.double()
        q, k, v = y.split(C, -1)
        if maskclip_last and i == len(blocks) - 1:
            o = v
        else:
            sh = lambda t: t.reshape(B, -1, nh, C // nh).transpose(1, 2)  # noqa: E731
            a = torch.softmax(sh(q) @ sh(k).transpose(-1, -2) / math.sqrt(C // nh), -1)
            o = (a @ sh(v)).transpose(1, 2).reshape(B, -1, C)
        x = x + (o @ blk.attn.out_proj.weight.double().T + blk.attn.out_proj.bias.double())
        h = gelu(_ln64(x, blk.ln_2, eps) @ blk.mlp.c_fc.weight.double().T + blk.mlp.c_fc.bias.double())
        x = x + h @ blk.mlp.c_proj.weight.double().T + blk.mlp.c_proj.bias.double()
    return (_ln64(x, visual.ln_post, eps)[:, 1:] @ visual.proj.double()).reshape(B, 4, 4, -1).permute(0, 3, 1, 2)


def test_maskclip_preset_is_the_published_block_and_reduced_is_clearclips():
    m, r = AttentionSpec.preset("maskclip"), AttentionSpec.preset("maskclip_reduced")
    assert (m.source, m.residual, m.ffn) == ("identity", True, True)
    assert (r.source, r.residual, r.ffn) == ("identity", False, False)


def test_maskclip_full_block_matches_float64_formula(tiny_clip):
    torch.manual_seed(1)
    images = torch.randn(2, 3, 64, 64)
    visual = tiny_clip[0].visual
    with torch.no_grad():
        feats = DenseCLIPEncoder(visual, AttentionSpec.preset("maskclip"))(images)
    ref = _tower64(visual, images, act="quick_gelu", eps=1e-5, maskclip_last=True)
    torch.testing.assert_close(feats.double(), ref, atol=1e-5, rtol=1e-5)
    # the official build: GELU and LayerNorm eps 1e-6 in the vision tower, text tower untouched
    variant = vision_tower_variant(tiny_clip[0], tiny_clip[2], act="gelu", ln_eps=1e-6)
    assert variant is not visual and isinstance(variant.transformer.resblocks[0].mlp.gelu, torch.nn.GELU)
    assert variant.ln_post.eps == 1e-6 and visual.ln_post.eps == 1e-5  # the model itself is untouched
    assert not isinstance(visual.transformer.resblocks[0].mlp.gelu, torch.nn.GELU)
    with torch.no_grad():
        feats = DenseCLIPEncoder(variant, AttentionSpec.preset("maskclip"))(images)
    ref_gelu = _tower64(visual, images, act="gelu", eps=1e-6, maskclip_last=True)
    torch.testing.assert_close(feats.double(), ref_gelu, atol=1e-5, rtol=1e-5)
    assert (ref_gelu - ref).abs().max() > 1e-4  # the build option changes the features
    assert vision_tower_variant(tiny_clip[0], tiny_clip[2]) is visual
    with pytest.raises(ValueError, match="unknown vision activation 'relu'"):
        vision_tower_variant(tiny_clip[0], tiny_clip[2], act="relu")


def test_maskclip_templates():
    t = get_templates("maskclip")
    assert len(t) == 85 and t[:80] == list(OPENAI_IMAGENET_TEMPLATES)
    assert t[80:] == ["there is a {} in the scene.", "there is the {} in the scene.", "this is a {} in the scene.",
                      "this is the {} in the scene.", "this is one {} in the scene."]
    assert tuple(t) == MASKCLIP_TEMPLATES and t[84] == "this is one {} in the scene."


# ---------------------------------------------------------------- PAMR
def test_pamr_small_case_by_hand():
    # One channel, one row: I = [0, 0, 1], dilation 1 (rows replicate onto themselves).
    image = torch.tensor([[[[0.0, 0.0, 1.0]]]])
    mask = torch.tensor([[[[1.0, 0.0, 0.0]], [[0.0, 1.0, 0.0]], [[0.0, 0.0, 1.0]]]])  # m0, m1, m2 one-hot
    out = pamr(image, mask, steps=1, dilations=[1])[0, :, 0]  # (3 channels, 3 pixels)
    e = math.exp(-20.0)  # |1 - 0| / (0.1 * std), std = 0.5 at pixels 1 and 2
    # pixel 0: all 9 values 0 -> std 0 -> every affinity 0 -> uniform over 8 neighbours:
    #   dx = -1 (3) and dx = 0 (2) read m0, dx = +1 (3) read m1 -> (5 m0 + 3 m1) / 8
    # pixel 1: neighbours with I = 0: 3 at dx=-1 (m0), 2 at dx=0 (m1); 3 with I = 1 at dx=+1 (m2)
    # pixel 2: 3 with I = 0 at dx=-1 (m1); 5 with I = 1 (m2)
    expected = torch.tensor([
        [5 / 8, 3 / (5 + 3 * e), 0.0],
        [3 / 8, 2 / (5 + 3 * e), 3 * e / (5 + 3 * e)],
        [0.0, 3 * e / (5 + 3 * e), 5 / (5 + 3 * e)],
    ])
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)
    assert len(pamr_offsets([8, 16])) == 16
    # linear in the mask, 0 steps = identity, invalid arguments name the value
    torch.manual_seed(0)
    img, m = torch.randn(1, 3, 9, 11), torch.randn(1, 4, 9, 11)
    torch.testing.assert_close(pamr(img, 3 * m, 2, (1, 2)), 3 * pamr(img, m, 2, (1, 2)), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pamr(img, m, 0, (1,)), m)
    with pytest.raises(ValueError, match="positive integers"):
        pamr(img, m, 1, [0])
    with pytest.raises(ValueError, match="non-negative integer"):
        pamr(img, m, -1, [1])


def test_pamr_in_the_model_refines_the_output_size_logits():
    from detectron2.modeling import build_model

    from sparseclip_d2.modeling.postprocess import class_scores

    cfg = tiny_cfg(**{"MODEL.SPARSECLIP.PAMR.STEPS": 2, "MODEL.SPARSECLIP.PAMR.DILATIONS": [1, 2]})
    model = build_model(cfg)
    torch.manual_seed(0)
    img = torch.randint(0, 256, (3, 32, 48), dtype=torch.uint8)
    x = {"image": img, "vocabulary": ["cat", "dog", "sky"], "background_index": None, "height": 40, "width": 50}
    out = model([x])[0]["sem_seg"]
    emb, idx = model.text_classifier_for(x["vocabulary"])
    image = model.normalize_image(img)
    logits = model.synonym_logits(image, emb)
    full = F.interpolate(logits[None], size=(40, 50), mode="bilinear", align_corners=False)
    img_full = F.interpolate(image[None], size=(40, 50), mode="bilinear", align_corners=False)
    ref = class_scores(pamr(img_full, full, 2, (1, 2))[0], idx, 3)
    torch.testing.assert_close(out, ref)
    model.stages = torch.nn.ModuleList()  # the same model without its PAMR stage
    assert not torch.allclose(model([x])[0]["sem_seg"], out)
    with pytest.raises(ValueError, match="ATTENTION_STATS.ENABLED needs MODEL.SPARSECLIP.PATCH_REMAINDER pad_crop"):
        build_model(tiny_cfg(**{"TEST.ATTENTION_STATS.ENABLED": True, "MODEL.SPARSECLIP.PATCH_REMAINDER": "truncate"}))


# ---------------------------------------------------------------- class-name sets
COUNTS = {"voc21": 21, "voc20": 20, "context60": 60, "context59": 59, "ade150": 150, "coco_stuff171": 171,
          "coco_object": 81, "cityscapes19": 19}


@pytest.mark.parametrize("class_set", CLASS_NAME_SETS)
def test_upstream_class_name_sets_load_with_the_right_counts(class_set):
    files = available_class_name_files(class_set)
    missing = {"maskclip": {"voc21", "context60", "coco_object"},  # lists MaskCLIP does not publish
               "itaclip": {"voc20", "context59", "ade150"},  # datasets ITACLIP has no config for
               "cliptrase": {"cityscapes19"},  # CLIPtrase's configs/dataset_cfg.py has no Cityscapes entry
               "talk2dino": set(COUNTS) - {"voc21", "voc20"}}  # only the VOC configs are held yet
    extra = {"proxyclip": {"context459": 459}}  # ProxyCLIP's cls_context459.txt (its cfg_context459.py)
    expected = (set(COUNTS) - missing.get(class_set, set())) | set(extra.get(class_set, {}))
    assert set(files) == expected
    for name in files:
        count = extra.get(class_set, {}).get(name, COUNTS.get(name))
        assert len(load_class_names(name, class_set=class_set)) == count, (class_set, name)


def test_upstream_class_name_set_contents():
    sclip = {n: load_class_names(n, class_set="sclip") for n in COUNTS}
    assert all(load_class_names(n, class_set="naclip") == sclip[n] for n in COUNTS)  # identical files
    assert load_class_names("voc21", class_set="clearclip")[0] == "background"
    assert sclip["voc21"][0].startswith("sky, wall, tree") and sclip["context60"][59] == "wood"  # "wood " stripped
    assert load_class_names("voc20", class_set="maskclip")[19] == "tv monitor"
    assert load_class_names("ade150", class_set="maskclip")[7] == "bed"  # "bed " upstream
    with pytest.raises(ValueError, match="unknown class-name set 'openseg'; valid: '' \\(the project's\\), sclip"):
        load_class_names("voc21", class_set="openseg")
    with pytest.raises(ValueError, match="unknown class-name file 'voc21' in the 'maskclip' class-name set"):
        load_class_names("voc21", class_set="maskclip")


def test_model_uses_the_upstream_vocabulary_and_keeps_duplicates(tiny_clip):
    from detectron2.modeling import build_model

    model = build_model(tiny_cfg(**{"MODEL.SPARSECLIP.CLASS_NAMES": "clearclip"}))
    vocab, bg = model._vocabulary({"dataset_name": "sparseclip_demo"})
    assert vocab == load_class_names("voc21", class_set="clearclip") and bg == 0
    with pytest.raises(ValueError, match="unknown MODEL.SPARSECLIP.CLASS_NAMES 'x'"):
        build_model(tiny_cfg(**{"MODEL.SPARSECLIP.CLASS_NAMES": "x"}))
    # SCLIP's coco_object names "bed" twice: encoded once, so the two rows tie exactly and
    # the argmax gives the lower class (background), as upstream.
    clip, tokenizer, _ = tiny_clip
    emb, idx = TextClassifier(clip, tokenizer, "single", cache_dir="off")(["sky, bed", "cat", "bed"])
    assert idx.tolist() == [0, 0, 1, 2] and torch.equal(emb[1], emb[3]) and not torch.equal(emb[1], emb[2])
