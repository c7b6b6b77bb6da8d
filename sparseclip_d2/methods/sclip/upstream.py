"""SCLIP's entry in the upstream timing benchmark (``tools/benchmark_methods.py``): its segmentor
(``clip_segmentor.py``, wangf3014/SCLIP at b56bd30) from ``configs/cfg_voc21.py``, driven as the
agreement rows drive it (docs/upstream_agreement.md, first section)."""
from ..registry import UPSTREAM, UpstreamEntry, mmseg_dataset_configs


@UPSTREAM.register("sclip")
class SCLIPUpstream(UpstreamEntry):
    """CLIPForSegmentation(clip_path=<weights file>, name_path, device='cpu', **model dict of
    configs/cfg_voc21.py over configs/base_config.py); its data preprocessor and predict (slide
    224 / 112, postprocess)."""

    repo, commit, marker = "wangf3014/SCLIP", "b56bd30", "clip_segmentor.py"
    cuda = True  # template_segmentor puts the segmentor on spec["device"]
    config = "sclip_b16_voc21.yaml"
    upstream_config, class_file = "configs/cfg_voc21.py", "configs/cls_voc21.txt"
    # the agreement rows: sclip_b16.yaml's first dataset is VOC20 (configs/cfg_voc20.py)
    configs = mmseg_dataset_configs("sclip_b16", "voc20", ("voc21", "context60", "coco_object", "coco_stuff",
                                                          "cityscapes"))
    # prob_thd of configs/cfg_{voc21,context60,coco_object}.py (0.1; PROB_THRESHOLD here) at 0 on both
    # sides: random weights' near-uniform scores would send every pixel to the background
    forcing = {"prob0": (("MODEL.SPARSECLIP.PROB_THRESHOLD", "0.0"), {"prob_thd": 0.0})}

    @classmethod
    def build(cls, spec, image, path, kit):
        return kit.template_segmentor(spec, image, path, cls, "clip_segmentor:CLIPForSegmentation",
                                      clip_path=spec["weights"])
