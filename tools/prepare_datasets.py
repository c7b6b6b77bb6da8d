#!/usr/bin/env python
"""Convert official downloads, once, into the files sparseclip_d2 evaluates on (under
$DETECTRON2_DATASETS): label PNGs that detectron2's SemSegEvaluator reads as they are
(class indices of the dataset, 255 = ignore).

    python tools/prepare_datasets.py check [NAME ...] [--sample N]  # which datasets are ready (exit 1 if not)
    python tools/prepare_datasets.py voc20       [--root R] # SegmentationClass -> annotations_detectron2/voc20_val
    python tools/prepare_datasets.py ade20k      [--root R] # annotations -> annotations_detectron2 (detectron2's)
    python tools/prepare_datasets.py context     [--root R] [--json trainval_merged.json]  # 60- and 59-class masks
    python tools/prepare_datasets.py context59   [--root R] # SegmentationClassContext -> annotations_detectron2/pc59_val
    python tools/prepare_datasets.py coco_stuff  [--root R] # stuffthingmaps -> *_labelTrainIds.png
    python tools/prepare_datasets.py coco_object [--root R] # -> *_instanceTrainIds.png (SCLIP)
    python tools/prepare_datasets.py cityscapes  [--root R] # *_gtFine_labelIds -> *_labelTrainIds

Pascal VOC 2012 (21 classes) needs nothing beyond the official archive; VOC20, ADE20K and
Pascal Context 59 drop a class (MMSeg's ``reduce_zero_label``: 0 -> 255, v -> v - 1), which is
done here, once, into ``annotations_detectron2/`` folders next to the official masks, as
detectron2's datasets/prepare_ade20k_sem_seg.py does for ADE20K. A conversion rewrites only
masks that are missing or older than their source; every mask is written atomically.
COCO: put val2017 images in coco_stuff164k/images/val2017 and the raw COCO-Stuff maps
(stuffthingmaps_trainval2017.zip, values 0..181, 255 unlabeled) in
coco_stuff164k/annotations/val2017. COCO-Object is built from those raw maps as SCLIP does
(stuff -> 0 background, the 80 things -> 1..80) or, without them, from
annotations/instances_val2017.json with pycocotools (--from-instances; pixels no instance
covers become background).
FG-OVD: the JSON files of https://github.com/lorebianchi98/FG-OVD (benchmarks/ and
validation_sets/) in fg-ovd/benchmarks and fg-ovd/validation_sets, and COCO 2017 train AND
val images in coco/train2017 and coco/val2017 (the files' file_name is relative to coco/);
`check` verifies that every image a split needs exists.
Pascal Context: put trainval_merged.json (PASCAL in Detail) in VOCdevkit/VOC2010 next to
JPEGImages (VOCtrainval_03-May-2010.tar); the val masks are built as MMSeg's
pascal_context.py does, with pycocotools instead of the Detail API.
`check` reads every mask of each segmentation dataset (mode, size against its image, label
range over the histogram), as train_net.py does before inference.
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

# Cityscapes label id -> train id (the 19 evaluated classes; everything else 255).
CITYSCAPES_TRAIN_IDS = {7: 0, 8: 1, 11: 2, 12: 3, 13: 4, 17: 5, 19: 6, 20: 7, 21: 8, 22: 9, 23: 10,
                        24: 11, 25: 12, 26: 13, 27: 14, 28: 15, 31: 16, 32: 17, 33: 18}


def _lut(mapping, default=255):
    lut = np.full(256, default, dtype=np.uint8)
    for k, v in mapping.items():
        lut[k] = v
    return lut


def _num_classes(class_names_file):
    from sparseclip_d2.data import load_class_names

    return len(load_class_names(class_names_file))


def _convert_files(pairs, *, num_classes, reduce_zero_label=False, lut=None):
    """Convert each ``(source, destination)`` whose destination is missing or older than
    its source (``convert_sem_seg_gt``: labels checked, atomic write). Returns
    ``(written, up to date)``; exits naming the file when a source is out of range."""
    from sparseclip_d2.data.ground_truth import convert_sem_seg_gt, is_up_to_date

    written = fresh = 0
    for src, dst in pairs:
        if is_up_to_date(src, dst):
            fresh += 1
            continue
        try:
            convert_sem_seg_gt(src, dst, num_classes=num_classes, reduce_zero_label=reduce_zero_label, lut=lut)
        except (OSError, ValueError) as e:
            sys.exit(f"cannot convert {src}: {e}")
        written += 1
    return written, fresh


def _convert(files, lut, old_suffix, new_suffix, num_classes):
    pairs = [(f, f[: -len(old_suffix)] + new_suffix) for f in files]
    return _convert_files(pairs, num_classes=num_classes, lut=lut)


def _report(written, fresh, what, where):
    print(f"wrote {written} {what} to {where}" + (f" ({fresh} already up to date)" if fresh else ""))


def _raw_coco_maps(root):
    ann = os.path.join(root, "coco_stuff164k", "annotations", "val2017")
    files = [f for f in sorted(glob.glob(os.path.join(ann, "*.png"))) if not f.endswith("Ids.png")]
    if not files:
        sys.exit(f"no raw COCO-Stuff maps (*.png from stuffthingmaps_trainval2017.zip) in {ann}")
    return files


def coco_stuff(root):
    mapping = {c - 1: i for i, c in enumerate(THING_IDS + STUFF_IDS)}
    ann = os.path.join(root, "coco_stuff164k", "annotations", "val2017")
    written = _convert(_raw_coco_maps(root), _lut(mapping), ".png", "_labelTrainIds.png", _num_classes("coco_stuff171"))
    _report(*written, "*_labelTrainIds.png", ann)


def coco_object(root, from_instances=False):
    if not from_instances:
        mapping = {c - 1: i + 1 for i, c in enumerate(THING_IDS)}
        mapping.update({c - 1: 0 for c in STUFF_IDS})
        ann = os.path.join(root, "coco_stuff164k", "annotations", "val2017")
        written = _convert(_raw_coco_maps(root), _lut(mapping), ".png", "_instanceTrainIds.png",
                           _num_classes("coco_object"))
        _report(*written, "*_instanceTrainIds.png", ann)
        return
    from pycocotools.coco import COCO

    from sparseclip_d2.common.io import atomic_path

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
        with atomic_path(os.path.join(out_dir, stem + "_instanceTrainIds.png")) as tmp:
            Image.fromarray(label).save(tmp, format="PNG")
    print(f"wrote {len(coco.getImgIds())} *_instanceTrainIds.png from {js}")


def _split_ids(split_file):
    if not os.path.isfile(split_file):
        sys.exit(f"missing split file {split_file}")
    with open(split_file) as f:
        ids = [line.strip() for line in f if line.strip()]
    if not ids:
        sys.exit(f"split file {split_file} lists no images")
    return ids


def _reduce_split(base, source_dir, split_file, out_dir, class_names_file):
    """The masks of ``split_file``'s ids in ``base/source_dir`` -> ``base/out_dir`` with
    ``reduce_zero_label`` (0 -> 255, v -> v - 1)."""
    from sparseclip_d2.data.datasets.segmentation import CONVERTED_GT

    src_dir = os.path.join(base, source_dir)
    dst_dir = os.path.join(base, CONVERTED_GT, out_dir)
    ids = _split_ids(os.path.join(base, split_file))
    missing = [i for i in ids if not os.path.isfile(os.path.join(src_dir, i + ".png"))]
    if missing:
        sys.exit(f"{len(missing)} of {len(ids)} masks listed in {split_file} are missing from {src_dir}, "
                 f"e.g. {missing[0]}.png")
    pairs = [(os.path.join(src_dir, i + ".png"), os.path.join(dst_dir, i + ".png")) for i in ids]
    written, fresh = _convert_files(pairs, num_classes=_num_classes(class_names_file), reduce_zero_label=True)
    _report(written, fresh, f"{class_names_file} masks", dst_dir)


def voc20(root):
    """VOC2012 SegmentationClass (val) -> annotations_detectron2/voc20_val (background -> 255)."""
    _reduce_split(os.path.join(root, "VOCdevkit", "VOC2012"), "SegmentationClass",
                  os.path.join("ImageSets", "Segmentation", "val.txt"), "voc20_val", "voc20")


def context59(root):
    """VOC2010 SegmentationClassContext (60 classes, val) -> annotations_detectron2/pc59_val."""
    _reduce_split(os.path.join(root, "VOCdevkit", "VOC2010"), "SegmentationClassContext",
                  os.path.join("ImageSets", "SegmentationContext", "val.txt"), "pc59_val", "context59")


def ade20k(root):
    """ADE20K annotations/validation -> annotations_detectron2/validation (0 -> 255, v -> v - 1),
    as detectron2's datasets/prepare_ade20k_sem_seg.py (here the validation split only)."""
    from sparseclip_d2.data.datasets.segmentation import CONVERTED_GT

    base = os.path.join(root, "ADEChallengeData2016")
    src_dir = os.path.join(base, "annotations", "validation")
    files = sorted(glob.glob(os.path.join(src_dir, "*.png")))
    if not files:
        sys.exit(f"no ADE20K masks (*.png from ADEChallengeData2016.zip) in {src_dir}")
    dst_dir = os.path.join(base, CONVERTED_GT, "validation")
    pairs = [(f, os.path.join(dst_dir, os.path.basename(f))) for f in files]
    written, fresh = _convert_files(pairs, num_classes=_num_classes("ade150"), reduce_zero_label=True)
    _report(written, fresh, "ade150 masks", dst_dir)


