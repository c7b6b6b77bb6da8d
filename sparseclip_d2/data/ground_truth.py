"""Semantic-segmentation ground truth: converted once, offline, then read as it is.

detectron2's ``SemSegEvaluator`` reads each ``sem_seg_file_name`` as it is on disk
(``np.array(Image.open(f), dtype=int)``) and treats ``ignore_label`` (255) as ignored, so a
dataset's files must already hold the class indices ``[0, num_classes)`` of its
``stuff_classes``. Datasets whose official files use another label map (MMSeg's
``reduce_zero_label``: 0 = "other" -> ignore, v -> v - 1; ADE20K, VOC20, Pascal Context 59)
are converted by ``tools/prepare_datasets.py`` with :func:`convert_sem_seg_gt`, as
detectron2's ``datasets/prepare_ade20k_sem_seg.py`` converts ADE20K into
``annotations_detectron2/``: uint8 PNGs (16-bit above 255 classes), 255 = ignore.

:func:`load_sem_seg_gt` reads (and, for conversion, maps) one file, refusing labels out of
range with the file named. :func:`check_ground_truth` checks every mask of a dataset before
inference (mode, size against its image, label range over the histogram), each bad file
named in one error, with a per-run cache of the masks found usable.
"""
import logging
import os
from typing import Optional

import numpy as np
from PIL import Image

from ..common.io import atomic_path

__all__ = ["IGNORE_LABEL", "MASK_MODES", "load_sem_seg_gt", "convert_sem_seg_gt", "is_up_to_date",
           "GroundTruthError", "mask_problem", "find_bad_ground_truth", "check_ground_truth"]

logger = logging.getLogger(__name__)

IGNORE_LABEL = 255

#: PIL modes of a single-channel label PNG that ``SemSegEvaluator`` reads as class indices:
#: 8-bit gray ``L``, palette ``P`` (the palette index is the label, as in Pascal VOC) and
#: 16/32-bit integers.
MASK_MODES = ("L", "P", "I;16", "I;16L", "I;16B", "I;16N", "I")


def load_sem_seg_gt(path: str, *, num_classes: int, reduce_zero_label: bool = False,
                    ignore_label: int = IGNORE_LABEL) -> np.ndarray:
    """Read a label PNG as ``SemSegEvaluator`` does and check its labels; with
    ``reduce_zero_label`` (MMSeg), also map 0 -> ignore, v -> v - 1 (the offline conversion
    of ADE20K, VOC20, Context59).

    Returns:
        ``(H, W)`` int64 array of labels in ``[0, num_classes)`` or ``ignore_label``.
    Raises:
        ValueError: the file is not a single-channel label image (mode named), or holds a
            label outside ``[0, num_classes)`` other than ``ignore_label``, naming the file
            and the bad values.
    """
    with Image.open(path) as im:
        if im.mode not in MASK_MODES:
            raise ValueError(f"ground truth {path!r} has PIL mode {im.mode!r}; expected a single-channel label "
                             f"PNG (modes {', '.join(MASK_MODES)})")
        gt = np.asarray(im, dtype=np.int64).copy()
    if gt.ndim != 2:
        raise ValueError(f"ground truth {path!r} has shape {gt.shape}; expected a single-channel label PNG")
    return _shifted_and_checked(gt, path, num_classes, reduce_zero_label, ignore_label, "holds")


def _shifted_and_checked(gt: np.ndarray, path: str, num_classes: int, reduce_zero_label: bool,
                         ignore_label: int, verb: str) -> np.ndarray:
    """``gt`` with MMSeg's ``reduce_zero_label`` applied (0 -> ignore, the rest shifted down by
    one), checked to hold only ``[0, num_classes)`` and ``ignore_label`` (ValueError naming
    ``path``)."""
    if reduce_zero_label:
        ignore = (gt == ignore_label) | (gt == 0)
        gt = gt - 1
        gt[ignore] = ignore_label
    bad = (gt != ignore_label) & ((gt < 0) | (gt >= num_classes))
    if bad.any():
        raise ValueError(
            f"ground truth {path!r} {verb} labels {sorted(np.unique(gt[bad]).tolist())[:10]} outside "
            f"[0, {num_classes}) and != ignore {ignore_label} (after reduce_zero_label={reduce_zero_label})"
        )
    return gt


def is_up_to_date(src: str, dst: str) -> bool:
    """True when ``dst`` exists and is not older than ``src`` (make's rule)."""
    return os.path.isfile(dst) and os.stat(dst).st_mtime_ns >= os.stat(src).st_mtime_ns


