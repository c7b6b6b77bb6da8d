"""PEARL's entry in the upstream timing benchmark (``tools/benchmark_methods.py``): its segmentor
(``pearl_ovss.py`` ``PEARL``, PGSmall/PEARL at c26062b), driven as ``tools/agreement_pearl.py``
drives it: the model dict of ``configs/cfg_voc21.py`` (whole image, ``prob_thd`` 0.1), the CLIP
weights file as ``clip_path``, and the text-aware Laplacian propagation on (``use_prop='on'``, as
upstream's ``run.sh`` passes ``--prop on``, the setting of the paper's numbers)."""
from ..registry import UPSTREAM, UpstreamEntry


@UPSTREAM.register("pearl")
class PEARLUpstream(UpstreamEntry):
    """PEARL built from configs/base_config.py + cfg_voc21.py with clip_path = the weights file,
    device='cpu' and use_prop='on'; its data preprocessor and predict (whole image, TLP,
    postprocess)."""

    repo, commit, marker = "PGSmall/PEARL", "c26062b", "pearl_ovss.py"
    config = "pearl_b16_voc21.yaml"
    upstream_config, class_file = "configs/cfg_voc21.py", "configs/cls_voc21.txt"

    @classmethod
    def build(cls, spec, image, path, kit):
        return kit.template_segmentor(spec, image, path, cls, "pearl_ovss:PEARL", clip_path=spec["weights"],
                                      use_prop="on")
