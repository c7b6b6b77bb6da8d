"""Test loaders chosen by a dataset's metadata ``evaluator_type``.

:data:`TEST_LOADER_REGISTRY` is an fvcore ``Registry`` (the style of detectron2's
``META_ARCH_REGISTRY``, and of this package's attention registries): an entry is a function
``fn(cfg, dataset_name, dataset_dicts) -> iterable loader`` whose ``__name__`` is the
``evaluator_type`` it serves (``sem_seg`` here, ``fgovd`` in ``fgovd_mapper.py``), decorated
with :func:`consumed_by` to name the META_ARCHs that consume its inputs, so that a config
pairing a dataset with the wrong model fails before the model is built.
"""
from typing import Callable, List, Sequence, Tuple

from detectron2.data import MetadataCatalog, build_detection_test_loader
from fvcore.common.registry import Registry

from .mapper import SparseCLIPTestMapper

__all__ = ["TEST_LOADER_REGISTRY", "consumed_by", "build_test_loader", "check_meta_architecture",
           "registered_evaluator_type"]

TEST_LOADER_REGISTRY = Registry("SPARSECLIP_TEST_LOADER")
TEST_LOADER_REGISTRY.__doc__ = """
Test-loader builders keyed by dataset metadata ``evaluator_type`` (the function's name):
``fn(cfg, dataset_name, dataset_dicts) -> loader``, with the attribute
``meta_architectures`` set by :func:`consumed_by`.
"""


def consumed_by(*meta_architectures: str) -> Callable[[Callable], Callable]:
    """Decorator recording on a test-loader builder the ``MODEL.META_ARCHITECTURE`` names that
    consume its inputs (``fn.meta_architectures``)."""
    if not meta_architectures:
        raise ValueError("consumed_by needs at least one META_ARCH name")

    def deco(fn: Callable) -> Callable:
        fn.meta_architectures = tuple(meta_architectures)
        return fn

    return deco


def registered_evaluator_type(dataset_name: str, registry: Registry, what: str) -> str:
    """The metadata ``evaluator_type`` of ``dataset_name``, which must name an entry of the
    fvcore ``registry`` (``what`` names the registry's entries in the error: "test loader",
    "evaluator").

    Raises:
        ValueError: the dataset has no ``evaluator_type``, or ``registry`` has no entry for it
            (the message lists the registered ones).
    """
    evaluator_type = MetadataCatalog.get(dataset_name).get("evaluator_type", None)
    if evaluator_type is None:
        raise ValueError(f"dataset {dataset_name!r} has no evaluator_type in its metadata")
    if evaluator_type not in registry:
        raise ValueError(
            f"no {what} for evaluator_type {evaluator_type!r} of dataset {dataset_name!r}; "
            f"registered: {', '.join(sorted(name for name, _ in registry))}"
        )
    return evaluator_type


def _loader_of(dataset_name: str) -> Tuple[str, Callable]:
    evaluator_type = registered_evaluator_type(dataset_name, TEST_LOADER_REGISTRY, "test loader")
    return evaluator_type, TEST_LOADER_REGISTRY.get(evaluator_type)


def build_test_loader(cfg, dataset_name: str, dataset_dicts: List[dict]):
    """The test loader of ``dataset_name`` chosen by its metadata ``evaluator_type``."""
    return _loader_of(dataset_name)[1](cfg, dataset_name, dataset_dicts)


def check_meta_architecture(meta_architecture: str, dataset_names: Sequence[str]) -> None:
    """Raise ``ValueError`` when a dataset's inputs are meant for another of this package's
    META_ARCHs than ``meta_architecture`` (an architecture no task names is let through)."""
    known = {a for _, builder in TEST_LOADER_REGISTRY for a in getattr(builder, "meta_architectures", ())}
    if meta_architecture not in known:
        return
    for name in dataset_names:
        evaluator_type, builder = _loader_of(name)
        archs = getattr(builder, "meta_architectures", ())
        if meta_architecture not in archs:
            raise ValueError(
                f"dataset {name!r} (evaluator_type {evaluator_type!r}) is evaluated with "
                f"MODEL.META_ARCHITECTURE {' or '.join(archs)}, not {meta_architecture}; evaluate it "
                f"in a run of its own (e.g. a config under configs/fgovd/ for FG-OVD)"
            )


@TEST_LOADER_REGISTRY.register()
@consumed_by("SparseCLIP")
def sem_seg(cfg, dataset_name: str, dataset_dicts: List[dict]):
    """Segmentation datasets (``evaluator_type`` "sem_seg"): :class:`SparseCLIPTestMapper`."""
    return build_detection_test_loader(
        dataset_dicts, mapper=SparseCLIPTestMapper(cfg, dataset_name), num_workers=cfg.DATALOADER.NUM_WORKERS
    )
