"""SFP's entry in the upstream timing benchmark (``tools/benchmark_methods.py``): its segmentor
(``SFP_ICCV/SFP_segmentor.py``, Kimsure/SFP at 2804f5b), driven as SC-CLIP's (docs/upstream_agreement.md,
"SC-CLIP and SFP")."""
from ..registry import UPSTREAM, UpstreamEntry, mmseg_dataset_configs


@UPSTREAM.register("sfp")
class SFPUpstream(UpstreamEntry):
    """SFPForSegmentation built from configs/base_config.py + cfg_voc21.py with clip_path = the
    weights file and device='cpu'; its data preprocessor and predict (slide, postprocess)."""

    # the SFP repository holds its code in SFP_ICCV/ (its README: cd SFP_ICCV, python eval.py)
    repo, commit, marker, subdir = "Kimsure/SFP", "2804f5b", "SFP_ICCV/SFP_segmentor.py", "SFP_ICCV"
    cuda = True  # template_segmentor puts the segmentor on spec["device"]
    config = "sfp_b16_voc21.yaml"
    upstream_config, class_file = "configs/cfg_voc21.py", "configs/cls_voc21.txt"
    configs = mmseg_dataset_configs("sfp_b16", "ade20k", ("voc21", "voc20", "context60", "context59", "coco_object",
                                                         "coco_stuff", "cityscapes"))
    # its segmentor's prob_thd (PROB_THRESHOLD here) at 0: random weights' near-uniform scores
    # would send every pixel to the background
    # area_off: the area threshold off (AREA_THRESHOLD 0 here, area_thd None upstream, its default in
    # SFP_segmentor.py): on voc_wide configs/cfg_voc21.py's area_thd=0.1 leaves one class, so this
    # variant's row checks the arg-max over all classes it would hide (not a stage-forcing variant)
    forcing = {"prob0": (("MODEL.SPARSECLIP.PROB_THRESHOLD", "0.0"), {"prob_thd": 0.0}),
               "area_off": (("MODEL.SPARSECLIP.AREA_THRESHOLD", "0.0"), {"area_thd": None})}

    @classmethod
    def build(cls, spec, image, path, kit):
        return kit.template_segmentor(spec, image, path, cls, "SFP_segmentor:SFPForSegmentation",
                                      clip_path=spec["weights"])
