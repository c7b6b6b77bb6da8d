"""Semantic-segmentation benchmarks of training-free open-vocabulary CLIP methods.

Registered on import under ``$DETECTRON2_DATASETS`` (default ``datasets``), in the
layouts SCLIP / NACLIP / MMSeg users already have:

=============================  ==========================================================
name                           layout under the root
=============================  ==========================================================
sparseclip_voc21_val           VOCdevkit/VOC2012/{JPEGImages, SegmentationClass,
sparseclip_voc20_val           ImageSets/Segmentation/val.txt} (voc20: 0 -> ignore, shift)
sparseclip_context60_val       VOCdevkit/VOC2010/{JPEGImages, SegmentationClassContext,
sparseclip_context59_val       ImageSets/SegmentationContext/val.txt} (59: 0 -> ignore, shift)
sparseclip_ade20k_val          ADEChallengeData2016/{images,annotations}/validation
                               (0 -> ignore, 1..150 -> 0..149)
sparseclip_coco_stuff_val      coco_stuff164k/{images,annotations}/val2017, *_labelTrainIds.png
sparseclip_coco_object_val     coco_stuff164k/{images,annotations}/val2017, *_instanceTrainIds.png
sparseclip_cityscapes_val      cityscapes/{leftImg8bit,gtFine}/val, *_gtFine_labelTrainIds.png
=============================  ==========================================================

Ground-truth files are read as they are on disk; label maps that differ from the model's
class indices (``reduce_zero_label``, MMSeg's term) are applied when the evaluator loads
them (:func:`load_sem_seg_gt`), so nothing needs converting for VOC / ADE (Pascal Context masks
are made from the official ``trainval_merged.json`` by ``tools/prepare_datasets.py context``).
Metadata: ``stuff_classes`` (class names with synonyms), ``ignore_label`` 255,
``evaluator_type`` "sem_seg", ``background_index`` (int or None), ``reduce_zero_label``,
``class_names_file`` (the packaged class-name file, e.g. ``voc21``, also the key of the
upstream class-name sets),
``dataset_root``, ``prepare_command``.
"""
import glob
import logging
import os
from typing import Callable, Dict, List, Optional

import numpy as np
from PIL import Image

from detectron2.data import DatasetCatalog, MetadataCatalog

from ..class_names import load_class_names
from .root import DATASETS_ENV, datasets_root

__all__ = [
    "DatasetNotFoundError",
    "load_split_file_dataset",
    "load_paired_dataset",
    "load_sem_seg_gt",
    "register_sem_seg_dataset",
    "register_pascal_voc",
    "register_pascal_context",
    "register_ade20k",
    "register_coco_stuff",
    "register_cityscapes",
    "register_all_sparseclip_segmentation",
]

logger = logging.getLogger(__name__)

IGNORE_LABEL = 255
PREPARE = "python tools/prepare_datasets.py"


class DatasetNotFoundError(FileNotFoundError):
    """A dataset's files are missing; the message names the path and how to prepare it."""


def _missing(name: str, path: str, prepare_command: str, what: str = "") -> DatasetNotFoundError:
    return DatasetNotFoundError(
        f"dataset {name!r}: {what or 'expected path'} {path!r} does not exist. Set {DATASETS_ENV} "
        f"to the folder holding it (now {datasets_root()!r}) and/or "
        f"prepare it: {prepare_command}"
    )


def load_split_file_dataset(
    name: str, image_dir: str, gt_dir: str, split_file: str, *, prepare_command: str,
    image_ext: str = ".jpg", gt_ext: str = ".png",
) -> List[Dict]:
    """Dataset dicts for an id list (Pascal VOC / Context style).

    Returns:
        ``[{"file_name", "sem_seg_file_name", "image_id"}]`` in the order of ``split_file``.
    Raises:
        DatasetNotFoundError: the split file, or any listed image or mask, is missing.
    """
    for path in (split_file, image_dir, gt_dir):
        if not os.path.exists(path):
            raise _missing(name, path, prepare_command)
    with open(split_file) as f:
        ids = [line.strip() for line in f if line.strip()]
    if not ids:
        raise DatasetNotFoundError(f"dataset {name!r}: split file {split_file!r} lists no images")
    dicts = []
    for image_id in ids:
        image = os.path.join(image_dir, image_id + image_ext)
        gt = os.path.join(gt_dir, image_id + gt_ext)
        for path in (image, gt):
            if not os.path.isfile(path):
                raise _missing(name, path, prepare_command, f"file listed in {split_file} as")
        dicts.append({"file_name": image, "sem_seg_file_name": gt, "image_id": image_id})
    return dicts