def cityscapes(root):
    files = sorted(glob.glob(os.path.join(root, "cityscapes", "gtFine", "val", "*", "*_gtFine_labelIds.png")))
    if not files:
        sys.exit(f"no *_gtFine_labelIds.png under {os.path.join(root, 'cityscapes', 'gtFine', 'val')}")
    written = _convert(files, _lut(CITYSCAPES_TRAIN_IDS), "_labelIds.png", "_labelTrainIds.png",
                       _num_classes("cityscapes19"))
    _report(*written, "*_gtFine_labelTrainIds.png", os.path.join(root, "cityscapes", "gtFine", "val"))


# PASCAL-Context: PASCAL in Detail category ids (1-based, alphabetical over its 459 classes) of
# the 59 evaluated classes. Sorted, they are train ids 1..59 in the order of
# classnames/context60.txt; 0 is background (pixels no annotation covers, and - here - pixels of
# the other 400 classes, which the 59-class protocol counts as background).
CONTEXT59_DETAIL_IDS = (
    2, 9, 18, 19, 22, 23, 25, 31, 33, 34, 44, 45, 46, 59, 65, 68, 72, 80, 85, 98, 104, 105, 113,
    115, 144, 158, 159, 162, 187, 189, 207, 220, 232, 258, 259, 260, 284, 295, 296, 308, 324, 326,
    347, 349, 354, 355, 360, 366, 368, 397, 415, 416, 420, 424, 427, 440, 445, 454, 458,
)


