"""ITACLIP's options as parts any config can use: class definitions mixed into the text side,
test-time augmentation of the window logits, label-map closing; the itaclip configs.
References are written here independently (numpy / float64)."""
import glob
import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sparseclip_d2.clip import AttentionSpec
from sparseclip_d2.clip.definitions import load_definitions, mix_definitions
from sparseclip_d2.methods.itaclip.tta import close_labels, tta_logits
from sparseclip_d2.methods.cosine import CosineHead

from conftest import tiny_cfg

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def _write(tmp_path, text, name="defs.txt"):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return str(p)


# ----------------------------------------------------------------------------- definitions
def test_definitions_file_in_itaclips_format(tmp_path):
    path = _write(tmp_path, "cat >=a small animal, with whiskers.\ndog >=a loyal animal >= friend\n")
    # the text is what follows the first '>=' (and stops at a second one, as upstream's split)
    assert load_definitions(path) == [("cat", "a small animal, with whiskers."), ("dog", "a loyal animal ")]
    with pytest.raises(ValueError, match=r"defs2.txt:2: 'dog: a loyal animal' is not 'name >=definition'"):
        load_definitions(_write(tmp_path, "cat >=a small animal\ndog: a loyal animal\n", "defs2.txt"))
    with pytest.raises(ValueError, match=r"defs3.txt:1: class 'cat' has an empty definition"):
        load_definitions(_write(tmp_path, "cat >=  \n", "defs3.txt"))
    with pytest.raises(ValueError, match="is empty"):
        load_definitions(_write(tmp_path, "", "defs4.txt"))
    with pytest.raises(FileNotFoundError, match="nope.txt' does not exist"):
        load_definitions(str(tmp_path / "nope.txt"))


def test_mix_definitions_by_hand():
    emb = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8], [0.8, 0.6]])
    idx = torch.tensor([0, 0, 1, 2])  # background (2 synonyms), class 1, class 2
    d = torch.tensor([[0.0, 2.0], [4.0, 0.0]])  # definitions of classes 1 and 2
    out = mix_definitions(emb, idx, d, 0.25, background_index=0)
    expected = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.45, 0.6 + 0.5], [0.6 + 1.0, 0.45]])
    torch.testing.assert_close(out, expected)
    # without a background class every class has a definition
    d3 = torch.tensor([[2.0, 2.0], [0.0, 2.0], [4.0, 0.0]])
    out = mix_definitions(emb, idx, d3, 0.5)
    torch.testing.assert_close(out, torch.tensor([[1.5, 1.0], [1.0, 1.5], [0.3, 1.4], [2.4, 0.3]]))
    with pytest.raises(ValueError, match="2 definitions for a vocabulary of 3 classes; expected one per class, 3"):
        mix_definitions(emb, idx, d, 0.5)
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        mix_definitions(emb, idx, d, 1.5, background_index=0)


# ----------------------------------------------------------------------------- TTA
def _features64(x):
    """A fixed dense 'encoder': per 4x4 patch, the mean and the square mean of each channel
    (6-d), float64."""
    x = x.double()
    m = F.avg_pool2d(x, 4)
    s = F.avg_pool2d(x * x, 4)
    return torch.cat([m, s], 1)


def _blur64(x, k=11, sigma=5.0):
    """Gaussian blur with reflect padding, by hand: 1-d kernel exp(-t^2 / (2 sigma^2)) normalised."""
    t = np.arange(k) - (k - 1) / 2
    g = np.exp(-(t ** 2) / (2 * sigma ** 2))
    g = g / g.sum()
    a = x.double().numpy()
    pad = k // 2
    a = np.pad(a, ((0, 0), (0, 0), (pad, pad), (pad, pad)), mode="reflect")
    H, W = x.shape[-2:]
    rows = sum(g[i] * a[..., i:i + H, :] for i in range(k))
    out = sum(g[j] * rows[..., :, j:j + W] for j in range(k))
    return torch.from_numpy(out)


