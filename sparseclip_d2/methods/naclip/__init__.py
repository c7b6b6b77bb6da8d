"""NACLIP (sinahmr/NACLIP): its neighbourhood attention is a preset (``clip/spec.py``) and PAMR a generic
stage; this folder holds its entry in the upstream timing benchmark (:mod:`.upstream`)."""
from . import upstream  # noqa: F401  (registers its upstream benchmark entry)
