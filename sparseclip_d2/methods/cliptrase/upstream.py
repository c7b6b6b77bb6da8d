"""CLIPtrase's entry in the upstream timing benchmark (``tools/benchmark_methods.py``) and the
agreement driver (``tools/agreement.py``): its own loop (``clip_self_correlation.py``,
leaves162/CLIPtrase at 2b7de61) over a folder holding the photo; the loop's label map is what it
hands its metric (``scores(cal_gt, cal_pred, n)``), caught by a stand-in for that metric."""
from ..registry import UPSTREAM, UpstreamEntry

#: clip_self_correlation.py self_clip_test (leaves162/CLIPtrase @ 2b7de61): the 336 px protocol,
#: self_clip(..., image_size=336, eps=1.1, min=7); the 224 px one is the entry's defaults below
_PROTOCOL_336 = {"image_size": 336, "eps": 1.1, "min": 7}

#: clip_self_correlation.py self_clip: the datasets whose "background" word list is appended after
#: their classes (``if dataset in ['COCO80_val','VOC21','PC60']``), all its words one label, C
WITH_BACKGROUND = ("COCO80_val", "VOC21", "PC60")


@UPSTREAM.register("cliptrase")
class CLIPtraseUpstream(UpstreamEntry):
    """CLIPtrase's own loop (``self_clip``) over the folder the tool wrote (the photo and an all-0
    ground truth), on the CPU, its metric replaced by a stand-in that keeps the loop's label map,
    its text features memoised.

    An agreement row's "upstream config" is the ``dataset_info`` key of ``configs/dataset_cfg.py``
    that ``self_clip`` is called with; its settings (``config_settings``) are ``self_clip``'s
    ``image_size``, ``eps`` and ``min``."""

    repo, commit, marker = "leaves162/CLIPtrase", "2b7de61", "clip_self_correlation.py"
    config, kind, dataset = "cliptrase_b16.yaml", "folder", "sparseclip_voc21_val"
    # clip_self_correlation.py self_clip_test: self_clip(clip, "VOC21", image_size=224, eps=0.7, min=3)
    upstream_config, image_size, eps, min_samples = "VOC21", 224, 0.7, 3
    # the agreement rows: each project config's first dataset (DATASETS.TEST[0]) -> its dataset_info key
    configs = {"cliptrase_b16.yaml": "VOC21", "cliptrase_b16_voc20.yaml": "VOC20",
               "cliptrase_b16_336.yaml": "VOC21", "cliptrase_b16_336_voc20.yaml": "VOC20"}
    config_settings = {"cliptrase_b16_336.yaml": _PROTOCOL_336, "cliptrase_b16_336_voc20.yaml": _PROTOCOL_336}

    @classmethod
    def protocol(cls, spec):
        """``self_clip``'s ``image_size``, ``eps`` and ``min`` of this run: the 224 px protocol, with the
        row's settings (the 336 px protocol's) over it."""
        return {"image_size": cls.image_size, "eps": cls.eps, "min": cls.min_samples, **cls.settings_of(spec)}

    @classmethod
    def build(cls, spec, image, path, kit):
        import clip_self_correlation as cs
        import clip_utils
        from configs.dataset_cfg import dataset_info

        dataset = cls.upstream_config_of(spec)
        if dataset not in dataset_info:
            raise SystemExit(f"CLIPtrase: upstream dataset {dataset!r} is not a key of configs/dataset_cfg.py "
                             f"dataset_info; valid: {', '.join(dataset_info)}")
        settings = cls.protocol(spec)
        cs.device = "cpu"  # clip_self_correlation.py: device = "cuda"
        caught = {}

        def keep_label_maps(gts, preds, n):  # its metric over one image: the label map is what is kept
            caught["preds"] = list(preds)
            return {}
        cs.scores = keep_label_maps
        cs.prompt_templates = kit.cut_templates(cs.prompt_templates, spec)
        text_cache, encode_text = {}, cs.get_text_features

        def cached_text_features(clip, labels):
            key = tuple(labels)
            if key not in text_cache:
                text_cache[key] = encode_text(clip, labels)
            return text_cache[key]
        cs.get_text_features = cached_text_features
        ds = dataset_info[dataset]
        ds["image_path"], ds["gt_path"] = spec["folder"] + "/img", spec["folder"] + "/gt"
        clip, _ = clip_utils.load(spec["weights"], image_size=settings["image_size"], device="cpu")
        clip.eval()

        def run():
            caught.clear()
            cs.self_clip(clip, dataset, **settings)
            return dict(preds=caught.get("preds"), dataset=dataset, classes=len(ds["labels"]))
        return run

    @classmethod
    def labels(cls, output, spec):
        """The label map of the loop's one image in the project's class order. ``self_clip`` appends
        a dataset's background words after its ``C`` classes and labels them all ``C``; the
        project's vocabulary of that dataset (class-name set ``cliptrase``) has them as class 0
        (``data/classnames/SOURCES.md``): upstream's ``C`` becomes 0 and class ``c`` becomes ``c + 1``."""
        import numpy as np

        preds = output.get("preds") if isinstance(output, dict) else None
        if not preds or len(preds) != 1:
            raise SystemExit(f"CLIPtrase: its loop labelled {len(preds or [])} images, expected the folder's one "
                             "(an image whose ground truth holds only ignore pixels is skipped by self_clip)")
        pred = np.asarray(preds[0]).astype(np.int64)
        if output["dataset"] in WITH_BACKGROUND:
            c = int(output["classes"])
            if pred.max(initial=0) > c:
                raise SystemExit(f"CLIPtrase: label {int(pred.max())} above the background label {c} of "
                                 f"{output['dataset']}")
            pred = np.where(pred == c, 0, pred + 1)
        return pred
