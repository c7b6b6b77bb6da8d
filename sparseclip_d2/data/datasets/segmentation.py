"""Semantic-segmentation benchmarks of training-free open-vocabulary CLIP methods.

Registered on import under ``$DETECTRON2_DATASETS`` (default ``datasets``), in the
layouts SCLIP / NACLIP / MMSeg / detectron2 users already have:

=============================  ==========================================================
name                           layout under the root
=============================  ==========================================================
sparseclip_voc21_val           VOCdevkit/VOC2012/{JPEGImages, SegmentationClass,
                               ImageSets/Segmentation/val.txt}
sparseclip_voc20_val           the same images, masks in VOC2012/annotations_detectron2/voc20_val
                               (``prepare_datasets.py voc20``)
sparseclip_context60_val       VOCdevkit/VOC2010/{JPEGImages, SegmentationClassContext,
                               ImageSets/SegmentationContext/val.txt} (``prepare_datasets.py context``)
sparseclip_context59_val       the same images, masks in VOC2010/annotations_detectron2/pc59_val
                               (``prepare_datasets.py context`` or ``context59``)
sparseclip_ade20k_val          ADEChallengeData2016/images/validation, masks in
                               ADEChallengeData2016/annotations_detectron2/validation
                               (``prepare_datasets.py ade20k``, as detectron2's
                               datasets/prepare_ade20k_sem_seg.py)
sparseclip_coco_stuff_val      coco_stuff164k/{images,annotations}/val2017, *_labelTrainIds.png
sparseclip_coco_object_val     coco_stuff164k/{images,annotations}/val2017, *_instanceTrainIds.png
sparseclip_cityscapes_val      cityscapes/{leftImg8bit,gtFine}/val, *_gtFine_labelTrainIds.png
sparseclip_ade847_val          ADE20K_2021_17_01/{images,annotations}_detectron2/validation
                               (*.jpg, *.tif; ``prepare_datasets.py ade847``, CAT-Seg's layout)
sparseclip_context459_val      VOCdevkit/VOC2010/JPEGImages, masks in
                               VOC2010/annotations_detectron2/pc459_val/*.tif
                               (``prepare_datasets.py context459``, CAT-Seg's layout)
=============================  ==========================================================

Every ``sem_seg_file_name`` holds the dataset's class indices as they are (255 = ignore),
which is what detectron2's ``SemSegEvaluator`` reads: label maps that differ from the
official files (MMSeg's ``reduce_zero_label`` for VOC20, Context59, ADE20K; train ids) are
converted once, offline, by ``tools/prepare_datasets.py`` (``data/ground_truth.py``). The two
large vocabularies (847 and 459 classes) are uint16 TIFFs with ``ignore_label`` 65535
(``sparseclip_d2/prepare/catseg.py`` says why for Context-459). A
missing or stale conversion (a converted mask older than its source) is an error that names
the command to run. Metadata: ``stuff_classes`` (class names with synonyms), ``ignore_label``
255, ``evaluator_type`` "sem_seg", ``background_index`` (int or None), ``class_names_file``
(the packaged class-name file, e.g. ``voc21``, also the key of the upstream class-name
sets), ``dataset_root``, ``prepare_command``; ADE20K-847 also ``vocabulary_as_published`` (its
published names repeat synonyms across classes: kept, logged once, instead of refused).
"""
import glob
import logging
import os
from typing import Callable, Dict, List, Optional, Tuple

from detectron2.data import DatasetCatalog, MetadataCatalog

from ..class_names import load_class_names
from ..ground_truth import IGNORE_LABEL, load_sem_seg_gt
from .root import DATASETS_ENV, datasets_root

__all__ = [
    "DatasetNotFoundError",
    "load_split_file_dataset",
    "load_paired_dataset",
    "load_sem_seg_gt",
    "register_sem_seg_dataset",
    "CONVERTED_GT",
    "register_pascal_voc",
    "register_pascal_context",
    "register_ade20k",
    "register_coco_stuff",
    "register_cityscapes",
    "register_ade847",
    "register_context459",
    "load_gt_listed_dataset",
    "register_all_sparseclip_segmentation",
]

