"""Layer 1 of sparseclip_d2: configurable attention in pure torch.

Score sources (:mod:`.sources`), row normalisers (:mod:`.normalizers`), additive priors
(:mod:`.priors`) are fvcore registries; :func:`attention_weights` combines them;
:func:`mix_attention` (:mod:`.mixing`) blends a block's weights with layers tapped earlier.
No open_clip or detectron2 import here.
"""
from .cosine import COSINE_TERMS, QKV_NORMS, check_cosine_source, cosine_attention_weights, adaptive_inverse_temperature
from .entmax import ALPHA_RANGE, alpha_entmax, check_alpha
from .feedback import FEEDBACK_PRECISIONS, blend_feedback, check_feedback_precision, feedback_prior, patch_labels
from .functional import SUM_MODES, apply_attention, attention_weights
from .mixing import check_mix_scale, check_mix_weight, mix_attention
from .normalizers import NORMALIZER_REGISTRY, get_normalizer, support_size
from .priors import PRIOR_REGISTRY, build_prior, get_prior
from .sources import SCORE_SOURCE_REGISTRY, SOURCE_ALIASES, canonical_source, get_score_source, paper_source_name, parse_source
from .nucleus import TOP_P_DEFAULT, check_top_p, nucleus_mask, nucleus_prune  # registers the top_p normaliser
from .procrustes import PROCRUSTES_SOLVERS, check_procrustes_options, polar_factor, procrustes_scores
from .outliers import OUTLIER_DETECTOR_REGISTRY, detect_outliers, lof_scores, repair_outliers
from .similarity import cosine_similarity_map, similarity_aggregate, similarity_scores

__all__ = [
    "alpha_entmax",
    "ALPHA_RANGE",
    "check_alpha",
    "attention_weights",
    "apply_attention",
    "SUM_MODES",
    "mix_attention",
    "check_mix_weight",
    "check_mix_scale",
    "SCORE_SOURCE_REGISTRY",
    "NORMALIZER_REGISTRY",
    "PRIOR_REGISTRY",
    "SOURCE_ALIASES",
    "get_score_source",
    "get_normalizer",
    "get_prior",
    "build_prior",
    "parse_source",
    "canonical_source",
    "paper_source_name",
    "support_size",
    "cosine_attention_weights",
    "adaptive_inverse_temperature",
    "check_cosine_source",
    "COSINE_TERMS",
    "QKV_NORMS",
    "FEEDBACK_PRECISIONS",
    "blend_feedback",
    "check_feedback_precision",
    "feedback_prior",
    "patch_labels",
    "TOP_P_DEFAULT",
    "check_top_p",
    "nucleus_mask",
    "nucleus_prune",
    "PROCRUSTES_SOLVERS",
    "check_procrustes_options",
    "polar_factor",
    "procrustes_scores",
    "OUTLIER_DETECTOR_REGISTRY",
    "detect_outliers",
    "lof_scores",
    "repair_outliers",
    "cosine_similarity_map",
    "similarity_aggregate",
    "similarity_scores",
]
