"""CLIPtrase's parts: the layer self-correlation map, the DBSCAN cluster vote with its
median filter, the CLS-logit product, the centre-crop protocol, the ``cliptrase`` preset (with
entmax) and their keys; each checked against computations written here (float64 where numeric)."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sparseclip_d2.attention.self_correlation import cls_denoised_correlation, self_correlation_map
from sparseclip_d2.clip import AttentionSpec, DenseCLIPEncoder
from sparseclip_d2.methods.cosine import CosineHead

from test_mixing_and_taps import _qkv64, _tower64, deep_visual  # noqa: F401  (the float64 tower and its fixture)


# ----------------------------------------------------------------------------- self-correlation
def _correlation64(q, k, v):
    """Head mean of (cos QQ + cos KK + cos VV) / 3, pair by pair in float64 (B, L, L)."""
    B, H, L, _ = q.shape
    out = torch.zeros(B, L, L, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for t in (q, k, v):
                a = t[b, h].double()
                for i in range(L):
                    for j in range(L):
                        out[b, i, j] += float(a[i] @ a[j]) / (float(a[i].norm()) * float(a[j].norm())) / 3 / H
    return out


def test_self_correlation_map_matches_a_pairwise_float64_reference():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 6, 5, generator=g, dtype=torch.float64) for _ in range(3))
    ref = _correlation64(q, k, v)
    got = self_correlation_map(q.float(), k.float(), v.float())
    assert got.dtype == torch.float32 and got.shape == (2, 6, 6)
    assert torch.allclose(got.double(), ref, atol=1e-6)
    # CLS row removed from every patch row, negatives clamped: written element by element
    den = cls_denoised_correlation(got)
    for b in range(2):
        for i in range(5):
            for j in range(5):
                want = max(float(ref[b, 1 + i, 1 + j]) - float(ref[b, 0, 1 + j]), 0.0)
                assert abs(float(den[b, i, j]) - want) < 1e-6
    with pytest.raises(ValueError, match="needs a CLS token"):
        cls_denoised_correlation(got, num_prefix_tokens=0)


def test_encoder_block_qkv_gives_the_tapped_blocks_projections(deep_visual):
    """block_qkv(-2, taps[-2 % depth]) = the float64 projections of block 2's input (4 blocks)."""
    torch.manual_seed(1)
    images = torch.randn(1, 3, 64, 64)  # the float64 stem: native grid only
    enc = DenseCLIPEncoder(deep_visual, AttentionSpec.preset("cliptrase"))
    p = enc.forward_pass(images, tap_layers=[2])
    q, k, v = enc.block_qkv(-2, p.taps[2], p.grid)
    _, inputs = _tower64(deep_visual, images, source="qq+kk+vv", mix_layers=(), mix_source="qk", mix_weight=0.0,
                         mix_scale=1.0, residual=True, ffn=True)
    for got, want in zip((q, k, v), _qkv64(deep_visual.transformer.resblocks[2], inputs[2])):
        assert torch.allclose(got.double(), want, atol=1e-4)
    with pytest.raises(ValueError, match="valid: -4..3"):
        enc.block_index(4)


# ----------------------------------------------------------------------------- the preset with entmax
def test_cliptrase_preset_with_entmax_matches_float64_tower(deep_visual):
    """preset cliptrase with NORMALIZER entmax alpha 1.2: entmax(QQ) + entmax(KK) + entmax(VV)
    (rows sum to 3), residual and FFN kept, against the float64 tower of test_methods."""
    spec = AttentionSpec.preset("cliptrase", normalizer="entmax", alpha=1.2)
    assert (spec.source, spec.sum_mode, spec.residual, spec.ffn) == ("qq+kk+vv", "normalize_then_sum", True, True)
    torch.manual_seed(2)
    images = torch.randn(2, 3, 64, 64)
    enc = DenseCLIPEncoder(deep_visual, spec)
    feats, attn = enc(images, return_attention=True)
    ref, _ = _tower64(deep_visual, images, source="qq+kk+vv", mix_layers=(), mix_source="qk", mix_weight=0.0,
                      mix_scale=1.0, residual=True, ffn=True, alpha=1.2)
    assert torch.allclose(feats.double(), ref, atol=1e-4)
    assert torch.allclose(attn.sum(-1), torch.full_like(attn.sum(-1), 3.0), atol=1e-5)


# ----------------------------------------------------------------------------- cluster vote
def _settings(**kw):
    from sparseclip_d2.methods.cliptrase.cluster_vote import ClusterVoteSettings

    return ClusterVoteSettings(**kw)