logger = logging.getLogger(__name__)

PREPARE = "python tools/prepare_datasets.py"


class DatasetNotFoundError(FileNotFoundError):
    """A dataset's files are missing; the message names the path and how to prepare it."""


def _missing(name: str, path: str, prepare_command: str, what: str = "",
             source_dir: Optional[str] = None) -> DatasetNotFoundError:
    if source_dir is not None and os.path.isdir(source_dir):  # the download is there, the conversion is not
        return DatasetNotFoundError(
            f"dataset {name!r}: {what or 'converted ground truth'} {path!r} does not exist, but its source "
            f"masks {source_dir!r} do: convert them once with: {prepare_command}"
        )
    return DatasetNotFoundError(
        f"dataset {name!r}: {what or 'expected path'} {path!r} does not exist. Set {DATASETS_ENV} "
        f"to the folder holding it (now {datasets_root()!r}) and/or "
        f"prepare it: {prepare_command}"
    )


def _check_not_stale(name: str, gt: str, source: Optional[str], prepare_command: str) -> None:
    """A converted mask must not be older than its ``source`` (when that file exists)."""
    if source is not None and os.path.isfile(source) and os.stat(source).st_mtime_ns > os.stat(gt).st_mtime_ns:
        raise DatasetNotFoundError(
            f"dataset {name!r}: converted ground truth {gt!r} is older than its source {source!r}; "
            f"convert again: {prepare_command}"
        )


def _source_of(gt: str, source_dir: Optional[str], source_suffix: Optional[Tuple[str, str]]) -> Optional[str]:
    """The source of converted mask ``gt``: the same file name in ``source_dir``, or, with
    ``source_suffix = (converted suffix, source suffix)``, the file next to it whose name ends
    in the source suffix instead."""
    if source_suffix is not None:
        converted, source = source_suffix
        return gt[: -len(converted)] + source if gt.endswith(converted) else None
    if source_dir is not None:
        return os.path.join(source_dir, os.path.basename(gt))
    return None


def load_split_file_dataset(
    name: str, image_dir: str, gt_dir: str, split_file: str, *, prepare_command: str,
    image_ext: str = ".jpg", gt_ext: str = ".png", source_dir: Optional[str] = None,
) -> List[Dict]:
    """Dataset dicts for an id list (Pascal VOC / Context style).

    Args:
        source_dir: for converted ground truth (``gt_dir`` written by
            ``tools/prepare_datasets.py``), the folder of the source masks (same file names):
            a missing ``gt_dir`` is then reported as a missing conversion, and a converted
            mask older than its source as stale.
    Returns:
        ``[{"file_name", "sem_seg_file_name", "image_id"}]`` in the order of ``split_file``.
    Raises:
        DatasetNotFoundError: the split file, or any listed image or mask, is missing, or a
            converted mask is stale.
    """
    for path in (split_file, image_dir):
        if not os.path.exists(path):
            raise _missing(name, path, prepare_command)
    if not os.path.exists(gt_dir):
        raise _missing(name, gt_dir, prepare_command, source_dir=source_dir)
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
        _check_not_stale(name, gt, _source_of(gt, source_dir, None), prepare_command)
        dicts.append({"file_name": image, "sem_seg_file_name": gt, "image_id": image_id})
    return dicts


