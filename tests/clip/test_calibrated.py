"""SC-CLIP's and SFP's parts: LOF / L2 / SOM outlier-token repair, the similarity-thresholded
aggregation, the intermediate layer's similarity as a score term, multi-level fusion; their
spec fields, config keys and preset; each checked against float64 computations written here
(loops, not the vectorised code under test)."""
import math

import pytest
import torch
import torch.nn.functional as F

from sparseclip_d2.attention import outliers
from sparseclip_d2.attention import (cosine_similarity_map, detect_outliers, lof_scores, repair_outliers,
                                     similarity_aggregate, similarity_scores)
from sparseclip_d2.clip import AttentionSpec, CalibrationOptions, DenseCLIPEncoder, describe_spec, parse_attention_spec
from sparseclip_d2.clip.spec import PRESETS

from test_mixing_and_taps import _entmax64, _heads, _ln, _mlp64, _stem64, deep_visual  # noqa: F401 (fixture)


# ----------------------------------------------------------------------------- references
def _lof64(x, k):
    """LOF of the rows of x (N, C) as SC-CLIP defines it, with loops: kdist(p) = the distance
    to the k-th nearest other row (squared Euclidean), reach(p, o) = max(d(p, o), kdist(p)),
    lrd(p) = k / mean_o reach(p, o), LOF(p) = mean_{o in kNN(p)} lrd(o) / lrd(p)."""
    x = x.double()
    N = x.shape[0]
    d = [[float(((x[i] - x[j]) ** 2).sum()) for j in range(N)] for i in range(N)]
    knn, kdist = [], []
    for i in range(N):
        order = sorted((d[i][j], j) for j in range(N) if j != i)[:k]
        knn.append([j for _, j in order])
        kdist.append(order[-1][0])
    lrd = [k / (sum(max(d[i][j], kdist[i]) for j in knn[i]) / k) for i in range(N)]
    return torch.tensor([sum(lrd[j] / lrd[i] for j in knn[i]) / k for i in range(N)], dtype=torch.float64)


def _quantile64(v, q):
    s = sorted(float(a) for a in v)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _lof_mask64(x, k, contamination):
    scores = _lof64(x, k)
    t = _quantile64(scores, 1 - contamination)
    return scores > t


def _repair64(p, mask, h, w):
    """p (N, C) row-major on an h x w grid; each masked token -> mean of its unmasked 3x3 neighbours."""
    out = p.clone().double()
    for r in range(h):
        for c in range(w):
            if not mask[r * w + c]:
                continue
            nb = [p[rr * w + cc].double() for rr in range(r - 1, r + 2) for cc in range(c - 1, c + 2)
                  if (rr, cc) != (r, c) and 0 <= rr < h and 0 <= cc < w and not mask[rr * w + cc]]
            if nb:
                out[r * w + c] = sum(nb) / len(nb)
    return out


def _cos64(f):
    f = f.double()
    n = f.norm(dim=-1, keepdim=True)
    return (f / n) @ (f / n).T


def _aggregate64(x, s, beta):
    s = torch.where(s < beta, torch.zeros_like(s), s)
    return (s / (s.sum(-1, keepdim=True) + 1e-6)) @ x.double()


