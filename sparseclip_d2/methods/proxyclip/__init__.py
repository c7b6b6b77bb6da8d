"""ProxyCLIP (mc-lan/ProxyCLIP): the last CLIP block attends with a second backbone's feature
similarities (:mod:`.encoder`), and the ``MODEL.SPARSECLIP.PROXY.*`` keys that switch a second
backbone on and choose the last block built on it (:mod:`.keys`)."""
from .encoder import ProxyCLIPEncoder, check_proxy_spec, normalize_proxy_scores
from . import keys  # noqa: F401  (registers the family and its config sections)
from . import upstream  # noqa: F401  (registers its upstream benchmark entry)

__all__ = ["ProxyCLIPEncoder", "check_proxy_spec", "normalize_proxy_scores"]
