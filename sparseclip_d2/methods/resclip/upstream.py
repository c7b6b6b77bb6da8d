"""ResCLIP's entry in the upstream timing benchmark (``tools/benchmark_methods.py``): its segmentor
(``resclip_segmentor.py``, yvhangyang/ResCLIP at 0e085f7) from ``configs/cfg_voc21.py``."""
from ..registry import UPSTREAM, UpstreamEntry, mmseg_dataset_configs


@UPSTREAM.register("resclip")
class ResCLIPUpstream(UpstreamEntry):
    """ResCLIPSegmentation(clip_path=<weights file>, name_path, device='cpu', **model dict of
    configs/cfg_voc21.py), its hard-coded ``.cuda()`` calls kept on the CPU; its data preprocessor
    and predict."""

    repo, commit, marker = "yvhangyang/ResCLIP", "0e085f7", "resclip_segmentor.py"
    cuda = True  # template_segmentor puts the segmentor on spec["device"]
    config = "resclip_b16_voc21.yaml"
    upstream_config, class_file = "configs/cfg_voc21.py", "configs/cls_voc21.txt"
    configs = mmseg_dataset_configs("resclip_b16", "ade20k", ("voc21", "voc20", "context60", "context59", "coco_object",
                                                            "coco_stuff", "cityscapes"))
    # SFR's first segmentation: temp_thd of resclip_segmentor.py (FEEDBACK.THRESHOLD here) at 0 gives
    # it real labels with random weights; prob_thd (PROB_THRESHOLD) at 0 keeps the classes' argmax
    forcing = {"feedback0": (("MODEL.SPARSECLIP.FEEDBACK.THRESHOLD", "0.0"), {"temp_thd": 0.0}),
               "prob0": (("MODEL.SPARSECLIP.PROB_THRESHOLD", "0.0"), {"prob_thd": 0.0})}

    @classmethod
    def build(cls, spec, image, path, kit):
        kit.cpu_cuda_standins()
        return kit.template_segmentor(spec, image, path, cls, "resclip_segmentor:ResCLIPSegmentation",
                                      clip_path=spec["weights"])
