"""NACLIP's entry in the upstream timing benchmark (``tools/benchmark_methods.py``): its segmentor
(``naclip.py``, sinahmr/NACLIP at 0cac3a6) from ``configs/cfg_voc21.py`` with ``eval.py --pamr off``,
driven as the agreement rows drive it (docs/upstream_agreement.md, first section)."""
from ..registry import UPSTREAM, UpstreamEntry, mmseg_dataset_configs


#: the datasets of the project's NACLIP configs besides the bare one (naclip_b16_<dataset>.yaml)
_DATASETS = ("voc21", "voc20", "context60", "coco_object", "cityscapes")


@UPSTREAM.register("naclip")
class NACLIPUpstream(UpstreamEntry):
    """NACLIP(clip_path=<weights file>, name_path, device='cpu', pamr_steps=0, **model dict of
    configs/cfg_voc21.py over configs/base_config.py: whole image, ``slide_crop=0``); its data
    preprocessor and predict."""

    repo, commit, marker = "sinahmr/NACLIP", "0cac3a6", "naclip.py"
    cuda = True  # template_segmentor puts the segmentor on spec["device"]
    config = "naclip_b16_voc21.yaml"  # PAMR off, as eval.py --pamr off (pamr_steps=0)
    upstream_config, class_file = "configs/cfg_voc21.py", "configs/cls_voc21.txt"
    # the agreement rows: naclip_b16.yaml's first dataset is Context59 (configs/cfg_context59.py);
    # naclip_pamr_b16*.yaml are the same upstream configs with PAMR on (eval.py --pamr on keeps
    # naclip.py's default pamr_steps=10, pamr_stride=(8, 16))
    configs = dict(mmseg_dataset_configs("naclip_b16", "context59", _DATASETS),
                   **mmseg_dataset_configs("naclip_pamr_b16", "context59", _DATASETS))
    config_settings = {c: {"pamr_steps": 10} for c in mmseg_dataset_configs("naclip_pamr_b16", "context59", _DATASETS)}
    # prob_thd of configs/cfg_{voc21,context60,coco_object}.py (0.1; PROB_THRESHOLD here) at 0 on both
    # sides: random weights' near-uniform scores would send every pixel to the background
    forcing = {"prob0": (("MODEL.SPARSECLIP.PROB_THRESHOLD", "0.0"), {"prob_thd": 0.0})}

    @classmethod
    def build(cls, spec, image, path, kit):
        # eval.py (sinahmr/NACLIP 0cac3a6): --pamr off sets cfg.model['pamr_steps'] = 0; a PAMR
        # config's row sets it back to 10 (config_settings, applied after these arguments)
        return kit.template_segmentor(spec, image, path, cls, "naclip:NACLIP", clip_path=spec["weights"],
                                      pamr_steps=0)
