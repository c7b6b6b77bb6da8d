#!/usr/bin/env python
"""Peak resident memory (RSS) and seconds of loading a CLIP from a local state-dict file, the
builder's way against open_clip's ``load_checkpoint``, each in a fresh process (not a test)::

    python tools/benchmark_load.py --model ViT-B-16-quickgelu [--weights FILE] [--reps 3]

Without ``--weights`` a seed-0 random state dict of the model is written to a temporary file
first. Each repetition runs both ways, alternating, each in its own process, and prints one JSON
line per process (``after_import_mib``, ``peak_mib``: ``ru_maxrss`` after the load, ``load_s``);
then the medians. ``builder``: ``sparseclip_d2.clip.build_clip(model, FILE)`` (the file's tensors
assigned once the random initial tensors are freed); ``open_clip``: ``open_clip.create_model``
then ``open_clip.load_checkpoint`` (the file read beside the built model, then copied).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {root!r})
import torch, open_clip
from sparseclip_d2.clip import build_clip
torch.set_num_threads(1)
rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
base = rss()
t = time.perf_counter()
if {way!r} == "builder":
    model = build_clip({model!r}, {path!r})
else:
    model = open_clip.create_model({model!r}, pretrained=None)
    open_clip.load_checkpoint(model, {path!r})
print(json.dumps(dict(way={way!r}, after_import_mib=round(base), peak_mib=round(rss()),
                      load_s=round(time.perf_counter() - t, 2))))
"""


def _run(way: str, model: str, path: str) -> dict:
    code = CHILD.format(root=ROOT, way=way, model=model, path=path)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    if r.returncode:
        raise SystemExit(f"the {way} process failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="ViT-B-16-quickgelu", help="an open_clip model name")
    p.add_argument("--weights", help="a state-dict file of the model (default: a seed-0 random one, written first)")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.weights
        if path is None:  # in a process of its own: a child's ru_maxrss starts at its parent's at the fork
            path = os.path.join(tmp, "weights.pt")
            subprocess.run([sys.executable, "-c", "import sys, torch, open_clip; torch.manual_seed(0); torch.save("
                            "open_clip.create_model(sys.argv[1], pretrained=None).state_dict(), sys.argv[2])",
                            args.model, path], check=True, capture_output=True)
            print(f"RANDOM WEIGHTS (seed 0) written to {path}: the figures are costs only", flush=True)
        elif not os.path.isfile(path):
            p.error(f"--weights {path}: no such file")
        rows = []
        for _ in range(args.reps):
            for way in ("open_clip", "builder"):
                rows.append(_run(way, args.model, path))
                print(json.dumps(rows[-1]), flush=True)
    for way in ("open_clip", "builder"):
        mine = [r for r in rows if r["way"] == way]
        print(f"{way}: median peak RSS {statistics.median(r['peak_mib'] for r in mine):.0f} MiB "
              f"(after imports {statistics.median(r['after_import_mib'] for r in mine):.0f}), "
              f"median load {statistics.median(r['load_s'] for r in mine):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
