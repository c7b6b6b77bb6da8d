"""FG-OVD loader (official LVIS-style schema, type checks), registration, missing files and
the test mapper, on generated benchmarks with images in both COCO folders."""
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
)
from sparseclip_d2.data.datasets.segmentation import DatasetNotFoundError
from sparseclip_d2.data.fgovd_mapper import FGOVDDatasetMapper

# caption id -> text (the official files' category names; ids from 0 as in
# validation_sets/*.json); full sentences that contain commas (must never be split)
CAPTIONS = {i: f"A {c} mug, with {p} handle, number {i}." for i, (c, p) in enumerate(
    [(c, p) for c in ("red", "blue", "green", "black", "white") for p in ("a thin", "a thick", "no", "a gold")])}
IMAGES = [  # id, width, height, COCO folder (the official files mix train2017 and val2017)
    (1, 80, 60, "val2017"),
    (2, 64, 96, "train2017"),
    (3, 48, 48, "val2017"),
]


def _negs(first, n):
    """n caption ids after ``first`` (never ``first`` itself)."""
    ids = sorted(CAPTIONS)
    return [ids[(first + 1 + j) % len(ids)] for j in range(n)]


# id, image_id, bbox, positive caption id, number of negatives
ANNS = [
    (101, 1, [8, 6, 40, 30], 0, 10),
    (102, 1, [0, 0, 80, 60], 2, 9),    # fewer than 10 negatives: dropped with N = 10
    (103, 2, [16, 32, 32, 48], 3, 12),  # more than 10: keeps the first 10
    (104, 2, [0, 0, 10.5, 20], 4, 10),
    (105, 3, [4, 4, 20, 20], 5, 10),
]


def make_benchmark(root, name="1_attributes.json", anns=ANNS, seed=0):
    """Write a tiny FG-OVD-style benchmark under ``root``; return (json_file, image_root)."""
    rng = np.random.default_rng(seed)
    image_root = os.path.join(root, "coco")
    images = []
    for iid, w, h, folder in IMAGES:
        os.makedirs(os.path.join(image_root, folder), exist_ok=True)
        fn = f"{folder}/{iid:012d}.png"
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(os.path.join(image_root, fn))
        images.append({"id": iid, "width": w, "height": h, "file_name": fn, "license": 1, "flickr_url": "",
                       "coco_url": f"http://images.cocodataset.org/{fn}", "neg_category_ids": [],
                       "not_exhaustive_category_ids": [], "checked": True})
    annotations = [
        {"id": aid, "image_id": iid, "bbox": bbox, "area": bbox[2] * bbox[3], "segmentation": {},
         "category_id": pos, "neg_category_ids": _negs(pos, n), "needs_revision": False}
        for aid, iid, bbox, pos, n in anns
    ]
    cats = [{"id": i, "name": t, "def": "", "image_count": 1, "instance_count": 1, "synset": "",
             "synonyms": [], "frequency": "f"} for i, t in CAPTIONS.items()]
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
    assert a["caption_id"] == 0 and a["caption"] == CAPTIONS[0] and "," in a["caption"]
    assert a["neg_caption_ids"] == _negs(0, 10)
    assert a["neg_captions"] == [CAPTIONS[c] for c in _negs(0, 10)]
    assert [len(x["annotations"]) for x in dicts] == [2, 2, 1]  # loader keeps everything
    assert len(dicts[1]["annotations"][0]["neg_caption_ids"]) == 12  # all negatives kept
    # file_name resolved under coco/ whichever the folder
    assert dicts[1]["file_name"] == os.path.join(image_root, "train2017/000000000002.png")
    assert all(os.path.isfile(x["file_name"]) for x in dicts)



def _corrupt(tmp_path, fn):
    json_file, image_root = make_benchmark(str(tmp_path))
    with open(json_file) as f:
        data = json.load(f)
    fn(data)
    with open(json_file, "w") as f:
        json.dump(data, f)
    return json_file, image_root


def _set(path, value):
    """A mutation setting data[path[0]][path[1]]...[path[-1]] = value."""
    def fn(d):
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value
    return fn


