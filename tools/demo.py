#!/usr/bin/env python
"""Open-vocabulary segmentation of your own images (the ``sparseclip-demo`` console script).

The program lives in ``sparseclip_d2/cli/demo.py``; ``python tools/demo.py --help`` prints its help."""
from sparseclip_d2.cli.demo import cli_main

if __name__ == "__main__":
    cli_main()
