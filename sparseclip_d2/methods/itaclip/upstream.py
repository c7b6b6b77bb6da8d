"""ITACLIP's entry in the upstream timing benchmark (``tools/benchmark_methods.py``): its segmentor
(``itaclip_segmentor.py``, m-arda-aydn/ITACLIP at 521a33c) from ``configs/cfg_voc21.py``, with its
class definitions on both sides."""
import os

from ..registry import UPSTREAM, UpstreamEntry


@UPSTREAM.register("itaclip")
class ITACLIPUpstream(UpstreamEntry):
    """ITACLIP_Segmentor(model_name=<weights file>, auxiliary_text_path=<its definitions>, name_path,
    device='cpu', **model dict of configs/cfg_voc21.py); its data preprocessor and predict."""

    repo, commit, marker = "m-arda-aydn/ITACLIP", "521a33c", "itaclip_segmentor.py"
    cuda = True  # template_segmentor puts the segmentor on spec["device"]
    config = "itaclip_b16_voc21.yaml"
    upstream_config, class_file = "configs/cfg_voc21.py", "configs/cls_voc21.txt"
    #: the class definitions both sides read (the project's TEXT.DEFINITIONS) in the timing benchmark
    definitions = "llama_generated_texts/voc21_definitions.txt"
    # the checkout's dataset configs (configs/cfg_<dataset>.py; Cityscapes' is cfg_cityscapes.py)
    configs = {"itaclip_b16_voc21.yaml": "configs/cfg_voc21.py", "itaclip_b16_context60.yaml": "configs/cfg_context60.py",
               "itaclip_b16_coco_object.yaml": "configs/cfg_coco_object.py",
               "itaclip_b16.yaml": "configs/cfg_coco_stuff164k.py",
               "itaclip_b16_cityscapes.yaml": "configs/cfg_cityscapes.py"}
    # its configs name their files from the checkout's parent: configs/cfg_voc21.py name_path =
    # './ITACLIP/configs/cls_voc21.txt', auxiliary_text_path = './ITACLIP/llama_generated_texts/...'
    config_path_prefix = "ITACLIP"
    # prob_thd of itaclip_segmentor.py (PROB_THRESHOLD here) at 0: random weights' near-uniform scores
    # would send every pixel to the background (configs/cfg_voc21.py, cfg_context60.py and
    # cfg_coco_object.py set 0.1)
    forcing = {"prob0": (("MODEL.SPARSECLIP.PROB_THRESHOLD", "0.0"), {"prob_thd": 0.0})}

    @classmethod
    def project_opts(cls, path, workdir, drawn):
        return ["MODEL.SPARSECLIP.TEXT.DEFINITIONS", os.path.join(path, cls.definitions)] if path else []

    @classmethod
    def auxiliary_file(cls, root, model):
        """The dataset's auxiliary text file (definitions or synonyms) its config names, in ``root``."""
        return os.path.join(root, cls.checkout_path(model.get("auxiliary_text_path") or cls.definitions))

    @classmethod
    def row_opts(cls, root, model):
        return ["MODEL.SPARSECLIP.TEXT.DEFINITIONS", cls.auxiliary_file(root, model)]

    @classmethod
    def build(cls, spec, image, path, kit):
        model = kit.upstream_config(path, cls.upstream_config_of(spec))
        return kit.template_segmentor(spec, image, path, cls, "itaclip_segmentor:ITACLIP_Segmentor",
                                      model_name=spec["weights"], auxiliary_text_path=cls.auxiliary_file(path, model))
