#!/usr/bin/env python
"""Agreement of a method's project configs with its upstream code, pixel by pixel, one row per
(config, input): ``python tools/agreement.py --method resclip --upstream /path/to/ResCLIP``.

How to rerun a row from ``git clone`` of the upstream repository: docs/agreement/README.md; the
logic is ``sparseclip_d2.benchmarks.agreement`` (its module docstring says what both sides get).
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from sparseclip_d2.benchmarks.agreement import main  # noqa: E402

if __name__ == "__main__":
    main()
