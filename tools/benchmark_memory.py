#!/usr/bin/env python
"""Peak resident memory (RSS) of one large image through the evaluation path or the demo.

Writes a random ``--height x --width`` RGB JPEG. Default (evaluation path): reads it with the
dataset mapper (``INPUT.MIN_SIZE_TEST`` / ``MAX_SIZE_TEST`` resize), runs the model once as
``inference_on_dataset`` would and prints one JSON line with the peak RSS before and after
the forward pass (``ru_maxrss`` of this process, a high-water mark), the working
resolution, the number of sliding windows and the output (``sem_seg`` scores, or the
``sem_seg_labels`` label map above ``TEST.SEM_SEG_SCORES_MAX_MB``). With ``--demo``, runs
``tools/demo.py`` in this process on the photo instead (label map, overlay and, with
``--save-probs``, the probabilities and their figure), with ``--config-file`` and the
overrides as its ``--opts``::

    python tools/benchmark_memory.py --height 4000 --width 6000 --num-classes 21 \\
        MODEL.SPARSECLIP.CLIP.NAME ViT-B-16-quickgelu MODEL.SPARSECLIP.CLIP.PRETRAINED none \\
        TEST.SLIDING_WINDOW.ENABLED True TEST.SLIDING_WINDOW.CROP_SIZE 448 \\
        TEST.SLIDING_WINDOW.STRIDE 224 INPUT.MIN_SIZE_TEST 2000 INPUT.MAX_SIZE_TEST 6000

Trailing ``KEY VALUE`` pairs are config overrides (on top of ``--config-file``, default the
package defaults). With the sliding window the encoder only ever sees ``BATCH_SIZE`` crops;
what grows with the image is the ``(S, H, W)`` float32 logits of the whole image (S synonyms)
and the ``(C, height, width)`` output, which ``output_mib`` reports.
"""
import argparse
import json
import os
import resource
import sys
import tempfile
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from PIL import Image


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far, MiB (Linux ``ru_maxrss`` is KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--height", type=int, default=4000)
    parser.add_argument("--width", type=int, default=6000)
    parser.add_argument("--num-classes", type=int, default=21, help="vocabulary size (class_0 ... class_N-1)")
    parser.add_argument("--config-file", default=os.path.join(ROOT, "configs", "Base-SparseCLIP.yaml"),
                        help="a sparseclip_d2 YAML config (default: configs/Base-SparseCLIP.yaml)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    parser.add_argument("--demo", action="store_true", help="measure tools/demo.py on the photo")
    parser.add_argument("--save-probs", action="store_true", help="with --demo: also --save-probs")
    parser.add_argument("--vocabulary", default=None,
                        help="a packaged class-name file (voc21, ade150, ...) instead of --num-classes "
                             "synthetic names (its synonyms included)")
    parser.add_argument("opts", nargs=argparse.REMAINDER, help="config overrides KEY VALUE ...")
    args = parser.parse_args(argv)
    if args.height <= 0 or args.width <= 0 or args.num_classes <= 0:
        parser.error(f"--height, --width and --num-classes must be positive, got "
                     f"{args.height}, {args.width}, {args.num_classes}")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.demo:
        return run_demo(args)

    from detectron2.config import get_cfg
    from detectron2.modeling import build_model

    from sparseclip_d2 import add_sparseclip_config
    from sparseclip_d2.data import SparseCLIPTestMapper
    from sparseclip_d2.modeling import resolve_device
    from sparseclip_d2.dense.windows import window_grid

    cfg = get_cfg()
    add_sparseclip_config(cfg)
    if args.config_file:
        cfg.merge_from_file(args.config_file)
    cfg.merge_from_list(args.opts)
    cfg.MODEL.DEVICE = resolve_device(cfg.MODEL.DEVICE)
    cfg.MODEL.SPARSECLIP.TEXT.CACHE_DIR = cfg.MODEL.SPARSECLIP.TEXT.CACHE_DIR or "off"
    cfg.freeze()

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"large_{args.height}x{args.width}.jpg")
        write_photo(path, args.height, args.width)

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = build_model(cfg)
        if args.vocabulary:
            from sparseclip_d2.data import load_class_names

            vocabulary = load_class_names(args.vocabulary)
        else:
            vocabulary = [f"class {i}" for i in range(args.num_classes)]
        model.text_classifier_for(vocabulary)  # text encoding outside the measured forward
        mapper = SparseCLIPTestMapper(cfg, "benchmark_memory")
        x = mapper({"file_name": path})
        x["vocabulary"] = vocabulary
        rss_before = peak_rss_mib()
        start = time.perf_counter()
        with torch.no_grad():
            output = model([x])[0]
        key = "sem_seg" if "sem_seg" in output else "sem_seg_labels"
        out = output[key]
        seconds = time.perf_counter() - start
        rss_after = peak_rss_mib()

    h, w = x["image"].shape[-2:]
    sw = cfg.TEST.SLIDING_WINDOW
    windows = len(window_grid(h, w, sw.CROP_SIZE, sw.STRIDE)) if sw.ENABLED else 1
    result = {
        "image": [args.height, args.width],
        "working_resolution": [int(h), int(w)],
        "model": cfg.MODEL.SPARSECLIP.CLIP.NAME,
        "precision": cfg.MODEL.SPARSECLIP.CLIP.PRECISION,
        "device": cfg.MODEL.DEVICE,
        "sliding_window": bool(sw.ENABLED),
        "crop_size": int(sw.CROP_SIZE) if sw.ENABLED else None,
        "stride": int(sw.STRIDE) if sw.ENABLED else None,
        "windows": windows,
        "num_classes": len(vocabulary),
        "vocabulary": args.vocabulary,
        "output": key,
        "output_shape": list(out.shape),
        "output_finite": bool(torch.isfinite(out.float()).all()),
        "output_mib": out.numel() * out.element_size() / 2 ** 20,
        "peak_rss_before_forward_mib": round(rss_before, 1),
        "peak_rss_mib": round(rss_after, 1),
        "forward_seconds": round(seconds, 2),
        "load_average": list(os.getloadavg()),
    }
    print(json.dumps(result))
    return result


def write_photo(path: str, height: int, width: int) -> None:
    """A random photo: smooth random content (a coarse grid upsampled) keeps the JPEG small."""
    rng = np.random.default_rng(0)
    coarse = rng.integers(0, 256, (max(height // 64, 1), max(width // 64, 1), 3), dtype=np.uint8)
    Image.fromarray(coarse).resize((width, height), Image.BILINEAR).save(path, quality=90)


def run_demo(args) -> dict:
    """Peak RSS of tools/demo.py (imported, run in this process) on one random photo."""
    import importlib.util
    import logging

    spec = importlib.util.spec_from_file_location("sparseclip_tools_demo", os.path.join(ROOT, "tools", "demo.py"))
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"large_{args.height}x{args.width}.jpg")
        write_photo(path, args.height, args.width)
        classes = ", ".join(f"class {i}" for i in range(args.num_classes))
        vocab = ["--vocabulary", args.vocabulary] if args.vocabulary else ["--classes", classes]
        argv = ["--config-file", args.config_file, "--input", path, *vocab,
                "--output", os.path.join(tmp, "out")] + (["--save-probs"] if args.save_probs else [])
        argv += ["--opts", *args.opts]
        rss_before = peak_rss_mib()
        start = time.perf_counter()
        written = demo.main(argv)
        seconds = time.perf_counter() - start
        rss_after = peak_rss_mib()
        files = {os.path.basename(f): os.path.getsize(f) for f in written[path]}
    logging.shutdown()
    result = {
        "mode": "demo" + (" --save-probs" if args.save_probs else ""),
        "image": [args.height, args.width],
        "num_classes": args.num_classes if not args.vocabulary else args.vocabulary,
        "config": os.path.relpath(args.config_file, ROOT),
        "opts": args.opts,
        "files": files,
        "peak_rss_before_demo_mib": round(rss_before, 1),
        "peak_rss_mib": round(rss_after, 1),
        "demo_seconds": round(seconds, 2),
        "load_average": list(os.getloadavg()),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
