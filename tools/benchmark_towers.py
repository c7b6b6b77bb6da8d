#!/usr/bin/env python
"""Dense-forward time of DenseCLIPEncoder per tower kind: softmax vs alpha-entmax in the last block.

For each model (random weights; only the vision tower matters, the text tower is a stub)
the encoder runs one warm-up forward and then ``--repeats`` timed forwards of a
``--size`` x ``--size`` batch of ``--batch`` images, with the last block's attention
``qq`` + softmax and ``qq`` + alpha-entmax (``--alpha``). Prints a Markdown table with the
median times and their ratio::

    python tools/benchmark_towers.py --size 448 --repeats 1
"""
import argparse
import statistics
import sys
import time
import warnings

import torch

import open_clip
from sparseclip_d2.clip import AttentionSpec, DenseCLIPEncoder

_STUB_TEXT = {"context_length": 8, "vocab_size": 16, "width": 8, "heads": 1, "layers": 1}
DEFAULT_MODELS = ("ViT-B-16", "ViT-B-16-SigLIP", "ViT-B-16-SigLIP2", "EVA02-B-16", "PE-Core-B-16")


def time_forward(encoder, images, repeats):
    with torch.no_grad():
        encoder(images)  # warm-up (position-embedding caches, kernel build)
        times = []
        for _ in range(repeats):
            if images.is_cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            encoder(images)
            if images.is_cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    parser.add_argument("--size", type=int, default=448)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--alpha", type=float, default=1.2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"device {device}, {torch.get_num_threads()} CPU threads, batch {args.batch}, "
          f"{args.size}x{args.size}, median of {args.repeats} run(s) after one warm-up; random weights\n")
    print("| model | tower | tokens | softmax (s) | entmax alpha %.2f (s) | entmax / softmax |" % args.alpha)
    print("|---|---|---|---|---|---|")
    for name in args.models:
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = open_clip.create_model(name, pretrained=None, text_cfg=_STUB_TEXT).eval().to(device)
        soft = DenseCLIPEncoder(model.visual, AttentionSpec(source="qq", normalizer="softmax"))
        sparse = DenseCLIPEncoder(model.visual, AttentionSpec(source="qq", normalizer="entmax", alpha=args.alpha))
        p = soft.patch_size if isinstance(soft.patch_size, int) else soft.patch_size[0]
        size = args.size // p * p
        images = torch.randn(args.batch, 3, size, size, device=device)
        ts = time_forward(soft, images, args.repeats)
        te = time_forward(sparse, images, args.repeats)
        tokens = soft.num_prefix_tokens + (size // p) ** 2
        print(f"| {name} | {soft.tower_kind} | {tokens} | {ts:.3f} | {te:.3f} | {te / ts:.2f} |")
        del model, soft, sparse
    return 0


if __name__ == "__main__":
    sys.exit(main())