def _context_json(root, json_path=None):
    if json_path:
        candidates = [json_path]
    else:
        voc = os.path.join(root, "VOCdevkit")
        candidates = [os.path.join(voc, "VOC2010", "trainval_merged.json"),
                      os.path.join(voc, "trainval_merged.json"), os.path.join(root, "trainval_merged.json")]
    for c in candidates:
        if os.path.isfile(c):
            return c
    sys.exit(f"missing trainval_merged.json (PASCAL in Detail annotations) - looked at {candidates}; "
             "pass --json PATH")


def _decode_detail_segmentation(seg, height, width):
    """Binary (H, W) mask of one Detail ``segmentation`` (COCO-style RLE)."""
    from pycocotools import mask as mask_utils

    if isinstance(seg, dict) and isinstance(seg.get("counts"), list):  # uncompressed RLE
        seg = mask_utils.frPyObjects(seg, height, width)
    if not (isinstance(seg, dict) and "counts" in seg):
        raise ValueError(f"unsupported segmentation encoding {type(seg).__name__} (expected an RLE dict)")
    m = mask_utils.decode(seg)
    if m.shape != (height, width):
        raise ValueError(f"RLE size {m.shape} differs from image size {(height, width)}")
    return m


def _check_context_names(categories):
    """Warn when the json's names of the 59 ids do not match classnames/context60.txt."""
    names_file = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sparseclip_d2", "data",
                              "classnames", "context60.txt")
    if not categories or not os.path.isfile(names_file):
        return
    with open(names_file) as f:
        ours = [line.strip() for line in f if line.strip()][1:]
    theirs = {c.get("category_id"): str(c.get("name", "")) for c in categories}
    squash = lambda s: s.replace(" ", "").lower()  # noqa: E731  ('tvmonitor' vs 'tv monitor')
    bad = [(cid, theirs.get(cid), line) for cid, line in zip(CONTEXT59_DETAIL_IDS, ours)
           if cid in theirs and squash(theirs[cid]) not in {squash(a) for a in line.split(",")}]
    for cid, name, line in bad:
        print(f"WARNING: Detail category {cid} is {name!r} in the json, expected one of {line!r}")


