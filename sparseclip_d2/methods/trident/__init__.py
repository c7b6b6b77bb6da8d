"""Trident (YuHengsss/Trident): the proxy attends on sub-windows spliced onto the whole image, then
SAM's last global attention aggregates (:mod:`.encoder`; keys and SAM in :mod:`.keys`)."""
from .encoder import TridentEncoder, TridentSettings, check_trident_settings
from . import keys  # noqa: F401  (registers the family and its config sections)
from . import stage  # noqa: F401  (registers its window-loop stage, trident_grid)
from . import upstream  # noqa: F401  (registers its upstream benchmark entry)

#: the families this one is built on (it may name them; tests/project/test_source_rules.py)
BUILDS_ON = ("proxyclip",)

__all__ = ["TridentEncoder", "TridentSettings", "check_trident_settings"]
