"""``MODEL.SPARSECLIP.PROXY.GLA.*``: the window-set last block's keys, read and validated, and the
encoder family on the second backbone (duck-typed config; no detectron2 import)."""
from typing import Optional

from ...clip.spec import AttentionSpec
from ...common.keys import Key, Section, switch_is_on
from ...proxy.keys import KEY as PROXY_KEY, proxy_node
from ..proxyclip.encoder import check_proxy_spec
from ..proxyclip.keys import refuse_score_keys
from ..registry import CONFIG_SECTIONS, ENCODERS, EncoderFamily
from .encoder import WindowSetEncoder
from .window_set import WindowSetSettings, check_window_set_settings

__all__ = ["KEY", "GLA_SECTION", "window_set_settings_from_config", "GLAFamily"]

KEY = f"{PROXY_KEY}.GLA"
#: GLA-CLIP's window-set attention (2btlFe/GLA-CLIP @ ba74915 myutils.py KV_Extension): ``ENABLED`` then
#: :class:`WindowSetSettings`' keys; with ``ENABLED False`` the others must keep their defaults.
GLA_SECTION = CONFIG_SECTIONS.register(KEY)(Section(WindowSetSettings, switch="ENABLED", before=(
    Key("ENABLED", False, "The last block of every window attends over the proxy tokens of all windows of the "
                          "image (GLA-CLIP, gla_clip_segmentor.py forward_kv_expansion)."),)))


def window_set_settings_from_config(cfg) -> Optional[WindowSetSettings]:
    """The validated :class:`WindowSetSettings` of ``cfg``, or None when ``PROXY.GLA.ENABLED`` is False
    (then every other ``PROXY.GLA`` key must keep its default)."""
    g = proxy_node(cfg).GLA
    if not switch_is_on(g, GLA_SECTION, KEY):
        return None
    return check_window_set_settings(WindowSetSettings(
        threshold=g.THRESHOLD, iterations=g.ITERATIONS, beta_alpha=g.BETA_ALPHA, gamma_alpha=g.GAMMA_ALPHA,
        precision=str(g.PRECISION).strip().lower(), block_rows=g.BLOCK_ROWS), KEY)


@ENCODERS.register("gla_clip")
class GLAFamily(EncoderFamily):
    """2btlFe/GLA-CLIP: the proxy last block over the window set of the image."""

    key = f"{KEY}.ENABLED"

    @classmethod
    def settings_from_config(cls, cfg):
        return window_set_settings_from_config(cfg)

    @classmethod
    def check(cls, cfg, proxy_options, settings) -> None:
        refuse_score_keys(cfg, ("BETA", "GAMMA"), cls.key,
                          "its scores are shifted and scaled by the dynamic beta and gamma")
        if not cfg.TEST.SLIDING_WINDOW.ENABLED:
            raise ValueError(f"{cls.key} True attends over the sliding windows of the image; "
                             "TEST.SLIDING_WINDOW.ENABLED = False is invalid with it; valid: True")
        if proxy_options.input_size != 0:
            raise ValueError(f"{PROXY_KEY}.INPUT_SIZE = {proxy_options.input_size} with {cls.key}: the proxy reads "
                             "each window as it is (gla_clip_segmentor.py forward_feature); valid: 0")
        if cfg.MODEL.SPARSECLIP.PATCH_REMAINDER != "pad_crop":
            raise ValueError(f"MODEL.SPARSECLIP.PATCH_REMAINDER = {cfg.MODEL.SPARSECLIP.PATCH_REMAINDER!r} with "
                             f"{cls.key}: windows are zero-padded, centred (gla_clip_segmentor.py compute_padsize); "
                             "valid: pad_crop")
        check_proxy_spec(AttentionSpec.from_config(cfg, warn=False))

    @classmethod
    def build(cls, cfg, visual, spec, proxy, settings, *, device, crop_size, pos_embed_interp, attn_pool_dense):
        return WindowSetEncoder(visual, spec, proxy, settings=settings, crop_size=crop_size,
                                pos_embed_interp=pos_embed_interp, attn_pool_dense=attn_pool_dense)