def _unit(f):
    return f / f.norm(dim=1, keepdim=True)


def test_itaclip_tta_by_hand():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 16, 12, generator=g)
    text = torch.randn(5, 6, generator=g).double()
    w, scale = 0.7, 40.0
    gray = (0.2989 * x[:, :1] + 0.587 * x[:, 1:2] + 0.114 * x[:, 2:]).expand(-1, 3, -1, -1)
    feats = [_unit(_features64(v)) for v in (x, gray, _blur64(x))]
    base = torch.einsum("ndhw,sd->nshw", sum(feats) / 3, text)
    fv = torch.einsum("ndhw,sd->nshw", _unit(_features64(x.flip(2))), text).flip(2)
    fh = torch.einsum("ndhw,sd->nshw", _unit(_features64(x.flip(3))), text).flip(3)
    ref = scale * (w * base + (1 - w) * (fv + fh) / 2)
    out = tta_logits("itaclip", lambda im: _features64(im).float(), x, text.float(), scale, w)
    torch.testing.assert_close(out.double(), ref, atol=1e-4, rtol=1e-5)
    plain = tta_logits("", lambda im: _features64(im).float(), x, text.float(), scale, w)
    torch.testing.assert_close(plain.double(), scale * torch.einsum("ndhw,sd->nshw", _unit(_features64(x)), text),
                               atol=1e-4, rtol=1e-5)
    with pytest.raises(ValueError, match="unknown test-time augmentation 'flip'; valid: '', 'itaclip'"):
        tta_logits("flip", _features64, x, text, scale, w)


# ----------------------------------------------------------------------------- closing
def _close64(a, k):
    """Grey closing by hand: max filter then min filter over k x k windows, pixels outside the
    map ignored (cv2's default border for morphology)."""
    H, W = a.shape
    r = k // 2

    def filt(b, fn):
        out = np.empty_like(b)
        for i in range(H):
            for j in range(W):
                out[i, j] = fn(b[max(0, i - r):i + r + 1, max(0, j - r):j + r + 1])
        return out

    return filt(filt(a, np.max), np.min)


def test_label_closing_by_hand():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 6, size=(9, 11))
    a[3:6, 4:7] = 9
    a[4, 5] = 0  # a hole that closing fills
    out = close_labels(torch.from_numpy(a), 3)
    assert out.dtype == torch.long
    np.testing.assert_array_equal(out.numpy(), _close64(a, 3))
    assert out[4, 5] == 9
    assert torch.equal(close_labels(torch.from_numpy(a), 0), torch.from_numpy(a))
    with pytest.raises(ValueError, match="odd integer >= 3, got 2"):
        close_labels(torch.from_numpy(a), 2)
    with pytest.raises(ValueError, match="uint8 label maps; labels span 0..300"):
        close_labels(torch.tensor([[0, 300]]), 3)


# ----------------------------------------------------------------------------- wiring
def _tiny_itaclip(**opts):
    base = {"MODEL.SPARSECLIP.ATTENTION.SOURCE": "qq+kk", "MODEL.SPARSECLIP.ATTENTION.MIX.LAYERS": "[0]",
            "MODEL.SPARSECLIP.ATTENTION.MIX.SOURCE": "qq+kk", "MODEL.SPARSECLIP.BLOCK.FFN": False,
            "TEST.SLIDING_WINDOW.ENABLED": True, "TEST.SLIDING_WINDOW.CROP_SIZE": 32,
            "TEST.SLIDING_WINDOW.STRIDE": 16}
    base.update(opts)
    return tiny_cfg(**base)