def load_paired_dataset(
    name: str, image_dir: str, gt_dir: str, *, image_suffix: str, gt_suffix: str,
    prepare_command: str, recursive: bool = False,
) -> List[Dict]:
    """Dataset dicts pairing ``<stem><image_suffix>`` images with ``<stem><gt_suffix>`` masks
    (same relative folder), sorted by path.

    Raises:
        DatasetNotFoundError: a folder is missing, it holds no images, or an image has no mask.
    """
    for path in (image_dir, gt_dir):
        if not os.path.isdir(path):
            raise _missing(name, path, prepare_command)
    pattern = os.path.join(image_dir, "**", "*" + image_suffix) if recursive else os.path.join(image_dir, "*" + image_suffix)
    images = sorted(glob.glob(pattern, recursive=recursive))
    if not images:
        raise DatasetNotFoundError(f"dataset {name!r}: no '*{image_suffix}' images under {image_dir!r}; {prepare_command}")
    dicts, missing = [], []
    for image in images:
        rel = os.path.relpath(image, image_dir)[: -len(image_suffix)]
        gt = os.path.join(gt_dir, rel + gt_suffix)
        if not os.path.isfile(gt):
            missing.append(gt)
            continue
        dicts.append({"file_name": image, "sem_seg_file_name": gt, "image_id": os.path.basename(rel)})
    if missing:
        raise DatasetNotFoundError(
            f"dataset {name!r}: {len(missing)} of {len(images)} images have no ground truth, e.g. "
            f"{missing[0]!r}; prepare the masks: {prepare_command}"
        )
    return dicts


def load_sem_seg_gt(path: str, *, num_classes: int, reduce_zero_label: bool = False,
                    ignore_label: int = IGNORE_LABEL) -> np.ndarray:
    """Read a label PNG and map it to class indices ``[0, num_classes)`` or ``ignore_label``.

    ``reduce_zero_label`` (MMSeg): 0 -> ignore, v -> v - 1 (ADE20K, VOC20, Context59).

    Returns:
        ``(H, W)`` int64 array.
    Raises:
        ValueError: a label outside ``[0, num_classes)`` other than ``ignore_label``
            (a wrong layout or an unprepared file), naming the file and the bad values.
    """
    with Image.open(path) as im:
        gt = np.asarray(im, dtype=np.int64).copy()
    if gt.ndim != 2:
        raise ValueError(f"ground truth {path!r} has shape {gt.shape}; expected a single-channel label PNG")
    if reduce_zero_label:
        ignore = (gt == ignore_label) | (gt == 0)
        gt = gt - 1
        gt[ignore] = ignore_label
    bad = (gt != ignore_label) & ((gt < 0) | (gt >= num_classes))
    if bad.any():
        raise ValueError(
            f"ground truth {path!r} holds labels {sorted(np.unique(gt[bad]).tolist())[:10]} outside "
            f"[0, {num_classes}) and != ignore {ignore_label} (after reduce_zero_label={reduce_zero_label})"
        )
    return gt


def register_sem_seg_dataset(
    name: str, loader: Callable[[], List[Dict]], *, class_names: List[str],
    background_index: Optional[int], reduce_zero_label: bool, dataset_root: str,
    prepare_command: str, **extra_metadata,
) -> None:
    """Register one semantic-segmentation dataset and its metadata."""
    DatasetCatalog.register(name, loader)
    MetadataCatalog.get(name).set(
        stuff_classes=list(class_names),
        ignore_label=IGNORE_LABEL,
        evaluator_type="sem_seg",
        background_index=background_index,
        reduce_zero_label=reduce_zero_label,
        dataset_root=dataset_root,
        prepare_command=prepare_command,
        **extra_metadata,
    )


def _register_voc_style(base: str, image_dir: str, mask_dir: str, split_file: str, prep: str,
                        variants) -> None:
    """Register the variants ``(name, class-name file, background_index, reduce_zero_label)``
    of one VOC-style dataset (images, masks and a split file of ids under ``base``)."""
    for name, classes, bg, reduce in variants:
        register_sem_seg_dataset(
            name,
            lambda name=name: load_split_file_dataset(
                name, os.path.join(base, image_dir), os.path.join(base, mask_dir),
                os.path.join(base, split_file), prepare_command=prep),
            class_names=load_class_names(classes), background_index=bg, reduce_zero_label=reduce,
            dataset_root=base, prepare_command=prep, class_names_file=classes,
        )


