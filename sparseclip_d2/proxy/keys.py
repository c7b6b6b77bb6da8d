"""``MODEL.SPARSECLIP.PROXY.*``: the second backbone's keys, read and validated (duck-typed config;
no detectron2 import). The last blocks built on it register their own sections under it
(``methods/registry.py`` ``ENCODERS``)."""
from typing import Optional

from ..common.keys import Key, Section
from .second_backbone import ProxyOptions, check_proxy_options

__all__ = ["KEY", "PROXY_SECTION", "proxy_node", "proxy_options_from_config"]

KEY = "MODEL.SPARSECLIP.PROXY"
#: The PROXY keys (:class:`ProxyOptions`' fields, then the proxy cosine scores' keys): with
#: ``NAME ""`` every other key must keep its default (a key set without a proxy would change
#: nothing and is refused). ``NAME`` is the switch: its section default ``""`` (off) stands for the
#: field's missing one.
PROXY_SECTION = Section(ProxyOptions, switch="NAME", defaults={"name": ""}, after=(
    Key("BETA", 1.2, "ProxyCLIP's scores (S - BETA * mean S) * GAMMA, negatives -> -inf, then ATTENTION.NORMALIZER "
                     "(mc-lan/ProxyCLIP proxyclip_segmentor.py defaults beta=1.2, gamma=3.0)."),
    Key("GAMMA", 3.0, "See BETA.")))


def proxy_node(cfg):
    """``cfg.MODEL.SPARSECLIP.PROXY``, or a ValueError saying how to add the keys."""
    try:
        return cfg.MODEL.SPARSECLIP.PROXY
    except (AttributeError, KeyError) as e:
        raise ValueError(f"config lacks {KEY} ({e}); call sparseclip_d2.add_sparseclip_config(cfg) first") from e


def proxy_options_from_config(cfg) -> Optional[ProxyOptions]:
    """The validated :class:`ProxyOptions` of ``cfg``, or None when ``PROXY.NAME`` is ``""``."""
    p = proxy_node(cfg)
    if not p.NAME:
        return None
    return check_proxy_options(ProxyOptions(
        name=p.NAME, weights=p.WEIGHTS, layer=p.LAYER, feature=p.FEATURE, input_size=p.INPUT_SIZE,
        pos_embed_interp=p.POS_EMBED_INTERP, precision=p.PRECISION), KEY)
