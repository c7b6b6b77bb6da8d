"""Layer 2 of sparseclip_d2: open_clip models, the dense encoder and the text classifier.

torch + open_clip only (no detectron2 import).
"""
from .builder import PRECISIONS, VISION_ACTS, build_clip, get_tokenizer, is_random_weights, vision_tower_variant
from .definitions import load_definitions, mix_definitions
from .encoder import POS_EMBED_INTERP_MODES, DenseCLIPEncoder, EncoderPass, interpolate_pos_embed
from .model_configs import LOCAL_MODEL_CONFIGS, TINY_MODEL_NAME, register_local_model_config
from .spec import (PRESETS, SETTINGS, SPEC_KEYS, AttentionSpec, CalibrationOptions, FeedbackOptions, MixOptions,
                   ParallelOptions, describe_spec, parse_attention_spec, parse_attention_specs)
from .templates import OPENAI_IMAGENET_TEMPLATES, TEMPLATE_SETS, get_templates
from .text import TextClassifier, max_over_synonyms, split_synonyms, text_cache_dir, weights_fingerprint

__all__ = [
    "AttentionSpec",
    "MixOptions",
    "ParallelOptions",
    "FeedbackOptions",
    "CalibrationOptions",
    "PRESETS",
    "SETTINGS",
    "SPEC_KEYS",
    "parse_attention_spec",
    "parse_attention_specs",
    "describe_spec",
    "build_clip",
    "is_random_weights",
    "get_tokenizer",
    "PRECISIONS",
    "vision_tower_variant",
    "VISION_ACTS",
    "DenseCLIPEncoder",
    "EncoderPass",
    "load_definitions",
    "mix_definitions",
    "interpolate_pos_embed",
    "POS_EMBED_INTERP_MODES",
    "LOCAL_MODEL_CONFIGS",
    "TINY_MODEL_NAME",
    "register_local_model_config",
    "TextClassifier",
    "get_templates",
    "max_over_synonyms",
    "split_synonyms",
    "text_cache_dir",
    "weights_fingerprint",
    "TEMPLATE_SETS",
    "OPENAI_IMAGENET_TEMPLATES",
]
