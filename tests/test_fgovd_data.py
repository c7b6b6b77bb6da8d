"""FG-OVD loader, N-negatives rule, registration and test mapper on a generated benchmark."""
import copy
import json
import os
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from detectron2.config import get_cfg
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.data.build import load_proposals_into_dataset
from detectron2.structures import BoxMode

from sparseclip_d2.config import add_sparseclip_config
from sparseclip_d2.data.datasets.fgovd import (
    FGOVD_SPLITS,
    FGOVDFormatError,
    load_fgovd_json,
    register_fgovd_dataset,
    resolve_num_negatives,
    select_negatives,
)
from sparseclip_d2.data.fgovd_mapper import FGOVDDatasetMapper, FGOVDOptions

# caption id -> text; full sentences that contain commas (must never be split)
CAPTIONS = {i: f"A {c} mug, with {p} handle, number {i}." for i, (c, p) in enumerate(
    [(c, p) for c in ("red", "blue", "green", "black", "white") for p in ("a thin", "a thick", "no", "a gold")], start=1)}
IMAGES = [  # id, width, height
    (1, 80, 60),
    (2, 64, 96),
    (3, 48, 48),
]


def _negs(first, n):
    ids = sorted(CAPTIONS)
    return [ids[(first + j) % len(ids)] for j in range(n)]


# id, image_id, bbox, positive, number of negatives
ANNS = [
    (101, 1, [8, 6, 40, 30], 1, 10),
    (102, 1, [0, 0, 80, 60], 2, 9),    # fewer than 10 negatives: dropped with N = 10
    (103, 2, [16, 32, 32, 48], 3, 12),  # more than 10: keeps the first 10
    (104, 2, [0, 0, 10.5, 20], 4, 10),
    (105, 3, [4, 4, 20, 20], 5, 10),
]


def make_benchmark(root, name="1_attributes.json", anns=ANNS, seed=0):
    """Write a tiny FG-OVD-style benchmark under ``root``; return (json_file, image_root)."""
    rng = np.random.default_rng(seed)
    image_root = os.path.join(root, "coco")
    os.makedirs(os.path.join(image_root, "val2017"), exist_ok=True)
    images = []
    for iid, w, h in IMAGES:
        fn = f"val2017/{iid:012d}.png"
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(os.path.join(image_root, fn))
        images.append({"id": iid, "width": w, "height": h, "file_name": fn, "coco_url": "",
                       "neg_category_ids": [], "not_exhaustive_category_ids": []})
    annotations = [
        {"id": aid, "image_id": iid, "bbox": bbox, "area": bbox[2] * bbox[3], "segmentation": [],
         "category_id": pos, "neg_category_ids": _negs(pos, n)}
        for aid, iid, bbox, pos, n in anns
    ]
    cats = [{"id": i, "name": t, "synset": "", "frequency": "r"} for i, t in CAPTIONS.items()]
    bench = os.path.join(root, "fg-ovd", "benchmarks")
    os.makedirs(bench, exist_ok=True)
    json_file = os.path.join(bench, name)
    with open(json_file, "w") as f:
        json.dump({"images": images, "annotations": annotations, "categories": cats}, f)
    return json_file, image_root


def test_loader_records(tmp_path):
    json_file, image_root = make_benchmark(str(tmp_path))
    dicts = load_fgovd_json(json_file, image_root, dataset_name="x")
    assert [d["image_id"] for d in dicts] == [1, 2, 3]
    d = dicts[0]
    assert d["file_name"] == os.path.join(image_root, "val2017/000000000001.png")
    assert (d["height"], d["width"], d["dataset_name"]) == (60, 80, "x")
    a = d["annotations"][0]
    assert a["bbox"] == [8.0, 6.0, 40.0, 30.0] and a["bbox_mode"] == BoxMode.XYWH_ABS
    assert a["caption"] == CAPTIONS[1] and "," in a["caption"]
    assert a["neg_caption_ids"] == _negs(1, 10)
    assert a["neg_captions"] == [CAPTIONS[c] for c in _negs(1, 10)]
    assert [len(x["annotations"]) for x in dicts] == [2, 2, 1]  # loader keeps everything