def context_masks(data, phase="val", unmapped=None):
    """Yield ``(image id, uint8 mask)`` for the images of ``phase`` in a Detail json dict.

    Like the Detail API's class mask: start from 0 and paint each of the image's annotations
    with its category id, in json order (later ones win); then map the 59 ids to 1..59 and
    everything else to 0 (their ids are added to the set ``unmapped`` when given).
    """
    lut = np.zeros(max(CONTEXT59_DETAIL_IDS) + 1, dtype=np.uint8)
    lut[list(CONTEXT59_DETAIL_IDS)] = np.arange(1, 60, dtype=np.uint8)
    segs = {}  # by annotation id, json order (a repeated id keeps its first place, last content)
    for seg in data["annos_segmentation"]:
        segs[seg["id"]] = seg
    by_image = {}
    for seg in segs.values():
        by_image.setdefault(seg["image_id"], []).append(seg)
    for img in data["images"]:
        if img.get("phase") != phase:
            continue
        h, w = int(img["height"]), int(img["width"])
        cat = np.zeros((h, w), dtype=np.int64)
        for seg in by_image.get(img["image_id"], []):
            cat[_decode_detail_segmentation(seg["segmentation"], h, w).astype(bool)] = seg["category_id"]
        known = (cat >= 0) & (cat < len(lut))
        out = np.zeros((h, w), dtype=np.uint8)
        out[known] = lut[cat[known]]
        if unmapped is not None:
            unmapped.update(int(c) for c in np.unique(cat[out == 0]) if c != 0)
        yield os.path.splitext(os.path.basename(img["file_name"]))[0], out


def context(root, json_path=None):
    """trainval_merged.json -> VOC2010/SegmentationClassContext/*.png + SegmentationContext/val.txt,
    then the 59-class masks (:func:`context59`)."""
    import json

    src = _context_json(root, json_path)
    voc = os.path.join(root, "VOCdevkit", "VOC2010")
    out_dir = os.path.join(voc, "SegmentationClassContext")
    split_dir = os.path.join(voc, "ImageSets", "SegmentationContext")
    os.makedirs(out_dir, exist_ok=True)
    os.makedirs(split_dir, exist_ok=True)
    print(f"reading {src} ...")
    with open(src) as f:
        data = json.load(f)
    _check_context_names(data.get("categories"))
    ids, unmapped = [], set()
    from sparseclip_d2.common.io import atomic_path, atomic_write_text

    for image_id, mask in context_masks(data, "val", unmapped):
        with atomic_path(os.path.join(out_dir, image_id + ".png")) as tmp:
            Image.fromarray(mask).save(tmp, format="PNG")
        ids.append(image_id)
    if not ids:
        sys.exit(f"no images with phase 'val' in {src}")
    ids.sort()
    atomic_write_text(os.path.join(split_dir, "val.txt"), "".join(i + "\n" for i in ids))
    if unmapped:  # MMSeg's converter asserts these never occur; here they become background
        print(f"note: {len(unmapped)} category ids outside the 59 were painted as background 0: "
              f"{sorted(unmapped)[:20]}{' ...' if len(unmapped) > 20 else ''}")
    print(f"wrote {len(ids)} masks to {out_dir} and {os.path.join(split_dir, 'val.txt')}")
    context59(root)  # the 59-class masks of sparseclip_context59_val, from these
    if not os.path.isdir(os.path.join(voc, "JPEGImages")):
        print(f"note: {os.path.join(voc, 'JPEGImages')} is missing (extract VOCtrainval_03-May-2010.tar)")


