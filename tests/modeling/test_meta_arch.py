"""SparseCLIP META_ARCH, backbone, sliding window and post-processing."""
import itertools
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

import sparseclip_d2  # noqa: F401  (registers everything)
from conftest import tiny_cfg
from sparseclip_d2.clip import AttentionSpec, DenseCLIPEncoder, TextClassifier
from sparseclip_d2.common.needs import Needs
from sparseclip_d2.modeling import SparseCLIP, class_scores, dense_logits, symmetric_pad, window_grid



# ---------------------------------------------------------------- window grid (pure torch)
def test_window_grid_mmseg_known_sizes():
    # 336 x 500, crop 224, stride 112: rows (0,224),(112,336); columns 0,112,224 and the
    # last one snapped to the edge (276,500). Hand-computed.
    rows = [(0, 224), (112, 336)]
    cols = [(0, 224), (112, 336), (224, 448), (276, 500)]
    expected = [(y1, y2, x1, x2) for (y1, y2), (x1, x2) in itertools.product(rows, cols)]
    assert window_grid(336, 500, 224, 112) == expected
    # Image smaller than the crop: one window, the whole image.
    assert window_grid(100, 150, 224, 112) == [(0, 100, 0, 150)]
    # Exactly one crop.
    assert window_grid(448, 448, 448, 224) == [(0, 448, 0, 448)]
    # 448 x 597, crop 448 / stride 224 (ClearCLIP at 448): columns 0 and 149.
    assert window_grid(448, 597, 448, 224) == [(0, 448, 0, 448), (0, 448, 149, 597)]
    with pytest.raises(ValueError, match="stride"):
        window_grid(10, 10, 4, 0)


def test_symmetric_pad():
    assert symmetric_pad(48, 64, 16) == (0, 0, 0, 0)
    assert symmetric_pad(50, 61, 16) == (1, 2, 7, 7)  # W 61 -> 64, H 50 -> 64


def _pooled_logits(x):
    """A deterministic 'encoder': 16x16 average pooling, 3 channels = 3 logits."""
    return F.avg_pool2d(x, 16) * torch.tensor([1.0, -2.0, 0.5]).view(1, 3, 1, 1)


def test_dense_logits_covering_crop_equals_whole_and_counts():
    torch.manual_seed(0)
    image = torch.randn(3, 50, 70)
    whole = dense_logits(image, _pooled_logits, patch_size=16)
    covering = dense_logits(image, _pooled_logits, patch_size=16, crop_size=128, stride=64)
    assert whole.shape == (3, 50, 70)
    torch.testing.assert_close(covering, whole, rtol=0, atol=0)
    # Overlap averaging: a constant image gives constant logits whatever the grid.
    const = torch.ones(3, 64, 96)
    slid = dense_logits(const, _pooled_logits, patch_size=16, crop_size=32, stride=16)
    torch.testing.assert_close(slid, torch.tensor([1.0, -2.0, 0.5]).view(3, 1, 1).expand(3, 64, 96))


def test_dense_logits_batched_windows_equal_one_by_one_and_calls_are_batched():
    torch.manual_seed(0)
    image = torch.randn(3, 80, 112)
    calls = []

    def fn(x):
        calls.append(x.shape[0])
        return _pooled_logits(x)

    batched = dense_logits(image, fn, patch_size=16, crop_size=48, stride=32, batch_size=4)
    n_windows = len(window_grid(80, 112, 48, 32))
    assert n_windows == 2 * 3 and calls == [4, 2]
    calls.clear()
    single = dense_logits(image, fn, patch_size=16, crop_size=48, stride=32, batch_size=1)
    assert calls == [1] * n_windows
    torch.testing.assert_close(batched, single)