def convert_sem_seg_gt(src: str, dst: str, *, num_classes: int, reduce_zero_label: bool,
                       ignore_label: int = IGNORE_LABEL, lut: Optional[np.ndarray] = None) -> None:
    """Write the evaluator-ready labels of ``src`` to ``dst`` (atomically: a killed conversion
    never leaves half a PNG): uint8 mode ``L`` (uint16 when ``num_classes > 255``), labels in
    ``[0, num_classes)``, ``ignore_label`` for ignored pixels.

    Args:
        lut: optional ``(256,)`` look-up table applied to the raw values first (Cityscapes
            label ids -> train ids, COCO-Stuff raw ids -> train ids); the result is then read
            like a raw file (``reduce_zero_label``, range check).
    Raises:
        ValueError: a label of ``src`` is out of range after the mapping (file named).
    """
    if lut is not None:
        with Image.open(src) as im:
            if im.mode not in ("L", "P"):
                raise ValueError(f"ground truth {src!r} has PIL mode {im.mode!r}; expected an 8-bit label PNG")
            raw = np.asarray(im)
        gt = _shifted_and_checked(lut[raw].astype(np.int64), src, num_classes, reduce_zero_label, ignore_label,
                                  "maps to")
    else:
        gt = load_sem_seg_gt(src, num_classes=num_classes, reduce_zero_label=reduce_zero_label,
                             ignore_label=ignore_label)
    dtype = np.uint8 if max(num_classes - 1, ignore_label) <= 255 else np.uint16
    with atomic_path(dst) as tmp:
        Image.fromarray(gt.astype(dtype)).save(tmp, format="PNG")


# ------------------------------------------------------------------------------- the check
#: EXIF orientations that swap width and height (TIFF/EXIF tag 0x0112: 5..8 are transposes
#: and 90-degree rotations, as PIL.ImageOps.exif_transpose applies them).
_TRANSPOSING_ORIENTATIONS = (5, 6, 7, 8)
CHECK_CACHE_FILE = "ground_truth_check.json"
BAD_LIST_FILE = "bad_ground_truth.txt"
_NAMED_IN_ERROR = 20


class GroundTruthError(ValueError):
    """Ground-truth masks of a dataset are unusable; the message names each bad file (the
    first 20, and the file listing all of them when there are more)."""

    def __init__(self, dataset_name: str, problems, total: int, listing: Optional[str] = None):
        self.dataset_name, self.problems, self.total, self.listing = dataset_name, list(problems), total, listing
        named = "; ".join(self.problems[:_NAMED_IN_ERROR])
        more = len(self.problems) - _NAMED_IN_ERROR
        tail = f"; ... and {more} more" if more > 0 else ""
        where = f" (all listed in {listing})" if listing else ""
        super().__init__(f"{len(self.problems)} of {total} ground-truth masks of dataset {dataset_name!r} are "
                         f"unusable{where}: {named}{tail}")


def _oriented_size(path: str):
    """``(width, height)`` of an image as the mapper sees it (EXIF orientation applied),
    from its header only (for a PNG, an eXIf chunk after the pixel data is not seen here;
    the mapper's own size check still catches such a file)."""
    with Image.open(path) as im:
        width, height = im.size
        if im.format == "PNG":
            raw = im.info.get("exif")
            exif = Image.Exif()
            if raw:
                exif.load(raw)
        else:
            exif = im.getexif()
        orientation = exif.get(0x0112, 1) if exif is not None else 1
    return (height, width) if orientation in _TRANSPOSING_ORIENTATIONS else (width, height)


def mask_problem(mask_file: str, image_file: Optional[str], *, num_classes: int,
                 ignore_label: int = IGNORE_LABEL) -> Optional[str]:
    """One line describing what is wrong with a ground-truth mask, or None when it is usable:
    readable, a single-channel label mode (:data:`MASK_MODES`), the size of its image
    (``image_file``, EXIF orientation applied; skipped when None) and labels in
    ``[0, num_classes)`` or ``ignore_label``. Reads the headers and the mask's pixels once
    (a histogram for 8-bit masks)."""
    try:
        with Image.open(mask_file) as m:
            mode, (mw, mh) = m.mode, m.size
            if mode not in MASK_MODES:
                return (f"mask {mask_file} has PIL mode {mode!r}; expected a single-channel label PNG "
                        f"(modes {', '.join(MASK_MODES)})")
            if mode in ("L", "P"):
                labels = [v for v, count in enumerate(m.histogram()[:256]) if count]
            else:
                labels = np.unique(np.asarray(m)).tolist()
    except Exception as e:  # unreadable, truncated, not an image
        return f"mask {mask_file} cannot be read: {type(e).__name__}: {e}"
    if image_file is not None:
        try:
            width, height = _oriented_size(image_file)
        except Exception as e:
            return f"cannot read image {image_file} (the image of mask {mask_file}): {type(e).__name__}: {e}"
        if (mw, mh) != (width, height):
            return f"mask {mask_file} is {mw}x{mh} but its image {image_file} is {width}x{height}"
    bad = [v for v in labels if v != ignore_label and not 0 <= v < num_classes]
    if bad:
        return (f"mask {mask_file} holds labels {bad[:10]} outside [0, {num_classes}) and != ignore "
                f"{ignore_label}")
    return None


