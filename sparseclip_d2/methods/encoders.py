"""The encoder a config builds on the second backbone (``MODEL.SPARSECLIP.PROXY.*``): the one
dispatch over :data:`~.registry.ENCODERS`, the checks every such encoder shares, and what the
encoder will need, read before it is built. The families' own keys and checks are in their
folders; this module names none of them."""
from typing import List, Optional, Tuple

from ..clip.spec import AttentionSpec
from ..common.keys import key_defaults
from ..common.needs import Needs
from ..proxy.attention import check_beta_gamma
from ..proxy.keys import KEY, PROXY_SECTION, proxy_node, proxy_options_from_config
from ..proxy.second_backbone import PROXY_MODELS, ProxyOptions, build_proxy
from .registry import CONFIG_SECTIONS, ENCODERS

__all__ = ["check_proxy_config", "chosen_encoder", "build_proxy_encoder", "encoder_needs_from_config"]

CONFIG_SECTIONS.register(KEY)(PROXY_SECTION)


def _families() -> List[Tuple[str, type]]:
    return [(name, cls) for name, cls in ENCODERS if not cls.default]


def _default() -> Tuple[str, type]:
    defaults = [(name, cls) for name, cls in ENCODERS if cls.default]
    if len(defaults) != 1:
        raise RuntimeError(f"exactly one default second-backbone encoder must be registered, got "
                           f"{[n for n, _ in defaults]}")
    return defaults[0]


def chosen_encoder(cfg) -> Tuple[str, type, object]:
    """``(registered name, family, validated settings)`` of the encoder family a config with a
    proxy builds: the one switched on, else the default. Every family's keys are validated (a key
    set while its family is off is refused); two families switched on are refused."""
    on = [(name, cls, cls.settings_from_config(cfg)) for name, cls in _families()]
    on = [t for t in on if t[2] is not None]
    if len(on) > 1:
        raise ValueError(f"{on[0][1].key} and {on[1][1].key} are two different last blocks; enable one")
    if on:
        return on[0]
    name, cls = _default()
    return name, cls, cls.settings_from_config(cfg)


def check_proxy_config(cfg) -> Optional[ProxyOptions]:
    """Validate the PROXY keys (and what they need of the rest of ``cfg``) before any model is built.

    Raises:
        ValueError: a PROXY key set while ``NAME`` is ``""``; a bad value (naming the key and the
            valid choices); what the chosen family refuses (its ``check``); the FG-OVD META_ARCH and
            ``TEST.ATTENTION_STATS.ENABLED`` (both assume CLIP's grid); ``INPUT_SIZE -1`` without the
            sliding window; SAM without ``INPUT_SIZE 1024``.
        FileNotFoundError: ``PROXY.WEIGHTS`` names a missing file (key and path in the message).
    """
    p = proxy_node(cfg)
    opts = proxy_options_from_config(cfg)
    if opts is None:
        changed = [f"{KEY}.{k} = {p[k]!r}" for k, v in key_defaults(PROXY_SECTION).items() if p[k] != v]
        changed += [f"{cls.key} = True" for _, cls in _families() if cls.switched_on(cfg)]
        if changed:
            raise ValueError(f"{', '.join(changed)} changes nothing without a proxy backbone: set {KEY}.NAME (valid: "
                             f"{', '.join(PROXY_MODELS)}) or leave these keys at their defaults")
        for _, cls in _families():
            cls.settings_from_config(cfg)  # refuses a family's keys set while it is off
        return None
    check_beta_gamma(p.BETA, p.GAMMA, KEY)
    _, family, settings = chosen_encoder(cfg)
    family.check(cfg, opts, settings)
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


def build_proxy_encoder(cfg, visual, device, *, pos_embed_interp: str, attn_pool_dense: str):
    """The encoder of ``cfg`` around ``visual`` built by the chosen family, with the proxy built on
    ``device`` (random weights logged loudly) and the spec of ``cfg``."""
    opts = check_proxy_config(cfg)
    if opts is None:
        raise ValueError(f"{KEY}.NAME is empty: no proxy encoder to build")
    _, family, settings = chosen_encoder(cfg)
    proxy = build_proxy(opts, device=device, key=KEY)
    sw = cfg.TEST.SLIDING_WINDOW
    return family.build(cfg, visual, AttentionSpec.from_config(cfg), proxy, settings, device=device,
                        crop_size=sw.CROP_SIZE if sw.ENABLED else None, pos_embed_interp=pos_embed_interp,
                        attn_pool_dense=attn_pool_dense)


def encoder_needs_from_config(cfg) -> Tuple[Needs, str]:
    """``(Needs, key)``: what the encoder the config builds will need besides the windows (its
    family's declaration, read before it is built) and the key that chooses it."""
    p = proxy_node(cfg)
    if p.NAME:
        for _, cls in _families():
            if cls.switched_on(cfg) and cls.needs != Needs():
                return cls.needs, cls.key
    if cfg.MODEL.SPARSECLIP.FEEDBACK.ENABLED:
        return Needs(first_segmentation=True), "MODEL.SPARSECLIP.FEEDBACK.ENABLED"
    return Needs(), (f"{KEY}.NAME" if p.NAME else "the CLIP encoder")