def test_cluster_assignment_of_two_planted_groups():
    """A 4x4 grid whose left two columns correlate only among themselves (rows = e_left) and
    right columns likewise: DBSCAN finds the two groups; with upsample 1 and no median filter
    the cluster maps are the two group indicator maps (their row means), so every pixel of the
    left half takes cluster 0 and of the right half cluster 1 (bilinear resize of a 0/1 step)."""
    from sparseclip_d2.methods.cliptrase.cluster_vote import cluster_assignment

    h = w = 4
    left = torch.tensor([[c < 2 for c in range(w)] for _ in range(h)], dtype=torch.float32).flatten()
    corr = torch.stack([left if bool(left[i]) else 1 - left for i in range(h * w)])
    a = cluster_assignment(corr, (h, w), _settings(eps=0.5, min_samples=2, upsample=1, median_size=1), (8, 8))
    want = torch.tensor([[0] * 4 + [1] * 4] * 8)
    assert torch.equal(a, want)
    # every patch alone (min_samples above the group size): no cluster, None
    assert cluster_assignment(corr, (h, w), _settings(eps=0.5, min_samples=9), (8, 8)) is None


def test_cluster_assignment_padding_and_median_filter():
    """With padding the cluster maps are resized to the padded image and cropped back; the
    median filter (size 3) removes a one-patch spike of a cluster map that wins without it."""
    from sparseclip_d2.methods.cliptrase.cluster_vote import cluster_assignment

    h, w = 3, 4
    left = torch.tensor([True, True, False, False] * 3)
    corr = torch.stack([left.float() if bool(left[i]) else (~left).float() for i in range(h * w)])
    s = _settings(eps=0.5, min_samples=2, upsample=1, median_size=1)
    a = cluster_assignment(corr, (h, w), s, (3 * 16 - 4, 4 * 16 - 6), pad=(3, 3, 2, 2), patch_size=16)
    assert a.shape == (44, 58)
    # padded image 64 wide, crop [3, 61): the halves meet at 32 - 3 = 29 (cluster 0 = the left group)
    assert bool((a[:, :28] == 0).all()) and bool((a[:, 30:] == 1).all())
    spiked = corr.clone()
    spiked[~left, 5] = 5.0  # the right group's map peaks at patch (1, 1) of the left half
    no_median = cluster_assignment(spiked, (h, w), s, (h, w))
    assert int(no_median[1, 1]) == 1
    median = cluster_assignment(spiked, (h, w), _settings(eps=0.5, min_samples=2, upsample=1, median_size=3), (h, w))
    assert torch.equal(median, torch.tensor([[0, 0, 1, 1]] * 3))


def test_majority_vote_hand_example():
    from sparseclip_d2.methods.cliptrase.cluster_vote import majority_vote

    labels = torch.tensor([[1, 1, 2, 3],
                           [1, 2, 3, 3],
                           [5, 4, 4, 5]])
    clusters = torch.tensor([[0, 0, 0, 1],
                             [0, 0, 1, 1],
                             [2, 2, 2, 2]])
    out = majority_vote(labels, clusters)
    # cluster 0: labels 1,1,2,1,2 -> 1; cluster 1: 3,3,3 -> 3; cluster 2: 5,4,4,5 tie -> lower 4
    assert torch.equal(out, torch.tensor([[1, 1, 1, 3], [1, 1, 3, 3], [4, 4, 4, 4]]))


def test_cluster_vote_settings_refuse_bad_values():
    with pytest.raises(ValueError, match="CLUSTER_VOTE.EPS = -1"):
        _settings(eps=-1.0)
    with pytest.raises(ValueError, match="MIN_SAMPLES = 0"):
        _settings(min_samples=0)


# ----------------------------------------------------------------------------- centre crop
def test_center_crop_matches_torchvision_resize_and_center_crop():
    """The image crop equals torchvision's Resize(n, BICUBIC) + CenterCrop(n) on the PIL image
    (CLIPtrase's _transform1), the label crop Resize(n, NEAREST) + CenterCrop(n) (gt_transform)."""
    from PIL import Image
    from torchvision.transforms import CenterCrop, Compose, InterpolationMode, Resize

    from sparseclip_d2.data.center_crop import CenterCropResize, center_crop_geometry, center_crop_labels

    assert center_crop_geometry(375, 500, 224) == ((224, 298), (0, 37))  # int(224 * 500 / 375) = 298
    assert center_crop_geometry(500, 333, 224) == ((336, 224), (56, 0))
    rng = np.random.default_rng(0)
    for h, w in ((75, 100), (90, 61), (40, 40)):
        img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        ref = np.asarray(Compose([Resize(32, interpolation=InterpolationMode.BICUBIC), CenterCrop(32)])(
            Image.fromarray(img)))
        got = CenterCropResize(32).get_transform(img).apply_image(img)
        assert got.shape == (32, 32, 3) and np.array_equal(got, ref)
        lab = rng.integers(0, 21, (h, w), dtype=np.uint8)
        lab[0, 0] = 255
        ref = np.asarray(Compose([Resize(32, interpolation=InterpolationMode.NEAREST), CenterCrop(32)])(
            Image.fromarray(lab)))
        assert np.array_equal(center_crop_labels(lab, 32), ref)
        assert np.array_equal(center_crop_labels(lab.astype(np.int64), 32), ref.astype(np.int64))
    with pytest.raises(ValueError, match="CENTER_CROP_TEST"):
        center_crop_geometry(10, 10, 0)


