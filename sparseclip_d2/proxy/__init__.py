"""A second frozen backbone (a vision foundation model: DINO, DINOv2, MAE, SAM) whose features
give the last CLIP block its attention (ProxyCLIP and the methods built on it).

- :mod:`.second_backbone`: :class:`ProxyBackbone` built through timm, weights from a file, timm's tag
  or none (random); :func:`to_proxy_input` (CLIP normalisation -> the proxy's).
- :mod:`.attention`: pure-torch parts: :func:`proxy_cosine_scores` (ProxyCLIP's score source),
  :func:`resample_grid` (CLIP's values on the proxy grid).
- :mod:`.proxyclip`: :class:`ProxyCLIPEncoder`, the ``DenseCLIPEncoder`` with the proxy last block.
- :mod:`.fsa`: FSA's feedback attention on that block (:class:`FSAEncoder`, :func:`kl_similarity`,
  :func:`fsa_scores`, :func:`fsa_ensemble`).
- :mod:`.corrclip`: CorrCLIP's parts (:data:`REGION_RESTRICTION_REGISTRY`, :func:`restrict_to_regions`,
  :func:`merge_regions`, :func:`region_mode_labels`, ``.npz`` masks) and :class:`CorrCLIPEncoder`.
- :mod:`.keys`: ``MODEL.SPARSECLIP.PROXY.*`` read and validated (no detectron2 import).

See docs/architecture.md ("The second backbone").
"""
from .attention import check_beta_gamma, proxy_cosine_scores, resample_grid
from .second_backbone import (PROXY_FEATURES, PROXY_MODELS, ProxyBackbone, ProxyOptions, build_proxy,
                              check_proxy_options, load_proxy_state_dict, to_proxy_input)
from .proxyclip import ProxyCLIPEncoder, check_proxy_spec
from .fsa import FSAEncoder, FSASettings, check_fsa_settings, fsa_ensemble, fsa_scores, kl_similarity
from .corrclip import (REGION_RESTRICTION_REGISTRY, CorrCLIPEncoder, CorrCLIPSettings, check_corrclip_settings,
                       load_region_mask, merge_regions, region_mode_labels, restrict_to_regions, write_region_mask)

__all__ = [
    "PROXY_FEATURES", "PROXY_MODELS", "ProxyBackbone", "ProxyOptions", "build_proxy", "check_proxy_options",
    "load_proxy_state_dict", "to_proxy_input", "proxy_cosine_scores", "resample_grid", "check_beta_gamma",
    "ProxyCLIPEncoder", "check_proxy_spec",
    "FSAEncoder", "FSASettings", "check_fsa_settings", "kl_similarity", "fsa_scores", "fsa_ensemble",
    "REGION_RESTRICTION_REGISTRY", "CorrCLIPEncoder", "CorrCLIPSettings", "check_corrclip_settings", "load_region_mask",
    "merge_regions", "region_mode_labels", "restrict_to_regions", "write_region_mask",
]