def load_paired_dataset(
    name: str, image_dir: str, gt_dir: str, *, image_suffix: str, gt_suffix: str,
    prepare_command: str, recursive: bool = False, source_dir: Optional[str] = None,
    source_suffix: Optional[Tuple[str, str]] = None,
) -> List[Dict]:
    """Dataset dicts pairing ``<stem><image_suffix>`` images with ``<stem><gt_suffix>`` masks
    (same relative folder), sorted by path. ``source_dir``: as in
    :func:`load_split_file_dataset` (flat folders only); ``source_suffix`` ``(converted,
    source)``: converted masks live next to their sources (``x_labelTrainIds.png`` made from
    ``x.png``: ``("_labelTrainIds.png", ".png")``), and one older than its source is stale.

    Raises:
        DatasetNotFoundError: a folder is missing, it holds no images, an image has no mask,
            or a converted mask is stale.
    """
    if not os.path.isdir(image_dir):
        raise _missing(name, image_dir, prepare_command)
    if not os.path.isdir(gt_dir):
        raise _missing(name, gt_dir, prepare_command, source_dir=source_dir)
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
        _check_not_stale(name, gt, _source_of(gt, source_dir, source_suffix), prepare_command)
        dicts.append({"file_name": image, "sem_seg_file_name": gt, "image_id": os.path.basename(rel)})
    if missing:
        raise DatasetNotFoundError(
            f"dataset {name!r}: {len(missing)} of {len(images)} images have no ground truth, e.g. "
            f"{missing[0]!r}; prepare the masks: {prepare_command}"
        )
    return dicts


def register_sem_seg_dataset(
    name: str, loader: Callable[[], List[Dict]], *, class_names: List[str],
    background_index: Optional[int], dataset_root: str, prepare_command: str,
    reduce_zero_label: bool = False, ignore_label: int = IGNORE_LABEL, **extra_metadata,
) -> None:
    """Register one semantic-segmentation dataset and its metadata.

    The loader's ``sem_seg_file_name`` files must hold the class indices of ``class_names``
    (``ignore_label``, default 255, = ignore) as they are: detectron2's ``SemSegEvaluator``
    reads them unchanged.

    Raises:
        ValueError: ``reduce_zero_label=True``: label maps are converted offline, not at
            evaluation time (``sparseclip_d2.data.ground_truth.convert_sem_seg_gt``, or
            ``tools/prepare_datasets.py`` for the built-in datasets).
    """
    if reduce_zero_label:
        raise ValueError(
            f"dataset {name!r}: reduce_zero_label=True is not applied at evaluation time; convert the masks "
            "once with sparseclip_d2.data.ground_truth.convert_sem_seg_gt(src, dst, num_classes=..., "
            "reduce_zero_label=True) and register the converted files"
        )
    if 0 <= int(ignore_label) < len(class_names):
        raise ValueError(f"dataset {name!r}: ignore_label {ignore_label} is a class index (of {len(class_names)} "
                         "classes); use a value outside [0, number of classes), e.g. 65535 for uint16 masks")
    DatasetCatalog.register(name, loader)
    MetadataCatalog.get(name).set(
        stuff_classes=list(class_names),
        ignore_label=int(ignore_label),
        evaluator_type="sem_seg",
        background_index=background_index,
        dataset_root=dataset_root,
        prepare_command=prepare_command,
        **extra_metadata,
    )


def _register_voc_style(base: str, split_file: str, variants) -> None:
    """Register the variants ``(name, class-name file, background_index, image dir, mask dir,
    source mask dir or None, prepare command)`` of one VOC-style dataset (folders relative to
    ``base``, a split file of ids)."""
    for name, classes, bg, image_dir, mask_dir, source_dir, prep in variants:
        register_sem_seg_dataset(
            name,
            lambda name=name, image_dir=image_dir, mask_dir=mask_dir, source_dir=source_dir, prep=prep:
            load_split_file_dataset(
                name, os.path.join(base, image_dir), os.path.join(base, mask_dir), os.path.join(base, split_file),
                prepare_command=prep, source_dir=None if source_dir is None else os.path.join(base, source_dir)),
            class_names=load_class_names(classes), background_index=bg,
            dataset_root=base, prepare_command=prep, class_names_file=classes,
        )


#: Folders of the converted ground truth, next to the official ones: detectron2's name
#: ``annotations_detectron2`` (detectron2 datasets/prepare_ade20k_sem_seg.py), one sub-folder
#: per converted dataset.
CONVERTED_GT = "annotations_detectron2"


