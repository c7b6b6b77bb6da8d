"""Reliability: bad inputs fail loudly and name the culprit, odd images work, large
images stay memory-bounded, low precision gives no NaN, runs are reproducible."""
import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

import sparseclip_d2
from conftest import register_sem_seg
from detectron2.config import get_cfg
from detectron2.modeling import build_model

from sparseclip_d2.data import SparseCLIPTestMapper
from sparseclip_d2.data.datasets.segmentation import DatasetNotFoundError, load_paired_dataset, load_split_file_dataset
from sparseclip_d2.evaluation.build import SparseCLIPSemSegEvaluator

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TINY = ["MODEL.SPARSECLIP.CLIP.NAME", "sparseclip-tiny-vit", "MODEL.SPARSECLIP.CLIP.PRETRAINED", "none",
        "MODEL.SPARSECLIP.TEXT.CACHE_DIR", "off", "MODEL.DEVICE", "cpu"]
VOCAB = ["sky", "grass, lawn", "person"]


def make_cfg(*opts):
    cfg = get_cfg()
    sparseclip_d2.add_sparseclip_config(cfg)
    cfg.merge_from_file(os.path.join(ROOT, "configs", "Base-SparseCLIP.yaml"))
    cfg.merge_from_list(TINY + list(opts))
    return cfg


