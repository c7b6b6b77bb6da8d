"""Reading and checking ``MODEL.SPARSECLIP.LABEL_PROPAGATION.*`` (duck-typed config; no detectron2
import)."""
import logging
from typing import Optional, Tuple

from ...common.keys import Section, changed_section_keys, refuse_keys_while_off
from ...proxy.second_backbone import ProxyOptions, build_proxy, check_proxy_options
from ..registry import CONFIG_SECTIONS
from .propagation import KEY, PROPAGATION_KINDS, LabelPropagation, LabelPropagationSettings, check_label_propagation_settings

__all__ = ["LABEL_PROPAGATION_SECTION", "VFM_SECTION", "label_propagation_from_config",
           "check_label_propagation_config", "build_label_propagation"]

logger = logging.getLogger(__name__)

#: The LABEL_PROPAGATION keys (:class:`LabelPropagationSettings`' fields): with ``KIND ""`` every
#: other key, the VFM's included, must keep its default (a key set without propagation would
#: change nothing and is refused). ``KIND`` is the switch: its section default ``""`` (off)
#: replaces the field's ``"lposs"``.
LABEL_PROPAGATION_SECTION = CONFIG_SECTIONS.register(KEY)(Section(LabelPropagationSettings, switch="KIND",
                                                                  defaults={"kind": ""}))
#: ``LABEL_PROPAGATION.VFM.*``, :class:`ProxyOptions`' keys with LPOSS's VFM as defaults
#: (models/lposs/lposs.py torch.hub dino_vitb16, its last block's values: enc_type_feats "v")
#: in place of the field defaults (no name, "none", "tokens").
VFM_SECTION = CONFIG_SECTIONS.register(f"{KEY}.VFM")(Section(
    ProxyOptions, defaults={"name": "vit_base_patch16_224.dino", "weights": "timm", "feature": "values"}))


def _node(cfg):
    try:
        return cfg.MODEL.SPARSECLIP.LABEL_PROPAGATION
    except (AttributeError, KeyError) as e:
        raise ValueError(f"config lacks {KEY} ({e}); call sparseclip_d2.add_sparseclip_config(cfg) first") from e


def label_propagation_from_config(cfg) -> Optional[Tuple[LabelPropagationSettings, ProxyOptions]]:
    """``(settings, VFM options)`` of ``cfg``, validated, or None when ``KIND`` is ``""``."""
    n = _node(cfg)
    kind = str(n.KIND).strip().lower()
    if not kind:
        return None
    s = check_label_propagation_settings(LabelPropagationSettings(
        kind=kind, k=n.K, sigma=n.SIGMA, pix_dist_pow=n.PIX_DIST_POW, gamma=n.GAMMA, alpha=n.ALPHA, tol=n.TOL,
        max_iter=n.MAX_ITER, tau=n.TAU, radius=n.RADIUS, reduce_synonyms=n.REDUCE_SYNONYMS))
    v = n.VFM
    if not v.NAME:
        raise ValueError(f"{KEY}.KIND = {kind!r} needs a VFM: {KEY}.VFM.NAME is empty; valid: a timm ViT name such "
                         "as vit_base_patch16_224.dino (LPOSS's DINO ViT-B/16)")
    opts = check_proxy_options(ProxyOptions(name=v.NAME, weights=v.WEIGHTS, layer=v.LAYER, feature=v.FEATURE,
                                            input_size=v.INPUT_SIZE, pos_embed_interp=v.POS_EMBED_INTERP,
                                            precision=v.PRECISION), f"{KEY}.VFM")
    return s, opts


def check_label_propagation_config(cfg) -> Optional[Tuple[LabelPropagationSettings, ProxyOptions]]:
    """Validate the LABEL_PROPAGATION keys (and the paths they cannot join) before any model is built.

    Raises:
        ValueError: a key set while ``KIND`` is ``""``; a bad value (naming the key and the valid
            choices); ``KIND`` with the FG-OVD META_ARCH or ``INPUT_SIZE -1`` without the sliding
            window (the stages it cannot join: ``methods/lposs/stage.py``, checked by ``methods.check_parts``).
        FileNotFoundError: ``VFM.WEIGHTS`` names a missing file (key and path in the message).
    """
    n = _node(cfg)
    if not isinstance(n.KIND, str):
        raise ValueError(f"{KEY}.KIND = {n.KIND!r} is invalid; valid: '' (off), {', '.join(PROPAGATION_KINDS)}")
    got = label_propagation_from_config(cfg)
    if got is None:
        refuse_keys_while_off(
            changed_section_keys(n, LABEL_PROPAGATION_SECTION, KEY)
            + changed_section_keys(n.VFM, VFM_SECTION, f"{KEY}.VFM"),
            f"{KEY}.KIND is ''", f"set KIND (valid: {', '.join(PROPAGATION_KINDS)}) or leave these keys at their defaults")
        return None
    if cfg.MODEL.META_ARCHITECTURE == "SparseCLIPFGOVD":
        raise ValueError(f"{KEY}.KIND = {got[0].kind!r} cannot be combined with MODEL.META_ARCHITECTURE = "
                         "'SparseCLIPFGOVD' (the propagated scores replace that path's); valid: SparseCLIP")
    if got[1].input_size == -1 and not cfg.TEST.SLIDING_WINDOW.ENABLED:
        raise ValueError(f"{KEY}.VFM.INPUT_SIZE = -1 (each window resized to the crop) needs "
                         "TEST.SLIDING_WINDOW.ENABLED True; or give INPUT_SIZE in pixels")
    return got


def build_label_propagation(cfg, device, clip_mean, clip_std) -> Optional[LabelPropagation]:
    """The :class:`LabelPropagation` of ``cfg`` with its VFM built on ``device`` (random weights
    logged loudly), or None when ``KIND`` is ``""``. ``clip_mean`` / ``clip_std``: the 0-1 RGB
    normalisation of the images the windows come from."""
    got = check_label_propagation_config(cfg)
    if got is None:
        return None
    settings, opts = got
    vfm = build_proxy(opts, device=device, key=f"{KEY}.VFM")
    return LabelPropagation(settings, vfm, clip_mean, clip_std)
