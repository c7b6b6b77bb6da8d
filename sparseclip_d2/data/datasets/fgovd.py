"""FG-OVD (fine-grained open-vocabulary detection) benchmark: registration and loader.

The benchmark ships one LVIS-style JSON file per split. Every annotation is a box of a
COCO val2017 image together with a positive caption (``category_id``) and a list of
hard-negative captions (``neg_category_ids``) that differ from it in attributes; the
``categories`` are the caption texts. The task scored here is region recognition: rank the
positive caption of each box against its first N negatives.

Registered datasets (root ``$DETECTRON2_DATASETS``, default ``datasets``)::

    sparseclip_fgovd_hard          fg-ovd/benchmarks/1_attributes.json        N = 10
    sparseclip_fgovd_medium        fg-ovd/benchmarks/2_attributes.json        N = 10
    sparseclip_fgovd_easy          fg-ovd/benchmarks/3_attributes.json        N = 10
    sparseclip_fgovd_trivial       fg-ovd/benchmarks/shuffle_negatives.json   N = 10
    sparseclip_fgovd_color         fg-ovd/benchmarks/color.json               N = 10
    sparseclip_fgovd_material      fg-ovd/benchmarks/material.json            N = 10
    sparseclip_fgovd_pattern       fg-ovd/benchmarks/pattern.json             N = 7
    sparseclip_fgovd_transparency  fg-ovd/benchmarks/transparency.json        N = 2

with images under ``coco/`` (their ``file_name`` is ``val2017/...``).

The loader is our own (detectron2's LVIS loader needs the ``lvis`` package and LVIS
metadata). It keeps *all* negatives of every box; the per-split rule "boxes with fewer than
N negatives are dropped (and counted), boxes with more keep the first N", as in the official
evaluation, is :func:`select_negatives`, applied by the test mapper so that the N of the
config (``MODEL.SPARSECLIP.FGOVD.NUM_NEGATIVES``) wins over the split default stored in the
metadata (``num_negatives``).
"""
import json
import logging
import os
from typing import Dict, List, Optional, Sequence, Tuple

from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.structures import BoxMode
from detectron2.utils.file_io import PathManager

__all__ = [
    "FGOVD_SPLITS",
    "FGOVD_DEFAULT_NUM_NEGATIVES",
    "FGOVDFormatError",
    "load_fgovd_json",
    "select_negatives",
    "register_fgovd_dataset",
    "register_all_fgovd",
    "resolve_num_negatives",
]

logger = logging.getLogger(__name__)

# split name -> (JSON file under fg-ovd/benchmarks/, default number of negatives N)
FGOVD_SPLITS: Dict[str, Tuple[str, int]] = {
    "hard": ("1_attributes.json", 10),
    "medium": ("2_attributes.json", 10),
    "easy": ("3_attributes.json", 10),
    "trivial": ("shuffle_negatives.json", 10),
    "color": ("color.json", 10),
    "material": ("material.json", 10),
    "pattern": ("pattern.json", 7),
    "transparency": ("transparency.json", 2),
}
FGOVD_DEFAULT_NUM_NEGATIVES: Dict[str, int] = {k: v[1] for k, v in FGOVD_SPLITS.items()}

# A box may exceed the image by at most this many pixels (float rounding in the source
# annotations); it is then clipped to the image. Anything further out is an error.
_BOX_TOLERANCE_PX = 1.0

_REQUIRED_IMAGE_KEYS = ("id", "width", "height", "file_name")
_REQUIRED_ANN_KEYS = ("id", "image_id", "bbox", "category_id", "neg_category_ids")
_REQUIRED_CAT_KEYS = ("id", "name")


class FGOVDFormatError(ValueError):
    """A malformed FG-OVD JSON file; the message names the file and the record."""


def _require(record: dict, keys: Sequence[str], json_file: str, what: str) -> None:
    missing = [k for k in keys if k not in record]
    if missing:
        rid = record.get("id", "<no id>")
        raise FGOVDFormatError(
            f"{json_file}: {what} id={rid} lacks key(s) {missing}; required: {list(keys)}"
        )


