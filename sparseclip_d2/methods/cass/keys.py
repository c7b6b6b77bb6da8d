"""``MODEL.SPARSECLIP.PROXY.CASS.*``: CASS's last-block keys, read and validated, and CASS as an
encoder family on the second backbone (duck-typed config; no detectron2 import). The
object-presence keys are :mod:`.object_presence`'s."""
from typing import Optional

from ...clip.spec import AttentionSpec
from ...common.keys import Key, Section, switch_is_on
from ...proxy.keys import KEY as PROXY_KEY, proxy_node
from ..proxyclip.keys import refuse_score_keys
from ..registry import CONFIG_SECTIONS, ENCODERS, EncoderFamily
from .encoder import CASSEncoder, CASSSettings, check_cass_settings, check_cass_spec

__all__ = ["KEY", "CASS_SECTION", "cass_settings_from_config", "CASSFamily"]

KEY = f"{PROXY_KEY}.CASS"
# CASS's last block (encoder.py, attention/spectral.py; MICV-yonsei/CASS @ 228ecdd clip/model.py
# custom_attn / _apply_spectral_strategy / optimal_q / _scale_singular_values): CLIP's
# ATTENTION.SOURCE graph combined per head with the proxy's key graph (PROXY.FEATURE keys), then
# ATTENTION.PRIOR and ATTENTION.NORMALIZER. ``ENABLED`` then :class:`CASSSettings`' keys.
CASS_SECTION = CONFIG_SECTIONS.register(KEY)(Section(CASSSettings, switch="ENABLED", before=(Key("ENABLED", False),)))


def cass_settings_from_config(cfg) -> Optional[CASSSettings]:
    """The validated :class:`~.encoder.CASSSettings` of ``cfg``, or None when ``PROXY.CASS.ENABLED``
    is False (then every other ``PROXY.CASS`` key must keep its default)."""
    c = proxy_node(cfg).CASS
    if not switch_is_on(c, CASS_SECTION, KEY):
        return None
    scale = c.SINGULAR_SCALE
    if not isinstance(scale, (list, tuple)) or len(scale) != 2:
        raise ValueError(f"{KEY}.SINGULAR_SCALE = {scale!r} is invalid; valid: [low, high], two numbers >= 0 "
                         "(upstream [0.5, 1.5]; [1.0, 1.0] leaves the singular values as they are)")
    return check_cass_settings(CASSSettings(
        matching=c.MATCHING, k_eigen=c.K_EIGEN, scale_factor=c.SCALE_FACTOR, rank=c.RANK, svd=c.SVD, seed=c.SEED,
        singular_low=scale[0], singular_high=scale[1], key_precision=c.KEY_PRECISION, input=c.INPUT), KEY)


@ENCODERS.register("cass")
class CASSFamily(EncoderFamily):
    """MICV-yonsei/CASS: CLIP's and the proxy's attention graphs combined spectrally."""

    key = f"{KEY}.ENABLED"
    needs = CASSEncoder.needs

    @classmethod
    def settings_from_config(cls, cfg):
        return cass_settings_from_config(cfg)

    @classmethod
    def check(cls, cfg, proxy_options, settings) -> None:
        if proxy_options.feature != "keys" or proxy_options.name.startswith("samvit"):
            raise ValueError(f"{cls.key} reads the proxy's keys: {PROXY_KEY}.FEATURE = {proxy_options.feature!r} with "
                             f"NAME {proxy_options.name!r} is invalid; valid: FEATURE keys of a timm ViT (upstream "
                             "DINO B/8)")
        refuse_score_keys(cfg, ("INPUT_SIZE", "BETA", "GAMMA"), cls.key,
                          f"CASS has its own proxy input, {KEY}.INPUT, and no ProxyCLIP scores")
        check_cass_spec(AttentionSpec.from_config(cfg, warn=False))

    @classmethod
    def build(cls, cfg, visual, spec, proxy, settings, *, device, crop_size, pos_embed_interp, attn_pool_dense):
        return CASSEncoder(visual, spec, proxy, cass=settings, pos_embed_interp=pos_embed_interp,
                           attn_pool_dense=attn_pool_dense)
