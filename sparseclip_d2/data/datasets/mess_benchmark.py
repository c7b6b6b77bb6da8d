"""MESS's 22 datasets through MESS's own package (``mess-benchmark``, the optional ``mess`` extra).

MESS (blumenstiel/MESS ``cc701b5`` = PyPI ``mess-benchmark`` 0.2) registers its datasets in
detectron2's ``DatasetCatalog`` when ``mess.datasets`` is imported, under
``$DETECTRON2_DATASETS`` (read once, at that import), with the metadata ``stuff_classes``,
``ignore_label`` (255), ``evaluator_type`` ``"sem_seg"``, ``classes_of_interest``,
``background_class`` (255 = none), ``image_root`` and ``sem_seg_root``
(``mess/datasets/register_*.py``). This module imports it (when the package is installed) and
lets every dataset it registered flow through the project's dataset path without naming any:

- a MESS dataset is one whose loader was defined in a ``mess.datasets.register_*`` module;
- ``background_index`` (what the META_ARCH and its background rules read) is MESS's
  ``background_class``, or None where MESS says there is none (a value outside the classes,
  255 in ``register_bdd100k.py``: "no background class");
- ``benchmark`` ``"mess"``: the ``sem_seg`` evaluator is then MESS's own
  (``sparseclip_d2.evaluation.mess_benchmark``); ``vocabulary_fixed_by``: the benchmark fixes
  the class names, so a method's upstream class-name set (``MODEL.SPARSECLIP.CLASS_NAMES``,
  which has no file for these datasets) does not replace them;
- the loader is wrapped: a missing or empty prepared folder is one
  :class:`~sparseclip_d2.data.datasets.segmentation.DatasetNotFoundError` line that names the
  folder, MESS's preparation command for the dataset and, for the five datasets MESS cannot
  download itself, where to get the files (never a silent skip; detectron2's ``load_sem_seg``
  alone raises a bare ``AssertionError`` or ``FileNotFoundError``).

Without the package nothing is registered here; :func:`mess_available` says whether it is.
"""
import importlib.util
import logging
import os
from typing import Dict, List, Optional

from detectron2.data import DatasetCatalog, MetadataCatalog

from .root import DATASETS_ENV, datasets_root
from .segmentation import DatasetNotFoundError

__all__ = ["MESS_BENCHMARK", "MESS_REQUIREMENT", "MANUAL_DOWNLOADS", "mess_available", "is_mess_dataset",
           "mess_dataset_names", "register_mess_datasets", "prepare_module", "missing_message"]

logger = logging.getLogger(__name__)

#: the ``benchmark`` metadata value of a MESS dataset
MESS_BENCHMARK = "mess"
#: what the ``mess`` extra installs (pyproject.toml); the package's import name is ``mess``
MESS_REQUIREMENT = "mess-benchmark==0.2"

_REGISTER_PREFIX = "mess.datasets.register_"
_WRAPPED = "_sparseclip_mess_loader"

#: The datasets MESS's preparation cannot download itself, by preparation module, with where
#: the files come from and where they go (mess-benchmark 0.2 = blumenstiel/MESS cc701b5:
#: ``mess/prepare_all_datasets.py``, "Manual preparation" comments, and the assertions of
#: ``mess/prepare_datasets/prepare_{bdd100k,isprs_potsdam,floodnet,uavid,cryonuseg}.py``).
MANUAL_DOWNLOADS: Dict[str, str] = {
    "prepare_bdd100k": "BDD100K needs a manual download: the 10K images and the segmentation labels "
                       "(bdd100k_images_10k.zip, bdd100k_sem_seg_labels_trainval.zip) from https://bdd-data.berkeley.edu/, "
                       "placed in the datasets folder",
    "prepare_isprs_potsdam": "ISPRS Potsdam needs a manual download: Potsdam.zip from "
                             "https://www.isprs.org/education/benchmarks/UrbanSemLab/default.aspx, placed in the "
                             "datasets folder",
    "prepare_floodnet": "FloodNet needs a manual download: the folder FloodNet-Supervised_v1.0 from "
                        "https://drive.google.com/drive/folders/1leN9eWVQcvWDVYwNb2GCo5ML_wBEycWD, placed in the "
                        "datasets folder",
    "prepare_uavid": "UAVid needs a manual download: the validation set zip from https://uavid.nl, placed in the "
                     "datasets folder",
    "prepare_cryonuseg": "CryoNuSeg needs a manual download: the Kaggle dataset "
                         "https://www.kaggle.com/datasets/ipateam/segmentation-of-nuclei-in-cryosectioned-he-images "
                         "(its folder 'archive'), placed in the datasets folder",
}


def mess_available() -> bool:
    """Whether MESS's package (import name ``mess``) is installed."""
    return importlib.util.find_spec("mess") is not None


