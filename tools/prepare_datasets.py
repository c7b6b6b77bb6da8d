#!/usr/bin/env python
"""Turn official downloads into the layouts sparseclip_d2 reads (under $DETECTRON2_DATASETS).

    python tools/prepare_datasets.py check                 # which datasets are ready
    python tools/prepare_datasets.py coco_stuff  [--root R] # stuffthingmaps -> *_labelTrainIds.png
    python tools/prepare_datasets.py coco_object [--root R] # -> *_instanceTrainIds.png (SCLIP)
    python tools/prepare_datasets.py cityscapes  [--root R] # *_gtFine_labelIds -> *_labelTrainIds

Pascal VOC 2012 and ADE20K need nothing (extract the official archives under the root).
COCO: put val2017 images in coco_stuff164k/images/val2017 and the raw COCO-Stuff maps
(stuffthingmaps_trainval2017.zip, values 0..181, 255 unlabeled) in
coco_stuff164k/annotations/val2017. COCO-Object is built from those raw maps as SCLIP does
(stuff -> 0 background, the 80 things -> 1..80) or, without them, from
annotations/instances_val2017.json with pycocotools (--from-instances; pixels no instance
covers become background).
"""
import argparse
import glob
import os
import sys

import numpy as np
from PIL import Image

# COCO-Stuff raw map values (category id - 1) of the 80 thing and 91 stuff classes, in
# order: the 171 train ids. Thing category ids skip 12, 26, 29, 30, 45, 66, 68, 69, 71, 83.
_MISSING_THINGS = {12, 26, 29, 30, 45, 66, 68, 69, 71, 83}
THING_IDS = [c for c in range(1, 91) if c not in _MISSING_THINGS]       # COCO category ids
STUFF_IDS = list(range(92, 183))                                       # 91 stuff ids
assert len(THING_IDS) == 80 and len(STUFF_IDS) == 91

# Cityscapes label id -> train id (the 19 evaluated classes; everything else 255).
CITYSCAPES_TRAIN_IDS = {7: 0, 8: 1, 11: 2, 12: 3, 13: 4, 17: 5, 19: 6, 20: 7, 21: 8, 22: 9, 23: 10,
                        24: 11, 25: 12, 26: 13, 27: 14, 28: 15, 31: 16, 32: 17, 33: 18}


def _lut(mapping, default=255):
    lut = np.full(256, default, dtype=np.uint8)
    for k, v in mapping.items():
        lut[k] = v
    return lut


def _convert(files, lut, old_suffix, new_suffix):
    n = 0
    for f in files:
        out = f[: -len(old_suffix)] + new_suffix
        if os.path.exists(out):
            continue
        Image.fromarray(lut[np.asarray(Image.open(f))]).save(out)
        n += 1
    return n


def _raw_coco_maps(root):
    ann = os.path.join(root, "coco_stuff164k", "annotations", "val2017")
    files = [f for f in sorted(glob.glob(os.path.join(ann, "*.png"))) if not f.endswith("Ids.png")]
    if not files:
        sys.exit(f"no raw COCO-Stuff maps (*.png from stuffthingmaps_trainval2017.zip) in {ann}")
    return files


def coco_stuff(root):
    mapping = {c - 1: i for i, c in enumerate(THING_IDS + STUFF_IDS)}
    n = _convert(_raw_coco_maps(root), _lut(mapping), ".png", "_labelTrainIds.png")
    print(f"wrote {n} *_labelTrainIds.png")


def coco_object(root, from_instances=False):
    if not from_instances:
        mapping = {c - 1: i + 1 for i, c in enumerate(THING_IDS)}
        mapping.update({c - 1: 0 for c in STUFF_IDS})
        n = _convert(_raw_coco_maps(root), _lut(mapping), ".png", "_instanceTrainIds.png")
        print(f"wrote {n} *_instanceTrainIds.png")
        return
    from pycocotools.coco import COCO

    base = os.path.join(root, "coco_stuff164k")
    js = os.path.join(base, "annotations", "instances_val2017.json")
    if not os.path.isfile(js):
        sys.exit(f"missing {js} (from annotations_trainval2017.zip)")
    coco = COCO(js)
    train_id = {c: i + 1 for i, c in enumerate(THING_IDS)}
    out_dir = os.path.join(base, "annotations", "val2017")
    os.makedirs(out_dir, exist_ok=True)
    for img in coco.loadImgs(coco.getImgIds()):
        label = np.zeros((img["height"], img["width"]), dtype=np.uint8)
        anns = sorted(coco.loadAnns(coco.getAnnIds(imgIds=img["id"], iscrowd=None)), key=lambda a: -a["area"])
        for a in anns:  # large first, so small objects stay visible
            label[coco.annToMask(a).astype(bool)] = train_id[a["category_id"]]
        stem = os.path.splitext(img["file_name"])[0]
        Image.fromarray(label).save(os.path.join(out_dir, stem + "_instanceTrainIds.png"))
    print(f"wrote {len(coco.getImgIds())} *_instanceTrainIds.png from {js}")


def cityscapes(root):
    files = sorted(glob.glob(os.path.join(root, "cityscapes", "gtFine", "val", "*", "*_gtFine_labelIds.png")))
    if not files:
        sys.exit(f"no *_gtFine_labelIds.png under {os.path.join(root, 'cityscapes', 'gtFine', 'val')}")
    n = _convert(files, _lut(CITYSCAPES_TRAIN_IDS), "_labelIds.png", "_labelTrainIds.png")
    print(f"wrote {n} *_gtFine_labelTrainIds.png")


def context(root):
    sys.exit(
        "Pascal Context masks (VOCdevkit/VOC2010/SegmentationClassContext, 0 = background, 1..59) are "
        "made from trainval_merged.json with the Detail API, which this script does not implement. "
        "Use MMSegmentation's tools/dataset_converters/pascal_context.py (as SCLIP/NACLIP do) and put "
        f"the result under {os.path.join(root, 'VOCdevkit', 'VOC2010')}"
    )


def check(root):
    os.environ["DETECTRON2_DATASETS"] = root
    import sparseclip_d2  # noqa: F401  (registers with this root)
    from detectron2.data import DatasetCatalog

    ok = True
    for name in sorted(n for n in DatasetCatalog.list() if n.startswith("sparseclip_")):
        try:
            print(f"{name}: {len(DatasetCatalog.get(name))} images")
        except Exception as e:  # report every dataset, then fail
            ok = False
            print(f"{name}: MISSING - {e}")
    sys.exit(0 if ok else 1)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("task", choices=["check", "coco_stuff", "coco_object", "cityscapes", "context"])
    p.add_argument("--root", default=os.path.expanduser(os.getenv("DETECTRON2_DATASETS", "datasets")))
    p.add_argument("--from-instances", action="store_true", help="coco_object from instances_val2017.json")
    a = p.parse_args()
    if a.task == "coco_object":
        coco_object(a.root, a.from_instances)
    else:
        {"check": check, "coco_stuff": coco_stuff, "cityscapes": cityscapes, "context": context}[a.task](a.root)


if __name__ == "__main__":
    main()
