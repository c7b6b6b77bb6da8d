"""FG-OVD (fine-grained open-vocabulary detection) benchmark: registration and loader.

One LVIS-style JSON file per split (lorebianchi98/FG-OVD, ``benchmarks/`` and
``validation_sets/``): every annotation is a box of a COCO 2017 image with a positive
caption (``category_id``) and hard-negative captions (``neg_category_ids``); the
``categories`` are the caption texts. Images are resolved as ``<root>/coco/<file_name>``,
``file_name`` being ``train2017/...`` or ``val2017/...`` (the official code joins
``coco_path + file_name``). Registered datasets (root ``$DETECTRON2_DATASETS``)::

    sparseclip_fgovd_{split}       fg-ovd/benchmarks/<file>.json
    sparseclip_fgovd_val_{split}   fg-ovd/validation_sets/<file>.json

for the splits of :data:`FGOVD_SPLITS` (file name, default number of negatives N).
"""
import json
import logging
import math
import os
from typing import Dict, List, Optional, Tuple

from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.structures import BoxMode
from detectron2.utils.file_io import PathManager

from .root import datasets_root
from .segmentation import DatasetNotFoundError

__all__ = [
    "FGOVD_SPLITS",
    "FGOVDFormatError",
    "load_fgovd_json",
    "missing_images",
    "register_fgovd_dataset",
    "register_all_fgovd",
    "resolve_num_negatives",
]

logger = logging.getLogger(__name__)

# split -> (JSON file name, default number of negatives N). File names: lorebianchi98/FG-OVD
# benchmarks/README.md (1_attributes = Hard, 2_attributes = Medium, 3_attributes = Easy,
# shuffle_negatives = Trivial); N per split: lorebianchi98/FG-CLIP src/eval_util.py
# do_fgovd_eval (limit 2 for transparency, 7 for pattern, 10 otherwise).
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

# Where to get the files (named in the errors of missing files).
_GET_JSON = (
    "download it from https://github.com/lorebianchi98/FG-OVD (folders benchmarks/ and "
    "validation_sets/) into {folder}"
)
_GET_IMAGES = (
    "FG-OVD images are COCO 2017 train AND val images: extract train2017.zip and val2017.zip "
    "from https://cocodataset.org/#download under {root} (so that {root}/train2017/ and "
    "{root}/val2017/ exist)"
)

# A box may exceed the image by at most this many pixels (float rounding in the source
# annotations); it is then clipped to the image. Anything further out is an error.
_BOX_TOLERANCE_PX = 1.0


class FGOVDFormatError(ValueError):
    """A malformed FG-OVD JSON file; the message names the file, the record and the field."""


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


class _Checker:
    """Type checks of one file's records; every error names the file, record and field."""

    def __init__(self, json_file: str):
        self.json_file = json_file

    def fail(self, what: str, rid, field: str, problem: str) -> FGOVDFormatError:
        return FGOVDFormatError(f"{self.json_file}: {what} id={rid!r} field '{field}': {problem}")

    def record(self, rec, what: str, index: int, keys) -> object:
        if not isinstance(rec, dict):
            raise FGOVDFormatError(
                f"{self.json_file}: {what} #{index} must be an object, got {type(rec).__name__} {rec!r:.80}"
            )
        if "id" not in rec:
            raise FGOVDFormatError(f"{self.json_file}: {what} #{index} lacks 'id'")
        rid = rec["id"]
        if not _is_int(rid):
            raise self.fail(what, rid, "id", f"must be an integer, got {type(rid).__name__}")
        missing = [k for k in keys if k not in rec]
        if missing:
            raise FGOVDFormatError(
                f"{self.json_file}: {what} id={rid} lacks key(s) {missing}; required: {list(keys)}"
            )
        return rid

    def int_field(self, rec, what, field, positive=False) -> int:
        v = rec[field]
        if not _is_int(v) or (positive and v <= 0):
            raise self.fail(what, rec["id"], field,
                            f"must be a {'positive ' if positive else ''}integer, got {v!r:.80}")
        return v

    def str_field(self, rec, what, field) -> str:
        v = rec[field]
        if not isinstance(v, str) or not v.strip():
            raise self.fail(what, rec["id"], field, f"must be a non-empty string, got {v!r:.80}")
        return v