def register_pascal_voc(root: str) -> None:
    """``sparseclip_voc21_val`` (background + 20) and ``sparseclip_voc20_val`` (20, 0 -> ignore)."""
    _register_voc_style(
        os.path.join(root, "VOCdevkit", "VOC2012"), "JPEGImages", "SegmentationClass",
        os.path.join("ImageSets", "Segmentation", "val.txt"),
        f"download VOCtrainval_11-May-2012.tar and extract it under {root}/ (no conversion needed)",
        (("sparseclip_voc21_val", "voc21", 0, False), ("sparseclip_voc20_val", "voc20", None, True)),
    )


def register_pascal_context(root: str) -> None:
    """``sparseclip_context60_val`` (0 = background) and ``sparseclip_context59_val`` (0 -> ignore)."""
    _register_voc_style(
        os.path.join(root, "VOCdevkit", "VOC2010"), "JPEGImages", "SegmentationClassContext",
        os.path.join("ImageSets", "SegmentationContext", "val.txt"),
        f"{PREPARE} context --root {root}",
        (("sparseclip_context60_val", "context60", 0, False), ("sparseclip_context59_val", "context59", None, True)),
    )


def register_ade20k(root: str) -> None:
    """``sparseclip_ade20k_val``: 150 classes, 0 -> ignore, 1..150 -> 0..149."""
    base = os.path.join(root, "ADEChallengeData2016")
    prep = f"download ADEChallengeData2016.zip and extract it under {root}/ (no conversion needed)"
    name = "sparseclip_ade20k_val"
    register_sem_seg_dataset(
        name,
        lambda: load_paired_dataset(
            name, os.path.join(base, "images", "validation"), os.path.join(base, "annotations", "validation"),
            image_suffix=".jpg", gt_suffix=".png", prepare_command=prep),
        class_names=load_class_names("ade150"), background_index=None, reduce_zero_label=True,
        dataset_root=base, prepare_command=prep, class_names_file="ade150",
    )


def register_coco_stuff(root: str) -> None:
    """``sparseclip_coco_stuff_val`` (171 classes) and ``sparseclip_coco_object_val``
    (background + 80 things, SCLIP's ``*_instanceTrainIds.png``)."""
    base = os.path.join(root, "coco_stuff164k")
    for name, classes, bg, suffix, task in (
        ("sparseclip_coco_stuff_val", "coco_stuff171", None, "_labelTrainIds.png", "coco_stuff"),
        ("sparseclip_coco_object_val", "coco_object", 0, "_instanceTrainIds.png", "coco_object"),
    ):
        prep = f"{PREPARE} {task} --root {root}"
        register_sem_seg_dataset(
            name,
            lambda name=name, suffix=suffix, prep=prep: load_paired_dataset(
                name, os.path.join(base, "images", "val2017"), os.path.join(base, "annotations", "val2017"),
                image_suffix=".jpg", gt_suffix=suffix, prepare_command=prep),
            class_names=load_class_names(classes), background_index=bg, reduce_zero_label=False,
            dataset_root=base, prepare_command=prep, class_names_file=classes,
        )


def register_cityscapes(root: str) -> None:
    """``sparseclip_cityscapes_val``: 19 train ids (``*_gtFine_labelTrainIds.png``)."""
    base = os.path.join(root, "cityscapes")
    prep = f"{PREPARE} cityscapes --root {root}"
    name = "sparseclip_cityscapes_val"
    register_sem_seg_dataset(
        name,
        lambda: load_paired_dataset(
            name, os.path.join(base, "leftImg8bit", "val"), os.path.join(base, "gtFine", "val"),
            image_suffix="_leftImg8bit.png", gt_suffix="_gtFine_labelTrainIds.png",
            prepare_command=prep, recursive=True),
        class_names=load_class_names("cityscapes19"), background_index=None, reduce_zero_label=False,
        dataset_root=base, prepare_command=prep, class_names_file="cityscapes19",
    )


def register_all_sparseclip_segmentation(root: str) -> None:
    """Register every benchmark above under ``root``."""
    register_pascal_voc(root)
    register_pascal_context(root)
    register_ade20k(root)
    register_coco_stuff(root)
    register_cityscapes(root)


register_all_sparseclip_segmentation(datasets_root())