def _code_version() -> str:
    """Hash of this module's source: cache entries of another version of the check are never used."""
    import hashlib

    with open(__file__, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def _stat_key(path: Optional[str]):
    if path is None:
        return None
    st = os.stat(path)
    return [os.path.abspath(path), st.st_size, st.st_mtime_ns]


def find_bad_ground_truth(dataset_name: str, dicts, *, num_classes: int, ignore_label: int = IGNORE_LABEL,
                          cache_file: Optional[str] = None, workers: Optional[int] = None,
                          return_records: bool = False):
    """:func:`mask_problem` of every record's ``sem_seg_file_name`` (against its
    ``file_name``), in threads.

    Args:
        cache_file: a JSON file remembering the masks found usable, keyed by the (path, size,
            mtime) of the mask and of its image, ``num_classes``, ``ignore_label`` and the
            source of this check; an entry whose key differs is checked again. None: no cache.
        workers: threads (default ``min(8, cpu count)``).
        return_records: also return ``[(record, problem)]`` of the bad records.
    Returns:
        ``(problems, stats)``: the problem lines in record order, and ``{"checked", "cached"}``
        (with ``return_records``: ``(problems, stats, bad_records)``).
    """
    import json
    from concurrent.futures import ThreadPoolExecutor

    from ..common.io import atomic_write_json

    version = _code_version()
    cache = {}
    if cache_file and os.path.isfile(cache_file):
        try:
            with open(cache_file) as f:
                data = json.load(f)
            if data.get("version") == version:
                cache = data.get("usable", {})
        except (OSError, ValueError):
            cache = {}  # unreadable cache: check everything again

    def key_of(record):
        try:
            return [_stat_key(record["sem_seg_file_name"]), _stat_key(record.get("file_name")),
                    int(num_classes), int(ignore_label)]
        except OSError:
            return None

    def one(record):
        mask, image = record["sem_seg_file_name"], record.get("file_name")
        key = key_of(record)
        if key is not None and cache.get(os.path.abspath(mask)) == key:
            return None, key, True
        return mask_problem(mask, image, num_classes=num_classes, ignore_label=ignore_label), key, False

    records = [d for d in dicts if "sem_seg_file_name" in d]
    n_workers = workers or min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=n_workers) as pool:
        results = list(pool.map(one, records))
    problems = [p for p, _, _ in results if p is not None]
    bad_records = [(record, p) for record, (p, _, _) in zip(records, results) if p is not None]
    cached = sum(1 for _, _, hit in results if hit)
    if cache_file:
        usable = dict(cache)
        for record, (problem, key, _) in zip(records, results):
            path = os.path.abspath(record["sem_seg_file_name"])
            if problem is None and key is not None:
                usable[path] = key
            else:
                usable.pop(path, None)
        try:
            atomic_write_json(cache_file, {"version": version, "usable": usable})
        except OSError as e:
            logger.warning("could not write the ground-truth check cache %s (%s)", cache_file, e)
    stats = {"checked": len(records), "cached": cached}
    return (problems, stats, bad_records) if return_records else (problems, stats)


def check_ground_truth(dataset_name: str, dicts, *, cache_dir: Optional[str] = None,
                       workers: Optional[int] = None, skip_bad: bool = False):
    """Check every ground-truth mask of a segmentation dataset before inference (nothing for
    datasets whose metadata ``evaluator_type`` is not "sem_seg").

    Args:
        dicts: the records that will be evaluated.
        cache_dir: a per-run folder (``OUTPUT_DIR``) for the cache of usable masks
            (``ground_truth_check.json``) and, when some are bad, ``bad_ground_truth.txt``.
        skip_bad: (``--skip-bad``) bad records are returned, each named in a warning, instead of
            raising.
    Returns:
        ``{"checked", "cached"}`` counts; with ``skip_bad`` also ``"skipped"``, the bad records
        as ``[{"file": image file, "error": the problem, "record": the dataset dict}]``.
    Raises:
        GroundTruthError: some masks are unusable (each named; a ``ValueError``), unless
        ``skip_bad``.
    """
    import time

    from detectron2.data import MetadataCatalog

    from ..common.io import atomic_write_text

    meta = MetadataCatalog.get(dataset_name)
    if meta.get("evaluator_type", None) != "sem_seg":
        return {"checked": 0, "cached": 0, "skipped": []} if skip_bad else {"checked": 0, "cached": 0}
    start = time.perf_counter()
    problems, stats, bad_records = find_bad_ground_truth(
        dataset_name, dicts, num_classes=len(meta.stuff_classes), ignore_label=int(meta.get("ignore_label", 255)),
        cache_file=os.path.join(cache_dir, CHECK_CACHE_FILE) if cache_dir else None, workers=workers,
        return_records=True)
    if skip_bad:
        stats["skipped"] = []
    if problems and skip_bad:
        for record, problem in bad_records:
            logger.warning("%s: skipping %s (--skip-bad): %s", dataset_name, record.get("file_name"), problem)
            stats["skipped"].append({"file": record.get("file_name") or record["sem_seg_file_name"], "error": problem,
                                     "record": record})
    elif problems:
        listing = None
        if cache_dir:
            listing = atomic_write_text(os.path.join(cache_dir, BAD_LIST_FILE), "".join(p + "\n" for p in problems))
        raise GroundTruthError(dataset_name, problems, stats["checked"], listing)
    logger.info("ground truth of %s: %d masks usable (%d from the cache) in %.2f s", dataset_name,
                stats["checked"], stats["cached"], time.perf_counter() - start)
    return stats
