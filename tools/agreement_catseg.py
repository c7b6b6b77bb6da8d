#!/usr/bin/env python
"""Agreement of ``tools/prepare_datasets.py ade847 / context459`` with CAT-Seg's own scripts
(``datasets/prepare_ade20k_full.py``, ``datasets/prepare_pascal_context_459.py``) on the same planted
downloads, file by file and pixel by pixel (``sparseclip_d2/prepare/agreement.py``)::

    git clone https://github.com/cvlab-kaist/CAT-Seg /tmp/CAT-Seg && git -C /tmp/CAT-Seg checkout 6d3a188
    python tools/agreement_catseg.py --upstream /tmp/CAT-Seg --workdir /tmp/catseg_agreement

Upstream's scripts need numpy, Pillow, OpenCV, scipy and tqdm (all in the project's venv). Prints
one JSON object.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sparseclip_d2.prepare.agreement import run_agreement  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--upstream", required=True, help="a checkout of cvlab-kaist/CAT-Seg at 6d3a188")
    p.add_argument("--workdir", required=True, help="a scratch folder (two planted copies are written there)")
    a = p.parse_args(argv)
    out = run_agreement(os.path.abspath(a.upstream), os.path.abspath(a.workdir))
    print(json.dumps(out, indent=1))
    return 0 if out["agreement_percent"] == 100.0 and not out["only_ours"] and not out["only_upstream"] else 1


if __name__ == "__main__":
    sys.exit(main())
