"""ResCLIP (yvhangyang/ResCLIP): its attention (RCS) and feedback (SFR) are a preset and generic parts
(``clip/spec.py``); this folder holds its entry in the upstream timing benchmark (:mod:`.upstream`)."""
from . import upstream  # noqa: F401  (registers its upstream benchmark entry)
