#!/usr/bin/env python
"""ResCLIP's agreement row with its former command line, run by the generic driver
(``tools/agreement.py --method resclip``, docs/agreement/resclip.md)::

    python tools/agreement_resclip.py --upstream /path/to/ResCLIP \\
        --config configs/baselines/resclip_b16_voc21.yaml --size 336 504 \\
        --feedback-threshold 0 --prob-threshold 0 --output /tmp/agreement

is ``tools/agreement.py --method resclip --upstream /path/to/ResCLIP --configs resclip_b16_voc21.yaml
--inputs voc@336x504 --force feedback0 prob0 --workdir /tmp/agreement``: the photo resized to
``--size`` (then given to both sides at that size), the thresholds at 0 on both sides through the
entry's stage-forcing variants (a threshold other than 0 is each config's own: leave it out).
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def translate(argv=None):
    """The generic driver's arguments for this tool's command line."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", required=True, help="checkout of yvhangyang/ResCLIP (0e085f7)")
    ap.add_argument("--config", required=True, help="project config (configs/baselines/resclip_b16_*.yaml)")
    ap.add_argument("--photo", choices=("voc", "arc2017"), default="voc")
    ap.add_argument("--size", type=int, nargs=2, default=(336, 504), metavar=("H", "W"))
    ap.add_argument("--feedback-threshold", type=float, default=None, help="0: FEEDBACK.THRESHOLD / temp_thd 0")
    ap.add_argument("--prob-threshold", type=float, default=None, help="0: PROB_THRESHOLD / prob_thd 0")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--output", required=True, help="folder for the weights, the photo and the label maps")
    args = ap.parse_args(argv)
    force = []
    for value, variant, option in ((args.feedback_threshold, "feedback0", "--feedback-threshold"),
                                   (args.prob_threshold, "prob0", "--prob-threshold")):
        if value is not None and value != 0:
            ap.error(f"{option} {value:g}: only 0 (the stage-forcing variant {variant}) is run on both sides; "
                     "leave it out for each config's own threshold")
        if value is not None:
            force.append(variant)
    out = ["--method", "resclip", "--upstream", args.upstream, "--configs", os.path.basename(args.config),
           "--inputs", f"{args.photo}@{args.size[0]}x{args.size[1]}", "--seed", str(args.seed),
           "--threads", str(args.threads), "--workdir", args.output]
    return out + (["--force", *force] if force else [])


if __name__ == "__main__":
    from sparseclip_d2.benchmarks.agreement import main

    main(translate())
