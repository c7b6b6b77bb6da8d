"""Model configs that sparseclip_d2 adds to open_clip's (a smoke model, and a hook for more).

``sparseclip-tiny-vit`` is a 2-layer, width-64, 4-head, patch-16 ViT at 64 px with a
2-layer width-64 text tower and a 32-d joint space, QuickGELU. It exists so tests and
end-to-end smoke runs (``build_clip("sparseclip-tiny-vit", "none")``, the demo data run)
are fast on a CPU; it has no pretrained weights and its numbers mean nothing.
:func:`build_clip` builds these through ``open_clip.create_model`` with the dict passed as
model kwargs (nothing is written into open_clip's own config registry, and importing this
module registers nothing anywhere).

:func:`register_local_model_config` adds another such config by name (an explicit call:
the test suite adds its tiny timm towers this way, ``tests/tiny_models.py``).
"""
import copy
from typing import Dict, Optional

__all__ = ["LOCAL_MODEL_CONFIGS", "get_local_model_config", "register_local_model_config", "TINY_MODEL_NAME"]

TINY_MODEL_NAME = "sparseclip-tiny-vit"

_TINY_TEXT = {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 4, "layers": 2}

LOCAL_MODEL_CONFIGS: Dict[str, dict] = {
    TINY_MODEL_NAME: {
        "embed_dim": 32,
        "quick_gelu": True,
        "vision_cfg": {"image_size": 64, "layers": 2, "width": 64, "head_width": 16, "patch_size": 16},
        "text_cfg": dict(_TINY_TEXT),
    },
}


def register_local_model_config(name: str, config: dict) -> None:
    """Make ``build_clip(name, ...)`` build the open_clip model described by ``config``
    (open_clip's model-config JSON layout: ``embed_dim``, ``vision_cfg``, ``text_cfg``,
    optional ``quick_gelu`` / ``custom_text``). An explicit, process-wide registration.

    Raises:
        ValueError: ``name`` is an open_clip model name or already registered with another
            config, or ``config`` lacks ``vision_cfg`` / ``text_cfg`` / ``embed_dim``.
    """
    import open_clip

    missing = [k for k in ("embed_dim", "vision_cfg", "text_cfg") if k not in config]
    if missing:
        raise ValueError(f"model config {name!r} lacks {', '.join(missing)}")
    if name in open_clip.list_models():
        raise ValueError(f"{name!r} is an open_clip model name; choose another name for a local config")
    if name in LOCAL_MODEL_CONFIGS and LOCAL_MODEL_CONFIGS[name] != config:
        raise ValueError(f"a different local model config {name!r} is already registered")
    LOCAL_MODEL_CONFIGS[name] = copy.deepcopy(config)


def get_local_model_config(name: str) -> Optional[dict]:
    """A deep copy of the sparseclip_d2 model config called ``name``, or ``None``."""
    cfg = LOCAL_MODEL_CONFIGS.get(name)
    return copy.deepcopy(cfg) if cfg is not None else None
