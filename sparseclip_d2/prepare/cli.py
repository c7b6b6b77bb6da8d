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
    python tools/prepare_datasets.py ade847      [--root R] # ADE20K_2021_17_01 -> *_detectron2/validation (CAT-Seg's)
    python tools/prepare_datasets.py context459  [--root R] # VOC2010/trainval/*.mat -> annotations_detectron2/pc459_val

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
ADE20K-847 and Pascal Context-459 are prepared as CAT-Seg (cvlab-kaist/CAT-Seg @ 6d3a188,
datasets/prepare_ade20k_full.py and prepare_pascal_context_459.py) prepares them: uint16 TIFF
labels, 65535 = ignore (sparseclip_d2/prepare/catseg.py). ADE20K-847: the ADE20K 2021 release
(ADE20K_2021_17_01/ with index_ade20k.pkl). Context-459: trainval.tar.gz's .mat files in
VOCdevkit/VOC2010/trainval/ and CAT-Seg's datasets/pascalcontext_val.txt in VOCdevkit/VOC2010/.
`check` reads every mask of each segmentation dataset (mode, size against its image, label
range over the histogram), as train_net.py does before inference.
"""

import argparse

from ..common.errors import run_cli

from .catseg import ade847, context459
from .check import check
from .context import context
from .convert import ade20k, cityscapes, coco_object, coco_stuff, context59, voc20


def main(argv=None):
    """The command line; a missing or bad input ends it with one ``prepare_datasets.py: error:``
    line and exit status 2 (``sparseclip_d2.common.errors.run_cli``), Ctrl-C with one line."""
    return run_cli("prepare_datasets.py", _main, argv,
                   interrupted="conversions write each mask atomically and skip up-to-date ones: run the same "
                               "command again to go on")


def _main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("task", choices=["check", "voc20", "ade20k", "context", "context59", "coco_stuff", "coco_object",
                                    "cityscapes", "ade847", "context459"])
    p.add_argument("names", nargs="*", help="check: dataset names or patterns (default: all)")
    p.add_argument("--root", default=None, help="datasets root (default: $DETECTRON2_DATASETS, else ./datasets)")
    p.add_argument("--from-instances", action="store_true", help="coco_object from instances_val2017.json")
    p.add_argument("--json", help="context: trainval_merged.json (default: looked for under the root)")
    p.add_argument("--sample", type=int, default=0,
                   help="check: masks checked per segmentation dataset, evenly spaced (default 0: all)")
    a = p.parse_intermixed_args(argv)
    if a.root is None:
        from ..data.datasets.root import datasets_root

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
         "cityscapes": cityscapes, "ade847": ade847, "context459": context459}[a.task](a.root)

