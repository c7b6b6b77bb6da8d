#!/usr/bin/env python
"""Open-vocabulary segmentation of your own images (the ``sparseclip-demo`` console script).

The program lives in ``sparseclip_d2/cli/demo.py``; ``python tools/demo.py --help`` prints its help."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's package

from sparseclip_d2.cli.demo import cli_main  # noqa: E402

if __name__ == "__main__":
    cli_main()
