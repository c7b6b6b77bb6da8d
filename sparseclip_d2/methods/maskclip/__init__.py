"""MaskCLIP (chongzhou96/MaskCLIP): its value-path last block is a preset (``clip/spec.py``,
``maskclip``); this folder holds its entry in the upstream benchmark and agreement driver
(:mod:`.upstream`)."""
from . import upstream  # noqa: F401  (registers its upstream benchmark entry)
