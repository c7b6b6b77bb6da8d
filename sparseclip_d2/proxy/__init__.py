"""A second frozen backbone (a vision foundation model: DINO, DINOv2, DINOv3, MAE, SAM) whose features
give the last CLIP block its attention, or build a patch graph. Generic: the methods built on it
live in ``sparseclip_d2/methods/`` (proxyclip, fsa, cass, trident, corrclip, lposs).

- :mod:`.second_backbone`: :class:`ProxyBackbone` built through timm, weights from a file, timm's tag
  or none (random); :func:`to_proxy_input` (CLIP normalisation -> the proxy's).
- :mod:`.attention`: pure-torch parts: :func:`proxy_cosine_scores` (the proxy's cosine score
  source), :func:`resample_grid` (CLIP's values on the proxy grid).
- :mod:`.region_partition`: a deterministic stand-in partition of an image into regions.

See docs/architecture.md ("The second backbone").
"""
from .attention import check_beta_gamma, proxy_cosine_scores, resample_grid
from .second_backbone import (PROXY_FEATURES, PROXY_MODELS, ProxyBackbone, ProxyOptions, build_proxy,
                              check_proxy_options, load_proxy_state_dict, to_proxy_input)

__all__ = [
    "PROXY_FEATURES", "PROXY_MODELS", "ProxyBackbone", "ProxyOptions", "build_proxy", "check_proxy_options",
    "load_proxy_state_dict", "to_proxy_input", "proxy_cosine_scores", "resample_grid", "check_beta_gamma",
]