def _read_fgovd_top_level(json_file: str) -> dict:
    """The parsed JSON of an FG-OVD file whose top level has the lists ``images``,
    ``annotations`` and ``categories`` (:class:`DatasetNotFoundError` / :class:`FGOVDFormatError`
    otherwise, naming the file)."""
    if not PathManager.exists(json_file):
        raise DatasetNotFoundError(
            f"FG-OVD file {json_file!r} does not exist; "
            + _GET_JSON.format(folder=os.path.dirname(json_file) or ".")
        )
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
        if not isinstance(data[key], list):
            raise FGOVDFormatError(
                f"{json_file}: top-level '{key}' must be a list of objects, got {type(data[key]).__name__}"
            )
    return data


def load_fgovd_json(
    json_file: str,
    image_root: str,
    dataset_name: Optional[str] = None,
    check_images: bool = False,
) -> List[dict]:
    """Load an FG-OVD LVIS-style JSON file into detectron2 dataset dicts.

    Every field read is type-checked (ids and sizes integers, ``bbox`` four finite numbers,
    ``neg_category_ids`` a list of integers, captions non-empty strings, top-level entries
    lists of objects).

    Args:
        json_file: the benchmark file (e.g. ``fg-ovd/benchmarks/1_attributes.json``).
        image_root: directory the images' ``file_name`` (``train2017/...`` or
            ``val2017/...``) is relative to (``<root>/coco``).
        dataset_name: stored in every record as ``dataset_name``.
        check_images: raise :class:`DatasetNotFoundError` when an image file is missing
            (how many, the first paths, and how to get them).

    Returns:
        One dict per image, in file order: ``file_name``, ``image_id``, ``height``,
        ``width``, (``dataset_name``), and ``annotations``, each with ``id``, ``bbox``
        ``[x, y, w, h]`` (``bbox_mode`` XYWH_ABS, clipped to the image), ``caption_id``,
        ``caption`` (text), ``neg_caption_ids`` and ``neg_captions`` (file order; all of them:
        the N-negatives rule is the evaluator's). Images without boxes are kept.

    Raises:
        DatasetNotFoundError: the file (or, with ``check_images``, an image) is missing.
        FGOVDFormatError: not JSON, a missing key, a wrong type, a non-finite number,
            duplicate ids, unknown image or caption ids, an empty box or one outside its
            image; the message names the file, the record id and the field.
    """
    data = _read_fgovd_top_level(json_file)
    chk = _Checker(json_file)

    captions: Dict[int, str] = {}
    for i, cat in enumerate(data["categories"]):
        cid = chk.record(cat, "category", i, ("id", "name"))
        if cid in captions:
            raise FGOVDFormatError(f"{json_file}: duplicate category id={cid}")
        captions[cid] = chk.str_field(cat, "category", "name")
    if not captions:
        raise FGOVDFormatError(f"{json_file}: 'categories' is empty (the captions)")

    records: Dict[int, dict] = {}
    for i, img in enumerate(data["images"]):
        iid = chk.record(img, "image", i, ("id", "width", "height", "file_name"))
        if iid in records:
            raise FGOVDFormatError(f"{json_file}: duplicate image id={iid}")
        fname = chk.str_field(img, "image", "file_name")
        if os.path.isabs(fname):
            raise chk.fail("image", iid, "file_name", f"must be relative to the COCO folder, got {fname!r}")
        record = {
            "file_name": os.path.join(image_root, fname),
            "image_id": iid,
            "height": chk.int_field(img, "image", "height", positive=True),
            "width": chk.int_field(img, "image", "width", positive=True),
            "annotations": [],
        }
        if dataset_name is not None:
            record["dataset_name"] = dataset_name
        records[iid] = record
    if not records:
        raise FGOVDFormatError(f"{json_file}: 'images' is empty")

    ann_ids = set()
    for i, ann in enumerate(data["annotations"]):
        aid = chk.record(ann, "annotation", i, ("id", "image_id", "bbox", "category_id", "neg_category_ids"))
        if aid in ann_ids:
            raise FGOVDFormatError(f"{json_file}: duplicate annotation id={aid}")
        ann_ids.add(aid)
        image_id = chk.int_field(ann, "annotation", "image_id")
        record = records.get(image_id)
        if record is None:
            raise chk.fail("annotation", aid, "image_id", f"refers to unknown image id {image_id}")
        pos = chk.int_field(ann, "annotation", "category_id")
        negs = ann["neg_category_ids"]
        if not isinstance(negs, list) or not negs or not all(_is_int(c) for c in negs):
            raise chk.fail("annotation", aid, "neg_category_ids",
                           f"must be a non-empty list of integers (caption ids), got {negs!r:.80}")
        unknown = [c for c in [pos, *negs] if c not in captions]
        if unknown:
            field = "category_id" if pos in unknown else "neg_category_ids"
            raise chk.fail("annotation", aid, field, f"unknown caption id(s) {unknown} (not in 'categories')")
        bbox = _checked_box(chk, ann, record)
        record["annotations"].append(
            {
                "id": aid,
                "bbox": bbox,
                "bbox_mode": BoxMode.XYWH_ABS,
                "caption_id": pos,
                "caption": captions[pos],
                "neg_caption_ids": list(negs),
                "neg_captions": [captions[c] for c in negs],
            }
        )

    if not ann_ids:
        raise FGOVDFormatError(f"{json_file}: 'annotations' is empty (no box to evaluate)")
    dataset_dicts = list(records.values())
    if check_images:
        missing = missing_images(dataset_dicts)
        if missing:
            raise DatasetNotFoundError(_missing_images_message(json_file, image_root, missing, len(dataset_dicts)))
    logger.info(
        "Loaded %d images, %d boxes, %d captions from %s",
        len(dataset_dicts), len(ann_ids), len(captions), json_file,
    )
    return dataset_dicts