@pytest.mark.parametrize(
    "mutate, pattern",
    [
        (lambda d: d.pop("categories"), "missing top-level key 'categories'"),
        (lambda d: d["annotations"][1].pop("neg_category_ids"), r"annotation id=102 lacks key\(s\) \['neg_category_ids'\]"),
        (lambda d: d["images"][0].pop("height"), r"image id=1 lacks key\(s\) \['height'\]"),
        (lambda d: d["annotations"][2]["neg_category_ids"].append(999),
         r"annotation id=103 field 'neg_category_ids': unknown caption id\(s\) \[999\]"),
        (_set(("annotations", 0, "category_id"), 777), r"annotation id=101 field 'category_id': unknown caption id\(s\) \[777\]"),
        (_set(("annotations", 0, "bbox"), [50, 6, 40, 30]), "annotation id=101 field 'bbox': box .* outside its image id=1 of size 80x60"),
        (_set(("annotations", 4, "bbox"), [-3, 4, 10, 10]), "annotation id=105 field 'bbox': box .* outside"),
        (_set(("annotations", 3, "bbox"), [1, 1, 0, 5]), "annotation id=104 field 'bbox': empty box"),
        (_set(("annotations", 3, "image_id"), 42), "annotation id=104 field 'image_id': refers to unknown image id 42"),
        # wrong types and non-finite numbers
        (_set(("annotations", 0, "bbox"), [8, float("nan"), 40, 30]), "annotation id=101 field 'bbox': must be .* finite numbers"),
        (_set(("annotations", 0, "bbox"), [8, 6, float("inf"), 30]), "annotation id=101 field 'bbox': must be .* finite"),
        (_set(("annotations", 0, "bbox"), "abc"), "annotation id=101 field 'bbox': must be \\[x, y, w, h\\]"),
        (_set(("annotations", 0, "bbox"), [8, 6, 40]), "annotation id=101 field 'bbox'"),
        (_set(("annotations", 0, "bbox"), [8, "6", 40, 30]), "annotation id=101 field 'bbox'"),
        (_set(("annotations", 0, "bbox"), [8, True, 40, 30]), "annotation id=101 field 'bbox'"),
        (_set(("annotations", 1, "neg_category_ids"), 5), "annotation id=102 field 'neg_category_ids': must be a non-empty list"),
        (_set(("annotations", 1, "neg_category_ids"), []), "annotation id=102 field 'neg_category_ids': must be a non-empty list"),
        (_set(("annotations", 1, "neg_category_ids"), [3, 4.5]), "annotation id=102 field 'neg_category_ids'"),
        (_set(("annotations", 1, "category_id"), "3"), "annotation id=102 field 'category_id': must be a.*integer"),
        (_set(("annotations", 1, "image_id"), None), "annotation id=102 field 'image_id': must be a.*integer"),
        (_set(("annotations", 1, "id"), 1.5), "annotation id=1.5 field 'id': must be an integer"),
        (_set(("categories",), {"0": "a mug"}), "top-level 'categories' must be a list of objects, got dict"),
        (_set(("categories",), []), "'categories' is empty"),
        (_set(("images",), []), "'images' is empty"),
        (_set(("annotations",), []), "'annotations' is empty"),
        (_set(("annotations", 2), [1, 2]), "annotation #2 must be an object"),
        (_set(("categories", 0, "name"), ""), "category id=0 field 'name': must be a non-empty string"),
        (_set(("categories", 0, "name"), 7), "category id=0 field 'name': must be a non-empty string"),
        (_set(("images", 0, "width"), "80"), "image id=1 field 'width': must be a positive integer"),
        (_set(("images", 0, "height"), -60), "image id=1 field 'height': must be a positive integer"),
        (_set(("images", 0, "file_name"), None), "image id=1 field 'file_name': must be a non-empty string"),
        (_set(("images", 0, "file_name"), "/abs/val2017/x.jpg"), "image id=1 field 'file_name': must be relative"),
        (lambda d: d["images"].append(dict(d["images"][0])), "duplicate image id=1"),
        (lambda d: d["annotations"].append(dict(d["annotations"][0])), "duplicate annotation id=101"),
    ],
)
def test_loader_malformed(tmp_path, mutate, pattern):
    json_file, image_root = _corrupt(tmp_path, mutate)
    with pytest.raises(FGOVDFormatError, match=pattern) as e:
        load_fgovd_json(json_file, image_root)
    assert json_file in str(e.value)


