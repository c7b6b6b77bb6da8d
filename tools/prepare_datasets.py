#!/usr/bin/env python
"""Convert official downloads, once, into the files sparseclip_d2 evaluates on (under
$DETECTRON2_DATASETS), and check which datasets are ready.

    python tools/prepare_datasets.py check [NAME ...] [--sample N]  # which datasets are ready (exit 1 if not)
    python tools/prepare_datasets.py voc20 [--root R]               # or ade20k, context, context59, coco_stuff, ...

The program lives in ``sparseclip_d2/prepare/`` (``cli.py``: the command line; the conversions,
Pascal Context and the check beside it); ``python tools/prepare_datasets.py --help`` prints its help.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's package

from sparseclip_d2.prepare.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
