"""``MODEL.SPARSECLIP.PROXY.TRIDENT.*``: Trident's keys, read and validated, its SAM, and Trident as an
encoder family on the second backbone (duck-typed config; no detectron2 import)."""
import functools
import os
from typing import Optional

from ...clip.spec import AttentionSpec
from ...common.keys import Key, Section, switch_is_on
from ...proxy.keys import KEY as PROXY_KEY
from ...proxy.second_backbone import (PROXY_WEIGHT_TAGS, ProxyBackbone, ProxyOptions, build_proxy, check_proxy_options,
                                      is_sam_encoder, meta_model)
from ..proxyclip.encoder import check_proxy_spec
from ..proxyclip.keys import proxy_scores
from ..registry import CONFIG_SECTIONS, ENCODERS, EncoderFamily
from .encoder import TridentEncoder, TridentSettings, check_trident_settings

__all__ = ["TRIDENT_SECTION", "trident_settings_from_config", "check_trident_config", "build_trident_sam",
           "TridentFamily"]

KEY = f"{PROXY_KEY}.TRIDENT"
#: ``PROXY.TRIDENT.*``: ``ENABLED``, SAM's keys (read by :func:`_sam_options`), then
#: :class:`TridentSettings`' keys; with ``ENABLED False`` the others must keep their defaults.
TRIDENT_SECTION = CONFIG_SECTIONS.register(KEY)(Section(TridentSettings, switch="ENABLED", before=(
    Key("ENABLED", False),
    Key("SAM_NAME", "samvit_base_patch16", "SAM's image encoder (a timm samvit_* name)."),
    Key("SAM_WEIGHTS", "none", "SAM's weights: none (random), timm, or a file (the SAM release "
                               "sam_vit_b_01ec64.pth loads as it is: image_encoder.* keys)."),
    Key("SAM_PRECISION", "fp32", "fp32, fp16 (upstream .half()) or bf16."))))


def trident_settings_from_config(cfg) -> Optional[TridentSettings]:
    """The validated :class:`~.trident.TridentSettings` of ``cfg``, or None when
    ``PROXY.TRIDENT.ENABLED`` is False (then every other ``PROXY.TRIDENT`` key must keep its default)."""
    t = cfg.MODEL.SPARSECLIP.PROXY.TRIDENT
    if not switch_is_on(t, TRIDENT_SECTION, KEY):
        return None
    return check_trident_settings(TridentSettings(
        cos_fac=t.COS_FAC, refine_neg_cos=t.REFINE_NEG_COS, crop_size=t.CROP_SIZE, stride=t.STRIDE,
        sam_tiles=t.SAM_TILES, splice=t.SPLICE, aggregation=t.AGGREGATION), KEY)


def _sam_options(cfg) -> ProxyOptions:
    t = cfg.MODEL.SPARSECLIP.PROXY.TRIDENT
    w = str(t.SAM_WEIGHTS).strip()
    if w.lower() not in PROXY_WEIGHT_TAGS + ("", "random"):
        path = os.path.expanduser(w)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{KEY}.SAM_WEIGHTS = {w!r}: no such file ({os.path.abspath(path)}); valid: none "
                                    "(random weights), timm (timm's own pretrained tag) or a local SAM weights file "
                                    "(e.g. sam_vit_b_01ec64.pth)")
    opts = ProxyOptions(name=t.SAM_NAME, weights=w, layer=-1, feature="tokens", input_size=0,
                        pos_embed_interp="size", precision=t.SAM_PRECISION)
    if not isinstance(t.SAM_NAME, str) or not _is_sam(t.SAM_NAME):
        raise ValueError(f"{KEY}.SAM_NAME = {t.SAM_NAME!r} is not a SAM image encoder; valid: samvit_base_patch16 "
                         "(or another timm samvit_* name whose last block attends globally)")
    if t.SAM_PRECISION not in ("fp32", "fp16", "bf16"):
        raise ValueError(f"{KEY}.SAM_PRECISION = {t.SAM_PRECISION!r} is invalid; valid: fp32, fp16, bf16")
    return check_proxy_options(opts, f"{KEY}.SAM_")


@functools.lru_cache(maxsize=None)
def _is_sam(name: str) -> bool:
    """Whether timm model ``name`` is a SAM image encoder whose last block attends globally
    (:func:`~sparseclip_d2.proxy.second_backbone.meta_model`: no memory, no weights)."""
    import timm

    if not timm.is_model(name):
        return False
    return is_sam_encoder(name) and getattr(meta_model(name).blocks[-1], "window_size", 1) == 0


def check_trident_config(cfg, proxy_opts: Optional[ProxyOptions]) -> Optional[TridentSettings]:
    """Validate the TRIDENT keys (and what Trident needs of the rest of ``cfg``) before any model is built.

    Raises:
        ValueError: a bad value (naming the key and the valid choices); Trident with the sliding
            window or with a proxy that does not see the windows as they are.
        FileNotFoundError: ``SAM_WEIGHTS`` names a missing file (key and path in the message).
    """
    settings = trident_settings_from_config(cfg)
    if settings is None:
        return None
    if proxy_opts is None:
        raise ValueError(f"{KEY}.ENABLED needs MODEL.SPARSECLIP.PROXY.NAME (Trident: vit_base_patch16_224.dino)")
    if cfg.TEST.SLIDING_WINDOW.ENABLED:
        raise ValueError(f"TEST.SLIDING_WINDOW.ENABLED True with {KEY}.ENABLED: Trident windows the whole image "
                         f"itself ({KEY}.CROP_SIZE / STRIDE); set TEST.SLIDING_WINDOW.ENABLED False")
    if proxy_opts.input_size != 0 or proxy_opts.name.startswith("samvit"):
        raise ValueError(f"MODEL.SPARSECLIP.PROXY.NAME {proxy_opts.name!r} / INPUT_SIZE {proxy_opts.input_size} with "
                         f"{KEY}.ENABLED: the proxy sees each sub-window as it is; valid: a ViT (e.g. "
                         "vit_base_patch16_224.dino) with INPUT_SIZE 0")
    _sam_options(cfg)
    return settings


def build_trident_sam(cfg, device) -> ProxyBackbone:
    """The frozen SAM :class:`~.second_backbone.ProxyBackbone` of ``PROXY.TRIDENT.SAM_*`` on ``device``."""
    return build_proxy(_sam_options(cfg), device=device, key=f"{KEY}.SAM_")


@ENCODERS.register("trident")
class TridentFamily(EncoderFamily):
    """YuHengsss/Trident: the proxy on sub-windows spliced onto the whole image, SAM's last global
    attention aggregating."""

    key = f"{KEY}.ENABLED"

    @classmethod
    def settings_from_config(cls, cfg):
        return trident_settings_from_config(cfg)

    @classmethod
    def check(cls, cfg, proxy_options, settings) -> None:
        check_trident_config(cfg, proxy_options)
        check_proxy_spec(AttentionSpec.from_config(cfg, warn=False))

    @classmethod
    def build(cls, cfg, visual, spec, proxy, settings, *, device, crop_size, pos_embed_interp, attn_pool_dense):
        beta, gamma = proxy_scores(cfg)
        return TridentEncoder(visual, spec, proxy, sam=build_trident_sam(cfg, device), settings=settings, beta=beta,
                              gamma=gamma, crop_size=crop_size, pos_embed_interp=pos_embed_interp,
                              attn_pool_dense=attn_pool_dense)