# ---------------------------------------------------------------- post-processing
def test_class_scores_synonym_max_and_prob_threshold():
    # 3 synonyms: class 0 has one, class 1 has two. Pixel A is confident, pixel B is not.
    logits = torch.tensor([[1.0, 0.0], [3.0, 0.0], [2.0, 0.1]]).view(3, 1, 2)
    class_index = torch.tensor([0, 1, 1])
    probs = logits.softmax(0)
    scores = class_scores(logits, class_index, 2)
    torch.testing.assert_close(scores[0], probs[0])
    torch.testing.assert_close(scores[1], torch.maximum(probs[1], probs[2]))
    # Pixel B's best probability is ~0.356 < 0.5: becomes the background (class 0) only
    # when the threshold is on and a background exists.
    assert scores.argmax(0).flatten().tolist() == [1, 1]
    thr = class_scores(logits, class_index, 2, prob_threshold=0.5, background_index=0)
    assert thr.argmax(0).flatten().tolist() == [1, 0]
    no_bg = class_scores(logits, class_index, 2, prob_threshold=0.5, background_index=None)
    assert no_bg.argmax(0).flatten().tolist() == [1, 1]


def test_class_scores_area_threshold():
    # 10 pixels: class 1 wins 9, class 2 wins 1 (10% of foreground), background never.
    logits = torch.zeros(3, 1, 10)
    logits[1, 0, :9] = 5.0
    logits[2, 0, 9] = 5.0
    idx = torch.arange(3)
    kept = class_scores(logits, idx, 3, area_threshold=0.05, background_index=0)
    assert kept.argmax(0).flatten().tolist() == [1] * 9 + [2]
    cut = class_scores(logits, idx, 3, area_threshold=0.2, background_index=0)
    assert cut[2].abs().sum() == 0
    assert cut.argmax(0).flatten().tolist()[-1] != 2


# ---------------------------------------------------------------- planted embeddings: 100 mIoU
class ColourCodedEncoder(nn.Module):
    """Fake encoder: a patch's embedding is the one-hot of round((mean R - 20) / 40)."""

    patch_size = 16
    needs = Needs()  # the encoder contract: nothing besides the windows

    def __init__(self, num_classes):
        super().__init__()
        self.embed_dim = num_classes

    def forward(self, x):
        cls = ((F.avg_pool2d(x[:, :1], 16)[:, 0] - 20) / 40).round().long().clamp(0, self.embed_dim - 1)
        return F.one_hot(cls, self.embed_dim).permute(0, 3, 1, 2).float()


def planted_model(num_classes, **kw):
    def text_classifier(names):
        return torch.eye(num_classes), torch.arange(num_classes)

    args = dict(encoder=ColourCodedEncoder(num_classes), text_classifier=text_classifier,
                pixel_mean=[0.0, 0.0, 0.0], pixel_std=[1.0, 1.0, 1.0], logit_scale=100.0)
    args.update(kw)
    return SparseCLIP(**args)


def _write_planted_dataset(folder, layouts):
    dicts = []
    for i, label in enumerate(layouts):
        image = np.repeat((label.clip(0, 10) * 40 + 20).astype(np.uint8)[:, :, None], 3, axis=2)
        gt = label.astype(np.uint8)
        ip, gp = os.path.join(folder, f"{i}.png"), os.path.join(folder, f"{i}_gt.png")
        Image.fromarray(image).save(ip)
        Image.fromarray(gt).save(gp)
        dicts.append({"file_name": ip, "sem_seg_file_name": gp, "image_id": str(i)})
    return dicts


