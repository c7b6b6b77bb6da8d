"""Dataset registration (on import): segmentation benchmarks, the built-in demo, FG-OVD and,
with the optional ``mess`` extra, MESS's 22 datasets (``mess_benchmark``).

Roots come from ``$DETECTRON2_DATASETS`` (default ``datasets``).
"""
from . import segmentation  # noqa: F401
from . import demo  # noqa: F401

from . import fgovd  # noqa: F401
from . import mess_benchmark  # noqa: F401  (MESS's datasets, when its package is installed)

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