def test_model_with_tta_definitions_and_closing(tmp_path):
    from detectron2.modeling import build_model

    from sparseclip_d2.modeling.postprocess import ScoreMaps

    defs = _write(tmp_path, "cat >=a small animal with whiskers.\ndog >=a loyal animal.\n")
    cfg = _tiny_itaclip(**{"TEST.TTA.MODE": "itaclip", "TEST.TTA.WEIGHT": 0.7,
                           "MODEL.SPARSECLIP.TEXT.DEFINITIONS": defs, "MODEL.SPARSECLIP.TEXT.DEFINITION_WEIGHT": 0.25,
                           "MODEL.SPARSECLIP.LABEL_CLOSING": 3})
    model = build_model(cfg)
    torch.manual_seed(0)
    img = torch.randint(0, 256, (3, 48, 64), dtype=torch.uint8)
    x = {"image": img, "vocabulary": ["sky, wall", "cat", "dog"], "background_index": 0}
    out = model([x])[0]
    assert set(out) == {"sem_seg_labels"}
    # text side: (1 - w) synonym + w definition, the background's synonyms unchanged
    emb, idx = model.text_classifier_for(x["vocabulary"], background_index=0)
    plain, _ = model.text_classifier()(x["vocabulary"])
    d = model.text_classifier().encode(["a small animal with whiskers.", "a loyal animal."])
    torch.testing.assert_close(emb[:2], plain[:2])
    torch.testing.assert_close(emb[2], 0.75 * plain[2] + 0.25 * d[0])
    torch.testing.assert_close(emb[3], 0.75 * plain[3] + 0.25 * d[1])
    # image side: each window's logits are tta_logits of the encoder; then the usual scores, closed
    image = model.normalize_image(img)
    crop = image[None, :, :32, :32]
    torch.testing.assert_close(model.encode_logits(crop, emb),
                               tta_logits("itaclip", model.encoder, crop, emb, model.logit_scale, 0.7))
    logits = model.synonym_logits(image, emb)
    labels = ScoreMaps(logits, idx, 3, background_index=0, out_size=(48, 64)).labels()
    assert torch.equal(out["sem_seg_labels"], close_labels(labels, 3))
    model.head = CosineHead()  # the same model without its TTA head
    assert not torch.allclose(model.synonym_logits(image, emb), logits)


@pytest.mark.parametrize("key, value, message", [
    ("TEST.TTA.MODE", "flip", "TEST.TTA.MODE = 'flip' is invalid; valid: '', 'itaclip'"),
    ("TEST.TTA.WEIGHT", 1.5, "TEST.TTA.WEIGHT = 1.5 is invalid; valid: a number in \\[0, 1\\]"),
    ("MODEL.SPARSECLIP.LABEL_CLOSING", 2, "MODEL.SPARSECLIP.LABEL_CLOSING = 2 is invalid; valid: 0 \\(off\\) or an odd"),
    ("MODEL.SPARSECLIP.TEXT.DEFINITION_WEIGHT", -0.1, "DEFINITION_WEIGHT = -0.1 is invalid; valid: a number in"),
    ("MODEL.SPARSECLIP.TEXT.DEFINITIONS", "/no/such/defs.txt", "'/no/such/defs.txt' does not exist"),
])
def test_bad_itaclip_keys_are_named_before_the_model_is_built(key, value, message, monkeypatch):
    from detectron2.modeling import build_model

    import sparseclip_d2.modeling.meta_arch as meta_arch

    def no_build(cfg):  # the check must come first
        raise AssertionError("the model was built before the keys were checked")

    monkeypatch.setattr(meta_arch, "build_clip_parts", no_build)
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        build_model(_tiny_itaclip(**{key: value}))


