"""PEARL's entry in the upstream benchmark and the agreement driver (``tools/agreement.py --method
pearl``): its segmentor (``pearl_ovss.py``, PGSmall/PEARL at c26062b) from ``configs/cfg_<dataset>.py``,
the text-aware Laplacian propagation on (``use_prop="on"``, as its ``run.sh``) or off."""
from ..registry import UPSTREAM, UpstreamEntry, mmseg_dataset_configs


@UPSTREAM.register("pearl")
class PEARLUpstream(UpstreamEntry):
    """PEARL(clip_path=<weights file>, name_path, device='cpu', **model dict of the dataset config,
    use_prop); its data preprocessor and predict (whole image or slide, TLP, postprocess)."""

    repo, commit, marker = "PGSmall/PEARL", "c26062b", "pearl/prop.py"
    config = "pearl_b16_voc21.yaml"
    upstream_config, class_file = "configs/cfg_voc21.py", "configs/cls_voc21.txt"
    configs = dict(mmseg_dataset_configs("pearl_b16", "context59", ("voc21", "voc20", "context60", "coco_object",
                                                                   "coco_stuff", "cityscapes", "ade20k")),
                   **{"pearl_b16_voc21_no_tlp.yaml": "configs/cfg_voc21.py"})
    # pearl_ovss.py PEARL(use_prop=...): "on" runs TLP after the logits (run.sh passes --prop on)
    config_settings = {"pearl_b16_voc21_no_tlp.yaml": {"use_prop": "off"}}
    # its prob_thd (PROB_THRESHOLD here) at 0: random weights' near-uniform scores send most pixels
    # to class 0 (configs/cfg_voc21.py, cfg_context60.py, cfg_coco_object.py set 0.1)
    # tlp_off: the other half of the TLP on / off pair on any config (eval.py's default --prop off,
    # PEARL(use_prop="off"); TLP.ENABLED False here), not a stage-forcing variant
    forcing = {"prob0": (("MODEL.SPARSECLIP.PROB_THRESHOLD", "0.0"), {"prob_thd": 0.0}),
               # TLP.GRID back at its default (pearl_ovss.py grid=80; TLPSettings.grid, which the test checks):
               # pearl_b16_cityscapes.yaml sets 224, a key that changes nothing once TLP is off, so refused
               "tlp_off": (("MODEL.SPARSECLIP.TLP.ENABLED", "False", "MODEL.SPARSECLIP.TLP.GRID", "80"),
                           {"use_prop": "off"})}

    @classmethod
    def build(cls, spec, image, path, kit):
        return kit.template_segmentor(spec, image, path, cls, "pearl_ovss:PEARL", clip_path=spec["weights"],
                                      use_prop="on")
