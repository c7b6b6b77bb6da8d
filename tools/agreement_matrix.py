#!/usr/bin/env python
"""The one-page summary of the agreement rows (method x dataset config x input, the lowest figure
of each cell), read from the method pages of ``docs/agreement/``:
``python tools/agreement_matrix.py --write docs/agreement/matrix.md`` (``--check FILE`` in CI).
The logic is ``sparseclip_d2.benchmarks.agreement_matrix``.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from sparseclip_d2.benchmarks.agreement_matrix import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