def missing_images(dataset_dicts: List[dict]) -> List[str]:
    """The ``file_name`` of every record whose image file does not exist."""
    return [d["file_name"] for d in dataset_dicts if not os.path.isfile(d["file_name"])]


def _missing_images_message(json_file: str, image_root: str, missing: List[str], total: int) -> str:
    shown = ", ".join(repr(m) for m in missing[:3])
    return (
        f"{len(missing)} of {total} images of {json_file} are missing under {image_root!r} "
        f"(e.g. {shown}). " + _GET_IMAGES.format(root=image_root)
    )


def _checked_box(chk: _Checker, ann: dict, record: dict) -> List[float]:
    """Validate an ``[x, y, w, h]`` box against its image; return it clipped to the image."""
    bbox = ann["bbox"]
    if not isinstance(bbox, list) or len(bbox) != 4 or not all(_is_number(v) for v in bbox):
        raise chk.fail("annotation", ann["id"], "bbox", f"must be [x, y, w, h] of four finite numbers, got {bbox!r:.80}")
    x, y, w, h = (float(v) for v in bbox)
    W, H = record["width"], record["height"]
    if w <= 0 or h <= 0:
        raise chk.fail("annotation", ann["id"], "bbox", f"empty box {bbox} (w, h must be > 0)")
    t = _BOX_TOLERANCE_PX
    if x < -t or y < -t or x + w > W + t or y + h > H + t:
        raise chk.fail(
            "annotation", ann["id"], "bbox",
            f"box {bbox} (x, y, w, h) lies outside its image id={record['image_id']} of size {W}x{H} (width x height)",
        )
    x0, y0 = max(x, 0.0), max(y, 0.0)
    x1, y1 = min(x + w, float(W)), min(y + h, float(H))
    return [x0, y0, x1 - x0, y1 - y0]


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
    name: str, json_file: str, image_root: str, num_negatives: int, split: str = "", check_images: bool = True
) -> None:
    """Register one FG-OVD split under ``name`` (lazy: the file is read on first use, and
    with ``check_images`` every image must exist then).

    Metadata: ``evaluator_type="fgovd"``, ``json_file``, ``image_root``, ``num_negatives``
    (default N of the split) and ``split``.
    """
    DatasetCatalog.register(
        name, lambda: load_fgovd_json(json_file, image_root, dataset_name=name, check_images=check_images)
    )
    MetadataCatalog.get(name).set(
        json_file=json_file,
        image_root=image_root,
        evaluator_type="fgovd",
        num_negatives=int(num_negatives),
        split=split,
    )


def register_all_fgovd(root: str) -> None:
    """Register the ``sparseclip_fgovd_<split>`` benchmark splits and the
    ``sparseclip_fgovd_val_<split>`` validation sets under the datasets root ``root``."""
    image_root = os.path.join(root, "coco")
    for split, (fname, n) in FGOVD_SPLITS.items():
        register_fgovd_dataset(f"sparseclip_fgovd_{split}", os.path.join(root, "fg-ovd", "benchmarks", fname),
                               image_root, n, split=split)
        register_fgovd_dataset(f"sparseclip_fgovd_val_{split}",
                               os.path.join(root, "fg-ovd", "validation_sets", fname), image_root, n,
                               split=f"val_{split}")


register_all_fgovd(datasets_root())
