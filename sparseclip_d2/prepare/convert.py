"""Label conversions of the segmentation benchmarks, once, into the files sparseclip_d2 evaluates
on (``tools/prepare_datasets.py voc20 / ade20k / context59 / coco_stuff / coco_object /
cityscapes``): label PNGs that detectron2's SemSegEvaluator reads as they are (class indices of
the dataset, 255 = ignore), each written atomically by ``convert_sem_seg_gt`` and only when it is
missing or older than its source. The id tables are declarative: COCO-Stuff's thing and stuff ids,
Cityscapes' train ids.

The detectron2 data layer is imported inside the functions (importing ``sparseclip_d2.data``
registers the datasets under the datasets root, which ``check`` sets first).
"""
import glob
import os

import numpy as np
from PIL import Image

from ..common.errors import UserError


class PrepareError(UserError):
    """A missing or unusable download (names the file and what to put there):
    ``tools/prepare_datasets.py`` prints it as one error line."""

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
    from ..data import load_class_names

    return len(load_class_names(class_names_file))


def _convert_files(pairs, *, num_classes, reduce_zero_label=False, lut=None):
    """Convert each ``(source, destination)`` whose destination is missing or older than
    its source (``convert_sem_seg_gt``: labels checked, atomic write). Returns
    ``(written, up to date)``; exits naming the file when a source is out of range."""
    from ..data.ground_truth import convert_sem_seg_gt, is_up_to_date

    written = fresh = 0
    for src, dst in pairs:
        if is_up_to_date(src, dst):
            fresh += 1
            continue
        try:
            convert_sem_seg_gt(src, dst, num_classes=num_classes, reduce_zero_label=reduce_zero_label, lut=lut)
        except (OSError, ValueError) as e:
            raise PrepareError(f"cannot convert {src}: {e}")
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
        raise PrepareError(f"no raw COCO-Stuff maps (*.png from stuffthingmaps_trainval2017.zip) in {ann}")
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

    from ..common.io import atomic_path

    base = os.path.join(root, "coco_stuff164k")
    js = os.path.join(base, "annotations", "instances_val2017.json")
    if not os.path.isfile(js):
        raise PrepareError(f"missing {js} (from annotations_trainval2017.zip)")
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
        raise PrepareError(f"missing split file {split_file}: is --root (default $DETECTRON2_DATASETS) the folder "
                           "that holds the extracted downloads? (docs/datasets.md)")
    with open(split_file) as f:
        ids = [line.strip() for line in f if line.strip()]
    if not ids:
        raise PrepareError(f"split file {split_file} lists no images")
    return ids


def _reduce_split(base, source_dir, split_file, out_dir, class_names_file):
    """The masks of ``split_file``'s ids in ``base/source_dir`` -> ``base/out_dir`` with
    ``reduce_zero_label`` (0 -> 255, v -> v - 1)."""
    from ..data.datasets.segmentation import CONVERTED_GT

    src_dir = os.path.join(base, source_dir)
    dst_dir = os.path.join(base, CONVERTED_GT, out_dir)
    ids = _split_ids(os.path.join(base, split_file))
    missing = [i for i in ids if not os.path.isfile(os.path.join(src_dir, i + ".png"))]
    if missing:
        raise PrepareError(f"{len(missing)} of {len(ids)} masks listed in {split_file} are missing from {src_dir}, "
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
    from ..data.datasets.segmentation import CONVERTED_GT

    base = os.path.join(root, "ADEChallengeData2016")
    src_dir = os.path.join(base, "annotations", "validation")
    files = sorted(glob.glob(os.path.join(src_dir, "*.png")))
    if not files:
        raise PrepareError(f"no ADE20K masks (*.png from ADEChallengeData2016.zip) in {src_dir}")
    dst_dir = os.path.join(base, CONVERTED_GT, "validation")
    pairs = [(f, os.path.join(dst_dir, os.path.basename(f))) for f in files]
    written, fresh = _convert_files(pairs, num_classes=_num_classes("ade150"), reduce_zero_label=True)
    _report(written, fresh, "ade150 masks", dst_dir)


def cityscapes(root):
    files = sorted(glob.glob(os.path.join(root, "cityscapes", "gtFine", "val", "*", "*_gtFine_labelIds.png")))
    if not files:
        raise PrepareError(f"no *_gtFine_labelIds.png under {os.path.join(root, 'cityscapes', 'gtFine', 'val')}")
    written = _convert(files, _lut(CITYSCAPES_TRAIN_IDS), "_labelIds.png", "_labelTrainIds.png",
                       _num_classes("cityscapes19"))
    _report(*written, "*_gtFine_labelTrainIds.png", os.path.join(root, "cityscapes", "gtFine", "val"))
