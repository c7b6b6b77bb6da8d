"""The parts of the one inference pipeline (see :mod:`.registry`): second-backbone encoders, logit
heads, post-processing stages and per-image side inputs, registered by importing their family
folders below. A family folder holds one method's parts, settings and keys; the maths they share
stays in the layers below (``attention/``, ``clip/``, ``proxy/``, ``propagation/``, ``dense/``),
which name no method. :mod:`.encoders` is the one dispatch over the encoders. Each folder's
``upstream.py`` registers the method's entry in the timing benchmark against its upstream code
(:data:`.registry.UPSTREAM`); a method whose parts are all presets or generic has a folder for
that entry alone."""
from .registry import (CONFIG_SECTIONS, ENCODERS, LOGIT_HEADS, SIDE_INPUTS, STAGE_KINDS, STAGES, UPSTREAM,
                       EncoderFamily, ImageInputs, LogitHead, PipelinePlan, SideInput, Stage, UpstreamEntry,
                       check_parts)
from .plan import plan_from_config
from . import encoders, cosine, pamr  # noqa: F401  (registration)
from . import proxyclip, fsa, cass, trident, corrclip, lposs, itaclip, cliptrase, clip_surgery, pearl  # noqa: F401
from . import gla_clip, talk2dino  # noqa: F401
from . import resclip, gem, scclip, sfp, sclip, clearclip, naclip, maskclip  # noqa: F401  (their upstream benchmark entries only)

__all__ = ["LOGIT_HEADS", "STAGES", "SIDE_INPUTS", "ENCODERS", "CONFIG_SECTIONS", "UPSTREAM", "STAGE_KINDS",
           "LogitHead", "Stage", "SideInput", "EncoderFamily", "UpstreamEntry", "ImageInputs", "PipelinePlan",
           "check_parts", "plan_from_config"]
