"""ClearCLIP's entry in the upstream timing benchmark (``tools/benchmark_methods.py``): its segmentor
(``clearclip_segmentor.py``, mc-lan/ClearCLIP at ad68a40) from ``configs/cfg_voc21.py`` with
``model_type='ClearCLIP'``, driven as the agreement rows drive it (docs/upstream_agreement.md, first
section: the weights file in place of the ``openai`` download, fp16 casts turned into float32)."""
from ..registry import UPSTREAM, UpstreamEntry


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
