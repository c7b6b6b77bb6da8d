"""detectron2 modeling parts: the ``SparseCLIP`` and ``SparseCLIPFGOVD`` META_ARCHs and the ``SparseCLIPBackbone``
(registered on import), plus the pure-torch sliding-window and post-processing steps."""
from .. import require_detectron2

require_detectron2("sparseclip_d2.modeling")

from .backbone import SparseCLIPBackbone, build_clip_from_config, resolve_device
from .meta_arch import SparseCLIP
from .fgovd import SparseCLIPFGOVD
from .postprocess import class_scores
from ..dense.windows import dense_logits, symmetric_pad, window_grid

__all__ = [
    "SparseCLIP",
    "SparseCLIPFGOVD",
    "SparseCLIPBackbone",
    "build_clip_from_config",
    "class_scores",
    "dense_logits",
    "resolve_device",
    "symmetric_pad",
    "window_grid",
]
