#!/usr/bin/env python
"""Seconds per image of SparseCLIP inference, softmax vs entmax (not a test).

    python tools/benchmark_segmentation.py                      # ViT-B/16, 448 short side
    python tools/benchmark_segmentation.py --model sparseclip-tiny-vit --short-side 64

Random weights (timing does not depend on them), the demo photo (500x375) resized to the
short side, whole image, 21 VOC classes, single template; the text classifier is built
before timing. Prints one line per configuration.
"""
import argparse
import statistics
import time

import torch

from detectron2.config import get_cfg
from detectron2.modeling import build_model

from sparseclip_d2 import add_sparseclip_config
from sparseclip_d2.data import SparseCLIPTestMapper
from sparseclip_d2.data.datasets.demo import load_demo_dataset

VARIANTS = {
    "qk/softmax": ["MODEL.SPARSECLIP.ATTENTION.SOURCE", "qk", "MODEL.SPARSECLIP.ATTENTION.NORMALIZER", "softmax"],
    "qk/entmax1.2": ["MODEL.SPARSECLIP.ATTENTION.SOURCE", "qk", "MODEL.SPARSECLIP.ATTENTION.NORMALIZER", "entmax"],
    "qq/softmax": ["MODEL.SPARSECLIP.ATTENTION.SOURCE", "qq", "MODEL.SPARSECLIP.ATTENTION.NORMALIZER", "softmax"],
    "qq/entmax1.2": ["MODEL.SPARSECLIP.ATTENTION.SOURCE", "qq", "MODEL.SPARSECLIP.ATTENTION.NORMALIZER", "entmax"],
}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="ViT-B-16-quickgelu")
    p.add_argument("--short-side", type=int, default=448)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    args = p.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, device {args.device}, "
          f"model {args.model} (random weights), short side {args.short_side}")
    models, inputs = {}, {}
    for name in args.variants:
        cfg = get_cfg()
        add_sparseclip_config(cfg)
        cfg.merge_from_list(["MODEL.META_ARCHITECTURE", "SparseCLIP", "MODEL.DEVICE", args.device,
                             "MODEL.SPARSECLIP.CLIP.NAME", args.model, "MODEL.SPARSECLIP.CLIP.PRETRAINED", "none",
                             "MODEL.SPARSECLIP.TEXT.CACHE_DIR", "off", "INPUT.FORMAT", "RGB",
                             "INPUT.MIN_SIZE_TEST", args.short_side, "INPUT.MAX_SIZE_TEST", 2048] + VARIANTS[name])
        torch.manual_seed(0)  # the same random weights for every variant
        models[name] = build_model(cfg)
        inputs[name] = SparseCLIPTestMapper(cfg, "sparseclip_demo")(load_demo_dataset()[0])
        models[name]([inputs[name]])  # warm-up: builds the text classifier (and the entmax kernel)
    # interleaved repetitions, so a change of machine load hits every variant alike
    times = {name: [] for name in args.variants}
    for _ in range(args.iters):
        for name in args.variants:
            start = time.perf_counter()
            models[name]([inputs[name]])
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
    base = {src: statistics.median(times[f"{src}/softmax"]) for src in ("qk", "qq") if f"{src}/softmax" in times}
    for name in args.variants:
        h, w = inputs[name]["image"].shape[-2:]
        med = statistics.median(times[name])
        ratio = med / base[name.split("/")[0]] if name.split("/")[0] in base else float("nan")
        print(f"{name:14s} {h}x{w}: {med:.3f} s/image (median of {args.iters}), min {min(times[name]):.3f}, "
              f"x{ratio:.3f} of the same source with softmax")

if __name__ == "__main__":
    main()