def check_masks(name, dicts, sample=None):
    """Check the masks of a segmentation dataset as train_net.py does before inference
    (``sparseclip_d2.data.ground_truth``): each must be a single-channel label PNG, the size
    of its image (EXIF orientation applied, as the mapper reads it), with labels in range
    over its histogram. All masks by default; ``sample`` N > 0: N evenly spaced records
    (first and last included).

    Returns:
        a list of problems, one line each naming the file (empty when all are usable).
    """
    from detectron2.data import MetadataCatalog

    from sparseclip_d2.data.ground_truth import find_bad_ground_truth

    meta = MetadataCatalog.get(name)
    if meta.get("evaluator_type", None) != "sem_seg" or not dicts:
        return []
    if sample:
        n, k = len(dicts), min(sample, len(dicts))
        dicts = [dicts[i] for i in sorted({round(i * (n - 1) / max(k - 1, 1)) for i in range(k)})]
    problems, _ = find_bad_ground_truth(name, dicts, num_classes=len(meta.stuff_classes),
                                        ignore_label=int(meta.get("ignore_label", 255)))
    return problems


def check(root, names=None, sample=None):
    """Load each requested dataset (every ``sparseclip_*`` one when ``names`` is empty; names
    may be shell patterns such as ``sparseclip_fgovd_*``) as a run would, which checks its
    files and, for FG-OVD, that every image exists; check every segmentation mask (or
    ``sample`` evenly spaced ones).
    Prints one line per dataset (and per problem); exits 1 when a requested dataset is not
    ready or a name matches nothing."""
    import fnmatch

    already = "sparseclip_d2.data" in sys.modules
    os.environ["DETECTRON2_DATASETS"] = root  # read by sparseclip_d2.data.datasets.root.datasets_root
    import sparseclip_d2

    sparseclip_d2.register_detectron2_parts()  # registers the datasets with this root
    from detectron2.data import DatasetCatalog, MetadataCatalog

    registered_root = os.path.dirname(MetadataCatalog.get("sparseclip_ade20k_val").dataset_root)
    if already and os.path.abspath(registered_root) != os.path.abspath(root):
        sys.exit(f"check: the datasets were registered under {registered_root!r} before --root {root!r} was "
                 "given; run the check in a fresh process")

    registered = sorted(n for n in DatasetCatalog.list() if n.startswith("sparseclip_"))
    ok = True
    selected = []
    for pattern in names or ["sparseclip_*"]:
        matched = [n for n in registered if fnmatch.fnmatchcase(n, pattern)]
        if not matched:
            ok = False
            print(f"{pattern}: no such dataset; registered: {', '.join(registered)}")
        selected += [n for n in matched if n not in selected]
    for name in selected:
        try:
            dicts = DatasetCatalog.get(name)
        except Exception as e:  # report every dataset, then fail
            ok = False
            print(f"{name}: NOT READY - {e}")
            continue
        problems = check_masks(name, dicts, sample)
        for problem in problems:
            print(f"{name}: BAD MASK - {problem}")
        ok = ok and not problems
        if not problems:
            masks = "" if not dicts or "sem_seg_file_name" not in dicts[0] else (
                f", {min(sample, len(dicts)) if sample else len(dicts)} masks checked")
            print(f"{name}: ready ({len(dicts)} images{masks})")
    sys.exit(0 if ok else 1)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("task", choices=["check", "voc20", "ade20k", "context", "context59", "coco_stuff", "coco_object",
                                    "cityscapes"])
    p.add_argument("names", nargs="*", help="check: dataset names or patterns (default: all)")
    p.add_argument("--root", default=None, help="datasets root (default: $DETECTRON2_DATASETS, else ./datasets)")
    p.add_argument("--from-instances", action="store_true", help="coco_object from instances_val2017.json")
    p.add_argument("--json", help="context: trainval_merged.json (default: looked for under the root)")
    p.add_argument("--sample", type=int, default=0,
                   help="check: masks checked per segmentation dataset, evenly spaced (default 0: all)")
    a = p.parse_intermixed_args()
    if a.root is None:
        from sparseclip_d2.data.datasets.root import datasets_root

        a.root = datasets_root()
    if a.sample < 0:
        p.error(f"--sample must be >= 0 (0 = every mask), got {a.sample}")
    if a.names and a.task != "check":
        p.error(f"dataset names are only taken by 'check', not by {a.task!r}")
    if a.task == "coco_object":
        coco_object(a.root, a.from_instances)
    elif a.task == "context":
        context(a.root, a.json)
    elif a.task == "check":
        check(a.root, a.names, a.sample)
    else:
        {"voc20": voc20, "ade20k": ade20k, "context59": context59, "coco_stuff": coco_stuff,
         "cityscapes": cityscapes}[a.task](a.root)


if __name__ == "__main__":
    main()
