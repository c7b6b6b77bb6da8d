"""The parts of the one inference pipeline (see :mod:`.registry`): second-backbone encoders, logit
heads, post-processing stages and per-image side inputs, registered by importing their family
folders below. A family folder holds one method's parts, settings and keys; the maths they share
stays in the layers below (``attention/``, ``clip/``, ``proxy/``, ``propagation/``, ``dense/``),
which name no method. :mod:`.encoders` is the one dispatch over the encoders. Each folder's
``upstream.py`` registers the method's entry in the timing benchmark against its upstream code
(:data:`.registry.UPSTREAM`); a method whose parts are all presets or generic has a folder for
that entry alone. The folders are found, not listed (:func:`family_folders`), and imported in
alphabetical order, which is also the order of the registries (the benchmark's list, the stages of
one kind)."""
import importlib
import pkgutil
from typing import List

from .registry import (CONFIG_SECTIONS, ENCODERS, LOGIT_HEADS, SIDE_INPUTS, STAGE_KINDS, STAGES, UPSTREAM,
                       EncoderFamily, ImageInputs, LogitHead, PipelinePlan, SideInput, Stage, UpstreamEntry,
                       check_parts)
from .plan import plan_from_config
from . import encoders, cosine, pamr  # noqa: F401  (registration of the generic parts)


def family_folders() -> List[str]:
    """The family folders (every sub-package of this one), in the order they are imported and so
    register their parts: alphabetical. A new method's folder is found here; no list names it."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if m.ispkg)


for _family in family_folders():
    importlib.import_module(f"{__name__}.{_family}")

__all__ = ["LOGIT_HEADS", "STAGES", "SIDE_INPUTS", "ENCODERS", "CONFIG_SECTIONS", "UPSTREAM", "STAGE_KINDS",
           "LogitHead", "Stage", "SideInput", "EncoderFamily", "UpstreamEntry", "ImageInputs", "PipelinePlan",
           "check_parts", "plan_from_config", "family_folders"]
