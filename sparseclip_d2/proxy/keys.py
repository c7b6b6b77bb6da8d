"""Reading and checking ``MODEL.SPARSECLIP.PROXY.*`` (duck-typed config; no detectron2 import)."""
import logging
from typing import Optional

from ..clip.spec import AttentionSpec
from ..common.keys import Key, Section, changed_section_keys, key_defaults, refuse_keys_while_off
from .attention import check_beta_gamma
from .second_backbone import PROXY_MODELS, ProxyOptions, build_proxy, check_proxy_options
from .proxyclip import ProxyCLIPEncoder, check_proxy_spec
from .fsa import FSAEncoder, FSASettings, check_fsa_settings
from .cass import CASSEncoder, CASSSettings, check_cass_settings, check_cass_spec
from .corrclip import CorrCLIPEncoder, CorrCLIPSettings, check_corrclip_settings

__all__ = ["PROXY_SECTION", "FSA_SECTION", "proxy_options_from_config", "fsa_settings_from_config",
           "check_proxy_config", "build_proxy_encoder", "CASS_SECTION", "cass_settings_from_config",
           "CORRCLIP_SECTION", "corrclip_settings_from_config"]

logger = logging.getLogger(__name__)

KEY = "MODEL.SPARSECLIP.PROXY"
#: The PROXY keys (:class:`ProxyOptions`' fields, then ProxyCLIP's score keys): with ``NAME ""``
#: every other key must keep its default (a key set without a proxy would change nothing and is
#: refused). ``NAME`` is the switch: its section default ``""`` (off) stands for the field's
#: missing one.
PROXY_SECTION = Section(ProxyOptions, switch="NAME", defaults={"name": ""}, after=(
    Key("BETA", 1.2, "ProxyCLIP's scores (S - BETA * mean S) * GAMMA, negatives -> -inf, then ATTENTION.NORMALIZER "
                     "(mc-lan/ProxyCLIP proxyclip_segmentor.py defaults beta=1.2, gamma=3.0)."),
    Key("GAMMA", 3.0, "See BETA.")))
#: ``PROXY.FSA.*``: ``ENABLED`` then :class:`FSASettings`' keys; with ``ENABLED False`` the others
#: must keep their defaults. The same holds for CASS and CORRCLIP below.
FSA_SECTION = Section(FSASettings, switch="ENABLED", before=(Key("ENABLED", False),))
CASS_SECTION = Section(CASSSettings, switch="ENABLED", before=(Key("ENABLED", False),))
CORRCLIP_SECTION = Section(CorrCLIPSettings, switch="ENABLED", before=(Key("ENABLED", False),))


def proxy_options_from_config(cfg) -> Optional[ProxyOptions]:
    """The validated :class:`ProxyOptions` of ``cfg``, or None when ``PROXY.NAME`` is ``""``."""
    p = _node(cfg)
    if not p.NAME:
        return None
    return check_proxy_options(ProxyOptions(
        name=p.NAME, weights=p.WEIGHTS, layer=p.LAYER, feature=p.FEATURE, input_size=p.INPUT_SIZE,
        pos_embed_interp=p.POS_EMBED_INTERP, precision=p.PRECISION), KEY)


def _node(cfg):
    try:
        return cfg.MODEL.SPARSECLIP.PROXY
    except (AttributeError, KeyError) as e:
        raise ValueError(f"config lacks {KEY} ({e}); call sparseclip_d2.add_sparseclip_config(cfg) first") from e


def fsa_settings_from_config(cfg) -> Optional[FSASettings]:
    """The validated :class:`~.fsa.FSASettings` of ``cfg``, or None when ``PROXY.FSA.ENABLED`` is
    False (then every other ``PROXY.FSA`` key must keep its default)."""
    f = _node(cfg).FSA
    if not f.ENABLED:
        refuse_keys_while_off(changed_section_keys(f, FSA_SECTION, f"{KEY}.FSA"), f"{KEY}.FSA.ENABLED is False",
                              "enable FSA or leave these keys at their defaults")
        return None
    return check_fsa_settings(FSASettings(top_p=f.TOP_P, lamda=f.LAMBDA, patch_scale=f.PATCH_SCALE,
                                          uniform_scale=f.UNIFORM_SCALE, normalizer=str(f.NORMALIZER).strip().lower()),
                              f"{KEY}.FSA")