# ----------------------------------------------------------------------------- layer 1
def test_lof_scores_match_the_loop_definition_and_find_a_planted_outlier(monkeypatch):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 30, 8, generator=g, dtype=torch.float64)
    x[0, 7] += 12.0   # a far token in each image, at different places
    x[1, 22] -= 12.0
    scores = lof_scores(x, neighbors=5)
    for b in range(2):
        torch.testing.assert_close(scores[b], _lof64(x[b], 5), rtol=1e-12, atol=1e-12)
    # 1 - 0.03 = the 0.97 quantile of 30 scores: only the largest lies above it
    mask = detect_outliers("lof", x, neighbors=5, contamination=0.03)
    assert mask.sum(1).tolist() == [1, 1] and bool(mask[0, 7]) and bool(mask[1, 22])
    # the batch does not mix images: each image alone gives the same mask
    for b in range(2):
        torch.testing.assert_close(detect_outliers("lof", x[b:b + 1], neighbors=5, contamination=0.03), mask[b:b + 1])
    # contamination 0.1: tokens above the 0.9 quantile (interpolated), as the loop reference says
    m10 = detect_outliers("lof", x, neighbors=5, contamination=0.1)
    for b in range(2):
        assert m10[b].tolist() == _lof_mask64(x[b], 5, 0.1).tolist()
    # float32 in chunks of 3 rows (and a remainder of 2): bit for bit SC-CLIP's one-shot
    # expression (SuleBai/SC-CLIP @ 0417ba9 clip/model.py lof_pytorch: torch.norm of all
    # differences at once, squared), then the same k-NN, reachability and ratio steps
    x32 = torch.randn(1, 50, 16, generator=g)
    monkeypatch.setattr(outliers, "_DIFF_ELEMENTS", 3 * 50 * 16)
    dist = torch.norm(x32[0][:, None] - x32[0][None, :], dim=2, p=2) ** 2
    knn_d, knn_i = torch.topk(dist, k=6, largest=False)
    knn_d, knn_i = knn_d[:, 1:], knn_i[:, 1:]
    lrd = 5 / torch.nan_to_num(torch.max(knn_d, knn_d[:, -1].unsqueeze(1).expand_as(knn_d)).mean(dim=1), nan=1e-6)
    assert torch.equal(lof_scores(x32, neighbors=5)[0], (lrd[knn_i] / lrd.unsqueeze(1)).mean(dim=1))
    with pytest.raises(ValueError, match=r"outlier_neighbors=30 needs 1 <= k < N = 30"):
        lof_scores(x, neighbors=30)
    with pytest.raises(ValueError, match=r"outlier_contamination=1.5 is invalid; valid: a share in \(0, 1\)"):
        detect_outliers("lof", x, contamination=1.5)
    with pytest.raises(ValueError, match="unknown outlier_detector .zscore.; valid: none, l2, lof, som"):
        detect_outliers("zscore", x)


def test_repair_replaces_outliers_by_their_inlier_neighbours_mean():
    h, w, C = 3, 4, 2
    p = torch.arange(2 * h * w * C, dtype=torch.float64).reshape(2, h * w, C) ** 1.5
    mask = torch.zeros(2, h * w, dtype=torch.bool)
    # image 0: a block of 4 outliers in the corner: (0,0) has no inlier neighbour and is kept;
    # (1,1) takes the mean of its 5 inlier neighbours; image 1: one outlier at the border
    for r, c in ((0, 0), (0, 1), (1, 0), (1, 1)):
        mask[0, r * w + c] = True
    mask[1, 1 * w + 3] = True
    out = repair_outliers(p, mask, (h, w))
    for b in range(2):
        torch.testing.assert_close(out[b], _repair64(p[b], mask[b], h, w), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out[0, 0], p[0, 0])  # no inlier neighbour: kept
    nb = [(0, 2), (1, 2), (2, 0), (2, 1), (2, 2)]
    torch.testing.assert_close(out[0, 1 * w + 1], sum(p[0, r * w + c] for r, c in nb) / 5)
    assert torch.equal(out[:, ~mask.any(0)], p[:, ~mask.any(0)])  # inliers untouched
    assert repair_outliers(p, torch.zeros_like(mask), (h, w)) is p
    with pytest.raises(ValueError, match="12 patch tokens do not form a 4x4 grid"):
        repair_outliers(p, mask, (4, 4))


def test_similarity_aggregation_and_scores_by_hand():
    f = torch.tensor([[[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]]], dtype=torch.float64)
    s = cosine_similarity_map(f)
    c = 1 / math.sqrt(2)
    torch.testing.assert_close(s[0], torch.tensor([[1, c, 0], [c, 1, c], [0, c, 1]], dtype=torch.float64))
    x = torch.tensor([[[2.0], [4.0], [8.0]]], dtype=torch.float64)
    # threshold 0.8: only the diagonal is kept -> every token keeps itself (x / (1 + 1e-6))
    torch.testing.assert_close(similarity_aggregate(x, s, 0.8), x / (1 + 1e-6))
    # threshold 0.5: row 1 averages all three with weights (c, 1, c)
    agg = similarity_aggregate(x, s, 0.5)
    assert float(agg[0, 1, 0]) == pytest.approx((c * 2 + 4 + c * 8) / (2 * c + 1 + 1e-6), rel=1e-12)
    torch.testing.assert_close(agg, _aggregate64(x[0], s[0], 0.5)[None])
    sc = similarity_scores(s, 3.0)
    mean = float(s.mean())
    assert sc.shape == (1, 1, 3, 3)
    want = (s[0] - mean) * 3
    want = torch.where(want < 0, torch.full_like(want, float("-inf")), want)
    torch.testing.assert_close(sc[0, 0], want)
    assert torch.isneginf(sc[0, 0, 0, 2]) and bool(torch.isfinite(sc[0, 0].diagonal()).all())


