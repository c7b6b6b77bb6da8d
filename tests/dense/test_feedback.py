"""ResCLIP's SFR as parts: patch labels, path connectivity, the feedback prior, its
blend (with upstream's float16 cast), the encoder's second run of the last block and the
model's first segmentation; each against float64 / scalar computations written here."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sparseclip_d2.attention import blend_feedback, feedback_prior, patch_labels
from sparseclip_d2.attention.feedback import path_connected
from sparseclip_d2.clip import AttentionSpec, DenseCLIPEncoder, FeedbackOptions, describe_spec, parse_attention_spec

from test_mixing_and_taps import _entmax64, _gaussian_prior64, _images, _ln, _mlp64, _qkv64, _stem64, deep_visual  # noqa: F401


# ----------------------------------------------------------------------------- references
def _connected_ref(labels):
    """Scalar loops: pair (a, b) is connected when labels[a] holds at round(a (1 - t_k) + b t_k)
    for k = 0 .. max|b - a| with t = linspace(0, 1, M + 1) (M = max(h, w) - 1), float32 arithmetic."""
    h, w = labels.shape
    M = max(h, w) - 1
    t = torch.linspace(0, 1, M + 1).numpy() if M else np.zeros(1, np.float32)
    out = np.ones((h * w, h * w), bool)
    for i in range(h * w):
        a = (i // w, i % w)
        for j in range(h * w):
            b = (j // w, j % w)
            steps = max(abs(b[0] - a[0]), abs(b[1] - a[1]))
            for k in range(steps + 1):
                tk = np.float32(t[k])
                pt = [int(np.round(np.float32(a[c]) * (np.float32(1) - tk) + np.float32(b[c]) * tk)) for c in (0, 1)]
                if labels[pt[0], pt[1]] != labels[a]:
                    out[i, j] = False
                    break
    return out


def _prior64(labels, std, connectivity, prefix=1):
    """The feedback prior in float64 with explicit loops over the gaussian taps."""
    h, w = labels.shape
    N = h * w
    flat = labels.reshape(-1)
    a = (flat[:, None] == flat[None]).double()
    if connectivity and max(h, w) > 1:
        conn = torch.from_numpy(_connected_ref(labels.numpy()))
        r, c = torch.arange(N) // w, torch.arange(N) % w
        steps = torch.maximum((r[:, None] - r[None]).abs(), (c[:, None] - c[None]).abs()).double()
        a = torch.where(conn, a, a * torch.exp(-steps / (max(h, w) - 1)))
    size = min(N, int(6 * std + 1))
    size += 1 - size % 2
    half = size // 2
    g = torch.tensor([math.exp(-(x * x) / (2 * std * std)) for x in range(-half, half + 1)], dtype=torch.float64)
    g = g / g.sum()
    rows = torch.zeros(N, N, dtype=torch.float64)
    for j in range(N):
        for o in range(-half, half + 1):  # out[j] = sum_o g[o] a[j + o] (zero outside)
            if 0 <= j + o < N:
                rows[:, j] += g[o + half] * a[:, j + o]
    rows = rows.clamp(min=0)
    rows = rows / (rows.sum(-1, keepdim=True) + 1e-8)
    out = torch.zeros(prefix + N, prefix + N, dtype=torch.float64)
    out[prefix:, prefix:] = rows
    return out


# ----------------------------------------------------------------------------- layer 1
def test_patch_labels_by_hand():
    # 2 labels, 4x6 pixels, patch 2: per pixel the argmax, then the most frequent per 2x2 block
    lab = torch.tensor([[0, 0, 1, 1, 1, 0],
                        [0, 1, 1, 1, 0, 1],
                        [1, 1, 0, 1, 1, 1],
                        [1, 1, 1, 0, 0, 1]])
    probs = torch.stack([(lab == 0).float() * 0.9 + 0.05, (lab == 1).float() * 0.9 + 0.05])[None]
    # block (0,0): 0,0,0,1 -> 0; (0,1): 1,1,1,1 -> 1; (0,2): 1,0,0,1 tie -> 0; (1,0): 1; (1,1): 0,1,1,0 -> 0; (1,2): 1
    assert patch_labels(probs, 2).tolist() == [[[0, 1, 0], [1, 0, 1]]]
    # threshold: pixels below it become 0; a 5x7 map drops the last row and column (unfold)
    p = torch.full((1, 3, 5, 7), 0.2)
    p[0, 2] = 0.6
    p[0, 2, :2, :2] = 0.3  # top-left block below 0.5 -> label 0
    assert patch_labels(p, 2, threshold=0.5).tolist() == [[[0, 2, 2], [2, 2, 2]]]
    assert patch_labels(p, 2).tolist() == [[[2, 2, 2], [2, 2, 2]]]
    with pytest.raises(ValueError, match="patch size 8 does not fit a 5x7"):
        patch_labels(p, 8)


def test_path_connected_by_hand_and_against_scalar_loops():
    lab = torch.tensor([[0, 0, 1], [0, 1, 1], [2, 2, 1]])
    c = path_connected(lab[None])[0]
    # (0,0) -> (0,2): M = 2, t = 0, .5, 1 visits (0,0), (0,1), (0,2): label 1 at the end -> not connected
    assert not c[0, 2]
    # (0,0) -> (1,1): steps 1 < M, only t = 0, .5 are visited: (0,0), round(.5, .5) = (0,0) -> connected
    assert c[0, 4]
    # (2,0) -> (2,1): label 2 both -> connected; (1,1) -> (0,1): label 0 on the way -> not
    assert c[6, 7] and not c[4, 1]
    g = torch.Generator().manual_seed(0)
    for h, w, k in [(3, 4, 2), (5, 4, 3), (1, 5, 2), (4, 4, 2)]:
        lab = torch.randint(0, k, (2, h, w), generator=g)
        got = path_connected(lab)
        for b in range(2):
            assert np.array_equal(got[b].numpy(), _connected_ref(lab[b].numpy())), (h, w, b)


@pytest.mark.parametrize("connectivity", [True, False])
def test_feedback_prior_against_float64_loops(connectivity):
    g = torch.Generator().manual_seed(1)
    for h, w, std in [(3, 4, 5.0), (4, 5, 1.0), (2, 3, 0.7)]:
        lab = torch.randint(0, 3, (2, h, w), generator=g)
        got = feedback_prior(lab, std, connectivity)
        assert got.shape == (2, 1 + h * w, 1 + h * w) and got.dtype == torch.float32
        for b in range(2):
            torch.testing.assert_close(got[b].double(), _prior64(lab[b], std, connectivity), atol=1e-6, rtol=1e-6)
    # connectivity changes the prior where a label is split
    lab = torch.tensor([[[0, 1, 0, 0]]])
    assert not torch.allclose(feedback_prior(lab, 1.0, True), feedback_prior(lab, 1.0, False))
    assert feedback_prior(lab, 1.0, num_prefix_tokens=0).shape == (1, 4, 4)
    with pytest.raises(ValueError, match="smooth_std must be a finite number > 0.*0"):
        feedback_prior(lab, 0.0)


def test_blend_feedback_by_hand_and_its_float16_rounding():
    s = torch.tensor([[[[1.0, -2.0], [0.5, 3.0]]]])  # (1, 1, 2, 2)
    p = torch.tensor([[[0.3, 0.6], [0.9, 0.2]]])  # max 0.9
    # 2 * (0.25 * s + 0.75 * p / 0.9)
    want = 2 * (0.25 * s.double() + 0.75 * p.double()[:, None] / 0.9)
    torch.testing.assert_close(blend_feedback(s, p, 0.75, 2.0).double(), want, atol=1e-6, rtol=1e-6)
    # float16: P / max P rounded to float16, the product with the weight rounded to float16
    p16 = (p.double() / 0.9).half().double()
    prod = (0.75 * p16).half().double()
    want16 = 2 * (0.25 * s.double() + prod[:, None])
    got16 = blend_feedback(s, p, 0.75, 2.0, "float16").double()
    torch.testing.assert_close(got16, want16, atol=1e-6, rtol=0)
    assert (got16 - want).abs().max() > 1e-5  # the rounding shows
    with pytest.raises(ValueError, match="unknown feedback precision 'bfloat16'; valid: float32, float16"):
        blend_feedback(s, p, 0.5, 1.0, "bfloat16")
    with pytest.raises(ValueError, match=r"prior of shape \(1, 3, 3\) does not match"):
        blend_feedback(s, torch.ones(1, 3, 3), 0.5, 1.0)


# ----------------------------------------------------------------------------- spec
def test_spec_feedback_fields_grammar_and_errors():
    res = AttentionSpec.preset("resclip")
    # yvhangyang/ResCLIP @ 0e085f7 configs/cfg_voc21.py attn_sfr_weights=[2.2, 0.7]; custom_attn's float16 cast
    assert res.feedback == FeedbackOptions(enabled=True, scale=2.2, weight=0.7, precision="float16") and res.feedback
    assert (res.feedback.enabled, res.feedback.scale, res.feedback.weight, res.feedback.precision) == (
        True, 2.2, 0.7, "float16")
    assert res.replace(feedback=False, feedback_weight=0.7, feedback_scale=2.2,
                       feedback_precision="float32") == AttentionSpec.preset("resclip_rcs")
    assert "second pass with the first segmentation's prior P (float16): 2.2 x ((1 - 0.7) S + 0.7 P)" in \
        describe_spec(res)
    s = parse_attention_spec("resclip:entmax:1.2:feedback_weight=0.6:feedback_precision=float32")
    assert (s.normalizer, s.alpha, s.feedback.weight, s.feedback.precision, s.feedback.enabled) == (
        "entmax", 1.2, 0.6, "float32", True)
    with pytest.raises(ValueError, match="feedback_scale=2.0 changes nothing without feedback"):
        parse_attention_spec("naclip:feedback_scale=2")
    with pytest.raises(ValueError, match="feedback='maybe' is not a boolean"):
        parse_attention_spec("naclip:feedback=maybe")
    for kw, msg in [(dict(feedback_weight=1.5), r"feedback_weight must be in \[0, 1\].*1.5"),
                    (dict(feedback_scale=0), "feedback_scale must be a finite number > 0.*0"),
                    (dict(feedback_precision="half"), "unknown feedback precision 'half'; valid: float32, float16"),
                    (dict(feedback="yes"), "feedback must be True or False, got 'yes'")]:
        with pytest.raises(ValueError, match=msg):
            AttentionSpec.from_settings(**kw)


# ----------------------------------------------------------------------------- layer 2
def _feedback_tower64(visual, images, labels, *, alpha, weight, scale, std):
    """float64: the tower to the last block's input; the last block (kk + gaussian prior, mixed with
    the Q-K softmax of blocks 0-2, no residual / FFN) once -> features of the first run; the prior of
    ``labels`` blended as scale * ((1 - weight) S + weight P / max P) before the gaussian prior; again."""
    B, _, H, W = images.shape
    gh, gw = H // 16, W // 16
    x = _stem64(visual, images)
    blocks = visual.transformer.resblocks
    taps = []
    for i, blk in enumerate(blocks[:-1]):
        q, k, v = _qkv64(blk, x)
        qk = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        taps.append(_entmax64(qk, alpha))  # the tapped layers take the override too (MIX.NORMALIZER "")
        a = torch.softmax(qk, -1)  # the block itself runs unchanged
        o = (a @ v).transpose(1, 2).reshape(B, -1, x.shape[-1])
        x = x + o @ blk.attn.out_proj.weight.double().T + blk.attn.out_proj.bias.double()
        x = x + _mlp64(blk, x)
    blk = blocks[-1]
    q, k, v = _qkv64(blk, x)
    s = k @ k.transpose(-1, -2) / math.sqrt(k.shape[-1])
    gauss = _gaussian_prior64(gh, gw, 5.0)
    mean_tap = sum(taps) / len(taps)

    def run(scores):
        a = 2.0 * (0.7 * _entmax64(scores + gauss, alpha) + 0.3 * mean_tap)
        o = (a @ v).transpose(1, 2).reshape(B, -1, x.shape[-1])
        y = o @ blk.attn.out_proj.weight.double().T + blk.attn.out_proj.bias.double()
        return (_ln(y, visual.ln_post)[:, 1:] @ visual.proj.double()).reshape(B, gh, gw, -1).permute(0, 3, 1, 2)

    first = run(s)
    prior = torch.stack([_prior64(lab, std, True) for lab in labels])
    prior = prior / prior.flatten(1).amax(1).view(-1, 1, 1)
    second = run(scale * ((1 - weight) * s + weight * prior[:, None]))
    return first, second


@pytest.mark.parametrize("alpha", [1.0, 1.2])
def test_feedback_second_pass_matches_float64_reference_with_softmax_and_entmax(deep_visual, alpha):
    """ResCLIP's layout (RCS over blocks 0-2 of a 4-block tower, SFR) with its softmaxes and with
    NORMALIZER entmax alpha 1.2, against the float64 composition; the callable sees the first
    run's features, and a batch of 3 is the 3 images one by one."""
    extra = {} if alpha == 1.0 else dict(normalizer="entmax", alpha=alpha)
    spec = AttentionSpec.preset("resclip", mix_layers=(0, 1, 2), feedback_precision="float32",
                             feedback_weight=0.6, feedback_scale=1.8, **extra)
    enc = DenseCLIPEncoder(deep_visual, spec)
    images = _images(5, b=3)
    g = torch.Generator().manual_seed(3)
    labels = torch.randint(0, 3, (3, 4, 4), generator=g)
    seen = []

    def feedback(first):
        seen.append(first)
        b = first.shape[0]
        idx = [0, 1, 2] if b == 3 else [seen_index[0]]
        return feedback_prior(labels[idx], 2.0, True)

    seen_index = [0]
    with torch.no_grad():
        feats = enc(images, feedback=feedback)
    first64, ref = _feedback_tower64(deep_visual, images, labels, alpha=alpha, weight=0.6, scale=1.8, std=2.0)
    torch.testing.assert_close(seen[0].double(), first64, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(feats.double(), ref, atol=2e-5, rtol=2e-5)
    assert (ref - first64).abs().max() > 1e-3  # the second pass changes the features
    with torch.no_grad():
        seen_index[0] = 1
        one = enc(images[1:2], feedback=feedback)
    torch.testing.assert_close(one, feats[1:2], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="feedback=True .* but no feedback callable was given"):
        enc(images)
    with pytest.raises(ValueError, match=r"must return a \(3, 17, 17\) prior, got \(1, 17, 17\)"):
        enc(images, feedback=lambda f: torch.ones(1, 17, 17))
    with pytest.raises(ValueError, match="a feedback callable was given but the attention spec has feedback=False"):
        DenseCLIPEncoder(deep_visual, AttentionSpec())(images, feedback=feedback)


# ----------------------------------------------------------------------------- layer 4
def test_first_segmentation_prior_by_hand():
    from sparseclip_d2.dense.first_segmentation import FeedbackSettings, first_segmentation_prior

    # 2 synonyms; features of a 2x3 patch grid pointing at synonym 0 or 1 (patch 4 px)
    want = torch.tensor([[[0, 1, 1], [0, 0, 1]], [[1, 1, 1], [0, 1, 0]]])
    text = torch.eye(2, 3)
    feats = torch.zeros(2, 3, 2, 3)
    feats[:, 0] = (want == 0).float() + 0.01
    feats[:, 1] = (want == 1).float() + 0.01
    images = torch.randn(2, 3, 8, 12, generator=torch.Generator().manual_seed(0))
    st = FeedbackSettings(threshold=0.0, pamr_steps=0, smooth_std=1.0)
    got = first_segmentation_prior(feats, images, text, 40.0, st, 4)
    # bilinear upsampling keeps each 4x4 patch's majority on the patch's own label here
    torch.testing.assert_close(got, feedback_prior(want, 1.0, True))
    # a threshold above every probability (scale 1: at most 0.73) sends all patches to label 0: one class, the plain gaussian rows
    st1 = FeedbackSettings(threshold=1.0, pamr_steps=0, smooth_std=1.0)
    torch.testing.assert_close(first_segmentation_prior(feats, images, text, 1.0, st1, 4),
                               feedback_prior(torch.zeros_like(want), 1.0, True))


def _patch_labels_by_hand(probs, p):
    """``(S, H, W)`` -> ``(H // p, W // p)``: per patch of the top-left ``H // p * p x W // p * p``
    pixels, the most frequent per-pixel argmax, ties to the smaller label (loops, bincount)."""
    pred = probs.argmax(0)
    h, w = probs.shape[1] // p, probs.shape[2] // p
    out = torch.zeros(h, w, dtype=torch.long)
    for i in range(h):
        for j in range(w):
            counts = torch.bincount(pred[i * p:(i + 1) * p, j * p:(j + 1) * p].reshape(-1), minlength=probs.shape[0])
            out[i, j] = int(counts.argmax())  # the first maximum: the smaller label
    return out


def _first_labels_by_hand(first, guide, emb, scale, p, steps, dilations):
    """The first segmentation's patch labels of one window: cosines of the ``(1, D, h, w)`` first-run
    features resized to ``guide``'s ``H x W`` (bilinear, half-pixel centres), PAMR guided by ``guide``
    (``dense.pamr``, tested against the reference in test_postprocess / test_baselines), softmax of
    ``scale *`` them over synonyms, then :func:`_patch_labels_by_hand` (threshold 0)."""
    from sparseclip_d2.dense.pamr import pamr

    f = first[0].float()
    f = f / f.norm(dim=0, keepdim=True)
    cos = torch.einsum("dhw,sd->shw", f, emb.float())[None]
    cos = F.interpolate(cos, size=tuple(guide.shape[-2:]), mode="bilinear", align_corners=False)
    cos = pamr(guide[None].float(), cos, steps, dilations)[0]
    return _patch_labels_by_hand(torch.softmax(cos * scale, dim=0), p)


@pytest.mark.parametrize("size", [(48, 88), (41, 75)])  # 504 = 31 * 16 + 8 as in the issue; both sides
def test_first_segmentation_of_a_non_multiple_whole_image_is_made_on_the_whole_image(size, monkeypatch):
    """a whole image whose sides are not multiples of the patch, with ``truncate`` (ResCLIP:
    yvhangyang/ResCLIP @ 0e085f7 ``clip/model.py`` ``create_logit_temp`` resizes the first pass's
    cosines to the whole input and guides PAMR with the whole input; ``create_patch_matrix`` then
    labels the top-left patches). The tiny tower, threshold 0: the prior the encoder's second run
    gets is the one made by hand on the whole image (not on the encoded top-left crop, which gives
    other labels here), and the logits are those of the second run with that prior."""
    import sparseclip_d2.modeling.meta_arch as meta_arch
    from detectron2.modeling import build_model

    from sparseclip_d2.methods.cosine import cosine_logits

    from conftest import tiny_cfg

    model = build_model(tiny_cfg(**{
        "MODEL.SPARSECLIP.FEEDBACK.ENABLED": True, "MODEL.SPARSECLIP.FEEDBACK.THRESHOLD": 0.0,
        "MODEL.SPARSECLIP.PATCH_REMAINDER": "truncate", "MODEL.SPARSECLIP.LOGIT_SCALE": 40.0}))
    p, H, W = 16, size[0], size[1]
    kh, kw = H // p * p, W // p * p
    g = torch.Generator().manual_seed(0)
    # a smooth picture (PAMR follows its edges) plus noise, normalised scale
    yy, xx = torch.meshgrid(torch.linspace(-1, 1, H), torch.linspace(-1, 1, W), indexing="ij")
    image = torch.stack([torch.sin(3 * xx + 2 * yy), (xx * yy > 0).float(), torch.cos(4 * yy)]) * 1.5
    image = image + 0.3 * torch.randn(3, H, W, generator=g)
    emb = F.normalize(torch.randn(6, model.encoder.embed_dim, generator=g), dim=-1)
    seen = []
    real = meta_arch.first_segmentation_prior

    def recording(first, images, *args):
        out = real(first, images, *args)
        seen.append((first, images, out))
        return out

    monkeypatch.setattr(meta_arch, "first_segmentation_prior", recording)
    with torch.no_grad():
        logits = model.synonym_logits(image, emb)
    assert len(seen) == 1
    first, guide, prior = seen[0]
    assert tuple(first.shape[-2:]) == (H // p, W // p)
    # what the feedback receives: the whole normalised image as the guide and the resize size
    assert tuple(guide.shape) == (1, 3, H, W)
    assert torch.equal(guide[0], image)
    fb = model.feedback
    labels = _first_labels_by_hand(first, image, emb, 40.0, p, fb.pamr_steps, fb.pamr_dilations)
    assert labels.unique().numel() >= 3  # a real first segmentation
    # the encoded top-left crop as guide and size (main before the fix) labels other patches
    cropped = _first_labels_by_hand(first, image[:, :kh, :kw], emb, 40.0, p, fb.pamr_steps, fb.pamr_dilations)
    assert not torch.equal(labels, cropped)
    want = feedback_prior(labels[None], fb.smooth_std, fb.connectivity)
    torch.testing.assert_close(prior, want, atol=0, rtol=0)
    # the logits: the second run with that prior on the encoded crop, resized to the whole image
    with torch.no_grad():
        feats = model.encoder(image[None, :, :kh, :kw], feedback=lambda f: want)
    ref = F.interpolate(cosine_logits(feats, emb, 40.0), size=(H, W), mode="bilinear", align_corners=False)[0]
    torch.testing.assert_close(logits, ref, atol=1e-5, rtol=1e-5)


def test_dense_logits_gives_the_whole_windows_only_when_asked():
    """``with_windows``: ``truncate`` windows come whole (the crop is their top-left part), padded
    crops come as they are encoded, windows of multiples are the crops; without it, no keyword."""
    from sparseclip_d2.dense.windows import dense_logits, window_grid

    img = torch.randn(3, 41, 75, generator=torch.Generator().manual_seed(0))
    got = []

    def fn(crops, windows=None):
        got.append((crops, windows))
        return F.avg_pool2d(crops, 16)

    dense_logits(img, fn, patch_size=16, patch_remainder="truncate", with_windows=True)
    (crops, windows), = got
    assert torch.equal(crops[0], img[:, :32, :64]) and torch.equal(windows[0], img)
    for crop_size, stride in ((24, 17), (32, 16)):  # sliding: windows of 24 (truncated to 16) and 32 (multiples)
        got.clear()
        dense_logits(img, fn, patch_size=16, crop_size=crop_size, stride=stride, batch_size=4,
                     patch_remainder="truncate", with_windows=True)
        grid = window_grid(41, 75, crop_size, stride)
        wins = torch.cat([w for _, w in got])
        assert torch.equal(wins, torch.stack([img[:, y1:y2, x1:x2] for y1, y2, x1, x2 in grid]))
        if crop_size == 32:
            assert all(c is w for c, w in got)
    for mode in ("pad_crop", "pad_corner"):
        got.clear()
        dense_logits(img, fn, patch_size=16, patch_remainder=mode, with_windows=True)
        (crops, windows), = got
        assert crops.shape[-2:] == (48, 80) and windows is crops
    got.clear()
    dense_logits(img, fn, patch_size=16, patch_remainder="truncate")
    assert got[0][1] is None
    side = torch.zeros(41, 75)
    seen = []
    dense_logits(img, lambda c, s, windows: seen.append(windows.shape) or F.avg_pool2d(c, 16), patch_size=16,
                 patch_remainder="truncate", side=side, with_windows=True)
    assert seen == [(1, 3, 41, 75)]


def test_first_segmentation_prior_refuses_windows_of_another_grid():
    from sparseclip_d2.dense.first_segmentation import FeedbackSettings, first_segmentation_prior

    feats, text = torch.randn(1, 3, 2, 3), torch.eye(2, 3)
    st = FeedbackSettings(pamr_steps=0)
    assert first_segmentation_prior(feats, torch.randn(1, 3, 11, 15), text, 1.0, st, 4).shape == (1, 7, 7)
    with pytest.raises(ValueError, match=r"needs 1 windows of 8\.\.11 x 12\.\.15 pixels, got \(1, 3, 12, 12\)"):
        first_segmentation_prior(feats, torch.randn(1, 3, 12, 12), text, 1.0, st, 4)


@pytest.mark.parametrize("key, value, message", [
    ("MODEL.SPARSECLIP.FEEDBACK.THRESHOLD", 1.5, r"FEEDBACK.THRESHOLD = 1.5 is invalid; valid: a probability in \[0, 1\]"),
    ("MODEL.SPARSECLIP.FEEDBACK.PAMR_STEPS", -1, "FEEDBACK.PAMR_STEPS = -1 is invalid; valid: an integer >= 0"),
    ("MODEL.SPARSECLIP.FEEDBACK.PAMR_DILATIONS", [0], r"FEEDBACK.PAMR_DILATIONS = \(0,\) is invalid; valid: a non-empty"),
    ("MODEL.SPARSECLIP.FEEDBACK.SMOOTH_STD", 0.0, "FEEDBACK.SMOOTH_STD = 0.0 is invalid; valid: a finite number > 0"),
    ("TEST.TTA.MODE", "itaclip", "TEST.TTA.MODE cannot be combined with MODEL.SPARSECLIP.FEEDBACK.ENABLED: the encoder needs a first segmentation"),
    ("MODEL.SPARSECLIP.FEEDBACK.PRECISION", "bf16", "MODEL.SPARSECLIP.FEEDBACK: unknown feedback precision 'bf16'; valid: float32, float16"),
    ("MODEL.SPARSECLIP.FEEDBACK.WEIGHT", 1.2, r"MODEL.SPARSECLIP.FEEDBACK: feedback_weight must be in \[0, 1\]"),
])
def test_bad_feedback_keys_are_named_before_the_model_is_built(key, value, message, monkeypatch):
    from detectron2.modeling import build_model

    import sparseclip_d2.modeling.backbone as backbone

    from conftest import tiny_cfg

    def no_build(*a, **k):  # the checks must come first
        raise AssertionError("the CLIP model was built before the keys were checked")

    monkeypatch.setattr(backbone, "build_clip_from_config", no_build)
    cfg = tiny_cfg(**{"MODEL.SPARSECLIP.FEEDBACK.ENABLED": True})
    cfg.merge_from_list([key, value])
    with pytest.raises(ValueError, match=message):
        build_model(cfg)


def test_resclip_configs_select_the_upstream_settings():
    import glob
    import os

    from conftest import baseline_cfg

    root = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "baselines")
    # yvhangyang/ResCLIP @ 0e085f7 configs/cfg_<dataset>.py: (dataset, short side, slide, prob_thd, temp_thd,
    # attn_rcs_weights, attn_sfr_weights)
    expected = {
        "resclip_b16": ("ade20k", 336, True, 0.0, 0.25, (2.0, 0.3), (2.1, 0.7)),
        "resclip_b16_voc21": ("voc21", 336, False, 0.1, 0.5, (2.0, 0.3), (2.2, 0.7)),
        "resclip_b16_voc20": ("voc20", 336, False, 0.0, 0.1, (2.0, 0.6), (2.1, 0.6)),
        "resclip_b16_context60": ("context60", 336, True, 0.1, 0.3, (2.0, 0.3), (1.8, 0.7)),
        "resclip_b16_context59": ("context59", 336, True, 0.0, 0.25, (2.0, 0.4), (1.8, 0.7)),
        "resclip_b16_coco_object": ("coco_object", 336, True, 0.1, 0.11, (2.0, 0.4), (1.8, 0.7)),
        "resclip_b16_coco_stuff": ("coco_stuff", 336, True, 0.0, 0.11, (2.0, 0.4), (1.8, 0.7)),
        "resclip_b16_cityscapes": ("cityscapes", 560, True, 0.0, 0.1, (2.0, 0.2), (2.1, 0.6)),
    }
    paths = sorted(glob.glob(os.path.join(root, "resclip_b16*.yaml")))
    assert sorted(os.path.basename(p)[:-5] for p in paths) == sorted(expected)
    for path in paths:
        cfg = baseline_cfg(path)
        sc, fb = cfg.MODEL.SPARSECLIP, cfg.MODEL.SPARSECLIP.FEEDBACK
        ds, size, slide, prob, temp, rcs, sfr = expected[os.path.basename(path)[:-5]]
        spec = AttentionSpec.from_config(cfg)
        assert spec == AttentionSpec.preset("resclip", mix_scale=rcs[0], mix_weight=rcs[1], feedback_scale=sfr[0],
                                            feedback_weight=sfr[1]), path
        assert (cfg.DATASETS.TEST, cfg.INPUT.MIN_SIZE_TEST, cfg.TEST.SLIDING_WINDOW.ENABLED, sc.PROB_THRESHOLD,
                fb.THRESHOLD) == ((f"sparseclip_{ds}_val",), size, slide, prob, temp), path
        assert (fb.PAMR_STEPS, list(fb.PAMR_DILATIONS), fb.CONNECTIVITY, fb.SMOOTH_STD, sc.PAMR.STEPS) == (
            10, [8, 16], True, 5.0, 0)
        assert (sc.CLASS_NAMES, sc.TEXT.TEMPLATES, sc.PIXEL_NORM, sc.LOGIT_SCALE, sc.PATCH_REMAINDER) == (
            "naclip", "openai_imagenet", "clip_mmseg", 40.0, "truncate")


def test_model_with_feedback_runs_windows_in_batches(tmp_path):
    """The tiny tower with FEEDBACK on (entmax 1.2): sliding windows encoded 3 at a time give the
    logits of windows encoded one at a time, and the feedback changes them."""
    from detectron2.modeling import build_model

    from conftest import tiny_cfg

    opts = {"MODEL.SPARSECLIP.FEEDBACK.ENABLED": True, "MODEL.SPARSECLIP.ATTENTION.NORMALIZER": "entmax",
            "MODEL.SPARSECLIP.FEEDBACK.THRESHOLD": 0.3, "MODEL.SPARSECLIP.FEEDBACK.PAMR_STEPS": 2,
            "TEST.SLIDING_WINDOW.ENABLED": True, "TEST.SLIDING_WINDOW.CROP_SIZE": 32,
            "TEST.SLIDING_WINDOW.STRIDE": 16, "TEST.SLIDING_WINDOW.BATCH_SIZE": 3}
    model = build_model(tiny_cfg(**opts))
    image = torch.randn(3, 48, 64, generator=torch.Generator().manual_seed(0))
    emb = F.normalize(torch.randn(4, model.encoder.embed_dim, generator=torch.Generator().manual_seed(1)), dim=-1)
    with torch.no_grad():
        batched = model.synonym_logits(image, emb)
        model.window_batch_size = 1
        single = model.synonym_logits(image, emb)
    torch.testing.assert_close(batched, single, atol=1e-5, rtol=1e-5)
    plain = build_model(tiny_cfg(**{**opts, "MODEL.SPARSECLIP.FEEDBACK.ENABLED": False,
                                    "MODEL.SPARSECLIP.FEEDBACK.THRESHOLD": 0.0,
                                    "MODEL.SPARSECLIP.FEEDBACK.PAMR_STEPS": 10}))
    with torch.no_grad():
        assert not torch.allclose(plain.synonym_logits(image, emb), batched, atol=1e-4)


def test_resclip_config_runs_through_train_net(tmp_path):
    """configs/baselines/resclip_b16_voc21.yaml end to end (tiny random-weight tower, so the RCS
    tap is block 0): the SFR second pass runs and label maps reach the evaluator."""
    import json

    from test_datasets import make_fake_root
    from test_train_net import TINY, run

    make_fake_root(str(tmp_path / "data"), n=2)
    out = tmp_path / "out"
    res = run(["--eval-only", "--config-file", "configs/baselines/resclip_b16_voc21.yaml", *TINY,
               "MODEL.SPARSECLIP.ATTENTION.MIX.LAYERS", "[0]", "MODEL.SPARSECLIP.TEXT.TEMPLATES", "single",
               "TEST.MAX_IMAGES", "1", "OUTPUT_DIR", str(out)], env={"DETECTRON2_DATASETS": str(tmp_path / "data")})
    assert res.returncode == 0, res.stderr[-4000:]
    results = json.loads((out / "results.json").read_text())
    assert results["sparseclip_voc21_val"]["num_images"] == 1
    cfg = results["config"]["MODEL"]["SPARSECLIP"]
    assert cfg["FEEDBACK"]["ENABLED"] is True and cfg["FEEDBACK"]["PRECISION"] == "float16"


@pytest.mark.parametrize("arch", ["SparseCLIPFGOVD", "backbone"])
def test_feedback_spec_is_refused_by_the_modules_without_class_embeddings(arch, monkeypatch):
    """FG-OVD and the bare backbone cannot make SFR's first segmentation: refused when the config
    is read, before the CLIP weights load (it used to fail only at the first forward)."""
    from detectron2.modeling import build_backbone, build_model

    import sparseclip_d2.modeling.backbone as backbone
    from sparseclip_d2.common.needs import Needs
    from sparseclip_d2.modeling import SparseCLIPBackbone

    from conftest import tiny_cfg

    def no_build(*a, **k):
        raise AssertionError("the CLIP model was built before the spec was refused")

    monkeypatch.setattr(backbone, "build_clip_from_config", no_build)
    cfg = tiny_cfg(**{"MODEL.SPARSECLIP.FEEDBACK.ENABLED": True})
    if arch == "backbone":
        cfg.MODEL.BACKBONE.NAME = "SparseCLIPBackbone"
        with pytest.raises(ValueError, match=r"SparseCLIPBackbone cannot run an attention spec with feedback=True"):
            build_backbone(cfg)
        # and a hand-built module with such an encoder
        encoder = type("E", (torch.nn.Module,), {})()
        encoder.spec, encoder.patch_size, encoder.embed_dim = AttentionSpec.preset("resclip"), 16, 8
        encoder.needs = Needs(first_segmentation=True)  # the encoder contract (common/needs.py)
        with pytest.raises(ValueError, match="SparseCLIPBackbone cannot run"):
            SparseCLIPBackbone(encoder=encoder)
    else:
        cfg.MODEL.META_ARCHITECTURE = "SparseCLIPFGOVD"
        with pytest.raises(ValueError, match=r"FG-OVD \(SparseCLIPFGOVD\) cannot run an attention spec with "
                                             r"feedback=True .*FEEDBACK.ENABLED False"):
            build_model(cfg)
