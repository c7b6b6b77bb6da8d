"""SCLIP's entry in the upstream timing benchmark (``tools/benchmark_methods.py``): its segmentor
(``clip_segmentor.py``, wangf3014/SCLIP at b56bd30) from ``configs/cfg_voc21.py``, driven as the
agreement rows drive it (docs/upstream_agreement.md, first section)."""
from ..registry import UPSTREAM, UpstreamEntry


@UPSTREAM.register("sclip")
class SCLIPUpstream(UpstreamEntry):
    """CLIPForSegmentation(clip_path=<weights file>, name_path, device='cpu', **model dict of
    configs/cfg_voc21.py over configs/base_config.py); its data preprocessor and predict (slide
    224 / 112, postprocess)."""

    repo, commit, marker = "wangf3014/SCLIP", "b56bd30", "clip_segmentor.py"
    cuda = True  # template_segmentor puts the segmentor on spec["device"]
    config = "sclip_b16_voc21.yaml"
    upstream_config, class_file = "configs/cfg_voc21.py", "configs/cls_voc21.txt"

    @classmethod
    def build(cls, spec, image, path, kit):
        return kit.template_segmentor(spec, image, path, cls, "clip_segmentor:CLIPForSegmentation",
                                      clip_path=spec["weights"])
