"""The plan of a config: which head and stages it switches on, validated with the encoder's needs
(:func:`~.registry.check_parts`) before any weight is loaded."""
from typing import Tuple

from ..common.needs import Needs
from .encoders import encoder_needs_from_config
from .registry import LOGIT_HEADS, STAGE_KINDS, STAGES, PipelinePlan, check_parts

__all__ = ["plan_from_config"]


def _head_classes():
    return {name: cls for name, cls in LOGIT_HEADS}


def _stage_classes():
    return {name: cls for name, cls in STAGES}


def plan_from_config(cfg) -> PipelinePlan:
    """Validate every head's and stage's keys and the combination of the parts switched on
    (:func:`check_parts` with the encoder's needs as far as the config tells them)."""
    heads = [(name, cls, cls.settings_from_config(cfg)) for name, cls in sorted(_head_classes().items())]
    chosen = [(name, cls, s) for name, cls, s in heads if s is not None and name != "cosine"]
    if len(chosen) > 1:
        (a, ca, _), (b, cb, _) = chosen[:2]
        raise ValueError(f"{ca.key} cannot be combined with {cb.key}: both compute the window logits (the {a!r} and "
                         f"{b!r} logit heads); turn one of them off")
    head = chosen[0] if chosen else [h for h in heads if h[0] == "cosine"][0]
    stages = []
    for kind in STAGE_KINDS:
        for name, cls in _stage_classes().items():
            if cls.kind == kind:
                s = cls.settings_from_config(cfg)
                if s is not None:
                    stages.append((name, s))
    plan = PipelinePlan(head[0], head[2], tuple(stages))
    check_parts(_config_encoder_needs(cfg), _head_classes()[plan.head], [_stage_classes()[n] for n, _ in stages],
                sliding_window=bool(cfg.TEST.SLIDING_WINDOW.ENABLED),
                patch_remainder=cfg.MODEL.SPARSECLIP.PATCH_REMAINDER,
                attention_stats=bool(cfg.TEST.ATTENTION_STATS.ENABLED))
    return plan


def _config_encoder_needs(cfg) -> Tuple[Needs, str]:
    """The encoder's needs as the config tells them before it is built, and the key naming it."""
    return encoder_needs_from_config(cfg)