def test_loader_applies_rule_when_asked(tmp_path):
    json_file, image_root = make_benchmark(str(tmp_path))
    dicts = load_fgovd_json(json_file, image_root, num_negatives=10)
    assert [[a["id"] for a in d["annotations"]] for d in dicts] == [[101], [103, 104], [105]]
    assert [d["fgovd_num_dropped"] for d in dicts] == [1, 0, 0]
    assert dicts[1]["annotations"][0]["neg_caption_ids"] == _negs(3, 12)[:10]


def test_select_negatives():
    annos = [{"id": i, "neg_caption_ids": list(range(n)), "neg_captions": [str(j) for j in range(n)]}
             for i, n in enumerate([1, 2, 3, 7])]
    orig = copy.deepcopy(annos)
    kept, dropped = select_negatives(annos, 2)
    assert [a["id"] for a in kept] == [1, 2, 3] and dropped == 1
    assert [a["neg_caption_ids"] for a in kept] == [[0, 1]] * 3
    assert [a["neg_captions"] for a in kept] == [["0", "1"]] * 3
    assert annos == orig
    assert select_negatives(annos, 8) == ([], 4)
    with pytest.raises(ValueError):
        select_negatives(annos, 0)


def _corrupt(tmp_path, fn):
    json_file, image_root = make_benchmark(str(tmp_path))
    with open(json_file) as f:
        data = json.load(f)
    fn(data)
    with open(json_file, "w") as f:
        json.dump(data, f)
    return json_file, image_root


@pytest.mark.parametrize(
    "mutate, pattern",
    [
        (lambda d: d.pop("categories"), "missing top-level key 'categories'"),
        (lambda d: d["annotations"][1].pop("neg_category_ids"), r"annotation id=102 lacks key\(s\) \['neg_category_ids'\]"),
        (lambda d: d["images"][0].pop("height"), r"image id=1 lacks key\(s\) \['height'\]"),
        (lambda d: d["annotations"][2]["neg_category_ids"].append(999), r"annotation id=103 refers to unknown caption id\(s\) \[999\]"),
        (lambda d: d["annotations"][0].update(category_id=777), r"annotation id=101 refers to unknown caption id\(s\) \[777\]"),
        (lambda d: d["annotations"][0].update(bbox=[50, 6, 40, 30]), "annotation id=101 box .* outside its image id=1 of size 80x60"),
        (lambda d: d["annotations"][4].update(bbox=[-3, 4, 10, 10]), "annotation id=105 box .* outside"),
        (lambda d: d["annotations"][3].update(bbox=[1, 1, 0, 5]), "annotation id=104 has an empty box"),
        (lambda d: d["annotations"][3].update(image_id=42), "annotation id=104 refers to unknown image_id=42"),
    ],
)
def test_loader_malformed(tmp_path, mutate, pattern):
    json_file, image_root = _corrupt(tmp_path, mutate)
    with pytest.raises(FGOVDFormatError, match=pattern) as e:
        load_fgovd_json(json_file, image_root)
    assert json_file in str(e.value)


def test_loader_clips_box_within_tolerance(tmp_path):
    json_file, image_root = _corrupt(tmp_path, lambda d: d["annotations"][0].update(bbox=[-0.5, 6, 80.9, 30]))
    a = load_fgovd_json(json_file, image_root)[0]["annotations"][0]
    assert a["bbox"] == [0.0, 6.0, 80.0, 30.0]


def test_registered_splits():
    expected = {
        "hard": ("1_attributes.json", 10), "medium": ("2_attributes.json", 10),
        "easy": ("3_attributes.json", 10), "trivial": ("shuffle_negatives.json", 10),
        "color": ("color.json", 10), "material": ("material.json", 10),
        "pattern": ("pattern.json", 7), "transparency": ("transparency.json", 2),
    }
    assert {k: v for k, v in FGOVD_SPLITS.items()} == expected
    for split, (fname, n) in expected.items():
        md = MetadataCatalog.get(f"sparseclip_fgovd_{split}")
        assert md.evaluator_type == "fgovd" and md.num_negatives == n and md.split == split
        assert md.json_file.endswith(os.path.join("fg-ovd", "benchmarks", fname))
        assert md.image_root.endswith("coco")
        assert f"sparseclip_fgovd_{split}" in DatasetCatalog.list()
    assert resolve_num_negatives("sparseclip_fgovd_pattern") == 7
    assert resolve_num_negatives("sparseclip_fgovd_pattern", 4) == 4
    with pytest.raises(ValueError, match="NUM_NEGATIVES"):
        resolve_num_negatives("sparseclip_fgovd_pattern", 0)


