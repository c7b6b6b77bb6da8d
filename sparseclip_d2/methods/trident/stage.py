"""The ``trident_grid`` stage: Trident's logits stay on SAM's grid until the output's own resize
(YuHengsss/Trident @ a93b346 ``trident.py`` ``get_trident_seg``: the logits on SAM's valid grid go
through one ``F.interpolate(logits, size=img_metas[0]['ori_shape'][:2], mode='bilinear')`` to the
image's original size). The generic window loop would first resize them to the working size and
the output map would resize that again: two bilinear steps, which differ from one by up to 4e-3
in a class probability (``voc_wide``, 336 x 504; docs/agreement/trident.md)."""
from ..registry import STAGES, Stage
from .keys import KEY

__all__ = ["TridentGridStage"]


@STAGES.register("trident_grid")
class TridentGridStage(Stage):
    """Replaces the window loop: the whole image in one call (the encoder windows it itself) and its
    logits on SAM's grid as they are, so that the output's bilinear resize takes them to the output
    size in one step."""

    kind = "windows"
    key = f"{KEY}.ENABLED"
    records_attention = False
    excludes = {"pamr": "upstream's PAMR runs on the logits at the image's size; these stay on SAM's grid"}

    @classmethod
    def settings_from_config(cls, cfg):
        return True if cfg.MODEL.SPARSECLIP.PROXY.TRIDENT.ENABLED else None

    @classmethod
    def from_config(cls, cfg, clip):
        return cls() if cls.settings_from_config(cfg) is not None else None

    def forward(self, model, inputs, window_logits_fn):
        # (1, S, h_s, w_s): the head's logits of the whole normalised image on SAM's grid
        return window_logits_fn(inputs.image[None])[0].float(), inputs.class_index

    def describe(self) -> str:
        return "Trident's logits kept on SAM's grid until the output's resize"
