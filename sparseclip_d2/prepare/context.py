"""Pascal Context from PASCAL in Detail (``tools/prepare_datasets.py context``):
``trainval_merged.json`` -> the 60-class val masks ``VOC2010/SegmentationClassContext`` and
``ImageSets/SegmentationContext/val.txt``, built as MMSeg's pascal_context.py does with
pycocotools instead of the Detail API, then the 59-class masks (:func:`.convert.context59`).
"""
import os

import numpy as np
from PIL import Image

from .convert import PrepareError, context59

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
    raise PrepareError(f"missing trainval_merged.json (PASCAL in Detail annotations) - looked at {candidates}; "
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
    names_file = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
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
    from ..common.io import atomic_path, atomic_write_text

    for image_id, mask in context_masks(data, "val", unmapped):
        with atomic_path(os.path.join(out_dir, image_id + ".png")) as tmp:
            Image.fromarray(mask).save(tmp, format="PNG")
        ids.append(image_id)
    if not ids:
        raise PrepareError(f"no images with phase 'val' in {src}")
    ids.sort()
    atomic_write_text(os.path.join(split_dir, "val.txt"), "".join(i + "\n" for i in ids))
    if unmapped:  # MMSeg's converter asserts these never occur; here they become background
        print(f"note: {len(unmapped)} category ids outside the 59 were painted as background 0: "
              f"{sorted(unmapped)[:20]}{' ...' if len(unmapped) > 20 else ''}")
    print(f"wrote {len(ids)} masks to {out_dir} and {os.path.join(split_dir, 'val.txt')}")
    context59(root)  # the 59-class masks of sparseclip_context59_val, from these
    if not os.path.isdir(os.path.join(voc, "JPEGImages")):
        print(f"note: {os.path.join(voc, 'JPEGImages')} is missing (extract VOCtrainval_03-May-2010.tar)")

