"""Labels from banded window logits (WindowLogits, rows made on demand) equal, bit for bit, the
labels from the whole (S, h, w) working logits: scores, background rules, argmax ties (the first
maximum, i.e. the lowest class index, wins in both) and the META_ARCH's predict path."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import sparseclip_d2  # noqa: F401  (registers everything)
from sparseclip_d2.clip import AttentionSpec, DenseCLIPEncoder, TextClassifier
from sparseclip_d2.dense import windows
from sparseclip_d2.dense.windows import WindowLogits, window_logits
from sparseclip_d2.modeling import SparseCLIP
from sparseclip_d2.modeling.postprocess import ScoreMaps


def _fn(weight):
    def fn(crops):  # (N, 3, h, w) -> (N, K, h / 4, w / 4)
        return torch.einsum("kc,nchw->nkhw", weight, F.avg_pool2d(crops, 4))
    return fn


def _lazy(image, weight, band_rows):
    return window_logits(image, _fn(weight), patch_size=4, crop_size=20, stride=8, batch_size=2,
                         band_rows=band_rows)


@pytest.mark.parametrize("rules", [dict(), dict(prob_threshold=0.4, background_index=0),
                                   dict(area_threshold=0.2, background_index=1)])
def test_banded_scores_and_labels_equal_the_whole_tensor(rules):
    torch.manual_seed(0)
    image = torch.randn(3, 36, 44)
    weight = torch.randn(6, 3) * 3
    class_index = torch.tensor([0, 1, 1, 2, 3, 2])
    whole = _lazy(image, weight, None).full()
    for out_size in [None, (80, 97), (25, 30)]:
        # the same output bands (the softmax kernel's vector / scalar split follows the band's size),
        # working rows made in bands of 3 on one side, held whole on the other
        ref = ScoreMaps(whole, class_index, 4, out_size=out_size, band_rows=5, **rules)
        got = ScoreMaps(_lazy(image, weight, 3), class_index, 4, out_size=out_size, band_rows=5, **rules)
        assert isinstance(got.source, WindowLogits)
        assert torch.equal(got.labels(), ref.labels())
        assert torch.equal(got.scores(), ref.scores())
        assert torch.equal(got.suppressed(), ref.suppressed())
        assert torch.equal(got.logits, whole)  # made whole on request


def test_argmax_ties_resolve_to_the_first_maximum_as_a_float64_hand_computation():
    # Synonym 0 (class 1) and synonym 2 (class 0) have the same text weights, so equal logits and
    # equal probabilities: where they are the largest, classes 0 and 1 tie and the lower class (0)
    # wins. Synonym 1 (class 0) is their negative; synonym 3 (class 2) its own direction.
    torch.manual_seed(1)
    image = torch.randn(3, 40, 48)
    w = torch.tensor([1.0, 0.5, -0.3])
    weight = torch.stack([w, -w, w, torch.tensor([-0.4, 1.0, 0.6])]) * 4
    class_index = torch.tensor([1, 0, 0, 2])
    out_size = (90, 101)
    lazy = _lazy(image, weight, 2)
    got = ScoreMaps(lazy, class_index, 3, out_size=out_size, band_rows=3).labels()
    whole = ScoreMaps(lazy.full(), class_index, 3, out_size=out_size, band_rows=3).labels()
    assert torch.equal(got, whole)
    # float64 by hand: resize the logits, softmax, max over each class's synonyms, first maximum
    logits = F.interpolate(lazy.full()[None].double(), size=out_size, mode="bilinear", align_corners=False)[0]
    probs = logits.softmax(0).numpy()
    cls = np.stack([np.maximum(probs[1], probs[2]), probs[0], probs[3]])  # classes 0, 1, 2
    ties = cls[0] == cls[1]
    assert ties.mean() > 0.2  # the tie is the maximum on a good part of the image
    expected = cls.argmax(0)  # numpy: the first maximum
    top2 = np.sort(cls, axis=0)[-2:]
    clear = (top2[1] - top2[0] > 1e-5) | ties
    assert clear.mean() > 0.95
    assert (got.numpy()[clear] == expected[clear]).all()
    assert (got.numpy()[ties & (cls[0] >= cls[2])] == 0).all()  # never class 1 on a tie


def _tiny_model(tiny_clip, **kw):
    clip, tokenizer, _ = tiny_clip
    encoder = DenseCLIPEncoder(clip.visual, AttentionSpec(source="qq", normalizer="entmax", alpha=1.2))
    return SparseCLIP(encoder=encoder, clip_model=clip, text_classifier=TextClassifier(clip, tokenizer, "single"),
                      pixel_mean=[255 * m for m in encoder.image_mean],
                      pixel_std=[255 * s for s in encoder.image_std], **kw)


@pytest.mark.parametrize("batch", [1, 8])
def test_predict_keeps_window_logits_banded_and_labels_identical(tiny_clip, monkeypatch, batch):
    torch.manual_seed(0)
    img = torch.randint(0, 256, (3, 64, 96), dtype=torch.uint8)
    x = {"image": img, "height": 150, "width": 211, "vocabulary": ["cat, kitten", "dog", "sky", "grass, lawn"],
         "background_index": None}
    model = _tiny_model(tiny_clip, sliding_window=True, crop_size=48, stride=16, window_batch_size=batch)
    monkeypatch.setattr(windows, "_ROW_BAND_ELEMENTS", 6 * 96 * 5)  # 6 synonyms: bands of 5 rows
    with torch.no_grad():
        maps = model.predict(x).score_maps
        assert isinstance(maps.source, WindowLogits) and maps.source.band_rows == 5
        inputs = model.image_inputs(x)
        whole, class_index = model.working_logits(inputs)  # the whole tensor (not banded)
        assert isinstance(whole, torch.Tensor) and whole.shape == (6, 64, 96)
        ref = ScoreMaps(whole, class_index, 4, out_size=(150, 211))
        assert torch.equal(maps.labels(), ref.labels())
        assert torch.equal(maps.scores(), ref.scores())
        model.max_scores_bytes = 0  # the label-map output, made in bands
        out = model([x])[0]
    assert torch.equal(out["sem_seg_labels"], ref.labels())
