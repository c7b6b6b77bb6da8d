#!/usr/bin/env python
"""Evaluate sparseclip_d2 (training-free) on the datasets of a config (the
``sparseclip-train-net`` console script).

The program lives in ``sparseclip_d2/cli/train_net.py``; ``python tools/train_net.py --help``
prints its help."""
from sparseclip_d2.cli.train_net import cli_main

if __name__ == "__main__":
    cli_main()