def cass_settings_from_config(cfg) -> Optional[CASSSettings]:
    """The validated :class:`~.cass.CASSSettings` of ``cfg``, or None when ``PROXY.CASS.ENABLED``
    is False (then every other ``PROXY.CASS`` key must keep its default)."""
    c = _node(cfg).CASS
    if not isinstance(c.ENABLED, bool):
        raise ValueError(f"{KEY}.CASS.ENABLED = {c.ENABLED!r} is invalid; valid: True, False")
    if not c.ENABLED:
        refuse_keys_while_off(changed_section_keys(c, CASS_SECTION, f"{KEY}.CASS"), f"{KEY}.CASS.ENABLED is False",
                              "enable CASS or leave these keys at their defaults")
        return None
    scale = c.SINGULAR_SCALE
    if not isinstance(scale, (list, tuple)) or len(scale) != 2:
        raise ValueError(f"{KEY}.CASS.SINGULAR_SCALE = {scale!r} is invalid; valid: [low, high], two numbers >= 0 "
                         "(upstream [0.5, 1.5]; [1.0, 1.0] leaves the singular values as they are)")
    return check_cass_settings(CASSSettings(
        matching=c.MATCHING, k_eigen=c.K_EIGEN, scale_factor=c.SCALE_FACTOR, rank=c.RANK, svd=c.SVD, seed=c.SEED,
        singular_low=scale[0], singular_high=scale[1], key_precision=c.KEY_PRECISION, input=c.INPUT), f"{KEY}.CASS")
def corrclip_settings_from_config(cfg) -> Optional[CorrCLIPSettings]:
    """The validated :class:`~.corrclip.CorrCLIPSettings` of ``cfg``, or None when
    ``PROXY.CORRCLIP.ENABLED`` is False (then every other ``PROXY.CORRCLIP`` key must keep its
    default). ``FileNotFoundError`` names ``MASK_DIR`` and the path when it is not a directory."""
    c = _node(cfg).CORRCLIP
    if not isinstance(c.ENABLED, bool):
        raise ValueError(f"{KEY}.CORRCLIP.ENABLED = {c.ENABLED!r} is invalid; valid: True, False")
    if not c.ENABLED:
        refuse_keys_while_off(changed_section_keys(c, CORRCLIP_SECTION, f"{KEY}.CORRCLIP"),
                              f"{KEY}.CORRCLIP.ENABLED is False", "enable CorrCLIP or leave these keys at their defaults")
        return None
    return check_corrclip_settings(CorrCLIPSettings(
        mask_dir=c.MASK_DIR, tau=c.TAU, spatial_weight=c.SPATIAL_WEIGHT, semantic_weight=c.SEMANTIC_WEIGHT,
        num_spatial=c.NUM_SPATIAL, dbscan_eps=c.DBSCAN_EPS, dbscan_min_samples=c.DBSCAN_MIN_SAMPLES,
        restriction=str(c.RESTRICTION).strip().lower(), mode_vote=c.MODE_VOTE), f"{KEY}.CORRCLIP")


def _check_corrclip_paths(cfg) -> None:
    """What CorrCLIP's per-image path (``methods/corrclip.py``) cannot join."""
    sc = cfg.MODEL.SPARSECLIP
    bad = [(on, key, valid) for on, key, valid in (
        (sc.PROXY.FSA.ENABLED, f"{KEY}.FSA.ENABLED", "False"),
        (sc.PROXY.CASS.ENABLED, f"{KEY}.CASS.ENABLED", "False"),
        (sc.PROXY.TRIDENT.ENABLED, f"{KEY}.TRIDENT.ENABLED", "False"),
        (cfg.TEST.TTA.MODE, "TEST.TTA.MODE", "''"),
        (sc.FEATURE_SURGERY.ENABLED, "MODEL.SPARSECLIP.FEATURE_SURGERY.ENABLED", "False"),
        (sc.FEEDBACK.ENABLED, "MODEL.SPARSECLIP.FEEDBACK.ENABLED", "False"),
        (sc.CLS_LOGIT_PRODUCT, "MODEL.SPARSECLIP.CLS_LOGIT_PRODUCT", "False"),
        (sc.LABEL_CLOSING, "MODEL.SPARSECLIP.LABEL_CLOSING", "0"),
        (sc.BLOCK.RESIDUAL, "MODEL.SPARSECLIP.BLOCK.RESIDUAL", "False"),
        (sc.BLOCK.FFN, "MODEL.SPARSECLIP.BLOCK.FFN", "False"),
        (sc.ATTENTION.NUM_LAYERS != 1, "MODEL.SPARSECLIP.ATTENTION.NUM_LAYERS", "1")) if on]
    if bad:
        on, key, valid = bad[0]
        raise ValueError(f"{KEY}.CORRCLIP.ENABLED True cannot be combined with {key} = {_get(cfg, key)!r} (CorrCLIP "
                         f"encodes each window with its region masks and sums three branches after the final norm); "
                         f"valid: {key} {valid}")
    defaults = key_defaults(PROXY_SECTION)
    for k in ("BETA", "GAMMA"):
        if sc.PROXY[k] != defaults[k]:
            raise ValueError(f"{KEY}.{k} = {sc.PROXY[k]!r} changes nothing with {KEY}.CORRCLIP.ENABLED (CorrCLIP's "
                             f"scores are the cosine x CORRCLIP.TAU within regions); valid: {defaults[k]}")
    if cfg.MODEL.META_ARCHITECTURE != "SparseCLIP":
        raise ValueError(f"{KEY}.CORRCLIP.ENABLED True needs MODEL.META_ARCHITECTURE SparseCLIP (its region masks are "
                         f"read per image there), got {cfg.MODEL.META_ARCHITECTURE!r}")


