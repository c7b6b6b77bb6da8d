"""detectron2 data parts: dataset registration (on import), class names, test mapper."""
from .. import require_detectron2

require_detectron2("sparseclip_d2.data")

from . import datasets  # noqa: F401
from .class_names import available_class_name_files, display_name, load_class_names
from .fgovd_mapper import FGOVDDatasetMapper, FGOVDOptions
from .mapper import SparseCLIPTestMapper

__all__ = [
    "FGOVDDatasetMapper",
    "FGOVDOptions",
    "SparseCLIPTestMapper", "available_class_name_files", "display_name", "load_class_names"]