@pytest.mark.parametrize("sliding", [False, True])
def test_planted_embeddings_reach_100_miou(tmp_path, sliding):
    from detectron2.data import DatasetCatalog, build_detection_test_loader
    from detectron2.evaluation import inference_on_dataset

    from sparseclip_d2.data import SparseCLIPTestMapper
    from sparseclip_d2.data.datasets import register_sem_seg_dataset
    from sparseclip_d2.evaluation import build_evaluator

    # Class regions are unions of 32-px stripes, so bilinear upsampling keeps every pixel.
    a = np.zeros((64, 96), np.int64)
    a[:, 32:64], a[:, 64:] = 1, 2
    b = np.full((96, 64), 3, np.int64)
    b[32:64], b[64:] = 0, 1
    gt_b = b.copy()
    layouts = [a, b]
    dicts = _write_planted_dataset(str(tmp_path), layouts)
    # Ignored pixels (255) in the ground truth do not count.
    g = np.array(Image.open(dicts[1]["sem_seg_file_name"]))
    g[:4, :4] = 255
    Image.fromarray(g).save(dicts[1]["sem_seg_file_name"])
    assert (gt_b == b).all()

    name = f"planted_{sliding}_{os.getpid()}"
    register_sem_seg_dataset(name, lambda: dicts, class_names=["a", "b, bee", "c", "d"], background_index=None,
                             reduce_zero_label=False, dataset_root=str(tmp_path), prepare_command="none")
    try:
        model = planted_model(4, sliding_window=sliding, crop_size=32, stride=16, window_batch_size=3)
        mapper = SparseCLIPTestMapper(dataset_name=name, augmentations=[], image_format="RGB")
        loader = build_detection_test_loader(dicts, mapper=mapper, num_workers=0)
        res = inference_on_dataset(model, loader, build_evaluator(None, name, None))["sem_seg"]
        assert res["mIoU"] == pytest.approx(100.0)
        assert res["pACC"] == pytest.approx(100.0)
        # And a wrong planting is caught: swap two text embeddings -> below 100.
        perm = torch.eye(4)[[1, 0, 2, 3]]
        bad = planted_model(4, text_classifier=lambda n: (perm, torch.arange(4)))
        res = inference_on_dataset(bad, build_detection_test_loader(dicts, mapper=mapper, num_workers=0),
                                   build_evaluator(None, name, None))["sem_seg"]
        assert res["mIoU"] < 60
    finally:
        DatasetCatalog.remove(name)


def test_output_at_original_size_and_batch_equals_single():
    model = planted_model(3)
    label = np.zeros((48, 64), np.int64)
    label[:, 32:] = 2
    img = torch.as_tensor(np.repeat((label * 40 + 20).astype(np.uint8)[None], 3, 0))
    x1 = {"image": img, "height": 96, "width": 128, "vocabulary": ["a", "b", "c"]}
    x2 = {"image": img[:, :32, :48].clone(), "vocabulary": ["a", "b", "c"]}
    out = model([x1, x2])
    assert out[0]["sem_seg"].shape == (3, 96, 128)
    assert out[1]["sem_seg"].shape == (3, 32, 48)
    torch.testing.assert_close(model([x1])[0]["sem_seg"], out[0]["sem_seg"])
    torch.testing.assert_close(model([x2])[0]["sem_seg"], out[1]["sem_seg"])
    pred = out[0]["sem_seg"].argmax(0)
    assert (pred[:, :64] == 0).all() and (pred[:, 64:] == 2).all()
    with pytest.raises(ValueError, match="dataset_name"):
        model([{"image": img}])


# ---------------------------------------------------------------- real tiny CLIP
def _tiny_model(tiny_clip, **kw):
    clip, tokenizer, _ = tiny_clip
    encoder = DenseCLIPEncoder(clip.visual, AttentionSpec(source="qq", normalizer="entmax", alpha=1.2))
    args = dict(encoder=encoder, clip_model=clip, text_classifier=TextClassifier(clip, tokenizer, "single"),
                pixel_mean=[255 * m for m in encoder.image_mean], pixel_std=[255 * s for s in encoder.image_std])
    args.update(kw)
    return SparseCLIP(**args)


def test_tiny_clip_sliding_window_equivalences(tiny_clip):
    torch.manual_seed(0)
    img = torch.randint(0, 256, (3, 64, 96), dtype=torch.uint8)
    x = {"image": img, "vocabulary": ["cat, kitten", "dog", "sky"], "background_index": None}
    whole = _tiny_model(tiny_clip)([x])[0]["sem_seg"]
    covering = _tiny_model(tiny_clip, sliding_window=True, crop_size=128, stride=64)([x])[0]["sem_seg"]
    torch.testing.assert_close(covering, whole)
    batched = _tiny_model(tiny_clip, sliding_window=True, crop_size=48, stride=16, window_batch_size=8)
    single = _tiny_model(tiny_clip, sliding_window=True, crop_size=48, stride=16, window_batch_size=1)
    torch.testing.assert_close(batched([x])[0]["sem_seg"], single([x])[0]["sem_seg"], rtol=1e-4, atol=1e-5)
    m = _tiny_model(tiny_clip)
    emb, idx = m.text_classifier_for(x["vocabulary"])
    assert emb.shape == (4, 32) and idx.tolist() == [0, 0, 1, 2]
    assert m.text_classifier_for(x["vocabulary"])[0] is emb  # cached
    il = m.normalize_images([x, {"image": img[:, :40, :50]}])
    assert il.tensor.shape == (2, 3, 64, 96) and il.image_sizes == [(64, 96), (40, 50)]




