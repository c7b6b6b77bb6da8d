"""``tools/prepare_datasets.py context`` (``sparseclip_d2.prepare.context``): PASCAL in Detail json
-> PASCAL-Context 60-class masks.

The synthetic ``trainval_merged.json`` has the fields the Detail API reads: ``images``
(``image_id``, ``file_name``, ``height``, ``width``, ``phase``), ``annos_segmentation`` (``id``,
``image_id``, ``category_id``, ``segmentation`` as COCO RLE) and ``categories``
(``category_id``, ``name``).
"""
import json
import os

import numpy as np
import pytest
from PIL import Image
from pycocotools import mask as mask_utils

from sparseclip_d2.data import load_class_names
from sparseclip_d2.data.datasets import load_sem_seg_gt
from sparseclip_d2.data.datasets.segmentation import load_split_file_dataset


@pytest.fixture(scope="module")
def prep():
    from sparseclip_d2.prepare import context

    return context


def _rle(binary):
    """Compressed COCO RLE with str counts, as stored in json."""
    rle = mask_utils.encode(np.asfortranarray(np.asarray(binary, dtype=np.uint8)))
    return {"size": [int(s) for s in rle["size"]], "counts": rle["counts"].decode("ascii")}


def _detail_json():
    a = np.zeros((3, 4), np.uint8)  # image 2008_000001 (val), 3 x 4
    row0, col0, col3 = a.copy(), a.copy(), a.copy()
    row0[0, :] = 1
    col0[:, 0] = 1
    col3[:, 3] = 1
    c = np.zeros((2, 2), np.uint8)  # image 2008_000000 (val), 2 x 2
    c[0, 1] = 1
    anns = [
        {"id": 10, "image_id": 2008000000, "category_id": 360, "segmentation": _rle(c)},   # sky
        {"id": 1, "image_id": 2008000001, "category_id": 2, "segmentation": _rle(row0)},   # aeroplane
        {"id": 2, "image_id": 2008000001, "category_id": 458, "segmentation": _rle(col0)},  # wood, over (0,0)
        {"id": 3, "image_id": 2008000001, "category_id": 3, "segmentation": _rle(col3)},   # air conditioner
        # person at (1,1),(1,2) as uncompressed RLE (column-major runs, zeros first)
        {"id": 4, "image_id": 2008000001, "category_id": 284,
         "segmentation": {"size": [3, 4], "counts": [4, 1, 2, 1, 4]}},
        {"id": 20, "image_id": 2008000002, "category_id": 2, "segmentation": _rle(np.ones((2, 2)))},
    ]
    return {
        "images": [
            {"image_id": 2008000001, "file_name": "2008_000001.jpg", "height": 3, "width": 4, "phase": "val"},
            {"image_id": 2008000002, "file_name": "2008_000002.jpg", "height": 2, "width": 2, "phase": "train"},
            {"image_id": 2008000000, "file_name": "2008_000000.jpg", "height": 2, "width": 2, "phase": "val"},
        ],
        "annos_segmentation": anns,
        "categories": [{"category_id": i, "name": n} for i, n in
                       [(2, "aeroplane"), (3, "air conditioner"), (284, "person"), (360, "sky"), (458, "wood")]],
    }


def test_context_id_table_matches_class_names(prep):
    names = load_class_names("context60")
    ids = prep.CONTEXT59_DETAIL_IDS
    assert len(ids) == 59 and list(ids) == sorted(ids)
    lookup = dict(zip(ids, names[1:]))
    assert lookup[2].startswith("aeroplane") and lookup[284].startswith("person")
    assert lookup[360] == "sky" and lookup[458] == "wood" and lookup[427].startswith("tv monitor")


def test_prepare_context(prep, tmp_path, capsys):
    voc = tmp_path / "VOCdevkit" / "VOC2010"
    os.makedirs(voc / "JPEGImages")
    with open(voc / "trainval_merged.json", "w") as f:
        json.dump(_detail_json(), f)
    for stem, (h, w) in {"2008_000000": (2, 2), "2008_000001": (3, 4), "2008_000002": (2, 2)}.items():
        Image.new("RGB", (w, h)).save(voc / "JPEGImages" / f"{stem}.jpg")

    prep.context(str(tmp_path))
    out = capsys.readouterr().out
    assert "WARNING" not in out and "[3]" in out  # air conditioner reported as unmapped

    assert (voc / "ImageSets" / "SegmentationContext" / "val.txt").read_text() == "2008_000000\n2008_000001\n"
    masks = voc / "SegmentationClassContext"
    assert sorted(os.listdir(masks)) == ["2008_000000.png", "2008_000001.png"]  # train image skipped
    m1 = Image.open(masks / "2008_000001.png")
    assert m1.mode == "L"
    # wood 59 (painted after aeroplane), aeroplane 1, person 37, air conditioner -> 0
    assert np.array(m1).tolist() == [[59, 1, 1, 0], [59, 37, 37, 0], [59, 0, 0, 0]]
    assert np.array(Image.open(masks / "2008_000000.png")).tolist() == [[0, 47], [0, 0]]  # sky 47

    # what sparseclip_context60_val / _59_val read
    dicts = load_split_file_dataset("ctx", str(voc / "JPEGImages"), str(masks),
                                    str(voc / "ImageSets" / "SegmentationContext" / "val.txt"),
                                    prepare_command="prep")
    assert [d["image_id"] for d in dicts] == ["2008_000000", "2008_000001"]
    gt59 = load_sem_seg_gt(dicts[1]["sem_seg_file_name"], num_classes=59, reduce_zero_label=True)
    assert gt59[1].tolist() == [58, 36, 36, 255]
    # ... and the 59-class masks `context` converted once for sparseclip_context59_val hold the same
    converted = voc / "annotations_detectron2" / "pc59_val"
    assert sorted(os.listdir(converted)) == ["2008_000000.png", "2008_000001.png"]
    assert np.array(Image.open(converted / "2008_000001.png"))[1].tolist() == [58, 36, 36, 255]
    assert (load_sem_seg_gt(str(converted / "2008_000001.png"), num_classes=59) == gt59).all()


def test_context_name_mismatch_warns_and_missing_json_exits(prep, tmp_path, capsys):
    data = _detail_json()
    data["categories"][0]["name"] = "accordion"  # id 2 is aeroplane in Detail
    masks = dict(prep.context_masks(data, "val"))
    assert sorted(masks) == ["2008_000000", "2008_000001"]
    prep._check_context_names(data["categories"])
    assert "WARNING: Detail category 2 is 'accordion'" in capsys.readouterr().out
    with pytest.raises(ValueError, match="trainval_merged.json.*--json PATH"):  # PrepareError: one error line
        prep.context(str(tmp_path))
