"""sparseclip_d2: training-free sparse (alpha-entmax) CLIP attention for dense
open-vocabulary prediction, as a detectron2 plugin.

Importing the package registers its parts with detectron2 (the ``SparseCLIP``
META_ARCH, the CLIP backbone, the datasets) and nothing else: no GPU, no network.
"""
try:
    import detectron2  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised only without detectron2
    raise ImportError(
        "sparseclip_d2 needs detectron2. Run `bash scripts/setup.sh` (installs the patched "
        "PyPI sdist pb1-detectron2==0.6), or with internet: "
        "pip install 'git+https://github.com/facebookresearch/detectron2.git'"
    ) from e

from .config import add_sparseclip_config
from . import modeling  # noqa: F401  (registers the META_ARCH and the backbone)
from . import data  # noqa: F401  (registers the datasets)
from . import evaluation  # noqa: F401  (evaluator factories)

__all__ = ["add_sparseclip_config"]
__version__ = "0.1.0"
