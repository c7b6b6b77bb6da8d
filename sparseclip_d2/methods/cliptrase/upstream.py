"""CLIPtrase's entry in the upstream timing benchmark (``tools/benchmark_methods.py``): its own loop
(``clip_self_correlation.py``, leaves162/CLIPtrase at 2b7de61) over a folder holding the photo."""
from ..registry import UPSTREAM, UpstreamEntry


@UPSTREAM.register("cliptrase")
class CLIPtraseUpstream(UpstreamEntry):
    """CLIPtrase's own loop (``self_clip``) over the folder the tool wrote (the photo and an all-0
    ground truth), on the CPU, its metric not computed, its text features memoised."""

    repo, commit, marker = "leaves162/CLIPtrase", "2b7de61", "clip_self_correlation.py"
    config, kind, dataset = "cliptrase_b16.yaml", "folder", "sparseclip_voc21_val"
    # clip_self_correlation.py self_clip_test: self_clip(clip, "VOC21", image_size=224, eps=0.7, min=3)
    upstream_dataset, image_size, eps, min_samples = "VOC21", 224, 0.7, 3

    @classmethod
    def build(cls, spec, image, path, kit):
        import clip_self_correlation as cs
        import clip_utils
        from configs.dataset_cfg import dataset_info

        cs.device = "cpu"  # clip_self_correlation.py: device = "cuda"
        cs.scores = lambda gts, preds, n: {}  # its metric over one image is not what is timed
        cs.prompt_templates = kit.cut_templates(cs.prompt_templates, spec)
        text_cache, encode_text = {}, cs.get_text_features

        def cached_text_features(clip, labels):
            key = tuple(labels)
            if key not in text_cache:
                text_cache[key] = encode_text(clip, labels)
            return text_cache[key]
        cs.get_text_features = cached_text_features
        ds = dataset_info[cls.upstream_dataset]
        ds["image_path"], ds["gt_path"] = spec["folder"] + "/img", spec["folder"] + "/gt"
        clip, _ = clip_utils.load(spec["weights"], image_size=cls.image_size, device="cpu")
        clip.eval()

        def run():
            cs.self_clip(clip, cls.upstream_dataset, image_size=cls.image_size, eps=cls.eps, min=cls.min_samples)
        return run
