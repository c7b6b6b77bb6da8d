"""ITACLIP (m-arda-aydn/ITACLIP): the test-time augmentation head and the label closing stage
(:mod:`.parts`, maths in :mod:`.tta`). Its attention is a preset (``clip/spec.py``) and its class
definitions a text option (``clip/definitions.py``)."""
from .parts import LabelClosingStage, TTAHead
from .tta import TTA_MODES, check_label_closing, check_tta_options, close_labels, tta_logits
from . import upstream  # noqa: F401  (registers its upstream benchmark entry)

__all__ = ["TTAHead", "LabelClosingStage", "TTA_MODES", "tta_logits", "close_labels", "check_tta_options",
           "check_label_closing"]
