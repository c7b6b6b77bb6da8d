"""Test loaders chosen by a dataset's metadata ``evaluator_type``.

A task registers its loader builder with :func:`register_test_loader` (``"sem_seg"`` here,
``"fgovd"`` in ``fgovd_mapper.py``); a builder is ``builder(cfg, dataset_name, dataset_dicts)
-> iterable loader``. It also names the META_ARCHs that consume its inputs, so that a config
pairing a dataset with the wrong model fails before the model is built.
"""
from typing import Callable, Dict, List, Sequence, Tuple

from detectron2.data import MetadataCatalog, build_detection_test_loader

from .mapper import SparseCLIPTestMapper

__all__ = ["TEST_LOADERS", "register_test_loader", "build_test_loader", "check_meta_architecture"]

# evaluator_type -> (loader builder, META_ARCH names that consume its inputs)
TEST_LOADERS: Dict[str, Tuple[Callable, Tuple[str, ...]]] = {}


def register_test_loader(evaluator_type: str, meta_architectures: Sequence[str]):
    """Decorator registering ``builder(cfg, dataset_name, dataset_dicts)`` for the datasets
    whose metadata ``evaluator_type`` is ``evaluator_type``."""

    def deco(builder: Callable) -> Callable:
        if evaluator_type in TEST_LOADERS:
            raise ValueError(f"a test loader for evaluator_type {evaluator_type!r} is already registered")
        TEST_LOADERS[evaluator_type] = (builder, tuple(meta_architectures))
        return builder

    return deco


def registered_evaluator_type(dataset_name: str, registry, what: str) -> str:
    """The metadata ``evaluator_type`` of ``dataset_name``, which must be a key of
    ``registry`` (``what`` names the registry's entries in the error: "test loader",
    "evaluator").

    Raises:
        ValueError: the dataset has no ``evaluator_type``, or ``registry`` has no entry for it.
    """
    evaluator_type = MetadataCatalog.get(dataset_name).get("evaluator_type", None)
    if evaluator_type is None:
        raise ValueError(f"dataset {dataset_name!r} has no evaluator_type in its metadata")
    if evaluator_type not in registry:
        raise ValueError(
            f"no {what} for evaluator_type {evaluator_type!r} of dataset {dataset_name!r}; "
            f"registered: {', '.join(sorted(registry))}"
        )
    return evaluator_type


def _evaluator_type(dataset_name: str) -> str:
    return registered_evaluator_type(dataset_name, TEST_LOADERS, "test loader")


def build_test_loader(cfg, dataset_name: str, dataset_dicts: List[dict]):
    """The test loader of ``dataset_name`` chosen by its metadata ``evaluator_type``."""
    return TEST_LOADERS[_evaluator_type(dataset_name)][0](cfg, dataset_name, dataset_dicts)


def check_meta_architecture(meta_architecture: str, dataset_names: Sequence[str]) -> None:
    """Raise ``ValueError`` when a dataset's inputs are meant for another of this package's
    META_ARCHs than ``meta_architecture`` (an architecture no task names is let through)."""
    known = {a for _, archs in TEST_LOADERS.values() for a in archs}
    if meta_architecture not in known:
        return
    for name in dataset_names:
        evaluator_type = _evaluator_type(name)
        archs = TEST_LOADERS[evaluator_type][1]
        if meta_architecture not in archs:
            raise ValueError(
                f"dataset {name!r} (evaluator_type {evaluator_type!r}) is evaluated with "
                f"MODEL.META_ARCHITECTURE {' or '.join(archs)}, not {meta_architecture}; evaluate it "
                f"in a run of its own (e.g. a config under configs/fgovd/ for FG-OVD)"
            )


@register_test_loader("sem_seg", meta_architectures=("SparseCLIP",))
def build_sem_seg_test_loader(cfg, dataset_name: str, dataset_dicts: List[dict]):
    """Segmentation datasets: :class:`SparseCLIPTestMapper`."""
    return build_detection_test_loader(
        dataset_dicts, mapper=SparseCLIPTestMapper(cfg, dataset_name), num_workers=cfg.DATALOADER.NUM_WORKERS
    )
