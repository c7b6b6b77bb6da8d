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
    #: the class definitions both sides read (the project's TEXT.DEFINITIONS)
    definitions = "llama_generated_texts/voc21_definitions.txt"

    @classmethod
    def project_opts(cls, path, workdir, drawn):
        return ["MODEL.SPARSECLIP.TEXT.DEFINITIONS", os.path.join(path, cls.definitions)] if path else []

    @classmethod
    def build(cls, spec, image, path, kit):
        return kit.template_segmentor(spec, image, path, cls, "itaclip_segmentor:ITACLIP_Segmentor",
                                      model_name=spec["weights"],
                                      auxiliary_text_path=os.path.join(path, cls.definitions))
