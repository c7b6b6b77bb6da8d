"""NACLIP's entry in the upstream timing benchmark (``tools/benchmark_methods.py``): its segmentor
(``naclip.py``, sinahmr/NACLIP at 0cac3a6) from ``configs/cfg_voc21.py`` with ``eval.py --pamr off``,
driven as the agreement rows drive it (docs/upstream_agreement.md, first section)."""
from ..registry import UPSTREAM, UpstreamEntry


@UPSTREAM.register("naclip")
class NACLIPUpstream(UpstreamEntry):
    """NACLIP(clip_path=<weights file>, name_path, device='cpu', pamr_steps=0, **model dict of
    configs/cfg_voc21.py over configs/base_config.py: whole image, ``slide_crop=0``); its data
    preprocessor and predict."""

    repo, commit, marker = "sinahmr/NACLIP", "0cac3a6", "naclip.py"
    cuda = True  # template_segmentor puts the segmentor on spec["device"]
    config = "naclip_b16_voc21.yaml"  # PAMR off, as eval.py --pamr off (pamr_steps=0)
    upstream_config, class_file = "configs/cfg_voc21.py", "configs/cls_voc21.txt"

    @classmethod
    def build(cls, spec, image, path, kit):
        # eval.py (sinahmr/NACLIP 0cac3a6): --pamr off sets cfg.model['pamr_steps'] = 0
        return kit.template_segmentor(spec, image, path, cls, "naclip:NACLIP", clip_path=spec["weights"],
                                      pamr_steps=0)