def test_build_model_from_config_and_demo_vocabulary():
    from detectron2.modeling import build_model

    cfg = tiny_cfg(**{"MODEL.SPARSECLIP.ATTENTION.SOURCE": "qq", "MODEL.SPARSECLIP.ATTENTION.NORMALIZER": "entmax",
                       "MODEL.SPARSECLIP.PROB_THRESHOLD": 0.99})
    model = build_model(cfg)
    assert isinstance(model, SparseCLIP) and model.random_weights and model.clip_model is not None
    assert model.encoder.spec.normalizer == "entmax"
    img = torch.randint(0, 256, (3, 64, 80), dtype=torch.uint8)
    out = model([{"image": img, "dataset_name": "sparseclip_demo", "height": 30, "width": 40}])
    assert out[0]["sem_seg"].shape == (21, 30, 40)
    # Random weights give near-uniform probabilities: all below 0.99 -> background (0).
    assert (out[0]["sem_seg"].argmax(0) == 0).all()
    keys = [k for k in model.state_dict() if k.startswith("pixel_")]
    assert keys == []  # non-persistent buffers


def test_backbone_through_build_backbone():
    from detectron2.modeling import build_backbone

    from sparseclip_d2.modeling import SparseCLIPBackbone

    cfg = tiny_cfg(**{"MODEL.BACKBONE.NAME": "SparseCLIPBackbone", "MODEL.SPARSECLIP.ATTENTION.SOURCE": "vv"})
    backbone = build_backbone(cfg)
    assert isinstance(backbone, SparseCLIPBackbone)
    shape = backbone.output_shape()["clip"]
    assert (shape.channels, shape.stride) == (32, 16) and backbone.size_divisibility == 16
    feats = backbone(torch.randn(2, 3, 64, 96))["clip"]
    assert feats.shape == (2, 32, 4, 6)
    assert not any(p.requires_grad for p in backbone.parameters())
    with pytest.raises(ValueError, match="multiples of 16"):
        backbone(torch.randn(1, 3, 60, 96))


def test_unloadable_weights_say_how_to_fix():
    from detectron2.modeling import build_model

    cfg = tiny_cfg(**{"MODEL.SPARSECLIP.CLIP.PRETRAINED": "/nonexistent/ckpt.pt"})
    with pytest.raises(RuntimeError) as e:
        build_model(cfg)
    msg = str(e.value)
    # a missing file: the fix is to pass an existing one or none (no offline advice: nothing was downloaded)
    assert "'/nonexistent/ckpt.pt'" in msg and "does not exist; pass an existing local checkpoint file" in msg
    assert "or `none`" in msg and "Offline?" not in msg


def test_a_published_vocabulary_keeps_its_duplicate_name_and_the_lower_class_wins():
    """An input ``vocabulary`` naming ``bed`` twice (SCLIP's COCO-Object file: among class 0's
    background words and as a class) is refused, unless ``vocabulary_as_published``; then the
    later ``bed`` class scores at most what class 0 scores (the max over its synonyms includes
    the same ``bed`` text) and never wins a pixel."""
    from detectron2.modeling import build_model

    model = build_model(tiny_cfg()).eval()
    g = torch.Generator().manual_seed(0)
    image = torch.randint(0, 256, (3, 32, 48), generator=g, dtype=torch.uint8)
    vocab = ["wall, bed", "cat", "bed"]
    with pytest.raises(ValueError, match="duplicate name 'bed' in class 0 .* and class 2"):
        model.predict({"image": image, "vocabulary": vocab})
    with torch.no_grad():
        out = model.predict({"image": image, "vocabulary": vocab, "vocabulary_as_published": True})
        ref = model.predict({"image": image, "vocabulary": ["wall, bed", "cat"]})
    scores = out.score_maps.scores()
    assert scores.shape[0] == 3
    assert (scores[2] <= scores[0]).all()
    labels = out.label_map()
    assert not (labels == 2).any()
    # the third class changes nothing else: the map is that of the vocabulary without it
    assert torch.equal(labels, ref.label_map())
