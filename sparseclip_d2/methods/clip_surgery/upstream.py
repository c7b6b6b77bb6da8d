"""CLIP Surgery's entry in the upstream timing benchmark (``tools/benchmark_methods.py``): its
``encode_image`` (xmed-lab/CLIP_Surgery at d4696d4), which ships no segmentation loop."""
from ..registry import UPSTREAM, UpstreamEntry


@UPSTREAM.register("clipsurgery")
class CLIPSurgeryUpstream(UpstreamEntry):
    """CLIP Surgery's ``encode_image`` (its ``CS-ViT-B/16`` build) on the normalised image."""

    repo, commit, marker = "xmed-lab/CLIP_Surgery", "d4696d4", "clip/clip_surgery_model.py"
    config, kind = "clipsurgery_b16.yaml", "encoder"

    @classmethod
    def build(cls, spec, image, path, kit):
        import torch

        x = torch.from_numpy(image)
        kit.install_standins()
        from clip.build_model import build_model
        model = build_model("CS-ViT-B/16", torch.load(spec["weights"], map_location="cpu")).float().eval()
        return lambda: model.encode_image(x)
