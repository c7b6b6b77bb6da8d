#!/usr/bin/env python
"""The interactive Gradio app (the ``sparseclip-app`` console script; needs the ``app`` extra).

The program lives in ``sparseclip_d2/app/`` (options and launch: ``cli.py``; the page:
``ui.py``; the engine: ``engine.py``; the pictures: ``render.py``); ``python tools/app.py
--help`` prints its options and ``docs/app.md`` describes the page."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's package

from sparseclip_d2.app import cli_main  # noqa: E402

if __name__ == "__main__":
    cli_main()
