"""CLIP Surgery's entry in the upstream timing benchmark (``tools/benchmark_methods.py``): its
``encode_image`` (xmed-lab/CLIP_Surgery at d4696d4), which ships no segmentation loop."""
from ..registry import UPSTREAM, UpstreamEntry


@UPSTREAM.register("clipsurgery")
class CLIPSurgeryUpstream(UpstreamEntry):
    """CLIP Surgery's ``encode_image`` (its ``CS-ViT-B/16`` build) on the normalised image."""

    repo, commit, marker = "xmed-lab/CLIP_Surgery", "d4696d4", "clip/clip_surgery_model.py"
    config, kind = "clipsurgery_b16.yaml", "encoder"
    cuda = True  # the model and the image on spec["device"]

    @classmethod
    def build(cls, spec, image, path, kit):
        import torch

        device = spec.get("device", "cpu")
        x = torch.from_numpy(image).to(device)
        kit.install_standins()
        from clip.build_model import build_model
        model = build_model("CS-ViT-B/16", torch.load(spec["weights"], map_location="cpu")).float().eval().to(device)
        return lambda: model.encode_image(x)