# ----------------------------------------------------------------------------- the composition
def _som_mask64(att, count, cls_scale):
    """att (H, 1 + N, 1 + N): patches whose head-mean CLS attention x cls_scale exceeds their
    head-mean self-attention, the `count` largest of those (loops)."""
    H, L, _ = att.shape
    c = [sum(float(att[h, 0, 1 + j]) * cls_scale for h in range(H)) / H for j in range(L - 1)]
    d = [sum(float(att[h, 1 + j, 1 + j]) for h in range(H)) / H for j in range(L - 1)]
    salient = sorted(((c[j], j) for j in range(L - 1) if c[j] > d[j]), reverse=True)[:count]
    mask = torch.zeros(L - 1, dtype=torch.bool)
    for _, j in salient:
        mask[j] = True
    return mask


@torch.no_grad()
def _calibrated64(visual, images, *, alpha, outlier_k, contamination, sim_layer, post_layer, fusion, beta, scale,
                  cls_weight, source, detector="lof", count=10, cls_scale=1.5, fusion_similarity_only=False,
                  threshold_term=False):
    """SC-CLIP's forward in float64 on any depth: native blocks; LOF + repair of the last block's
    input patches; the repaired tap ``sim_layer`` similarity aggregating them and as an attention
    term; the last block on patches only (mean of the entmax of the similarity term and of each
    source term; no residual / FFN) + cls_weight * CLS; post-aggregation; fusion branch."""
    B, _, H, W = images.shape
    gh, gw = H // 16, W // 16
    N = gh * gw
    x = _stem64(visual, images)
    blocks = visual.transformer.resblocks
    taps = {}
    for i, blk in enumerate(blocks[:-1]):
        taps[i] = x
        q, k, v = _qkv(blk, x)
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1)
        producing = a
        o = (a @ v).transpose(1, 2).reshape(B, -1, x.shape[-1])
        x = x + o @ blk.attn.out_proj.weight.double().T + blk.attn.out_proj.bias.double()
        x = x + _mlp64(blk, x)
    taps[len(blocks) - 1] = x
    last = blocks[-1]
    feats = []
    for b in range(B):
        p = x[b, 1:]
        if detector == "lof":
            mask = _lof_mask64(p, outlier_k, contamination)
        elif detector == "l2":
            order = sorted(((float(p[j].norm()), j) for j in range(N)), reverse=True)[:count]
            mask = torch.zeros(N, dtype=torch.bool)
            mask[[j for _, j in order]] = True
        else:
            mask = _som_mask64(producing[b], count, cls_scale)
        p = _repair64(p, mask, gh, gw)
        s = _cos64(_repair64(taps[sim_layer][b, 1:], mask, gh, gw))
        p = _aggregate64(p, s, beta)
        st = torch.where(s < beta, torch.zeros_like(s), s) if threshold_term else s
        t = (st - st.mean()) * scale
        t = torch.where(t < 0, torch.full_like(t, float("-inf")), t)
        s_post = _cos64(taps[post_layer][b, 1:])

        def block(z, similarity_only=False):
            q, k, v = _qkv(last, z[None])
            d = q.shape[-1]
            pick = {"q": q, "k": k}
            w = _entmax64(t.expand(q.shape[1], N, N), alpha)
            if not similarity_only:
                for term in source.split("+"):
                    w = w + _entmax64(pick[term[0]] @ pick[term[1]].transpose(-1, -2) / math.sqrt(d), alpha)
                w = w / (1 + len(source.split("+")))
            o = (w @ v).transpose(1, 2).reshape(1, N, -1)
            return (o @ last.attn.out_proj.weight.double().T + last.attn.out_proj.bias.double())[0]

        y = block(p) + cls_weight * x[b, :1]
        y = _aggregate64(y, s_post, beta)
        fused = sum(taps[i][b] for i in fusion)
        y = y + _aggregate64(block(fused[1:], fusion_similarity_only) + cls_weight * fused[:1], s_post, beta)
        out = _ln(torch.cat([x[b, :1], y])[None], visual.ln_post)[0, 1:] @ visual.proj.double()
        feats.append(out.reshape(gh, gw, -1).permute(2, 0, 1))
    return torch.stack(feats)


