"""FSA's entry in the upstream timing benchmark (``tools/benchmark_methods.py``): its segmentor
(``FSA_Proxy_segmentor.py``, chi-chi-zx/FSA at dbd2da5), ProxyCLIP's plus lamda / FSA
(configs/base_config.py: lamda=3.0, FSA=True) with the same VFM loading and fp16 casts: driven the
same way (:func:`..proxyclip.upstream.build_proxy_segmentor`)."""
from ..proxyclip.upstream import build_proxy_segmentor, proxy_project_opts
from ..registry import UPSTREAM, UpstreamEntry, mmseg_dataset_configs


@UPSTREAM.register("fsa")
class FSAUpstream(UpstreamEntry):
    """FSAProxySegmentation of configs/cfg_voc21.py, driven as ProxyCLIP's; its predict."""

    repo, commit, marker = "chi-chi-zx/FSA", "dbd2da5", "FSA_Proxy_segmentor.py"
    config = "fsa_b16_voc21.yaml"
    upstream_config, class_file = "configs/cfg_voc21.py", "configs/cls_voc21.txt"
    # fsa_b16.yaml is VOC20's (as proxyclip_b16.yaml, its base), the others one dataset each
    configs = mmseg_dataset_configs("fsa_b16", "voc20", ("voc21", "context60", "coco_object", "cityscapes", "ade20k"))
    # its segmentor's prob_thd (PROB_THRESHOLD here) at 0, as ProxyCLIP's
    forcing = {"prob0": (("MODEL.SPARSECLIP.PROB_THRESHOLD", "0.0"), {"prob_thd": 0.0})}
    needs_dino, vfm = "the torch.hub VFM code its upstream loads", "dino_vitb8"

    @classmethod
    def project_opts(cls, path, workdir, drawn):
        return proxy_project_opts(cls, path, workdir)

    @classmethod
    def build(cls, spec, image, path, kit):
        return build_proxy_segmentor(spec, image, path, kit, cls, "FSA_Proxy_segmentor:FSAProxySegmentation")
