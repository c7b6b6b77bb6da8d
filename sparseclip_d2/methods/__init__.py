"""The parts of the one inference pipeline (see :mod:`.registry`): logit heads, post-processing
stages and per-image side inputs, registered by importing their family modules below. A family
module holds a method's parts; the maths they call stays in the layers below (``attention/``,
``clip/``, ``proxy/``, ``propagation/``, ``modeling/``)."""
from .registry import (LOGIT_HEADS, SIDE_INPUTS, STAGE_KINDS, STAGES, ImageInputs, LogitHead, PipelinePlan,
                       SideInput, Stage, check_parts, plan_from_config)
from . import cosine, itaclip, clip_surgery, cliptrase, cass, corrclip, pamr, lposs  # noqa: F401  (registration)

__all__ = ["LOGIT_HEADS", "STAGES", "SIDE_INPUTS", "STAGE_KINDS", "LogitHead", "Stage", "SideInput", "ImageInputs",
           "PipelinePlan", "check_parts", "plan_from_config"]