def _qkv(blk, x):
    C = x.shape[-1]
    y = _ln(x, blk.ln_1) @ blk.attn.in_proj_weight.double().T + blk.attn.in_proj_bias.double()
    q, k, v = y.split(C, -1)
    nh = blk.attn.num_heads
    return _heads(q, nh), _heads(k, nh), _heads(v, nh)


# SC-CLIP's layout on a 4-block tower: LOF on the last block's input, similarity of tap 2
# (SC-CLIP: 9 of 12), post-aggregation by tap 1 (4 of 12), fusion of taps 1..3 (4..10).
@pytest.fixture(scope="module")
def rect_visual():
    """A random-weight (seed 0) 4-block open_clip ViT at 80 x 96 px (a native 5 x 6 patch grid, so
    the float64 reference needs no position-embedding interpolation): width 64, 4 heads, D 32."""
    from open_clip.transformer import VisionTransformer

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        v = VisionTransformer(image_size=(80, 96), patch_size=16, width=64, layers=4, heads=4, mlp_ratio=4.0,
                              output_dim=32)
        for m in v.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.data.uniform_(0.5, 1.5)
                m.bias.data.normal_(0, 0.1)
    return v.eval()


SMALL = dict(outlier_neighbors=5, outlier_contamination=0.1, similarity_layer=2, post_similarity_layer=1,
             fusion_layers=(1, 2, 3))