def _get(cfg, dotted: str):
    node = cfg
    for part in dotted.split("."):
        node = node[part]
    return node


def check_proxy_config(cfg) -> Optional[ProxyOptions]:
    """Validate the PROXY keys (and what they need of the rest of ``cfg``) before any model is built.

    Raises:
        ValueError: a PROXY key set while ``NAME`` is ``""``; a bad value (naming the key and the
            valid choices); an attention spec the proxy block replaces (:func:`check_proxy_spec`);
            ``TEST.ATTENTION_STATS.ENABLED`` and the FG-OVD META_ARCH (both assume CLIP's grid); ``INPUT_SIZE -1``
            without the sliding window; SAM without ``INPUT_SIZE 1024``.
        FileNotFoundError: ``PROXY.WEIGHTS`` names a missing file (key and path in the message).
    """
    p = _node(cfg)
    opts = proxy_options_from_config(cfg)
    if opts is None:
        changed = [f"{KEY}.{k} = {p[k]!r}" for k, v in key_defaults(PROXY_SECTION).items() if p[k] != v]
        if p.FSA.ENABLED:
            changed.append(f"{KEY}.FSA.ENABLED = True")
        if p.CASS.ENABLED:
            changed.append(f"{KEY}.CASS.ENABLED = True")
        else:
            cass_settings_from_config(cfg)  # refuses CASS keys set while CASS is off
        if p.TRIDENT.ENABLED:
            changed.append(f"{KEY}.TRIDENT.ENABLED = True")
        else:
            from .trident_keys import trident_settings_from_config

            trident_settings_from_config(cfg)  # refuses TRIDENT keys set while it is off
        if p.CORRCLIP.ENABLED:
            changed.append(f"{KEY}.CORRCLIP.ENABLED = True")
        if changed:
            raise ValueError(f"{', '.join(changed)} changes nothing without a proxy backbone: set {KEY}.NAME (valid: "
                             f"{', '.join(PROXY_MODELS)}) or leave these keys at their defaults")
        return None
    check_beta_gamma(p.BETA, p.GAMMA, KEY)
    from .trident_keys import check_trident_config

    check_trident_config(cfg, opts)  # PROXY.TRIDENT.*
    if fsa_settings_from_config(cfg) is not None:
        for bad, why in ((cfg.TEST.TTA.MODE, f"TEST.TTA.MODE = {cfg.TEST.TTA.MODE!r}"),
                         (cfg.MODEL.SPARSECLIP.FEATURE_SURGERY.ENABLED, "MODEL.SPARSECLIP.FEATURE_SURGERY.ENABLED")):
            if bad:
                raise ValueError(f"{why} with {KEY}.FSA.ENABLED: FSA's last block needs the class texts, which that "
                                 "path does not pass to the encoder; turn one of them off")
    cass = cass_settings_from_config(cfg)
    if cass is not None:
        for other in ("FSA", "TRIDENT", "CORRCLIP"):
            if p[other].ENABLED:
                raise ValueError(f"{KEY}.CASS.ENABLED and {KEY}.{other}.ENABLED are two different last blocks; "
                                 "enable one")
        if opts.feature != "keys" or opts.name.startswith("samvit"):
            raise ValueError(f"{KEY}.CASS.ENABLED reads the proxy's keys: {KEY}.FEATURE = {opts.feature!r} with NAME "
                             f"{opts.name!r} is invalid; valid: FEATURE keys of a timm ViT (upstream DINO B/8)")
        defaults = key_defaults(PROXY_SECTION)
        changed = [f"{KEY}.{k} = {p[k]!r}" for k in ("INPUT_SIZE", "BETA", "GAMMA") if p[k] != defaults[k]]
        if changed:
            raise ValueError(f"{', '.join(changed)} changes nothing with {KEY}.CASS.ENABLED (CASS has its own proxy "
                             f"input, {KEY}.CASS.INPUT, and no ProxyCLIP scores); leave them at their defaults")
        check_cass_spec(AttentionSpec.from_config(cfg, warn=False))
    else:
        check_proxy_spec(AttentionSpec.from_config(cfg, warn=False))
    if corrclip_settings_from_config(cfg) is not None:
        _check_corrclip_paths(cfg)
    if cfg.MODEL.META_ARCHITECTURE == "SparseCLIPFGOVD":
        raise ValueError(f"MODEL.META_ARCHITECTURE SparseCLIPFGOVD with {KEY}.NAME {opts.name!r}: its RoIAlign maps "
                         "boxes with CLIP's patch stride, the proxy block's features lie on the proxy's grid; not "
                         "supported yet (use the SparseCLIP META_ARCH, or no proxy)")
    if cfg.TEST.ATTENTION_STATS.ENABLED:
        raise ValueError(f"TEST.ATTENTION_STATS.ENABLED with {KEY}.NAME {opts.name!r}: the attention statistics map "
                         "CLIP's patch grid, the proxy block attends on the proxy's; disable one of them")
    if opts.input_size == -1 and not cfg.TEST.SLIDING_WINDOW.ENABLED:
        raise ValueError(f"{KEY}.INPUT_SIZE = -1 (each window resized to the crop) needs "
                         "TEST.SLIDING_WINDOW.ENABLED True; or give INPUT_SIZE in pixels")
    if opts.name.startswith("samvit") and opts.input_size != 1024:
        raise ValueError(f"{KEY}.INPUT_SIZE = {opts.input_size} for {opts.name}: the SAM image encoder runs at its "
                         "native 1024 x 1024 (ProxyCLIP proxyclip_segmentor.py resizes to (1024, 1024)); valid: 1024")
    return opts


