"""``MODEL.SPARSECLIP.PROXY.CORRCLIP.*``: CorrCLIP's keys, read and validated, and CorrCLIP as an
encoder family on the second backbone (duck-typed config; no detectron2 import)."""
from typing import Optional

from ...clip.spec import AttentionSpec
from ...common.keys import Key, Section, switch_is_on
from ...proxy.keys import KEY as PROXY_KEY, proxy_node
from ..proxyclip.encoder import check_proxy_spec
from ..proxyclip.keys import refuse_score_keys
from ..registry import CONFIG_SECTIONS, ENCODERS, EncoderFamily
from .encoder import CorrCLIPEncoder, CorrCLIPSettings, check_corrclip_settings

__all__ = ["KEY", "CORRCLIP_SECTION", "corrclip_settings_from_config", "CorrCLIPFamily"]

KEY = f"{PROXY_KEY}.CORRCLIP"
# CorrCLIP on the proxy last block (encoder.py; zdk258/CorrCLIP @ 103bc18
# CorrCLIPv1/open_clip/transformer.py VisionTransformer.forward, corrclip_segmentor.py):
# ``ENABLED`` then :class:`CorrCLIPSettings`' keys.
CORRCLIP_SECTION = CONFIG_SECTIONS.register(KEY)(Section(CorrCLIPSettings, switch="ENABLED",
                                                         before=(Key("ENABLED", False),)))


def corrclip_settings_from_config(cfg) -> Optional[CorrCLIPSettings]:
    """The validated :class:`~.encoder.CorrCLIPSettings` of ``cfg``, or None when
    ``PROXY.CORRCLIP.ENABLED`` is False (then every other ``PROXY.CORRCLIP`` key must keep its
    default). ``FileNotFoundError`` names ``MASK_DIR`` and the path when it is not a directory."""
    c = proxy_node(cfg).CORRCLIP
    if not switch_is_on(c, CORRCLIP_SECTION, KEY):
        return None
    return check_corrclip_settings(CorrCLIPSettings(
        mask_dir=c.MASK_DIR, tau=c.TAU, spatial_weight=c.SPATIAL_WEIGHT, semantic_weight=c.SEMANTIC_WEIGHT,
        num_spatial=c.NUM_SPATIAL, dbscan_eps=c.DBSCAN_EPS, dbscan_min_samples=c.DBSCAN_MIN_SAMPLES,
        restriction=str(c.RESTRICTION).strip().lower(), mode_vote=c.MODE_VOTE), KEY)


def _get(cfg, dotted: str):
    node = cfg
    for part in dotted.split("."):
        node = node[part]
    return node


@ENCODERS.register("corrclip")
class CorrCLIPFamily(EncoderFamily):
    """zdk258/CorrCLIP: the proxy last block restricted to per-image regions, three branches summed."""

    key = f"{KEY}.ENABLED"
    needs = CorrCLIPEncoder.needs

    @classmethod
    def settings_from_config(cls, cfg):
        return corrclip_settings_from_config(cfg)

    @classmethod
    def check(cls, cfg, proxy_options, settings) -> None:
        """What CorrCLIP's per-image path (``parts.py``) cannot join."""
        check_proxy_spec(AttentionSpec.from_config(cfg, warn=False))
        sc = cfg.MODEL.SPARSECLIP
        bad = [(key, valid) for on, key, valid in (
            (cfg.TEST.TTA.MODE, "TEST.TTA.MODE", "''"),
            (sc.FEATURE_SURGERY.ENABLED, "MODEL.SPARSECLIP.FEATURE_SURGERY.ENABLED", "False"),
            (sc.FEEDBACK.ENABLED, "MODEL.SPARSECLIP.FEEDBACK.ENABLED", "False"),
            (sc.CLS_LOGIT_PRODUCT, "MODEL.SPARSECLIP.CLS_LOGIT_PRODUCT", "False"),
            (sc.LABEL_CLOSING, "MODEL.SPARSECLIP.LABEL_CLOSING", "0"),
            (sc.BLOCK.RESIDUAL, "MODEL.SPARSECLIP.BLOCK.RESIDUAL", "False"),
            (sc.BLOCK.FFN, "MODEL.SPARSECLIP.BLOCK.FFN", "False"),
            (sc.ATTENTION.NUM_LAYERS != 1, "MODEL.SPARSECLIP.ATTENTION.NUM_LAYERS", "1")) if on]
        if bad:
            key, valid = bad[0]
            raise ValueError(f"{cls.key} True cannot be combined with {key} = {_get(cfg, key)!r} (CorrCLIP encodes "
                             f"each window with its region masks and sums three branches after the final norm); "
                             f"valid: {key} {valid}")
        refuse_score_keys(cfg, ("BETA", "GAMMA"), cls.key, f"CorrCLIP's scores are the cosine x {KEY}.TAU within regions")
        if cfg.MODEL.META_ARCHITECTURE != "SparseCLIP":
            raise ValueError(f"{cls.key} True needs MODEL.META_ARCHITECTURE SparseCLIP (its region masks are read per "
                             f"image there), got {cfg.MODEL.META_ARCHITECTURE!r}")

    @classmethod
    def build(cls, cfg, visual, spec, proxy, settings, *, device, crop_size, pos_embed_interp, attn_pool_dense):
        return CorrCLIPEncoder(visual, spec, proxy, settings=settings, crop_size=crop_size,
                               pos_embed_interp=pos_embed_interp, attn_pool_dense=attn_pool_dense)