def register_pascal_voc(root: str) -> None:
    """``sparseclip_voc21_val`` (background + 20, the official masks) and
    ``sparseclip_voc20_val`` (20 classes, background -> ignore, converted)."""
    download = f"download VOCtrainval_11-May-2012.tar and extract it under {root}/"
    _register_voc_style(
        os.path.join(root, "VOCdevkit", "VOC2012"), os.path.join("ImageSets", "Segmentation", "val.txt"),
        (("sparseclip_voc21_val", "voc21", 0, "JPEGImages", "SegmentationClass", None,
          f"{download} (no conversion needed)"),
         ("sparseclip_voc20_val", "voc20", None, "JPEGImages", os.path.join(CONVERTED_GT, "voc20_val"),
          "SegmentationClass", f"{download}, then: {PREPARE} voc20 --root {root}")),
    )


def register_pascal_context(root: str) -> None:
    """``sparseclip_context60_val`` (0 = background) and ``sparseclip_context59_val``
    (background -> ignore, converted from the 60-class masks)."""
    _register_voc_style(
        os.path.join(root, "VOCdevkit", "VOC2010"), os.path.join("ImageSets", "SegmentationContext", "val.txt"),
        (("sparseclip_context60_val", "context60", 0, "JPEGImages", "SegmentationClassContext", None,
          f"{PREPARE} context --root {root}"),
         ("sparseclip_context59_val", "context59", None, "JPEGImages", os.path.join(CONVERTED_GT, "pc59_val"),
          "SegmentationClassContext", f"{PREPARE} context --root {root} (or, with the 60-class masks "
          f"already there: {PREPARE} context59 --root {root})")),
    )


def register_ade20k(root: str) -> None:
    """``sparseclip_ade20k_val``: 150 classes, converted (0 -> ignore, 1..150 -> 0..149)."""
    base = os.path.join(root, "ADEChallengeData2016")
    prep = f"download ADEChallengeData2016.zip and extract it under {root}/, then: {PREPARE} ade20k --root {root}"
    name = "sparseclip_ade20k_val"
    register_sem_seg_dataset(
        name,
        lambda: load_paired_dataset(
            name, os.path.join(base, "images", "validation"), os.path.join(base, CONVERTED_GT, "validation"),
            image_suffix=".jpg", gt_suffix=".png", prepare_command=prep,
            source_dir=os.path.join(base, "annotations", "validation")),
        class_names=load_class_names("ade150"), background_index=None,
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
                image_suffix=".jpg", gt_suffix=suffix, prepare_command=prep, source_suffix=(suffix, ".png")),
            class_names=load_class_names(classes), background_index=bg,
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
            prepare_command=prep, recursive=True, source_suffix=("_labelTrainIds.png", "_labelIds.png")),
        class_names=load_class_names("cityscapes19"), background_index=None,
        dataset_root=base, prepare_command=prep, class_names_file="cityscapes19",
    )


#: ADE20K-847's ignore label (cvlab-kaist/CAT-Seg @ 6d3a188 cat_seg/data/datasets/register_ade20k_847.py
#: ``ignore_label=65535``; the value prepare/catseg.py writes).
ADE847_IGNORE = 65535
#: Context-459's: CAT-Seg @ 6d3a188 registers 459 (register_pascal_context.py), MESS (blumenstiel/MESS
#: cc701b5) 65535, for the same files; no prepared mask holds either (every pixel is ``LabelMap - 1``,
#: 0..458), so the metrics agree; 65535 is the value no uint16 class index takes, as for ADE-847.
CONTEXT459_IGNORE = 65535


