"""PEARL's text-aware Laplacian propagation as a logits stage any method can run
(``MODEL.SPARSECLIP.TLP.*``; the maths is :mod:`.propagation`)."""
from typing import Optional

import torch
import torch.nn.functional as F

from ...common.keys import Key, Section, switch_is_on
from ..registry import CONFIG_SECTIONS, STAGES, Stage
from .propagation import KEY, TLPSettings, check_tlp_settings, text_affinity, text_laplacian_propagation

__all__ = ["TLP_SECTION", "tlp_settings_from_config", "TextLaplacianStage"]

#: ``MODEL.SPARSECLIP.TLP``: ``ENABLED`` (PGSmall/PEARL @ c26062b ``eval.py --prop`` defaults to "off",
#: ``run.sh`` passes "on") then :class:`TLPSettings`' keys.
TLP_SECTION = CONFIG_SECTIONS.register(KEY)(Section(TLPSettings, switch="ENABLED", before=(
    Key("ENABLED", False, "Text-aware Laplacian propagation of the logits at the output size (PEARL's TLP, "
                          "pearl/prop.py; eval.py --prop off by default, run.sh on)"),)))


def tlp_settings_from_config(cfg) -> Optional[TLPSettings]:
    """The validated :class:`TLPSettings` of ``cfg``, or None when ``TLP.ENABLED`` is False (then every
    other ``TLP`` key must keep its default)."""
    try:
        n = cfg.MODEL.SPARSECLIP.TLP
    except (AttributeError, KeyError) as e:
        raise ValueError(f"config lacks {KEY} ({e}); call sparseclip_d2.add_sparseclip_config(cfg) first") from e
    if not switch_is_on(n, TLP_SECTION, KEY):
        return None
    return check_tlp_settings(TLPSettings(grid=n.GRID, text_temperature=n.TEXT_TEMPERATURE,
                                          diagonal_boost=n.DIAGONAL_BOOST, edge_constant=n.EDGE_CONSTANT,
                                          cg_steps=n.CG_STEPS, tau=n.TAU))


@STAGES.register("text_laplacian")
class TextLaplacianStage(Stage):
    """The synonym logits and the normalised image bilinearly resized to the output size
    (``align_corners=False``, as ``pearl_ovss.py`` ``predict``), divided by the logit scale (upstream
    propagates the unscaled cosines), propagated with the synonyms' text affinity, scaled back."""

    kind = "logits"
    key = f"{KEY}.ENABLED"

    def __init__(self, settings: TLPSettings):
        super().__init__()
        self.settings = check_tlp_settings(settings)

    @classmethod
    def settings_from_config(cls, cfg):
        return tlp_settings_from_config(cfg)

    @classmethod
    def from_config(cls, cfg, clip):
        s = cls.settings_from_config(cfg)
        return cls(s) if s is not None else None

    def forward(self, model, inputs, logits):
        text = inputs.text_emb
        if logits.shape[0] != text.shape[0]:
            raise ValueError(f"{self.key}: the logits have {logits.shape[0]} rows but there are {text.shape[0]} class "
                             "synonyms (a windows stage reduced the synonyms to classes first, e.g. "
                             "MODEL.SPARSECLIP.LABEL_PROPAGATION.REDUCE_SYNONYMS before_resize); the text affinity "
                             "needs one row per synonym: use REDUCE_SYNONYMS after_resize")
        size = (int(inputs.out_size[0]), int(inputs.out_size[1]))
        image = F.interpolate(inputs.image[None].float(), size=size, mode="bilinear", align_corners=False)
        full = F.interpolate(logits[None].float(), size=size, mode="bilinear", align_corners=False)
        S = text_affinity(text.float(), self.settings.text_temperature, self.settings.diagonal_boost)
        scale = float(model.logit_scale)
        return text_laplacian_propagation(image, full / scale, S, self.settings)[0] * scale

    def describe(self) -> str:
        s = self.settings
        return (f"text-aware Laplacian propagation (grid {s.grid}, {s.cg_steps} CG steps, tau {s.tau:g}, "
                f"text temperature {s.text_temperature:g}, diagonal boost {s.diagonal_boost:g}, "
                f"edge constant {s.edge_constant:g})")
