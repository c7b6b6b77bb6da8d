"""Model configs that sparseclip_d2 adds to open_clip's (test / smoke models only).

``sparseclip-tiny-vit`` is a 2-layer, width-64, 4-head, patch-16 ViT at 64 px with a
2-layer width-64 text tower and a 32-d joint space, QuickGELU. It only exists so tests
and end-to-end smoke runs (``build_clip("sparseclip-tiny-vit", "none")``) are fast on a
CPU; it has no pretrained weights and its numbers mean nothing. :func:`build_clip`
builds these through ``open_clip.create_model`` with the dict passed as model kwargs
(nothing is written into open_clip's own config registry).
"""
import copy
from typing import Dict, Optional

__all__ = ["LOCAL_MODEL_CONFIGS", "get_local_model_config", "TINY_MODEL_NAME"]

TINY_MODEL_NAME = "sparseclip-tiny-vit"

LOCAL_MODEL_CONFIGS: Dict[str, dict] = {
    TINY_MODEL_NAME: {
        "embed_dim": 32,
        "quick_gelu": True,
        "vision_cfg": {"image_size": 64, "layers": 2, "width": 64, "head_width": 16, "patch_size": 16},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 4, "layers": 2},
    },
}


def get_local_model_config(name: str) -> Optional[dict]:
    """A deep copy of the sparseclip_d2 model config called ``name``, or ``None``."""
    cfg = LOCAL_MODEL_CONFIGS.get(name)
    return copy.deepcopy(cfg) if cfg is not None else None