def _register(tmp_path, name, n=10):
    json_file, image_root = make_benchmark(str(tmp_path))
    if name in DatasetCatalog.list():
        DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)
    register_fgovd_dataset(name, json_file, image_root, n, split="hard")
    return json_file, image_root


def _cfg(**fgovd):
    cfg = get_cfg()
    add_sparseclip_config(cfg)
    cfg.INPUT.FORMAT = "RGB"
    for k, v in fgovd.items():
        setattr(cfg.MODEL.SPARSECLIP.FGOVD, k, v)
    return cfg


def test_mapper_dense_resize_boxes(tmp_path):
    _register(tmp_path, "_test_fgovd_mapper")
    dicts = DatasetCatalog.get("_test_fgovd_mapper")
    mapper = FGOVDDatasetMapper(_cfg(RESOLUTION=32))
    out = mapper(dicts[0])
    assert out["image"].shape == (3, 32, 32) and out["image"].dtype == torch.uint8
    assert (out["height"], out["width"]) == (60, 80)
    # box 101: xywh [8, 6, 40, 30] -> xyxy [8, 6, 48, 36] scaled by (32/80, 32/60)
    assert torch.allclose(out["instances"].gt_boxes.tensor, torch.tensor([[3.2, 3.2, 19.2, 19.2]]))
    assert out["instances"].ann_ids.tolist() == [101]
    assert out["fgovd_num_dropped"] == 1
    assert out["fgovd_captions"] == [[CAPTIONS[1]] + [CAPTIONS[c] for c in _negs(1, 10)]]
    assert out["fgovd_options"] == FGOVDOptions(resolution=32)
    assert "proposals" not in out
    assert len(dicts[0]["annotations"]) == 2  # the record itself is untouched
    # the configured N overrides the split default: with 9 both boxes stay, 9 captions + 1
    out9 = FGOVDDatasetMapper(_cfg(RESOLUTION=32, NUM_NEGATIVES=9))(dicts[0])
    assert out9["fgovd_num_dropped"] == 0 and [len(c) for c in out9["fgovd_captions"]] == [10, 10]


def test_mapper_crop_keeps_size_and_bgr(tmp_path):
    _register(tmp_path, "_test_fgovd_mapper_crop")
    d = DatasetCatalog.get("_test_fgovd_mapper_crop")[1]
    cfg = _cfg(PROTOCOL="crop")
    cfg.INPUT.FORMAT = "BGR"
    out = FGOVDDatasetMapper(cfg)(d)
    rgb = np.asarray(Image.open(d["file_name"]).convert("RGB"))
    assert torch.equal(out["image"], torch.as_tensor(rgb[:, :, ::-1].transpose(2, 0, 1).copy()))
    assert torch.allclose(out["instances"].gt_boxes.tensor,
                          torch.tensor([[16.0, 32.0, 48.0, 80.0], [0.0, 0.0, 10.5, 20.0]]))


def test_mapper_proposals(tmp_path):
    _register(tmp_path, "_test_fgovd_mapper_prop")
    dicts = DatasetCatalog.get("_test_fgovd_mapper_prop")
    pfile = str(tmp_path / "props.pkl")
    with open(pfile, "wb") as f:
        pickle.dump({"ids": [1, 2, 3],
                     "boxes": [np.array([[8, 6, 48, 36], [0, 0, 40, 30]], np.float32),
                               np.zeros((0, 4), np.float32), np.array([[4, 4, 24, 24]], np.float32)],
                     "objectness_logits": [np.array([0.1, 0.9], np.float32), np.zeros(0, np.float32),
                                           np.array([1.0], np.float32)]}, f)
    dicts = load_proposals_into_dataset(copy.deepcopy(dicts), pfile)
    cfg = _cfg(RESOLUTION=40)
    cfg.MODEL.LOAD_PROPOSALS = True
    out = FGOVDDatasetMapper(cfg)(dicts[0])
    # sorted by objectness (0.9 first), scaled by (40/80, 40/60)
    expected = torch.tensor([[0.0, 0.0, 20.0, 20.0], [4.0, 4.0, 24.0, 24.0]])
    assert torch.allclose(out["proposals"].proposal_boxes.tensor, expected)
    with pytest.raises(KeyError, match="LOAD_PROPOSALS is True"):
        FGOVDDatasetMapper(cfg)(DatasetCatalog.get("_test_fgovd_mapper_prop")[0])
