"""Which datasets are ready (``tools/prepare_datasets.py check``): each registered dataset loaded
as a run would load it, and every mask of a segmentation dataset (or an evenly spaced sample)
checked as ``train_net.py`` checks it before inference.
"""
import os
import sys

from ..common.errors import unknown_name
from .convert import PrepareError

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

    from ..data.ground_truth import find_bad_ground_truth

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
    may be shell patterns such as ``sparseclip_fgovd_*``; MESS's datasets by their names, e.g.
    ``'paxray_*'``, with the ``mess`` extra) as a run would, which checks its
    files and, for FG-OVD, that every image exists; check every segmentation mask (or
    ``sample`` evenly spaced ones).
    Prints one line per dataset (and per problem); exits 1 when a requested dataset is not
    ready. A name that matches nothing raises :class:`~.convert.PrepareError` (naming the
    closest) before any dataset is read."""
    import fnmatch

    already = "sparseclip_d2.data" in sys.modules
    os.environ["DETECTRON2_DATASETS"] = root  # read by sparseclip_d2.data.datasets.root.datasets_root
    from .. import register_detectron2_parts

    register_detectron2_parts()  # registers the datasets with this root
    from detectron2.data import DatasetCatalog, MetadataCatalog

    registered_root = os.path.dirname(MetadataCatalog.get("sparseclip_ade20k_val").dataset_root)
    if already and os.path.abspath(registered_root) != os.path.abspath(root):
        raise PrepareError(f"check: the datasets were registered under {registered_root!r} before --root {root!r} was "
                 "given; run the check in a fresh process")

    # this package's datasets, and MESS's where its package registered them (data/datasets/mess_benchmark.py)
    registered = sorted(n for n in DatasetCatalog.list()
                        if n.startswith("sparseclip_") or MetadataCatalog.get(n).get("benchmark", None) == "mess")
    ok = True
    selected = []
    for pattern in names or ["sparseclip_*"]:
        matched = [n for n in registered if fnmatch.fnmatchcase(n, pattern)]
        if not matched:  # before any dataset is read: a typo is said at once, in one line
            raise PrepareError(unknown_name("dataset", pattern, registered, ours=registered,
                                            ours_label="sparseclip_d2's",
                                            fix="names may be shell patterns such as sparseclip_fgovd_*"))
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
