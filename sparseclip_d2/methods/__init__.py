"""The parts of the one inference pipeline (see :mod:`.registry`): second-backbone encoders, logit
heads, post-processing stages and per-image side inputs, registered by importing their family
folders below. A family folder holds one method's parts, settings and keys; the maths they share
stays in the layers below (``attention/``, ``clip/``, ``proxy/``, ``propagation/``, ``dense/``),
which name no method. :mod:`.encoders` is the one dispatch over the encoders."""
from .registry import (CONFIG_SECTIONS, ENCODERS, LOGIT_HEADS, SIDE_INPUTS, STAGE_KINDS, STAGES, EncoderFamily,
                       ImageInputs, LogitHead, PipelinePlan, SideInput, Stage, check_parts)
from .plan import plan_from_config
from . import encoders, cosine, pamr  # noqa: F401  (registration)
from . import proxyclip, fsa, cass, trident, corrclip, lposs, itaclip, cliptrase, clip_surgery, pearl  # noqa: F401

__all__ = ["LOGIT_HEADS", "STAGES", "SIDE_INPUTS", "ENCODERS", "CONFIG_SECTIONS", "STAGE_KINDS", "LogitHead", "Stage",
           "SideInput", "EncoderFamily", "ImageInputs", "PipelinePlan", "check_parts", "plan_from_config"]