def build_proxy_encoder(cfg, visual, device, *, pos_embed_interp: str, attn_pool_dense: str) -> ProxyCLIPEncoder:
    """The :class:`ProxyCLIPEncoder` of ``cfg`` around ``visual`` (an :class:`~.fsa.FSAEncoder`
    with ``PROXY.FSA.ENABLED``): the proxy built on ``device`` (random weights logged loudly),
    the spec of ``cfg``, ``PROXY.BETA`` / ``GAMMA``, ``PROXY.FSA.*``."""
    opts = check_proxy_config(cfg)
    if opts is None:
        raise ValueError(f"{KEY}.NAME is empty: no proxy encoder to build")
    p = _node(cfg)
    fsa = fsa_settings_from_config(cfg)
    proxy = build_proxy(opts, device=device, key=KEY)
    sw = cfg.TEST.SLIDING_WINDOW
    kw = dict(beta=p.BETA, gamma=p.GAMMA, crop_size=sw.CROP_SIZE if sw.ENABLED else None,
              pos_embed_interp=pos_embed_interp, attn_pool_dense=attn_pool_dense)
    cass = cass_settings_from_config(cfg)
    if cass is not None:
        return CASSEncoder(visual, AttentionSpec.from_config(cfg), proxy, cass=cass, pos_embed_interp=pos_embed_interp,
                           attn_pool_dense=attn_pool_dense)
    if p.TRIDENT.ENABLED:  # Trident (proxy/trident.py): windows spliced, then SAM's global aggregation
        from .trident import TridentEncoder
        from .trident_keys import build_trident_sam, trident_settings_from_config

        return TridentEncoder(visual, AttentionSpec.from_config(cfg), proxy, sam=build_trident_sam(cfg, device),
                              settings=trident_settings_from_config(cfg), **kw)
    if fsa is not None:
        return FSAEncoder(visual, AttentionSpec.from_config(cfg), proxy, fsa=fsa, **kw)
    corr = corrclip_settings_from_config(cfg)
    if corr is not None:
        kw.pop("beta"), kw.pop("gamma")
        return CorrCLIPEncoder(visual, AttentionSpec.from_config(cfg), proxy, settings=corr, **kw)
    return ProxyCLIPEncoder(visual, AttentionSpec.from_config(cfg), proxy, **kw)


def encoder_needs_from_config(cfg):
    """``(Needs, key)``: what the encoder the config builds will need besides the windows (the
    class's own ``needs`` declaration, read before it is built) and the key that chooses it."""
    from ..common.needs import Needs
    from .corrclip import CorrCLIPEncoder
    from .fsa import FSAEncoder

    p = _node(cfg)
    if p.NAME and p.FSA.ENABLED:
        return FSAEncoder.needs, f"{KEY}.FSA.ENABLED"
    if p.NAME and p.CORRCLIP.ENABLED:
        return CorrCLIPEncoder.needs, f"{KEY}.CORRCLIP.ENABLED"
    if cfg.MODEL.SPARSECLIP.FEEDBACK.ENABLED:
        return Needs(first_segmentation=True), "MODEL.SPARSECLIP.FEEDBACK.ENABLED"
    return Needs(), (f"{KEY}.NAME" if p.NAME else "the CLIP encoder")
