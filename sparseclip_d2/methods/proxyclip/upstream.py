"""ProxyCLIP's entry in the upstream timing benchmark (``tools/benchmark_methods.py``): its segmentor
(``proxyclip_segmentor.py``, mc-lan/ProxyCLIP at e7b767f) from ``configs/cfg_voc21.py``, DINO ViT-B/8
answered from the ``--dino`` checkout; :func:`build_proxy_segmentor` drives FSA's too."""
import os

from ..registry import UPSTREAM, UpstreamEntry, mmseg_dataset_configs


def proxy_project_opts(entry, path, workdir):
    """The project side's second-backbone weights: the random DINO the upstream worker draws (with a
    checkout), else random ones drawn by the project."""
    return ["MODEL.SPARSECLIP.PROXY.WEIGHTS", entry.vfm_file(workdir) if path else "none"]


def build_proxy_segmentor(spec, image, path, kit, entry, segmentor: str):
    """A ProxyCLIP-style segmentor (``segmentor``: ``"module:Class"``) of ``entry.upstream_config``
    with ``name_path``, ``device='cpu'``, ``model_type`` = the weights file (by its bare name: its
    create_model turns "/" of a name into "-"); ``torch.hub.load`` of DINO answered from the
    ``--dino`` checkout with random weights (seed 0, drawn once, float16 numbers: ``kit.random_dino``);
    its fp16 casts in float32 (its CLIP built in float32, so that the text features its constructor
    encodes are float32 ones)."""
    import importlib

    weights = spec["weights"]
    kit.install_standins()
    # random VFM weights drawn by the upstream VFM code (seed 0), rounded to float16 (its constructor casts
    # the VFM to fp16); torch.hub.load('facebookresearch/dino:main', ...) answered offline with them
    kit.random_dino(spec, entry.vfm)
    module, cls = segmentor.split(":")
    seg_module = importlib.import_module(module)
    seg_module.openai_imagenet_template = kit.cut_templates(seg_module.openai_imagenet_template, spec)
    kit.fp32_create_model(seg_module)  # its constructor encodes the class names: in float32, as the project
    model = kit.upstream_config(path, entry.upstream_config_of(spec))
    model.pop("type", None)
    model.update(name_path=os.path.join(path, entry.class_file_of(spec)), device="cpu",
                 model_type=os.path.basename(weights))
    model.update(entry.settings_of(spec))
    os.chdir(os.path.dirname(weights))  # its create_model turns "/" of a name into "-": the bare file name
    seg = getattr(seg_module, cls)(**model)
    kit.upstream_to_fp32(seg, seg.vfm)
    return kit.segmentor_run(seg, image, spec)


@UPSTREAM.register("proxyclip")
class ProxyCLIPUpstream(UpstreamEntry):
    """ProxyCLIPSegmentation of configs/cfg_voc21.py (:func:`build_proxy_segmentor`); its predict."""

    repo, commit, marker = "mc-lan/ProxyCLIP", "e7b767f", "proxyclip_segmentor.py"
    config = "proxyclip_b16_voc21.yaml"
    upstream_config, class_file = "configs/cfg_voc21.py", "configs/cls_voc21.txt"
    configs = mmseg_dataset_configs("proxyclip_b16", "voc20", ("voc21", "context60", "coco_object", "cityscapes",
                                                              "ade20k"))
    # its segmentor's prob_thd (PROB_THRESHOLD here) at 0
    forcing = {"prob0": (("MODEL.SPARSECLIP.PROB_THRESHOLD", "0.0"), {"prob_thd": 0.0})}
    # its segmentor loads its VFM with torch.hub.load('facebookresearch/dino:main', 'dino_vitb8')
    needs_dino, vfm = "the torch.hub VFM code its upstream loads", "dino_vitb8"
    dino_aliases = ("--proxyclip-dino",)  # the option's first name

    @classmethod
    def project_opts(cls, path, workdir, drawn):
        return proxy_project_opts(cls, path, workdir)

    @classmethod
    def build(cls, spec, image, path, kit):
        return build_proxy_segmentor(spec, image, path, kit, cls, "proxyclip_segmentor:ProxyCLIPSegmentation")