def load_gt_listed_dataset(name: str, image_dir: str, gt_dir: str, *, image_ext: str, gt_ext: str,
                           prepare_command: str) -> List[Dict]:
    """Dataset dicts of every ``<stem><gt_ext>`` mask in ``gt_dir`` with its image
    ``image_dir/<stem><image_ext>``, sorted by stem: the masks choose the images (as detectron2's
    ``load_sem_seg`` pairs CAT-Seg's Context-459 masks with the 10k images of JPEGImages).

    Raises:
        DatasetNotFoundError: a folder is missing, it holds no mask, or a mask has no image.
    """
    for path in (image_dir, gt_dir):
        if not os.path.isdir(path):
            raise _missing(name, path, prepare_command)
    masks = sorted(f for f in os.listdir(gt_dir) if f.endswith(gt_ext))
    if not masks:
        raise DatasetNotFoundError(f"dataset {name!r}: no '*{gt_ext}' masks in {gt_dir!r}; {prepare_command}")
    dicts = []
    for mask in masks:
        stem = mask[: -len(gt_ext)]
        image = os.path.join(image_dir, stem + image_ext)
        if not os.path.isfile(image):
            raise _missing(name, image, prepare_command, f"the image of mask {mask} in {gt_dir},")
        dicts.append({"file_name": image, "sem_seg_file_name": os.path.join(gt_dir, mask), "image_id": stem})
    return dicts


def register_ade847(root: str) -> None:
    """``sparseclip_ade847_val``: ADE20K-847 as CAT-Seg prepares it (847 classes, uint16 TIFF
    labels, 65535 = ignore; cvlab-kaist/CAT-Seg @ 6d3a188 cat_seg/data/datasets/register_ade20k_847.py:
    images_detectron2/validation *.jpg, annotations_detectron2/validation *.tif)."""
    base = os.path.join(root, "ADE20K_2021_17_01")
    prep = (f"download ADE20K_2021_17_01.zip (ADE20K full) and extract it under {root}/, then: "
            f"{PREPARE} ade847 --root {root}")
    name = "sparseclip_ade847_val"
    register_sem_seg_dataset(
        name,
        lambda: load_paired_dataset(
            name, os.path.join(base, "images_detectron2", "validation"),
            os.path.join(base, CONVERTED_GT, "validation"), image_suffix=".jpg", gt_suffix=".tif",
            prepare_command=prep),
        class_names=load_class_names("ade847"), background_index=None, ignore_label=ADE847_IGNORE,
        dataset_root=base, prepare_command=prep, class_names_file="ade847",
        # CAT-Seg's WordNet names as published: 41 synonyms name two classes ("screen" in "blind,
        # screen" and "screen door, screen"); they tie and the lower class index wins (logged once)
        vocabulary_as_published=True,
    )


def register_context459(root: str) -> None:
    """``sparseclip_context459_val``: Pascal Context-459 as CAT-Seg prepares it (459 classes,
    ``LabelMap - 1`` as uint16 TIFFs in VOC2010/annotations_detectron2/pc459_val, paired with
    VOC2010/JPEGImages; cat_seg/data/datasets/register_pascal_context.py). Ignore label 65535
    (:data:`CONTEXT459_IGNORE` says why)."""
    base = os.path.join(root, "VOCdevkit", "VOC2010")
    prep = (f"download VOCtrainval_03-May-2010.tar and trainval.tar.gz (Pascal Context) and extract them in "
            f"{base}/ with CAT-Seg's datasets/pascalcontext_val.txt, then: {PREPARE} context459 --root {root}")
    name = "sparseclip_context459_val"
    register_sem_seg_dataset(
        name,
        lambda: load_gt_listed_dataset(
            name, os.path.join(base, "JPEGImages"), os.path.join(base, CONVERTED_GT, "pc459_val"),
            image_ext=".jpg", gt_ext=".tif", prepare_command=prep),
        class_names=load_class_names("context459"), background_index=None, ignore_label=CONTEXT459_IGNORE,
        dataset_root=base, prepare_command=prep, class_names_file="context459",
    )


def register_all_sparseclip_segmentation(root: str) -> None:
    """Register every benchmark above under ``root``."""
    register_pascal_voc(root)
    register_pascal_context(root)
    register_ade20k(root)
    register_coco_stuff(root)
    register_cityscapes(root)
    register_ade847(root)
    register_context459(root)


register_all_sparseclip_segmentation(datasets_root())
