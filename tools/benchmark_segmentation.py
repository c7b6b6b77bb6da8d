#!/usr/bin/env python
"""Seconds per image of SparseCLIP inference, softmax vs entmax (not a test).

    python tools/benchmark_segmentation.py                      # ViT-B/16, 448 short side
    python tools/benchmark_segmentation.py --model sparseclip-tiny-vit --short-side 64

Random weights (timing does not depend on them), the demo photo (500x375) resized to the
short side, whole image, 21 VOC classes, single template; the text classifier is built
before timing. Prints one line per configuration.
"""
import argparse
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
    for name in args.variants:
        cfg = get_cfg()
        add_sparseclip_config(cfg)
        cfg.merge_from_list(["MODEL.META_ARCHITECTURE", "SparseCLIP", "MODEL.DEVICE", args.device,
                             "MODEL.SPARSECLIP.CLIP.NAME", args.model, "MODEL.SPARSECLIP.CLIP.PRETRAINED", "none",
                             "MODEL.SPARSECLIP.TEXT.CACHE_DIR", "off", "INPUT.FORMAT", "RGB",
                             "INPUT.MIN_SIZE_TEST", args.short_side, "INPUT.MAX_SIZE_TEST", 2048] + VARIANTS[name])
        model = build_model(cfg)
        x = SparseCLIPTestMapper(cfg, "sparseclip_demo")(load_demo_dataset()[0])
        model([x])  # warm-up, builds the text classifier
        times = []
        for _ in range(args.iters):
            start = time.perf_counter()
            model([x])
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        h, w = x["image"].shape[-2:]
        print(f"{name:14s} {h}x{w}: {min(times):.3f} s/image (min of {args.iters}), mean {sum(times) / len(times):.3f}")


if __name__ == "__main__":
    main()
