"""sparseclip_d2: training-free sparse (alpha-entmax) CLIP attention for dense
open-vocabulary prediction, as a detectron2 plugin.

Layers (``docs/architecture.md``): :mod:`sparseclip_d2.attention` needs torch only,
:mod:`sparseclip_d2.clip` torch and open_clip; both import without detectron2 and register
nothing global. Importing this package imports nothing heavy either.

The detectron2 parts (the META_ARCHs, the CLIP backbone, the datasets, the loaders and
evaluator builders) register in detectron2's catalogs the documented way:
:func:`add_sparseclip_config` registers all of them (every tool calls it before merging a
config), and importing a detectron2-layer subpackage (``sparseclip_d2.modeling``,
``sparseclip_d2.data``, ``sparseclip_d2.evaluation``) registers that subpackage's parts.
:class:`Predictor` (``sparseclip_d2.predictor``) is the Python API for one image.
Nothing touches the GPU or the network on import.
"""
import importlib.util

__version__ = "0.1.0"


def _detectron2_available() -> bool:
    try:
        return importlib.util.find_spec("detectron2") is not None
    except (ImportError, ValueError):
        return False


#: True when detectron2 is installed (found without importing it); the detectron2 layer needs it.
HAS_DETECTRON2 = _detectron2_available()

DETECTRON2_MISSING = (
    "the detectron2 parts of sparseclip_d2 need detectron2. Run `bash scripts/setup.sh` "
    "(installs the patched PyPI sdist pb1-detectron2==0.6), or with internet: "
    "pip install 'git+https://github.com/facebookresearch/detectron2.git'. "
    "sparseclip_d2.attention and sparseclip_d2.clip work without it."
)


def require_detectron2(what: str) -> None:
    """Raise ``ImportError`` with install instructions when detectron2 is missing.

    Called at the top of the detectron2 layer's modules (``what`` names the module)."""
    if not HAS_DETECTRON2:
        raise ImportError(f"{what}: {DETECTRON2_MISSING}")


def register_detectron2_parts() -> None:
    """Register every detectron2 part of sparseclip_d2 (idempotent; called by
    :func:`add_sparseclip_config`): the META_ARCHs and backbone, the datasets, the test
    loaders and the evaluator builders."""
    require_detectron2("sparseclip_d2.register_detectron2_parts")
    from .common.logs import quiet_library_imports

    # detectron2.modeling / fvcore.nn torch.jit.script functions at import time; torch >= 2.10
    # answers each with a FutureWarning that is not ours to fix (silenced for these imports only).
    with quiet_library_imports():
        from . import modeling  # noqa: F401
        from . import data  # noqa: F401
        from . import evaluation  # noqa: F401


_LAZY = {
    "add_sparseclip_config": ("sparseclip_d2.config", "add_sparseclip_config"),
    "Predictor": ("sparseclip_d2.predictor", "Predictor"),
    "Prediction": ("sparseclip_d2.predictor", "Prediction"),
    "get_config_file": ("sparseclip_d2.model_zoo", "get_config_file"),
}

__all__ = ["HAS_DETECTRON2", "require_detectron2", "register_detectron2_parts", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        module, attr = _LAZY[name]
        if module != "sparseclip_d2.model_zoo":
            require_detectron2(f"sparseclip_d2.{name}")
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'sparseclip_d2' has no attribute {name!r}")