def test_itaclip_configs_select_the_upstream_settings():
    from conftest import baseline_cfg

    # m-arda-aydn/ITACLIP @ 521a33c configs/cfg_<dataset>.py
    expected = {  # file: (dataset, short side, logit scale, def_coefficient, img_eng_coefficient, prob, area)
        "itaclip_b16": ("sparseclip_coco_stuff_val", 448, 40.0, 0.2, 0.75, 0.0, 0.0),
        "itaclip_b16_voc21": ("sparseclip_voc21_val", 336, 60.0, 0.05, 0.7, 0.1, 0.1),
        "itaclip_b16_context60": ("sparseclip_context60_val", 336, 55.0, 0.15, 0.75, 0.1, 0.0),
        "itaclip_b16_coco_object": ("sparseclip_coco_object_val", 336, 50.0, 0.1, 0.75, 0.1, 0.0),
        "itaclip_b16_cityscapes": ("sparseclip_cityscapes_val", 560, 40.0, 0.05, 0.7, 0.0, 0.0),
    }
    paths = sorted(glob.glob(os.path.join(ROOT, "configs", "baselines", "itaclip_b16*.yaml")))
    assert [os.path.basename(p)[:-5] for p in paths] == sorted(expected)
    for path in paths:
        cfg = baseline_cfg(path)
        sc = cfg.MODEL.SPARSECLIP
        assert AttentionSpec.from_config(cfg) == AttentionSpec.preset("itaclip"), path
        got = (cfg.DATASETS.TEST[0], cfg.INPUT.MIN_SIZE_TEST, sc.LOGIT_SCALE, sc.TEXT.DEFINITION_WEIGHT,
               cfg.TEST.TTA.WEIGHT, sc.PROB_THRESHOLD, sc.AREA_THRESHOLD)
        assert got == expected[os.path.basename(path)[:-5]], path
        assert (cfg.TEST.TTA.MODE, sc.LABEL_CLOSING, sc.PAMR.STEPS, list(sc.PAMR.DILATIONS)) == ("itaclip", 3, 10, [8, 16])
        sw = cfg.TEST.SLIDING_WINDOW
        assert (sw.ENABLED, sw.CROP_SIZE, sw.STRIDE) == (True, 224, 28)
        assert (sc.CLASS_NAMES, sc.TEXT.TEMPLATES, sc.PIXEL_NORM, sc.CLIP.POS_EMBED_INTERP, sc.PATCH_REMAINDER,
                cfg.INPUT.RESIZE_MODE) == ("itaclip", "openai_imagenet", "clip_mmseg", "scale_factor", "truncate",
                                           "mmseg")
        assert sc.TEXT.DEFINITIONS == ""  # the definitions are the user's file, never shipped


def test_itaclip_config_runs_through_train_net(tmp_path):
    """configs/baselines/itaclip_b16_voc21.yaml end to end (tiny random-weight tower, so the
    tapped layer is block 0; a definitions file of our own), label maps reach the evaluator."""
    import json

    from test_datasets import make_fake_root
    from test_train_net import TINY, run

    make_fake_root(str(tmp_path / "data"), n=2)
    names = ["aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow", "table", "dog",
             "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor"]
    defs = _write(tmp_path, "".join(f"{n} >=a thing called {n}.\n" for n in names))
    out = tmp_path / "out"
    res = run(["--eval-only", "--config-file", "configs/baselines/itaclip_b16_voc21.yaml", *TINY,
               "MODEL.SPARSECLIP.ATTENTION.MIX.LAYERS", "[0]", "MODEL.SPARSECLIP.TEXT.DEFINITIONS", defs,
               "TEST.SLIDING_WINDOW.CROP_SIZE", "32", "TEST.SLIDING_WINDOW.STRIDE", "16", "TEST.MAX_IMAGES", "1",
               "OUTPUT_DIR", str(out)], env={"DETECTRON2_DATASETS": str(tmp_path / "data")})
    assert res.returncode == 0, res.stderr[-4000:]
    results = json.loads((out / "results.json").read_text())
    r = results["sparseclip_voc21_val"]
    assert r["num_images"] == 1 and 0 <= r["mIoU"] <= 100
    cfg = results["config"]["MODEL"]["SPARSECLIP"]
    assert cfg["LABEL_CLOSING"] == 3 and cfg["TEXT"]["DEFINITIONS"] == defs
