"""detectron2 data parts: dataset registration (on import), class names, test mappers, the
test-loader builders (``build_test_loader``, chosen by metadata ``evaluator_type``) and the
ground-truth conversion and check (``ground_truth``)."""
from .. import require_detectron2

require_detectron2("sparseclip_d2.data")

from . import datasets  # noqa: F401
from .build import TEST_LOADER_REGISTRY, build_test_loader, check_meta_architecture, consumed_by
from .class_names import available_class_name_files, display_name, load_class_names
from .fgovd_mapper import FGOVDDatasetMapper  # registers the "fgovd" test loader
from .ground_truth import GroundTruthError, check_ground_truth, convert_sem_seg_gt
from .mapper import SparseCLIPTestMapper

__all__ = [
    "FGOVDDatasetMapper",
    "GroundTruthError",
    "SparseCLIPTestMapper",
    "TEST_LOADER_REGISTRY",
    "available_class_name_files",
    "build_test_loader",
    "check_ground_truth",
    "check_meta_architecture",
    "display_name",
    "load_class_names",
    "consumed_by",
    "convert_sem_seg_gt",
]