def test_loader_not_json(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("{not json")
    with pytest.raises(FGOVDFormatError, match="not valid JSON"):
        load_fgovd_json(str(path), str(tmp_path))


def test_loader_clips_box_within_tolerance(tmp_path):
    json_file, image_root = _corrupt(tmp_path, lambda d: d["annotations"][0].update(bbox=[-0.5, 6, 80.9, 30]))
    a = load_fgovd_json(json_file, image_root)[0]["annotations"][0]
    assert a["bbox"] == [0.0, 6.0, 80.0, 30.0]


def test_missing_json_names_path_and_source(tmp_path):
    missing = str(tmp_path / "fg-ovd" / "benchmarks" / "1_attributes.json")
    with pytest.raises(DatasetNotFoundError, match="lorebianchi98/FG-OVD") as e:
        load_fgovd_json(missing, str(tmp_path / "coco"))
    assert missing in str(e.value)


def test_missing_images_counted_with_hint(tmp_path):
    json_file, image_root = make_benchmark(str(tmp_path))
    os.remove(os.path.join(image_root, "train2017", "000000000002.png"))
    assert len(load_fgovd_json(json_file, image_root)) == 3  # not checked unless asked
    with pytest.raises(DatasetNotFoundError) as e:
        load_fgovd_json(json_file, image_root, check_images=True)
    msg = str(e.value)
    assert "1 of 3 images" in msg and "train2017/000000000002.png" in msg and "train2017.zip" in msg


def test_registered_splits_and_validation_sets():
    expected = {
        "hard": ("1_attributes.json", 10), "medium": ("2_attributes.json", 10),
        "easy": ("3_attributes.json", 10), "trivial": ("shuffle_negatives.json", 10),
        "color": ("color.json", 10), "material": ("material.json", 10),
        "pattern": ("pattern.json", 7), "transparency": ("transparency.json", 2),
    }
    assert {k: v for k, v in FGOVD_SPLITS.items()} == expected
    for split, (fname, n) in expected.items():
        for name, folder, md_split in ((f"sparseclip_fgovd_{split}", "benchmarks", split),
                                       (f"sparseclip_fgovd_val_{split}", "validation_sets", f"val_{split}")):
            md = MetadataCatalog.get(name)
            assert md.evaluator_type == "fgovd" and md.num_negatives == n and md.split == md_split
            assert md.json_file.endswith(os.path.join("fg-ovd", folder, fname))
            assert md.image_root.endswith("coco")
            assert name in DatasetCatalog.list()
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


def _cfg():
    cfg = get_cfg()
    add_sparseclip_config(cfg)
    cfg.INPUT.FORMAT = "RGB"
    return cfg


def test_mapper_original_image_boxes_all_captions(tmp_path):
    _register(tmp_path, "_test_fgovd_mapper")
    dicts = DatasetCatalog.get("_test_fgovd_mapper")
    out = FGOVDDatasetMapper(_cfg())(dicts[0])
    rgb = np.asarray(Image.open(dicts[0]["file_name"]).convert("RGB"))
    assert torch.equal(out["image"], torch.as_tensor(rgb.transpose(2, 0, 1).copy()))
    assert (out["height"], out["width"]) == (60, 80)
    # xywh [8, 6, 40, 30] -> xyxy [8, 6, 48, 36]; [0, 0, 80, 60] -> itself (original pixels)
    assert torch.equal(out["instances"].gt_boxes.tensor, torch.tensor([[8.0, 6, 48, 36], [0, 0, 80, 60]]))
    assert out["instances"].ann_ids.tolist() == [101, 102]
    assert out["fgovd_captions"] == [[CAPTIONS[0]] + [CAPTIONS[c] for c in _negs(0, 10)],
                                     [CAPTIONS[2]] + [CAPTIONS[c] for c in _negs(2, 9)]]
    assert "proposals" not in out and "fgovd_options" not in out
    assert len(dicts[0]["annotations"]) == 2  # the record itself is untouched


def test_mapper_bgr(tmp_path):
    _register(tmp_path, "_test_fgovd_mapper_bgr")
    d = DatasetCatalog.get("_test_fgovd_mapper_bgr")[1]
    cfg = _cfg()
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
    cfg = _cfg()
    cfg.MODEL.LOAD_PROPOSALS = True
    out = FGOVDDatasetMapper(cfg)(dicts[0])
    # sorted by objectness (0.9 first), in the image's own pixels
    expected = torch.tensor([[0.0, 0.0, 40.0, 30.0], [8.0, 6.0, 48.0, 36.0]])
    assert torch.allclose(out["proposals"].proposal_boxes.tensor, expected)
    assert torch.allclose(out["proposals"].objectness_logits, torch.tensor([0.9, 0.1]))
    with pytest.raises(KeyError, match="LOAD_PROPOSALS is True"):
        FGOVDDatasetMapper(cfg)(DatasetCatalog.get("_test_fgovd_mapper_prop")[0])
