"""sparseclip_d2: training-free sparse (alpha-entmax) CLIP attention for dense
open-vocabulary prediction, as a detectron2 plugin.

Layers (``docs/architecture.md``): :mod:`sparseclip_d2.attention` needs torch only,
:mod:`sparseclip_d2.clip` torch and open_clip; both import without detectron2. When
detectron2 is installed, importing this package also registers the detectron2 parts
(the META_ARCHs, the CLIP backbone, the datasets, the evaluator builders), as
detectron2's own projects do. Nothing touches the GPU or the network on import.
"""
__version__ = "0.1.0"

try:
    import detectron2  # noqa: F401

    #: True when detectron2 can be imported; the detectron2 parts are registered only then.
    HAS_DETECTRON2 = True
except ImportError:
    HAS_DETECTRON2 = False

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


if HAS_DETECTRON2:
    from .common.logs import quiet_library_imports

    # detectron2.modeling / fvcore.nn torch.jit.script functions at import time; torch >= 2.10
    # answers each with a FutureWarning that is not ours to fix (silenced for these imports only).
    with quiet_library_imports():
        from .config import add_sparseclip_config
        from . import modeling  # noqa: F401  (registers the META_ARCHs and the backbone)
        from . import data  # noqa: F401  (registers the datasets)
        from . import evaluation  # noqa: F401  (evaluator builders)

    __all__ = ["add_sparseclip_config", "HAS_DETECTRON2", "require_detectron2"]
else:
    __all__ = ["HAS_DETECTRON2", "require_detectron2"]

    def __getattr__(name: str):
        if name == "add_sparseclip_config":
            require_detectron2("sparseclip_d2.add_sparseclip_config")
        raise AttributeError(f"module 'sparseclip_d2' has no attribute {name!r}")