# ----------------------------------------------------------------------------- the model
def _tiny(**opts):
    from detectron2.modeling import build_model

    from conftest import tiny_cfg

    return build_model(tiny_cfg(**opts))


def test_cls_logit_product_multiplies_each_synonym_by_the_cls_logit():
    """encode_logits with CLS_LOGIT_PRODUCT = (logit_scale cos(patch, t)) * (logit_scale cos(CLS, t))."""
    model = _tiny(**{"MODEL.SPARSECLIP.CLS_LOGIT_PRODUCT": "True", "MODEL.SPARSECLIP.LOGIT_SCALE": "20.0"})
    torch.manual_seed(3)
    images = torch.randn(2, 3, 64, 48)
    emb = F.normalize(torch.randn(5, model.encoder.embed_dim), dim=-1)
    got = model.encode_logits(images, emb)
    model.head = CosineHead()  # the same model without its CLS-product head
    plain = model.encode_logits(images, emb).double()
    tokens, grid, _ = model.encoder.forward_tokens(images)
    cls = F.normalize(model.encoder.pooled_embedding(tokens).double(), dim=-1)
    want = plain * (20.0 * cls @ emb.double().T)[:, :, None, None]
    assert torch.allclose(got.double(), want, atol=1e-4)


def test_cluster_vote_through_the_model_is_the_vote_of_its_own_labels():
    """forward with CLUSTER_VOTE returns sem_seg_labels that are constant on every DBSCAN
    cluster region and equal to the majority of the un-voted labels there (recomputed here
    from the encoder's tapped block, the self-correlation reference and sklearn's DBSCAN)."""
    from sklearn.cluster import DBSCAN

    opts = {"MODEL.SPARSECLIP.CLUSTER_VOTE.ENABLED": "True", "MODEL.SPARSECLIP.CLUSTER_VOTE.EPS": "1.1",
            "MODEL.SPARSECLIP.CLUSTER_VOTE.MIN_SAMPLES": "2", "MODEL.SPARSECLIP.CLUSTER_VOTE.LAYER": "-1",
            "MODEL.SPARSECLIP.ATTENTION.SOURCE": "qq+kk+vv"}
    model = _tiny(**opts)
    torch.manual_seed(4)
    image = torch.randint(0, 256, (3, 64, 80), dtype=torch.uint8)
    x = {"image": image, "vocabulary": ["cat", "dog", "sky", "grass"], "height": 64, "width": 80}
    voted = model([x])[0]["sem_seg_labels"]
    out = model.predict(x)
    maps, labels2 = out.score_maps, out.labels
    assert torch.equal(voted, labels2)
    plain = maps.labels()
    p = model.encoder.forward_pass(model.normalize_image(image)[None], tap_layers=[1])
    q, k, v = _qkv64(model.encoder.visual.transformer.resblocks[1], p.taps[1].double())
    corr = _correlation64(q, k, v)[0]
    den = (corr[1:, 1:] - corr[:1, 1:]).clamp(min=0)
    db = DBSCAN(eps=1.1, min_samples=2).fit_predict(den.float().numpy())
    assert len(set(db.tolist()) - {-1}) >= 2, "the planted test needs clusters"
    # each output pixel's cluster region: the vote makes labels constant within it
    from sparseclip_d2.methods.cliptrase.cluster_vote import cluster_assignment

    a = cluster_assignment(cls_denoised_correlation(self_correlation_map(*model.encoder.block_qkv(
        -1, p.taps[1], p.grid)))[0], p.grid, model.stage("cluster_vote").settings, (64, 80))
    changed = 0
    for c in a.unique().tolist():
        mask = a == c
        vals, counts = plain[mask].unique(return_counts=True)
        assert bool((voted[mask] == vals[counts.argmax()]).all())
        changed += int((plain[mask] != voted[mask]).sum())
    assert changed > 0, "the vote changed nothing: the test would not see a broken vote"