def load_fgovd_json(
    json_file: str,
    image_root: str,
    dataset_name: Optional[str] = None,
    num_negatives: Optional[int] = None,
) -> List[dict]:
    """Load an FG-OVD LVIS-style JSON file into detectron2 dataset dicts.

    Args:
        json_file: the benchmark file (e.g. ``fg-ovd/benchmarks/1_attributes.json``).
        image_root: directory the images' ``file_name`` (``val2017/...``) is relative to.
        dataset_name: stored in every record as ``dataset_name`` (the META_ARCH and the
            mapper read the dataset's metadata through it).
        num_negatives: when given, apply :func:`select_negatives` with this N here (the
            dropped count of each image is stored as ``fgovd_num_dropped``); when None (how
            the registered datasets call it) every box keeps all its negatives.

    Returns:
        One dict per image, in file order: ``file_name``, ``image_id``, ``height``,
        ``width``, ``dataset_name``, and ``annotations``, each with ``id``, ``bbox``
        ``[x, y, w, h]`` (``bbox_mode`` XYWH_ABS, clipped to the image), ``caption_id``,
        ``caption`` (text), ``neg_caption_ids`` and ``neg_captions`` (lists in file order).
        Images without boxes are kept (with an empty list).

    Raises:
        FGOVDFormatError: missing top-level or record keys, duplicate ids, annotations of
            unknown images, unknown caption ids, degenerate boxes or boxes outside the
            image; the message names the file and the record.
    """
    with PathManager.open(json_file, "r") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise FGOVDFormatError(f"{json_file}: not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise FGOVDFormatError(f"{json_file}: top level must be an object, got {type(data).__name__}")
    for key in ("images", "annotations", "categories"):
        if key not in data:
            raise FGOVDFormatError(
                f"{json_file}: missing top-level key '{key}'; required: images, annotations, categories"
            )

    captions: Dict[int, str] = {}
    for cat in data["categories"]:
        _require(cat, _REQUIRED_CAT_KEYS, json_file, "category")
        if cat["id"] in captions:
            raise FGOVDFormatError(f"{json_file}: duplicate category id={cat['id']}")
        captions[cat["id"]] = cat["name"]

    records: Dict[int, dict] = {}
    for img in data["images"]:
        _require(img, _REQUIRED_IMAGE_KEYS, json_file, "image")
        if img["id"] in records:
            raise FGOVDFormatError(f"{json_file}: duplicate image id={img['id']}")
        record = {
            "file_name": os.path.join(image_root, img["file_name"]),
            "image_id": img["id"],
            "height": int(img["height"]),
            "width": int(img["width"]),
            "annotations": [],
        }
        if dataset_name is not None:
            record["dataset_name"] = dataset_name
        records[img["id"]] = record

    ann_ids = set()
    for ann in data["annotations"]:
        _require(ann, _REQUIRED_ANN_KEYS, json_file, "annotation")
        aid = ann["id"]
        if aid in ann_ids:
            raise FGOVDFormatError(f"{json_file}: duplicate annotation id={aid}")
        ann_ids.add(aid)
        record = records.get(ann["image_id"])
        if record is None:
            raise FGOVDFormatError(
                f"{json_file}: annotation id={aid} refers to unknown image_id={ann['image_id']}"
            )
        unknown = [c for c in [ann["category_id"], *ann["neg_category_ids"]] if c not in captions]
        if unknown:
            raise FGOVDFormatError(
                f"{json_file}: annotation id={aid} refers to unknown caption id(s) {unknown} "
                f"(not in 'categories')"
            )
        bbox = _checked_box(ann["bbox"], record, json_file, aid)
        neg_ids = list(ann["neg_category_ids"])
        record["annotations"].append(
            {
                "id": aid,
                "bbox": bbox,
                "bbox_mode": BoxMode.XYWH_ABS,
                "caption_id": ann["category_id"],
                "caption": captions[ann["category_id"]],
                "neg_caption_ids": neg_ids,
                "neg_captions": [captions[c] for c in neg_ids],
            }
        )

    dataset_dicts = list(records.values())
    if num_negatives is not None:
        total_dropped = 0
        for record in dataset_dicts:
            record["annotations"], dropped = select_negatives(record["annotations"], num_negatives)
            record["fgovd_num_dropped"] = dropped
            total_dropped += dropped
        logger.info(
            "%s: dropped %d of %d boxes with fewer than %d negatives",
            json_file, total_dropped, len(ann_ids), num_negatives,
        )
    logger.info(
        "Loaded %d images, %d boxes, %d captions from %s",
        len(dataset_dicts), len(ann_ids), len(captions), json_file,
    )
    return dataset_dicts


def _checked_box(bbox, record: dict, json_file: str, aid) -> List[float]:
    """Validate an ``[x, y, w, h]`` box against its image; return it clipped to the image."""
    if not isinstance(bbox, (list, tuple)) or len(bbox) != 4:
        raise FGOVDFormatError(f"{json_file}: annotation id={aid} bbox must be [x, y, w, h], got {bbox!r}")
    x, y, w, h = (float(v) for v in bbox)
    W, H = record["width"], record["height"]
    if w <= 0 or h <= 0:
        raise FGOVDFormatError(f"{json_file}: annotation id={aid} has an empty box {list(bbox)} (w, h must be > 0)")
    t = _BOX_TOLERANCE_PX
    if x < -t or y < -t or x + w > W + t or y + h > H + t:
        raise FGOVDFormatError(
            f"{json_file}: annotation id={aid} box {list(bbox)} (x, y, w, h) lies outside its "
            f"image id={record['image_id']} of size {W}x{H} (width x height)"
        )
    x0, y0 = max(x, 0.0), max(y, 0.0)
    x1, y1 = min(x + w, float(W)), min(y + h, float(H))
    return [x0, y0, x1 - x0, y1 - y0]


def select_negatives(annotations: List[dict], num_negatives: int) -> Tuple[List[dict], int]:
    """Apply the official N-negatives rule to the boxes of one image.

    Boxes with fewer than ``num_negatives`` negatives are dropped; the others keep their
    first ``num_negatives`` negatives (file order).

    Args:
        annotations: records as produced by :func:`load_fgovd_json`.
        num_negatives: N >= 1.

    Returns:
        ``(kept, num_dropped)``; ``kept`` are new dicts (the inputs are not modified).
    """
    if int(num_negatives) < 1:
        raise ValueError(f"num_negatives must be >= 1, got {num_negatives}")
    n = int(num_negatives)
    kept = []
    for ann in annotations:
        if len(ann["neg_caption_ids"]) < n:
            continue
        ann = dict(ann)
        ann["neg_caption_ids"] = list(ann["neg_caption_ids"][:n])
        ann["neg_captions"] = list(ann["neg_captions"][:n])
        kept.append(ann)
    return kept, len(annotations) - len(kept)


def resolve_num_negatives(dataset_name: str, configured: int = -1) -> int:
    """The N used for ``dataset_name``: ``configured`` when > 0, else the metadata default.

    Raises:
        ValueError: ``configured`` is 0 or below -1, or the dataset has no ``num_negatives``
            in its metadata (not an FG-OVD dataset) and none is configured.
    """
    configured = int(configured)
    if configured > 0:
        return configured
    if configured != -1:
        raise ValueError(
            f"MODEL.SPARSECLIP.FGOVD.NUM_NEGATIVES must be >= 1 or -1 (split default), got {configured}"
        )
    n = MetadataCatalog.get(dataset_name).get("num_negatives", None)
    if n is None:
        raise ValueError(
            f"dataset '{dataset_name}' has no 'num_negatives' in its metadata (is it an FG-OVD "
            f"dataset? registered: {sorted('sparseclip_fgovd_' + s for s in FGOVD_SPLITS)}); "
            f"set MODEL.SPARSECLIP.FGOVD.NUM_NEGATIVES"
        )
    return int(n)


def register_fgovd_dataset(
    name: str, json_file: str, image_root: str, num_negatives: int, split: str = ""
) -> None:
    """Register one FG-OVD split under ``name`` (lazy: the file is read on first use).

    Metadata: ``evaluator_type="fgovd"``, ``json_file``, ``image_root``, ``num_negatives``
    (default N of the split) and ``split``.
    """
    DatasetCatalog.register(
        name, lambda: load_fgovd_json(json_file, image_root, dataset_name=name)
    )
    MetadataCatalog.get(name).set(
        json_file=json_file,
        image_root=image_root,
        evaluator_type="fgovd",
        num_negatives=int(num_negatives),
        split=split,
    )


def register_all_fgovd(root: str) -> None:
    """Register the eight ``sparseclip_fgovd_*`` splits under the datasets root ``root``."""
    for split, (fname, n) in FGOVD_SPLITS.items():
        register_fgovd_dataset(
            f"sparseclip_fgovd_{split}",
            os.path.join(root, "fg-ovd", "benchmarks", fname),
            os.path.join(root, "coco"),
            n,
            split=split,
        )


_root = os.path.expanduser(os.getenv("DETECTRON2_DATASETS", "datasets"))
register_all_fgovd(_root)
