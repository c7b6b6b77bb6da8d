"""GLA-CLIP (2btlFe/GLA-CLIP @ ba74915, CVPR 2026): every sliding window's last CLIP block attends over
the DINO tokens of all windows of the image, with a proxy anchor and a dynamic normalisation. The
maths in :mod:`.window_set`, the encoder in :mod:`.encoder` (ProxyCLIP's proxy block, window-set
attention), the keys ``MODEL.SPARSECLIP.PROXY.GLA.*`` and the encoder family in :mod:`.keys`, the
stage that encodes all windows together in :mod:`.parts`."""
from .window_set import (WindowSetSettings, anchor_scores, check_window_set_settings, dynamic_normalise,
                         window_set_attend, window_set_beta)
from .encoder import WindowSetEncoder
from . import keys  # noqa: F401  (registers the family and its config section)
from .parts import WindowSetStage
from . import upstream  # noqa: F401  (registers its upstream benchmark entry)

#: the families this one is built on (it may name them; tests/project/test_source_rules.py): its last
#: block is ProxyCLIP's proxy block with window-set attention
BUILDS_ON = ("proxyclip",)

__all__ = ["WindowSetSettings", "anchor_scores", "check_window_set_settings", "dynamic_normalise", "window_set_attend",
           "window_set_beta", "WindowSetEncoder", "WindowSetStage"]
