"""SCLIP (wangf3014/SCLIP): its correlative self-attention is a preset (``clip/spec.py``); this folder
holds its entry in the upstream timing benchmark (:mod:`.upstream`)."""
from . import upstream  # noqa: F401  (registers its upstream benchmark entry)
