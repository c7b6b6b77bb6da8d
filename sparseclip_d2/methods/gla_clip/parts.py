"""The ``window_set`` stage: the window loop with every window of the image in one encoder call, so
that the window-set last block (:class:`.encoder.WindowSetEncoder`) sees them all
(2btlFe/GLA-CLIP @ ba74915 ``gla_clip_segmentor.py forward_kv_expansion``: every crop cut first,
``torch.cat``, one ``forward_feature``)."""
from ...dense.windows import window_grid, window_logits
from ..registry import STAGES, Stage
from .keys import KEY, window_set_settings_from_config

__all__ = ["WindowSetStage"]


@STAGES.register("window_set")
class WindowSetStage(Stage):
    """Replaces the window loop: one batch holding all windows of the image (then merged as usual:
    logits upsampled to the padded window, cropped, summed, divided by the count map)."""

    kind = "windows"
    key = f"{KEY}.ENABLED"
    records_attention = False
    excludes = {"label_propagation": "both replace the window loop"}

    @classmethod
    def settings_from_config(cls, cfg):
        return window_set_settings_from_config(cfg)

    @classmethod
    def from_config(cls, cfg, clip):
        return cls() if cls.settings_from_config(cfg) is not None else None

    def forward(self, model, inputs, window_logits_fn):
        H, W = inputs.image.shape[-2:]
        windows = window_grid(H, W, model.crop_size, model.stride)
        # the windows' patch logits (rows made in bands on demand, as the window loop's)
        logits = window_logits(inputs.image, window_logits_fn, patch_size=int(model.encoder.patch_size),
                               crop_size=model.crop_size, stride=model.stride, batch_size=len(windows),
                               patch_remainder=model.patch_remainder)
        return logits, inputs.class_index

    def describe(self) -> str:
        return "all windows of the image encoded together"
