"""detectron2 data parts: dataset registration (on import), class names, test mappers and
the test-loader builders (``build_test_loader``, chosen by metadata ``evaluator_type``)."""
from .. import require_detectron2

require_detectron2("sparseclip_d2.data")

from . import datasets  # noqa: F401
from .build import TEST_LOADER_REGISTRY, build_test_loader, check_meta_architecture, consumed_by
from .class_names import available_class_name_files, display_name, load_class_names
from .fgovd_mapper import FGOVDDatasetMapper  # registers the "fgovd" test loader
from .mapper import SparseCLIPTestMapper

__all__ = [
    "FGOVDDatasetMapper",
    "SparseCLIPTestMapper",
    "TEST_LOADER_REGISTRY",
    "available_class_name_files",
    "build_test_loader",
    "check_meta_architecture",
    "display_name",
    "load_class_names",
    "consumed_by",
]
