#!/usr/bin/env python
"""Seconds per image and peak RSS of the project's newer methods next to their upstream loops (not a test).

    OMP_NUM_THREADS=1 python tools/benchmark_methods.py --methods resclip gem \\
        --resclip /path/to/ResCLIP --gem /path/to/GEM --gem-python /path/to/gem-venv/bin/python

The program lives in ``sparseclip_d2/benchmarks/`` (``cli.py``: the command line; the timing
harness, the upstream stand-ins and the project side beside it), each method's entry (its
checkout, config and upstream driver) in its folder, ``sparseclip_d2/methods/<family>/upstream.py``;
``python tools/benchmark_methods.py --help`` prints its help.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's package

from sparseclip_d2.benchmarks.cli import main  # noqa: E402

if __name__ == "__main__":
    main()  # returns the rows (tests read them); the exit status stays 0