@pytest.mark.parametrize("opts, match", [
    ({"MODEL.SPARSECLIP.CLUSTER_VOTE.EPS": "0.0"}, r"CLUSTER_VOTE.EPS = 0.0 is invalid; valid: a number in \(0"),
    ({"MODEL.SPARSECLIP.CLUSTER_VOTE.MIN_SAMPLES": "0"}, "CLUSTER_VOTE.MIN_SAMPLES = 0 is invalid"),
    ({"MODEL.SPARSECLIP.CLUSTER_VOTE.MEDIAN_SIZE": "0"}, "CLUSTER_VOTE.MEDIAN_SIZE = 0 is invalid"),
    ({"INPUT.CENTER_CROP_TEST": "-5"}, "INPUT.CENTER_CROP_TEST = -5 is invalid"),
    ({"MODEL.SPARSECLIP.CLUSTER_VOTE.ENABLED": "True", "TEST.SLIDING_WINDOW.ENABLED": "True"},
     "TEST.SLIDING_WINDOW.ENABLED = True is invalid with it; valid: False"),
    ({"MODEL.SPARSECLIP.CLUSTER_VOTE.ENABLED": "True", "MODEL.SPARSECLIP.PATCH_REMAINDER": "truncate"},
     "PATCH_REMAINDER = 'truncate' is invalid with it; valid: pad_crop"),
    ({"MODEL.SPARSECLIP.CLS_LOGIT_PRODUCT": "True", "MODEL.SPARSECLIP.FEATURE_SURGERY.ENABLED": "True"},
     "CLS_LOGIT_PRODUCT cannot be combined with MODEL.SPARSECLIP.FEATURE_SURGERY.ENABLED: both compute the window logits"),
    ({"MODEL.SPARSECLIP.CLUSTER_VOTE.ENABLED": "True", "TEST.TTA.MODE": "itaclip"},
     "CLUSTER_VOTE.ENABLED cannot be combined with TEST.TTA.MODE: it reads a block's self-correlation"),
    ({"MODEL.SPARSECLIP.CLS_LOGIT_PRODUCT": "True", "MODEL.SPARSECLIP.PROXY.NAME": "vit_base_patch8_224.dino"},
     "CLS_LOGIT_PRODUCT True cannot be combined with MODEL.SPARSECLIP.PROXY.NAME = 'vit_base_patch8_224.dino'"),
])
def test_cliptrase_keys_are_refused_before_the_model_is_built(opts, match):
    from sparseclip_d2.config import check_sparseclip_config

    from conftest import tiny_cfg

    with pytest.raises(ValueError, match=match):
        check_sparseclip_config(tiny_cfg(**opts))


def test_center_crop_evaluator_scores_the_cropped_ground_truth(tmp_path):
    """With INPUT.CENTER_CROP_TEST the evaluator compares the prediction with the ground truth
    resized (nearest) and centre-cropped as torchvision does; a prediction equal to that crop
    scores 100 mIoU, one of the full size is refused naming both sizes."""
    from PIL import Image
    from torchvision.transforms import CenterCrop, Compose, InterpolationMode, Resize

    from sparseclip_d2.evaluation import build_evaluator

    from conftest import register_sem_seg, tiny_cfg

    rng = np.random.default_rng(1)
    gt = rng.integers(0, 3, (30, 45), dtype=np.uint8)
    gt[:3, :3] = 255
    Image.fromarray(gt).save(tmp_path / "gt.png")
    Image.fromarray(rng.integers(0, 256, (30, 45, 3), dtype=np.uint8)).save(tmp_path / "img.png")
    dicts = [{"file_name": str(tmp_path / "img.png"), "sem_seg_file_name": str(tmp_path / "gt.png"),
              "height": 30, "width": 45}]
    register_sem_seg("sparseclip_test_center_crop", dicts, ["a", "b", "c"])
    crop = np.asarray(Compose([Resize(16, interpolation=InterpolationMode.NEAREST), CenterCrop(16)])(
        Image.fromarray(gt))).astype(np.int64)
    ev = build_evaluator(tiny_cfg(**{"INPUT.CENTER_CROP_TEST": "16"}), "sparseclip_test_center_crop")
    ev.reset()
    pred = torch.from_numpy(np.where(crop == 255, 0, crop))
    ev.process(dicts, [{"sem_seg_labels": pred}])
    assert ev.evaluate()["sem_seg"]["mIoU"] == pytest.approx(100.0)
    ev.reset()
    wrong = pred.clone()
    wrong[crop == 1] = 2  # class b predicted as c on the crop: IoU(b) = 0
    ev.process(dicts, [{"sem_seg_labels": wrong}])
    assert ev.evaluate()["sem_seg"]["IoU-b"] == pytest.approx(0.0)
    with pytest.raises(ValueError, match=r"prediction \(30, 45\) and centre-cropped ground truth \(16, 16\)"):
        ev.process(dicts, [{"sem_seg_labels": torch.zeros(30, 45, dtype=torch.long)}])