@pytest.mark.parametrize("alpha", [1.0, 1.2])
def test_scclip_layout_matches_float64_reference_with_softmax_and_entmax(rect_visual, alpha):
    """The preset's composition (softmax as published; ``NORMALIZER entmax`` alpha 1.2 as one
    override reaching both the similarity term and KK) on a non-square 5 x 6 grid, batch 2,
    against the float64 loop reference."""
    extra = {} if alpha == 1.0 else dict(normalizer="entmax", alpha=alpha)
    spec = AttentionSpec.preset("scclip", **SMALL, **extra)
    g = torch.Generator().manual_seed(5)
    images = torch.randn(2, 3, 80, 96, generator=g)
    enc = DenseCLIPEncoder(rect_visual, spec)
    with torch.no_grad():
        feats = enc(images)
        single = enc(images[1:])
    ref = _calibrated64(rect_visual, images, alpha=alpha, outlier_k=5, contamination=0.1, sim_layer=2, post_layer=1,
                        fusion=(1, 2, 3), beta=0.4, scale=3.0, cls_weight=0.3, source="kk")
    torch.testing.assert_close(feats.double(), ref, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(single, feats[1:], atol=1e-5, rtol=1e-5)
    # every part matters: without the repair, or the fusion, the features differ
    for change in (dict(outlier_detector="none"), dict(fusion_layers=()), dict(post_similarity_layer=-1)):
        with torch.no_grad():
            other = DenseCLIPEncoder(rect_visual, spec.replace(**change))(images)
        assert (other - feats).abs().max() > 1e-3, change


def test_calibrated_pass_layout_and_attention_rows(deep_visual):
    spec = AttentionSpec.preset("scclip", **SMALL)
    enc = DenseCLIPEncoder(deep_visual, spec)
    images = torch.randn(2, 3, 64, 80, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        p = enc.forward_pass(images, tap_layers=(1, 4))
    assert p.tokens.shape == (2, 1 + 20, 64) and p.attn.shape == (2, 4, 21, 21) and sorted(p.taps) == [1, 4]
    torch.testing.assert_close(p.attn.sum(-1), torch.ones(2, 4, 21), atol=1e-5, rtol=0)
    assert torch.equal(p.attn[:, :, 0], F.one_hot(torch.tensor(0), 21).float().expand(2, 4, 21))
    assert float(p.attn[:, :, 1:, 0].abs().max()) == 0.0  # the patches never attend to the CLS token


# ----------------------------------------------------------------------------- spec, grammar, config
def test_preset_is_the_published_setting():
    s = PRESETS["scclip"]
    c = s.calibration
    # SuleBai/SC-CLIP @ 0417ba9 clip/model.py VisionTransformer.__init__ / scclip_segmentor.py defaults
    assert (s.source, s.sum_mode, s.residual, s.ffn, s.cls_weight) == ("kk", "normalize_then_mean", False, False, 0.3)
    assert (c.outlier_detector, c.outlier_neighbors, c.outlier_contamination) == ("lof", 30, 0.05)
    assert (c.similarity_layer, c.similarity_scale, c.similarity_threshold) == (9, 3.0, 0.4)
    assert (c.post_similarity_layer, c.fusion_layers) == (4, (4, 5, 6, 7, 8, 9, 10))
    assert c and c.active and not AttentionSpec().calibration
    assert s.inert_settings() == [] and s.rows_sum_to == 1
    assert "lof outlier repair (k=30" in describe_spec(s)


@pytest.mark.parametrize("kwargs, message", [
    (dict(outlier_detector="zscore"), r"unknown outlier_detector 'zscore'; valid: none, l2, lof, som "
                                      r"\(MODEL.SPARSECLIP.CALIBRATION.OUTLIER_DETECTOR\)"),
    (dict(outlier_detector="lof", outlier_neighbors=0), r"outlier_neighbors=0 is invalid; valid: an integer >= 1"),
    (dict(outlier_detector="lof", outlier_contamination=0.0), r"outlier_contamination=0.0 is invalid; valid: a "
                                                              r"share in \(0, 1\)"),
    (dict(similarity_layer=-2), r"similarity_layer \(MODEL.SPARSECLIP.CALIBRATION.SIMILARITY_LAYER\) must be -1 "
                                r"\(off\) or a 0-based tap index >= 0, got -2"),
    (dict(similarity_layer=1, similarity_scale=0), r"similarity_scale=0 is invalid; valid: a finite number > 0"),
    (dict(similarity_layer=1, similarity_threshold=1.5), r"similarity_threshold=1.5 is invalid; valid: a cosine in "
                                                         r"\[-1, 1\]"),
    (dict(fusion_layers=(1, 1)), r"fusion_layers names a block twice.*FUSION_LAYERS"),
    (dict(similarity_layer=1, mix_layers=(0,)), r"calibrated last block .* cannot be combined with mix_layers=\(0,\)"),
    (dict(outlier_detector="lof", num_layers=2), r"cannot be combined with num_layers=2; valid: num_layers 1"),
    (dict(similarity_layer=1, source="qq+kk", sum_mode="sum_then_normalize"), r"sum_mode 'sum_then_normalize' is not "
                                                                              r"supported with it; valid: "),
])
def test_bad_calibration_values_name_the_field_key_and_choices(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AttentionSpec.from_settings(**kwargs)


def test_depth_tower_and_inert_checks(deep_visual):
    with pytest.raises(ValueError, match=r"\[4\] are not block inputs of a tower of depth 4; valid: 0-based tap "
                                         r"indices 0..3"):
        DenseCLIPEncoder(deep_visual, AttentionSpec.preset("scclip", **{**SMALL, "fusion_layers": (1, 4)}))
    inert = AttentionSpec(calibration=CalibrationOptions(outlier_neighbors=7, similarity_scale=2.0,
                                                     similarity_threshold=0.5)).inert_settings()
    assert any("outlier_neighbors=7 changes nothing without outlier_detector lof" in m for m in inert)
    assert any("similarity_scale=2 changes nothing without similarity_layer" in m for m in inert)
    assert any("similarity_threshold=0.5 changes nothing" in m for m in inert)
    enc = DenseCLIPEncoder(deep_visual, AttentionSpec.preset("scclip", **{**SMALL, "outlier_neighbors": 40}))
    with pytest.raises(ValueError, match=r"outlier_neighbors=40 needs 1 <= k < N = 16 patch tokens"):
        enc(torch.zeros(1, 3, 64, 64))


def test_grammar_and_config_keys_reach_the_spec():
    s = parse_attention_spec("scclip:entmax:1.2:similarity_layer=8:fusion_layers=3,4:outlier_neighbors=20")
    c = s.calibration
    assert (s.normalizer, s.alpha, c.similarity_layer, c.fusion_layers, c.outlier_neighbors) == (
        "entmax", 1.2, 8, (3, 4), 20)
    with pytest.raises(ValueError, match="fusion_layers='3;4' is not a comma-separated list"):
        parse_attention_spec("scclip:fusion_layers=3;4")
    with pytest.raises(ValueError, match="outlier_contamination='x' is not a number"):
        parse_attention_spec("scclip:outlier_contamination=x")

    from conftest import baseline_cfg

    cfg = baseline_cfg("scclip_b16_voc21")
    assert AttentionSpec.from_config(cfg) == PRESETS["scclip"]
    cfg.merge_from_list(["MODEL.SPARSECLIP.CALIBRATION.OUTLIER_DETECTOR", "zscore"])
    with pytest.raises(ValueError, match=r"MODEL.SPARSECLIP.CALIBRATION: unknown outlier_detector 'zscore'; valid: "
                                         r"none, l2, lof, som"):
        AttentionSpec.from_config(cfg)


def test_dataset_configs_carry_the_upstream_values():
    """SuleBai/SC-CLIP @ 0417ba9 configs/cfg_*.py over base_config.py / the segmentor defaults."""
    from conftest import baseline_cfg

    want = {  # config: (logit scale, prob_thd, area_thd, short side, dataset)
        "scclip_b16": (40.0, 0.0, 0.0, 336, "sparseclip_ade20k_val"),
        "scclip_b16_voc21": (50.0, 0.15, 0.1, 336, "sparseclip_voc21_val"),
        "scclip_b16_voc20": (40.0, 0.0, 0.0, 336, "sparseclip_voc20_val"),
        "scclip_b16_context60": (40.0, 0.15, 0.0, 336, "sparseclip_context60_val"),
        "scclip_b16_context59": (40.0, 0.0, 0.0, 336, "sparseclip_context59_val"),
        "scclip_b16_coco_object": (55.0, 0.35, 0.0, 336, "sparseclip_coco_object_val"),
        "scclip_b16_coco_stuff": (40.0, 0.0, 0.0, 336, "sparseclip_coco_stuff_val"),
        "scclip_b16_cityscapes": (40.0, 0.0, 0.0, 560, "sparseclip_cityscapes_val"),
    }
    for name, (scale, prob, area, short, ds) in want.items():
        cfg = baseline_cfg(name)
        sc, sw = cfg.MODEL.SPARSECLIP, cfg.TEST.SLIDING_WINDOW
        assert (sc.LOGIT_SCALE, sc.PROB_THRESHOLD, sc.AREA_THRESHOLD, cfg.INPUT.MIN_SIZE_TEST) == (scale, prob, area,
                                                                                                  short), name
        assert (sw.ENABLED, sw.CROP_SIZE, sw.STRIDE, cfg.DATASETS.TEST) == (True, 224, 112, (ds,)), name
        assert AttentionSpec.from_config(cfg) == PRESETS["scclip"], name


def test_meta_arch_runs_the_calibrated_block_and_window_batches_do_not_mix():
    """Through ``SparseCLIP`` (sliding windows encoded 4 at a time vs one at a time) on the tiny
    2-block CLIP with every calibrated part on (taps 0 / 1 stand for SC-CLIP's 4 / 9)."""
    from detectron2.modeling import build_model

    from conftest import tiny_cfg

    opts = {"MODEL.SPARSECLIP.CALIBRATION.OUTLIER_DETECTOR": "lof", "MODEL.SPARSECLIP.CALIBRATION.OUTLIER_NEIGHBORS": "5",
            "MODEL.SPARSECLIP.CALIBRATION.SIMILARITY_LAYER": "1", "MODEL.SPARSECLIP.CALIBRATION.POST_SIMILARITY_LAYER": "0",
            "MODEL.SPARSECLIP.CALIBRATION.FUSION_LAYERS": "[0, 1]", "MODEL.SPARSECLIP.ATTENTION.SOURCE": "kk",
            "MODEL.SPARSECLIP.ATTENTION.SUM_MODE": "normalize_then_mean", "MODEL.SPARSECLIP.BLOCK.RESIDUAL": "False",
            "MODEL.SPARSECLIP.BLOCK.FFN": "False", "MODEL.SPARSECLIP.BLOCK.CLS_WEIGHT": "0.3",
            "MODEL.SPARSECLIP.ATTENTION.NORMALIZER": "entmax", "TEST.SLIDING_WINDOW.ENABLED": "True",
            "TEST.SLIDING_WINDOW.CROP_SIZE": "64", "TEST.SLIDING_WINDOW.STRIDE": "32"}
    g = torch.Generator().manual_seed(7)
    x = {"image": torch.randint(0, 256, (3, 96, 128), generator=g, dtype=torch.uint8),
         "vocabulary": ["cat", "dog", "sky", "grass"]}
    model = build_model(tiny_cfg(**opts, **{"TEST.SLIDING_WINDOW.BATCH_SIZE": "4"}))
    assert model.encoder.spec.calibration.outlier_detector == "lof" and model.encoder.spec.normalizer == "entmax"
    out = {}
    for bs in (4, 1):
        model.window_batch_size = bs  # the same weights, windows encoded 4 at a time or one by one
        with torch.no_grad():
            out[bs] = model([x])[0]["sem_seg"]
    assert out[4].shape == (4, 96, 128)
    torch.testing.assert_close(out[4], out[1], atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- SFP
def test_l2_and_som_detectors_by_hand():
    p = torch.zeros(2, 5, 3, dtype=torch.float64)
    p[0, :, 0] = torch.tensor([1.0, 5.0, 2.0, 4.0, 3.0])
    p[1, :, 1] = torch.tensor([9.0, 1.0, 1.0, 8.0, 1.0])
    assert detect_outliers("l2", p, count=2).tolist() == [[False, True, False, True, False],
                                                          [True, False, False, True, False]]
    # SOM: 2 heads, CLS + 3 patches; head means of the CLS row (x 1.5) vs the diagonal
    att = torch.zeros(1, 2, 4, 4, dtype=torch.float64)
    att[0, :, 0, 1:] = torch.tensor([[0.2, 0.1, 0.4], [0.2, 0.3, 0.2]])  # means 0.2, 0.2, 0.3 -> x 1.5: .3 .3 .45
    att[0, :, 1, 1] = 0.25   # 0.30 > 0.25: salient
    att[0, :, 2, 2] = 0.35   # 0.30 < 0.35: not (it would be without the 1.5: 0.2 < 0.35 anyway)
    att[0, :, 3, 3] = 0.40   # 0.45 > 0.40: salient only thanks to the CLS scale (0.3 < 0.4)
    pp = torch.zeros(1, 3, 2, dtype=torch.float64)
    assert detect_outliers("som", pp, attention=att, count=10, cls_scale=1.5).tolist() == [[True, False, True]]
    # without the CLS scale no patch is salient (0.2 < 0.25, 0.2 < 0.35, 0.3 < 0.4)
    assert detect_outliers("som", pp, attention=att, count=10, cls_scale=1.0).tolist() == [[False, False, False]]
    assert detect_outliers("som", pp, attention=att, count=1, cls_scale=1.5).tolist() == [[False, False, True]]
    assert _som_mask64(att[0], 10, 1.5).tolist() == [True, False, True]
    with pytest.raises(ValueError, match="outlier_detector 'som' reads the CLS token's attention"):
        detect_outliers("som", pp, attention=att, num_prefix_tokens=0)


@pytest.mark.parametrize("alpha", [1.0, 1.2])
def test_sfp_layout_matches_float64_reference_with_softmax_and_entmax(rect_visual, alpha):
    """SFP's preset (SOM on the block before the last, (KK + QQ + S) / 3, the fusion branch
    attended by the similarity term alone) on the 4-block tower, softmax and entmax 1.2."""
    extra = {} if alpha == 1.0 else dict(normalizer="entmax", alpha=alpha)
    small = dict(SMALL, outlier_count=4)
    del small["outlier_neighbors"], small["outlier_contamination"]
    spec = AttentionSpec.preset("sfp", **small, **extra)
    images = torch.randn(2, 3, 80, 96, generator=torch.Generator().manual_seed(8))
    enc = DenseCLIPEncoder(rect_visual, spec)
    with torch.no_grad():
        feats = enc(images)
        single = enc(images[:1])
    ref = _calibrated64(rect_visual, images, alpha=alpha, outlier_k=0, contamination=0, sim_layer=2, post_layer=1,
                        fusion=(1, 2, 3), beta=0.4, scale=3.0, cls_weight=0.3, source="qq+kk", detector="som",
                        count=4, cls_scale=1.5, fusion_similarity_only=True, threshold_term=True)
    torch.testing.assert_close(feats.double(), ref, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(single, feats[:1], atol=1e-5, rtol=1e-5)
    for change in (dict(outlier_detector="l2"), dict(fusion_attention="last"), dict(threshold_similarity_term=False)):
        with torch.no_grad():
            other = DenseCLIPEncoder(rect_visual, spec.replace(**change))(images)
        assert (other - feats).abs().max() > 1e-3, change
    ref_l2 = _calibrated64(rect_visual, images, alpha=alpha, outlier_k=0, contamination=0, sim_layer=2, post_layer=1,
                           fusion=(1, 2, 3), beta=0.4, scale=3.0, cls_weight=0.3, source="qq+kk", detector="l2",
                           count=4, fusion_similarity_only=True, threshold_term=True)
    with torch.no_grad():
        l2 = DenseCLIPEncoder(rect_visual, spec.replace(outlier_detector="l2"))(images)
    torch.testing.assert_close(l2.double(), ref_l2, atol=2e-5, rtol=2e-5)


def test_sfp_preset_fields_and_errors():
    s = PRESETS["sfp"]
    c = s.calibration
    # Kimsure/SFP @ 2804f5b SFP_ICCV/configs/base_config.py and clip/model.py
    assert (s.source, s.sum_mode, c.outlier_detector, c.outlier_count, c.outlier_cls_scale) == (
        "qq+kk", "normalize_then_mean", "som", 10, 1.5)
    assert (c.similarity_layer, c.post_similarity_layer, c.fusion_layers, c.fusion_attention) == (
        9, 4, (4, 5, 6, 7, 8, 9, 10), "similarity")
    assert c.threshold_similarity_term and not PRESETS["scclip"].calibration.threshold_similarity_term
    assert s.inert_settings() == [] and s.rows_sum_to == 1
    with pytest.raises(ValueError, match=r"unknown fusion_attention 'mean' \(MODEL.SPARSECLIP.CALIBRATION."
                                         r"FUSION_ATTENTION\); valid: last, similarity"):
        s.replace(fusion_attention="mean")
    with pytest.raises(ValueError, match="fusion_attention 'similarity' .* needs similarity_layer >= 0"):
        s.replace(similarity_layer=-1)
    with pytest.raises(ValueError, match=r"outlier_count=0 is invalid; valid: an integer >= 1"):
        s.replace(outlier_count=0)
    with pytest.raises(ValueError, match=r"outlier_cls_scale=-1 is invalid; valid: a finite number > 0"):
        s.replace(outlier_cls_scale=-1)
    inert = PRESETS["scclip"].replace(outlier_count=3).inert_settings()
    assert inert == ["outlier_count=3 changes nothing without outlier_detector l2 or som"]


def test_sfp_dataset_configs_carry_the_upstream_values():
    """Kimsure/SFP @ 2804f5b SFP_ICCV/configs/cfg_*.py over base_config.py / the segmentor defaults."""
    from sparseclip_d2.data.class_names import load_class_names

    from conftest import baseline_cfg

    want = {  # config: (logit scale, prob_thd, area_thd, short side, dataset)
        "sfp_b16": (40.0, 0.0, 0.0, 384, "sparseclip_ade20k_val"),
        "sfp_b16_voc21": (50.0, 0.15, 0.1, 336, "sparseclip_voc21_val"),
        "sfp_b16_voc20": (40.0, 0.0, 0.0, 336, "sparseclip_voc20_val"),
        "sfp_b16_context60": (40.0, 0.15, 0.0, 336, "sparseclip_context60_val"),
        "sfp_b16_context59": (40.0, 0.0, 0.0, 336, "sparseclip_context59_val"),
        "sfp_b16_coco_object": (55.0, 0.35, 0.0, 336, "sparseclip_coco_object_val"),
        "sfp_b16_coco_stuff": (40.0, 0.0, 0.0, 336, "sparseclip_coco_stuff_val"),
        "sfp_b16_cityscapes": (40.0, 0.0, 0.0, 560, "sparseclip_cityscapes_val"),
    }
    for name, (scale, prob, area, short, ds) in want.items():
        cfg = baseline_cfg(name)
        sc, sw = cfg.MODEL.SPARSECLIP, cfg.TEST.SLIDING_WINDOW
        assert (sc.LOGIT_SCALE, sc.PROB_THRESHOLD, sc.AREA_THRESHOLD, cfg.INPUT.MIN_SIZE_TEST) == (scale, prob, area,
                                                                                                  short), name
        assert (sw.ENABLED, sw.CROP_SIZE, sw.STRIDE, cfg.DATASETS.TEST, sc.CLASS_NAMES) == (True, 224, 112, (ds,),
                                                                                           "sfp"), name
        assert AttentionSpec.from_config(cfg) == PRESETS["sfp"], name
    # SFP's vocabulary: SCLIP's but "people" for "person" (SFP_ICCV/configs/cls_voc21.txt line 16)
    assert load_class_names("voc21", class_set="sfp")[15].startswith("people, people in shirt")
    assert load_class_names("voc21", class_set="sclip")[15].startswith("person, person in shirt")
