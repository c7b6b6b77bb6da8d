"""CLIP Surgery (xmed-lab/CLIP_Surgery): the text-side feature surgery as a logit head
(:mod:`.head`, maths in :mod:`.surgery`). Its parallel path is generic (``clip/parallel.py``) and
its attention a preset (``clip/spec.py``)."""
from .head import FeatureSurgeryHead
from .surgery import check_surgery_options, check_surgery_scale, feature_surgery
from . import upstream  # noqa: F401  (registers its upstream benchmark entry)

__all__ = ["FeatureSurgeryHead", "feature_surgery", "check_surgery_scale", "check_surgery_options"]