def make_model(*opts, seed=0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build_model(make_cfg(*opts))


def predict(model, image_hwc, **extra):
    x = {"image": torch.as_tensor(np.ascontiguousarray(image_hwc.transpose(2, 0, 1))), "vocabulary": VOCAB}
    x.update(extra)
    return model([x])[0]["sem_seg"]


def mapper(fmt="RGB", min_size=0):
    cfg = make_cfg("INPUT.FORMAT", fmt, "INPUT.MIN_SIZE_TEST", str(min_size))
    return SparseCLIPTestMapper(cfg, "reliability_test")


# ------------------------------------------------------------------------- bad / odd files
def test_corrupt_and_truncated_images_name_the_file(tmp_path):
    garbage = tmp_path / "garbage.jpg"
    garbage.write_bytes(b"this is not a jpeg at all" * 10)
    good = tmp_path / "good.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(good)
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(good.read_bytes()[:200])
    for path in (garbage, truncated, tmp_path / "missing.jpg"):
        with pytest.raises(RuntimeError, match=path.name) as info:
            mapper()({"file_name": str(path)})
        assert "reliability_test" in str(info.value)  # names the dataset too


def _exif_rotated_jpeg(path, h, w):
    """A JPEG stored h x w whose EXIF orientation 6 says 'rotate 90 degrees clockwise'."""
    arr = np.zeros((h, w, 3), np.uint8)
    arr[: h // 2] = (255, 0, 0)  # top half red as stored
    img = Image.fromarray(arr)
    exif = img.getexif()
    exif[0x0112] = 6
    img.save(path, exif=exif, quality=95)


@pytest.mark.parametrize("kind", ["gray", "rgba", "uint16", "palette", "exif"])
@pytest.mark.parametrize("fmt", ["RGB", "BGR"])
def test_image_modes_through_mapper(tmp_path, kind, fmt):
    h, w = 24, 40
    path = str(tmp_path / (kind + (".jpg" if kind == "exif" else ".png")))
    expected_rgb = None
    if kind == "gray":
        Image.fromarray(np.full((h, w), 77, np.uint8), mode="L").save(path)
        expected_rgb = (77, 77, 77)
    elif kind == "rgba":
        rgba = np.zeros((h, w, 4), np.uint8)
        rgba[..., :3] = (10, 20, 30)
        rgba[..., 3] = 0  # fully transparent: stored colour kept
        Image.fromarray(rgba, mode="RGBA").save(path)
        expected_rgb = (10, 20, 30)
    elif kind == "uint16":
        Image.fromarray(np.full((h, w), 65535, np.uint16)).save(path)
        expected_rgb = (255, 255, 255)
    elif kind == "palette":
        p = Image.new("P", (w, h), 1)
        p.putpalette([0, 0, 0, 200, 100, 50] + [0] * 762)
        p.save(path)
        expected_rgb = (200, 100, 50)
    else:
        _exif_rotated_jpeg(path, h, w)
    out = mapper(fmt)({"file_name": path})
    img = out["image"]
    assert img.dtype == torch.uint8 and img.shape[0] == 3
    if kind == "exif":  # displayed orientation: w x h, red on the right after a 90 degree turn
        assert tuple(img.shape[1:]) == (w, h) and (out["height"], out["width"]) == (w, h)
        red = img[0 if fmt == "RGB" else 2].float()
        assert red[:, h // 2 + 2:].mean() > 200 and red[:, : h // 2 - 2].mean() < 50
    else:
        assert tuple(img.shape[1:]) == (h, w)
        rgb = expected_rgb if fmt == "RGB" else expected_rgb[::-1]
        assert img[:, h // 2, w // 2].tolist() == list(rgb)


def test_mask_of_another_size_names_both_files(tmp_path):
    image, mask = tmp_path / "img.png", tmp_path / "img_mask.png"
    Image.fromarray(np.zeros((30, 40, 3), np.uint8)).save(image)
    Image.fromarray(np.zeros((30, 41), np.uint8)).save(mask)
    with pytest.raises(ValueError) as info:
        mapper()({"file_name": str(image), "sem_seg_file_name": str(mask)})
    assert "img.png" in str(info.value) and "img_mask.png" in str(info.value)
    Image.fromarray(np.zeros((40, 30), np.uint8)).save(mask)  # transposed: EXIF hint
    with pytest.raises(ValueError, match="EXIF"):
        mapper()({"file_name": str(image), "sem_seg_file_name": str(mask)})
    Image.fromarray(np.zeros((30, 40), np.uint8)).save(mask)
    assert mapper()({"file_name": str(image), "sem_seg_file_name": str(mask)})["image"].shape == (3, 30, 40)


def test_labels_outside_class_range_raise_naming_the_file(tmp_path):
    gt = tmp_path / "gt_bad.png"
    lab = np.zeros((8, 8), np.uint8)
    lab[0, 0], lab[1, 1] = 3, 255  # 3 is outside [0, 3); 255 is ignore (fine)
    Image.fromarray(lab).save(gt)
    register_sem_seg("reliability_bad_labels", [{"file_name": "x.png", "sem_seg_file_name": str(gt)}], VOCAB)
    ev = SparseCLIPSemSegEvaluator("reliability_bad_labels", distributed=False)
    ev.reset()
    with pytest.raises(ValueError, match=r"gt_bad\.png.*\[3\]"):
        ev.process([{"file_name": "x.png"}], [{"sem_seg": torch.zeros(3, 8, 8)}])


def test_missing_dataset_root_names_the_path(tmp_path):
    missing = str(tmp_path / "no" / "such" / "root")
    with pytest.raises(DatasetNotFoundError, match="no/such/root.*DETECTRON2_DATASETS"):
        load_paired_dataset("x", missing + "/images", missing + "/ann", image_suffix=".jpg", gt_suffix=".png",
                            prepare_command="prepare it")
    with pytest.raises(DatasetNotFoundError, match="val.txt"):
        load_split_file_dataset("x", missing, missing, missing + "/val.txt", prepare_command="prepare it")


# ------------------------------------------------------------------------- vocabulary / text
@pytest.fixture(scope="module")
def model():
    return make_model()


@pytest.mark.parametrize("vocab, match", [
    ([], "empty"),
    (["cat", "dog", "Cat"], "duplicate name 'Cat'.*class 0"),
    (["cat, kitty", "kitty"], "duplicate name 'kitty'"),
    (["cat", " , "], "no name"),
    ("cat, dog", "list of class names"),
])
def test_bad_vocabulary_raises(model, vocab, match):
    x = {"image": torch.zeros(3, 32, 32, dtype=torch.uint8), "vocabulary": vocab}
    with pytest.raises(ValueError, match=match):
        model([x])


def test_a_published_vocabulary_keeps_its_duplicate_and_the_lower_class_wins(model, caplog):
    """An upstream class file as published (SC-CLIP's cls_coco_object.txt: 'bed' in the background
    class and as its own class): logged, not refused; class 1's only name is also class 0's, and a
    class scores its best name, so class 0 >= class 1 at every pixel and argmax never picks 1."""
    x = {"image": torch.zeros(3, 32, 32, dtype=torch.uint8), "vocabulary": ["cat, kitty", "kitty", "dog"],
         "vocabulary_as_published": True}
    with caplog.at_level(logging.WARNING):
        sem = model([x])[0]["sem_seg"]
    assert any("duplicate name 'kitty'" in r.getMessage() for r in caplog.records)
    assert sem.shape[0] == 3 and bool((sem[0] >= sem[1]).all())
    assert not bool((sem.argmax(0) == 1).any())


def test_long_caption_truncated_with_warning(model, caplog):
    caption = "a very long description of a small red plastic telephone " * 20
    with caplog.at_level(logging.WARNING):
        emb, idx = model.text_classifier_for([caption, "dog"])
    assert emb.shape[0] == 2 and torch.isfinite(emb).all()
    assert any("truncated" in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------------------- config errors
def test_config_key_typo_rejected(tmp_path):
    # yacs: merge_from_list asserts (AssertionError), merge_from_file raises KeyError
    with pytest.raises((KeyError, AssertionError), match="Non-existent key: MODEL.SPARSECLIP.ATENTION.ALPHA"):
        make_cfg("MODEL.SPARSECLIP.ATENTION.ALPHA", "1.3")
    bad = tmp_path / "typo.yaml"
    bad.write_text("MODEL:\n  SPARSECLIP:\n    ATTENTION:\n      ALHPA: 1.3\n")
    cfg = make_cfg()
    with pytest.raises(KeyError, match="ALHPA"):
        cfg.merge_from_file(str(bad))


@pytest.mark.parametrize("alpha", ["0.9", "2.5", "-1.0"])
def test_alpha_outside_range_rejected(alpha):
    with pytest.raises(ValueError, match="alpha"):
        make_model("MODEL.SPARSECLIP.ATTENTION.NORMALIZER", "entmax", "MODEL.SPARSECLIP.ATTENTION.ALPHA", alpha)


# ------------------------------------------------------------------------- sizes
SW = ["TEST.SLIDING_WINDOW.ENABLED", "True", "TEST.SLIDING_WINDOW.CROP_SIZE", "64",
      "TEST.SLIDING_WINDOW.STRIDE", "32"]


@pytest.mark.parametrize("sliding", [False, True])
@pytest.mark.parametrize("hw", [(5, 7), (1, 1), (17, 40), (40, 100)])
def test_images_smaller_than_a_patch_or_a_crop(sliding, hw):
    m = make_model(*(SW if sliding else []))
    img = np.random.default_rng(1).integers(0, 255, (*hw, 3), dtype=np.uint8)
    out = predict(m, img)
    assert tuple(out.shape) == (3, *hw) and torch.isfinite(out).all()
    # output at the original size even when the mapper upscaled the image
    out = predict(m, np.ascontiguousarray(np.repeat(np.repeat(img, 3, 0), 3, 1)), height=hw[0], width=hw[1])
    assert tuple(out.shape) == (3, *hw) and torch.isfinite(out).all()


def test_large_image_memory_bounded_by_sliding_window():
    """2400 x 3600 image, tiny model, crop 448 / stride 448: peak RSS grows by a few copies of the
    (S, H, W) logits only. Whole-image attention of the tiny model alone would take
    4 heads x (1 + 150 * 225)^2 x 4 B = 18 GiB."""
    res = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "benchmark_memory.py"), "--height", "2400", "--width", "3600",
         "--num-classes", "3", "--threads", "1", *TINY, "TEST.SLIDING_WINDOW.ENABLED", "True",
         "TEST.SLIDING_WINDOW.CROP_SIZE", "448", "TEST.SLIDING_WINDOW.STRIDE", "448", "INPUT.MIN_SIZE_TEST", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=3600)
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads(res.stdout.strip().splitlines()[-1])
    assert r["output_shape"] == [3, 2400, 3600] and r["output_finite"] and r["windows"] == 6 * 9
    grown = r["peak_rss_mib"] - r["peak_rss_before_forward_mib"]
    assert grown < 12 * r["output_mib"] + 256, r


# ------------------------------------------------------------------------- numerics
def test_bf16_model_on_cpu_no_nan_and_float32_attention():
    m16 = make_model("MODEL.SPARSECLIP.CLIP.PRECISION", "bf16", "MODEL.SPARSECLIP.ATTENTION.NORMALIZER", "entmax",
                     "MODEL.SPARSECLIP.ATTENTION.SOURCE", "qq+kk", *SW)
    m32 = make_model("MODEL.SPARSECLIP.ATTENTION.NORMALIZER", "entmax", "MODEL.SPARSECLIP.ATTENTION.SOURCE", "qq+kk",
                     *SW)
    assert any(p.dtype == torch.bfloat16 for p in m16.encoder.parameters())
    img = np.random.default_rng(2).integers(0, 255, (80, 120, 3), dtype=np.uint8)
    out16, out32 = predict(m16, img), predict(m32, img)
    assert out16.dtype == torch.float32 and torch.isfinite(out16).all()
    assert (out16.argmax(0) == out32.argmax(0)).float().mean() > 0.8
    x = m16.normalize_images([{"image": torch.as_tensor(img.transpose(2, 0, 1).copy())}]).tensor
    feats, attn = m16.encoder(x.to(torch.bfloat16), return_attention=True)
    assert attn.dtype == torch.float32 and torch.isfinite(attn).all() and torch.isfinite(feats.float()).all()
    torch.testing.assert_close(attn.sum(-1), torch.full_like(attn.sum(-1), 2.0), atol=1e-4, rtol=0)


def test_extreme_pixels_no_nan(model):
    for value in (0, 255):
        out = predict(model, np.full((48, 48, 3), value, np.uint8))
        assert torch.isfinite(out).all()


# ------------------------------------------------------------------------- determinism
def test_random_matched_seed_reproduces_and_changes():
    rm = ["MODEL.SPARSECLIP.ATTENTION.NORMALIZER", "random_matched", "MODEL.SPARSECLIP.ATTENTION.SOURCE", "qq"]
    img = np.random.default_rng(3).integers(0, 255, (64, 96, 3), dtype=np.uint8)
    a = predict(make_model(*rm, "MODEL.SPARSECLIP.ATTENTION.SEED", "7"), img)
    b = predict(make_model(*rm, "MODEL.SPARSECLIP.ATTENTION.SEED", "7"), img)
    m = make_model(*rm, "MODEL.SPARSECLIP.ATTENTION.SEED", "8")
    c = predict(m, img)
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)
    assert torch.equal(predict(m, img), c)  # re-seeded per forward: a second call reproduces


def _train_net(args, env):
    return subprocess.run([sys.executable, os.path.join(ROOT, "tools", "train_net.py"), *args], cwd=ROOT,
                          env=dict(os.environ, **env), capture_output=True, text=True, timeout=3600)


def test_train_net_twice_identical_and_max_images_flag(tmp_path):
    from test_datasets import make_fake_root

    make_fake_root(str(tmp_path / "data"), n=3)
    # --max-images is a flag: it goes before the KEY VALUE overrides (argparse REMAINDER)
    flags = ["--eval-only", "--max-images", "2", "--config-file", "configs/Base-SparseCLIP.yaml"]
    common = [*TINY, "INPUT.MIN_SIZE_TEST", "64",
              "DATALOADER.NUM_WORKERS", "0", "DATASETS.TEST", '("sparseclip_voc21_val",)',
              "MODEL.SPARSECLIP.ATTENTION.NORMALIZER", "random_matched", "MODEL.SPARSECLIP.ATTENTION.SOURCE", "qq"]
    env = {"DETECTRON2_DATASETS": str(tmp_path / "data")}
    results = []
    for i, extra in enumerate([[], [], ["MODEL.SPARSECLIP.ATTENTION.SEED", "5"]]):
        out = tmp_path / f"out{i}"
        res = _train_net(flags + common + extra + ["OUTPUT_DIR", str(out)], env)
        assert res.returncode == 0, res.stderr[-3000:]
        results.append(json.loads((out / "results.json").read_text()))
    r0, r1, r2 = (r["sparseclip_voc21_val"] for r in results)
    assert results[0]["max_images"] == 2 and results[0]["partial"] is True and r0["num_images"] == 2
    assert results[0]["config"]["TEST"]["MAX_IMAGES"] == 2
    keys = ["mIoU", "fwIoU", "mACC", "pACC", "per_class_IoU"]
    assert {k: r0[k] for k in keys} == {k: r1[k] for k in keys}
    assert {k: r0[k] for k in keys} != {k: r2[k] for k in keys}
    res = _train_net(["--eval-only", "--max-images", "-1", "--config-file", "configs/Base-SparseCLIP.yaml"]
                     + common + ["OUTPUT_DIR", str(tmp_path / "neg")], env)
    assert res.returncode != 0 and "--max-images" in res.stderr
