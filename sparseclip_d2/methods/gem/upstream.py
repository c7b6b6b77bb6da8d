"""GEM's entry in the upstream timing benchmark (``tools/benchmark_methods.py``): its dense forward of
the vision tower (WalBouss/GEM at 5fa677c), which ships no segmentation loop."""
import sys

from ..registry import UPSTREAM, UpstreamEntry


@UPSTREAM.register("gem")
class GEMUpstream(UpstreamEntry):
    """GEM's dense forward of the vision tower (``gem.model.visual``) on the normalised image."""

    repo, commit, marker = "WalBouss/GEM", "5fa677c", "gem/gem_wrapper.py"
    config, kind = "gem_b16.yaml", "encoder"
    cuda = True  # the model and the image on spec["device"]

    @classmethod
    def build(cls, spec, image, path, kit):
        import torch

        weights = spec["weights"]
        device = spec.get("device", "cpu")
        x = torch.from_numpy(image).to(device)
        from importlib.metadata import version

        from packaging.version import Version
        have = version("open_clip_torch")
        if Version(have.split("+")[0]) > Version("2.23.0"):
            raise SystemExit(f"GEM needs open_clip_torch<=2.23.0 (GEM's requirements.txt); {sys.executable} has "
                             f"{have}: pass --gem-python with an interpreter that has it")
        import open_clip
        from gem.gem_wrapper import GEMWrapper
        clip_model = open_clip.create_model("ViT-B-16-quickgelu", pretrained=None)
        clip_model.load_state_dict(torch.load(weights, map_location="cpu"))
        # gem.py create_gem_model defaults: gem_depth=7, ss_attn_iter=1, ss_attn_temp=None
        gem = GEMWrapper(clip_model.eval(), open_clip.get_tokenizer("ViT-B-16-quickgelu"), depth=7).eval().to(device)
        return lambda: gem.model.visual(x)
