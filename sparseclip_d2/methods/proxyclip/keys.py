"""ProxyCLIP as the default encoder on the second backbone: with ``MODEL.SPARSECLIP.PROXY.NAME``
set and no other family switched on, the last block attends with the proxy's cosine scores
(``PROXY.BETA`` / ``GAMMA``; the keys themselves are the generic ``proxy/keys.py``)."""
from typing import Tuple

from ...clip.spec import AttentionSpec
from ...common.keys import key_defaults
from ...proxy.keys import KEY, PROXY_SECTION, proxy_node
from ..registry import ENCODERS, EncoderFamily
from .encoder import ProxyCLIPEncoder, check_proxy_spec

__all__ = ["ProxyCLIPFamily", "proxy_scores", "refuse_score_keys"]


def proxy_scores(cfg) -> Tuple[float, float]:
    """``(BETA, GAMMA)`` of the proxy cosine scores (validated by ``check_proxy_config``)."""
    p = proxy_node(cfg)
    return float(p.BETA), float(p.GAMMA)


def refuse_score_keys(cfg, keys, switch: str, why: str) -> None:
    """A ValueError when one of the PROXY ``keys`` differs from its default under ``switch``:
    the family switched on by ``switch`` does not read it (``why``)."""
    p, defaults = proxy_node(cfg), key_defaults(PROXY_SECTION)
    changed = [f"{KEY}.{k} = {p[k]!r}" for k in keys if p[k] != defaults[k]]
    if changed:
        raise ValueError(f"{', '.join(changed)} changes nothing with {switch} ({why}); leave them at their defaults "
                         f"({', '.join(f'{k} {defaults[k]}' for k in keys)})")


@ENCODERS.register("proxyclip")
class ProxyCLIPFamily(EncoderFamily):
    """mc-lan/ProxyCLIP: the last block's attention from the proxy's feature cosines."""

    key = f"{KEY}.NAME"
    default = True

    @classmethod
    def settings_from_config(cls, cfg):
        return proxy_scores(cfg)

    @classmethod
    def check(cls, cfg, proxy_options, settings) -> None:
        check_proxy_spec(AttentionSpec.from_config(cfg, warn=False))

    @classmethod
    def build(cls, cfg, visual, spec, proxy, settings, *, device, crop_size, pos_embed_interp, attn_pool_dense):
        beta, gamma = settings
        return ProxyCLIPEncoder(visual, spec, proxy, beta=beta, gamma=gamma, crop_size=crop_size,
                                pos_embed_interp=pos_embed_interp, attn_pool_dense=attn_pool_dense)
