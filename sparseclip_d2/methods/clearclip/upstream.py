"""ClearCLIP's entry in the upstream timing benchmark (``tools/benchmark_methods.py``): its segmentor
(``clearclip_segmentor.py``, mc-lan/ClearCLIP at ad68a40) from ``configs/cfg_voc21.py`` with
``model_type='ClearCLIP'``, driven as the agreement rows drive it (docs/upstream_agreement.md, first
section: the weights file in place of the ``openai`` download, fp16 casts turned into float32)."""
from ..registry import UPSTREAM, UpstreamEntry, mmseg_dataset_configs


@UPSTREAM.register("clearclip")
class ClearCLIPUpstream(UpstreamEntry):
    """ClearCLIPSegmentation(name_path, device='cpu', model_type='ClearCLIP', **model dict of
    configs/cfg_voc21.py over configs/base_config.py); its vendored ``open_clip`` answers the
    ``openai`` download with the weights file; ``precision='fp16'`` and ``inputs.half()`` run in
    float32; its BLIP import (``BLIP.models.blip_retrieval``, used for ``clip_type='BLIP'`` only) is
    a stand-in that raises if called; its data preprocessor and predict (slide 448 / 224)."""

    repo, commit, marker = "mc-lan/ClearCLIP", "ad68a40", "clearclip_segmentor.py"
    cuda = True  # template_segmentor puts the segmentor on spec["device"]
    config = "clearclip_b16_voc21.yaml"
    upstream_config, class_file = "configs/cfg_voc21.py", "configs/cls_voc21.txt"
    # the agreement rows: clearclip_b16.yaml's first dataset is VOC20 (configs/cfg_voc20.py)
    configs = mmseg_dataset_configs("clearclip_b16", "voc20", ("voc21", "context60", "coco_object", "cityscapes"))
    # prob_thd of configs/cfg_voc21.py (0.5), cfg_context60.py (0.15), cfg_coco_object.py (0.4)
    # (PROB_THRESHOLD here) at 0 on both sides: random weights' near-uniform scores would send
    # every pixel to the background
    forcing = {"prob0": (("MODEL.SPARSECLIP.PROB_THRESHOLD", "0.0"), {"prob_thd": 0.0})}

    @classmethod
    def build(cls, spec, image, path, kit):
        import sys
        import types

        import torch

        def no_blip(*a, **k):
            raise SystemExit("ClearCLIP's BLIP path is not driven by this benchmark (clip_type='CLIP')")
        for name in ("BLIP", "BLIP.models"):
            sys.modules.setdefault(name, types.ModuleType(name))
        blip = types.ModuleType("BLIP.models.blip_retrieval")
        blip.blip_retrieval = no_blip
        sys.modules["BLIP.models.blip_retrieval"] = blip
        kit.install_standins()  # mmseg names, before the segmentor module is imported
        import open_clip.openai  # ClearCLIP's vendored copy (the checkout is first on sys.path)
        open_clip.openai.download_pretrained_from_url = lambda url, cache_dir=None: spec["weights"]
        import clearclip_segmentor
        create_model = clearclip_segmentor.create_model
        # clearclip_segmentor.py builds in fp16 (precision='fp16') and casts its input with .half():
        # both in float32 here, as every side of the benchmark runs
        clearclip_segmentor.create_model = lambda *a, **k: create_model(*a, **dict(k, precision="fp32"))
        torch.Tensor.half = lambda self: self.float()
        # docs/upstream_agreement.md: the project's ClearCLIP configs are its q-q attention
        # (model_type='ClearCLIP', its paper and demo), not base_config.py's 'vanilla'
        return kit.template_segmentor(spec, image, path, cls, "clearclip_segmentor:ClearCLIPSegmentation",
                                      model_type="ClearCLIP")
