"""The datasets root: ``$DETECTRON2_DATASETS`` (default ``datasets``), read in one place."""
import os

__all__ = ["DATASETS_ENV", "datasets_root"]

#: The environment variable detectron2's own dataset registration reads
#: (detectron2/data/datasets/builtin.py, main branch:
#: ``os.path.expanduser(os.getenv("DETECTRON2_DATASETS", "datasets"))``; v0.6 omits the expanduser).
DATASETS_ENV = "DETECTRON2_DATASETS"


def datasets_root() -> str:
    """``$DETECTRON2_DATASETS`` with ``~`` expanded, ``"datasets"`` when unset (detectron2's
    rule; relative to the working directory, as in detectron2)."""
    return os.path.expanduser(os.getenv(DATASETS_ENV, "datasets"))
