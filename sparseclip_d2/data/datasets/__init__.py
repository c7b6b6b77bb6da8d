"""Dataset registration (on import): segmentation benchmarks and the built-in demo.

Roots come from ``$DETECTRON2_DATASETS`` (default ``datasets``).
"""
from . import segmentation  # noqa: F401
from . import demo  # noqa: F401

from . import fgovd  # noqa: F401

from .demo import DEMO_DATASET, build_demo_files, demo_dir
from .segmentation import (
    DatasetNotFoundError,
    load_sem_seg_gt,
    register_all_sparseclip_segmentation,
    register_sem_seg_dataset,
)

__all__ = [
    "DEMO_DATASET",
    "DatasetNotFoundError",
    "build_demo_files",
    "demo_dir",
    "load_sem_seg_gt",
    "register_all_sparseclip_segmentation",
    "register_sem_seg_dataset",
]
