"""SC-CLIP's entry in the upstream timing benchmark (``tools/benchmark_methods.py``): its segmentor
(``scclip_segmentor.py``, SuleBai/SC-CLIP at 0417ba9), driven as the agreement rows drive it
(docs/upstream_agreement.md, "SC-CLIP and SFP")."""
from ..registry import UPSTREAM, UpstreamEntry, mmseg_dataset_configs


@UPSTREAM.register("scclip")
class SCCLIPUpstream(UpstreamEntry):
    """SCCLIPForSegmentation built from configs/base_config.py + cfg_voc21.py with clip_path = the
    weights file and device='cpu'; its data preprocessor and predict (slide, postprocess)."""

    repo, commit, marker = "SuleBai/SC-CLIP", "0417ba9", "scclip_segmentor.py"
    cuda = True  # template_segmentor puts the segmentor on spec["device"]
    config = "scclip_b16_voc21.yaml"
    upstream_config, class_file = "configs/cfg_voc21.py", "configs/cls_voc21.txt"
    configs = mmseg_dataset_configs("scclip_b16", "ade20k", ("voc21", "voc20", "context60", "context59", "coco_object",
                                                         "coco_stuff", "cityscapes"))
    # its segmentor's prob_thd (PROB_THRESHOLD here) at 0: random weights' near-uniform scores
    # would send every pixel to the background
    forcing = {"prob0": (("MODEL.SPARSECLIP.PROB_THRESHOLD", "0.0"), {"prob_thd": 0.0})}

    @classmethod
    def build(cls, spec, image, path, kit):
        return kit.template_segmentor(spec, image, path, cls, "scclip_segmentor:SCCLIPForSegmentation",
                                      clip_path=spec["weights"])
