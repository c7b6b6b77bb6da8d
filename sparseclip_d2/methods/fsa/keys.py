"""``MODEL.SPARSECLIP.PROXY.FSA.*``: FSA's keys, read and validated, and FSA as an encoder family on
the second backbone (duck-typed config; no detectron2 import)."""
from typing import Optional

from ...attention.normalizers import NORMALIZERS_WITHOUT_ALPHA
from ...clip.spec import AttentionSpec
from ...common.keys import Key, Section, switch_is_on
from ...proxy.keys import KEY as PROXY_KEY, proxy_node
from ..proxyclip.encoder import check_proxy_spec
from ..proxyclip.keys import proxy_scores
from ..registry import CONFIG_SECTIONS, ENCODERS, EncoderFamily
from .encoder import FSAEncoder, FSASettings, check_fsa_settings

__all__ = ["KEY", "FSA_SECTION", "fsa_settings_from_config", "FSAFamily"]

KEY = f"{PROXY_KEY}.FSA"
# FSA's feedback attention on the proxy last block (chi-chi-zx/FSA @ dbd2da5
# open_clip/transformer.py custom_attn / FSA / SparseAtten / attend_v_ens): ``ENABLED`` then
# :class:`FSASettings`' keys; with ``ENABLED False`` the others must keep their defaults.
FSA_SECTION = CONFIG_SECTIONS.register(KEY)(Section(FSASettings, switch="ENABLED", before=(Key("ENABLED", False),)))


def fsa_settings_from_config(cfg) -> Optional[FSASettings]:
    """The validated :class:`~.encoder.FSASettings` of ``cfg``, or None when ``PROXY.FSA.ENABLED`` is
    False (then every other ``PROXY.FSA`` key must keep its default)."""
    f = proxy_node(cfg).FSA
    if not switch_is_on(f, FSA_SECTION, KEY):
        return None
    return check_fsa_settings(FSASettings(top_p=f.TOP_P, lamda=f.LAMBDA, patch_scale=f.PATCH_SCALE,
                                          uniform_scale=f.UNIFORM_SCALE, normalizer=str(f.NORMALIZER).strip().lower()),
                              KEY)


@ENCODERS.register("fsa")
class FSAFamily(EncoderFamily):
    """chi-chi-zx/FSA: the proxy last block with feedback attention guided by the class texts."""

    key = f"{KEY}.ENABLED"
    needs = FSAEncoder.needs

    @classmethod
    def settings_from_config(cls, cfg):
        return fsa_settings_from_config(cfg)

    @classmethod
    def check(cls, cfg, proxy_options, settings) -> None:
        for bad, why in ((cfg.TEST.TTA.MODE, f"TEST.TTA.MODE = {cfg.TEST.TTA.MODE!r}"),
                         (cfg.MODEL.SPARSECLIP.FEATURE_SURGERY.ENABLED, "MODEL.SPARSECLIP.FEATURE_SURGERY.ENABLED")):
            if bad:
                raise ValueError(f"{why} with {cls.key}: FSA's last block needs the class texts, which that "
                                 "path does not pass to the encoder; turn one of them off")
        check_proxy_spec(AttentionSpec.from_config(cfg, warn=False))

    @classmethod
    def build(cls, cfg, visual, spec, proxy, settings, *, device, crop_size, pos_embed_interp, attn_pool_dense):
        beta, gamma = proxy_scores(cfg)
        return FSAEncoder(visual, spec, proxy, fsa=settings, beta=beta, gamma=gamma, crop_size=crop_size,
                          pos_embed_interp=pos_embed_interp, attn_pool_dense=attn_pool_dense)

    @classmethod
    def reads_alpha(cls, cfg) -> bool:
        f = proxy_node(cfg).FSA  # FSA's own normaliser reads ALPHA too (encoder.py)
        return bool(f.ENABLED and f.NORMALIZER and f.NORMALIZER not in NORMALIZERS_WITHOUT_ALPHA)
