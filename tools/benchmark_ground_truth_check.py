#!/usr/bin/env python
"""Time of the ground-truth check train_net.py runs before inference
(``sparseclip_d2.data.ground_truth.find_bad_ground_truth``): every mask's mode, size against
its image (headers only, EXIF orientation) and label range (one histogram pass).

Writes ``--num`` random ADE20K-sized pairs (``--height`` x ``--width`` JPEG image, 8-bit PNG
mask with labels 0..149 and 255) into a temporary folder, then times the first check (no
cache) and the second (cache of usable masks, as a rerun into the same OUTPUT_DIR sees it),
and one full decode of each mask for comparison (what ``SemSegEvaluator`` reads per image)::

    python tools/benchmark_ground_truth_check.py --num 200 --workers 1
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np
from PIL import Image

from sparseclip_d2.data.ground_truth import find_bad_ground_truth


def make_pairs(folder, num, height, width, seed=0):
    rng = np.random.default_rng(seed)
    dicts = []
    for i in range(num):
        image, mask = os.path.join(folder, f"{i:06d}.jpg"), os.path.join(folder, f"{i:06d}.png")
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(image, quality=90)
        # blocky labels, like real masks (PNG compresses them as it does real ones)
        blocks = rng.integers(0, 150, (height // 16 + 1, width // 16 + 1)).astype(np.uint8)
        lab = np.kron(blocks, np.ones((16, 16), np.uint8))[:height, :width]
        lab[:2] = 255
        Image.fromarray(lab).save(mask)
        dicts.append({"file_name": image, "sem_seg_file_name": mask})
    return dicts


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num", type=int, default=200)
    p.add_argument("--height", type=int, default=512)
    p.add_argument("--width", type=int, default=683)
    p.add_argument("--workers", type=int, default=None, help="threads (default: min(8, cpu count))")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dicts = make_pairs(tmp, a.num, a.height, a.width)
        cache = os.path.join(tmp, "run", "ground_truth_check.json")
        t0 = time.perf_counter()
        problems, stats = find_bad_ground_truth("bench", dicts, num_classes=150, cache_file=cache, workers=a.workers)
        first = time.perf_counter() - t0
        if problems or stats["cached"] != 0:
            sys.exit(f"benchmark data should be clean and uncached: {problems[:3]}, {stats}")
        t0 = time.perf_counter()
        _, stats2 = find_bad_ground_truth("bench", dicts, num_classes=150, cache_file=cache, workers=a.workers)
        second = time.perf_counter() - t0
        if stats2["cached"] != a.num:
            sys.exit(f"the second check should come from the cache: {stats2}")
        t0 = time.perf_counter()
        for d in dicts:
            np.array(Image.open(d["sem_seg_file_name"]), dtype=int)
        decode = time.perf_counter() - t0
    workers = a.workers or min(8, os.cpu_count() or 1)
    print(f"{a.num} masks of {a.height}x{a.width}, {workers} thread(s):")
    print(f"  first check (no cache): {first:.2f} s = {1000 * first / a.num:.2f} ms per mask")
    print(f"  second check (cached):  {second:.3f} s = {1000 * second / a.num:.3f} ms per mask")
    print(f"  one full decode as SemSegEvaluator reads it, single thread: {1000 * decode / a.num:.2f} ms per mask")


if __name__ == "__main__":
    main()