def _register_module(name: str) -> Optional[str]:
    loader = DatasetCatalog[name] if name in DatasetCatalog else None  # the registered function, not its call
    module = getattr(loader, _WRAPPED, None) or getattr(loader, "__module__", "") or ""
    return module if module.startswith(_REGISTER_PREFIX) else None


def is_mess_dataset(name: str) -> bool:
    """Whether ``name`` was registered by MESS's package (and taken in by this module)."""
    return MetadataCatalog.get(name).get("benchmark", None) == MESS_BENCHMARK


def mess_dataset_names() -> List[str]:
    """Every registered MESS dataset, in registration order."""
    return [n for n in DatasetCatalog.list() if is_mess_dataset(n)]


def prepare_module(register_module: str) -> str:
    """MESS's preparation module of a registration module (``mess.datasets.register_X`` ->
    ``mess.prepare_datasets.prepare_X``: the same ``X`` for all 22 in mess-benchmark 0.2)."""
    return "mess.prepare_datasets.prepare_" + register_module[len(_REGISTER_PREFIX):]


def missing_message(name: str, path: str, what: str, register_module: str, root: Optional[str] = None) -> str:
    """The one-line error of a MESS dataset whose prepared folder ``path`` is missing or empty."""
    root = datasets_root() if root is None else root
    prep = prepare_module(register_module)
    manual = MANUAL_DOWNLOADS.get(prep.rsplit(".", 1)[-1])
    first = f"{manual}; then prepare it" if manual else "Prepare it (MESS downloads it)"
    return (f"MESS dataset {name!r}: the prepared {what} folder {path!r} does not exist or is empty. {first}: "
            f"{DATASETS_ENV}={root} python -m {prep} (or all of MESS's datasets: python -m "
            f"mess.prepare_all_datasets --dataset_dir {root}; MESS's README), or set {DATASETS_ENV} to the folder "
            f"that holds MESS's prepared datasets (now {root!r})")


def _checked_loader(name: str, loader, register_module: str):
    meta = MetadataCatalog.get(name)

    def load():
        for what, path in (("image", meta.image_root), ("ground-truth", meta.sem_seg_root)):
            if not os.path.isdir(path) or not any(os.scandir(path)):
                raise DatasetNotFoundError(missing_message(name, path, what, register_module))
        try:
            dicts = loader()
        except (AssertionError, FileNotFoundError) as e:  # detectron2's load_sem_seg: "No annotations found in ..."
            raise DatasetNotFoundError(f"{missing_message(name, meta.sem_seg_root, 'ground-truth', register_module)} "
                                       f"({type(e).__name__}: {e})") from e
        if not dicts:
            raise DatasetNotFoundError(
                f"MESS dataset {name!r}: no image in {meta.image_root!r} has a ground-truth file in "
                f"{meta.sem_seg_root!r}; {missing_message(name, meta.image_root, 'image', register_module)}")
        return dicts

    setattr(load, _WRAPPED, register_module)
    return load


def register_mess_datasets() -> List[str]:
    """Import ``mess.datasets`` (MESS registers its datasets under ``$DETECTRON2_DATASETS``) and
    take in every dataset it registered (see the module docstring). Idempotent.

    Returns:
        the MESS dataset names (empty without the package).
    Raises:
        ValueError: a MESS dataset lacks one of the metadata keys this relies on.
    """
    if not mess_available():
        return []
    import mess.datasets  # noqa: F401  (registers on import)

    names = []
    for name in DatasetCatalog.list():
        module = _register_module(name)
        if module is None:
            continue
        names.append(name)
        meta = MetadataCatalog.get(name)
        if meta.get("benchmark", None) == MESS_BENCHMARK:
            continue  # taken in already
        missing = [k for k in ("stuff_classes", "ignore_label", "background_class", "classes_of_interest",
                               "image_root", "sem_seg_root") if meta.get(k, None) is None]
        if missing:
            raise ValueError(f"MESS dataset {name!r} (registered by {module}) has no {', '.join(missing)} in its "
                             f"metadata; this project expects {MESS_REQUIREMENT}")
        loader = DatasetCatalog.pop(name)
        DatasetCatalog.register(name, _checked_loader(name, loader, module))
        classes = list(meta.stuff_classes)
        bg = int(meta.background_class)
        meta.set(
            benchmark=MESS_BENCHMARK,
            background_index=bg if 0 <= bg < len(classes) and bg != int(meta.ignore_label) else None,
            vocabulary_fixed_by="MESS (the benchmark's own class names)",
            dataset_root=os.path.commonpath([meta.image_root, meta.sem_seg_root]),
            prepare_command=f"{DATASETS_ENV}={datasets_root()} python -m {prepare_module(module)}",
            mess_register_module=module,
        )
    return names


register_mess_datasets()
