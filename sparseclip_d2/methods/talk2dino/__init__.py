"""Talk2DINO (lorebianchi98/Talk2DINO @ 4918c2d, ICCV 2025): DINOv2-reg patch tokens against CLIP text
mapped into DINOv2's space by a learned projection. NOT training-free (the projection is trained)."""
from .maths import (PROJECTION_KEYS, TextProjection, clean_background, cls_attention_maps, load_projection,
                    random_projection, sigmoid_masks)
from .encoder import Talk2DINOEncoder
from . import parts  # noqa: F401  (registers the family, its head and its config section)

__all__ = ["TextProjection", "load_projection", "random_projection", "PROJECTION_KEYS", "cls_attention_maps",
           "sigmoid_masks", "clean_background", "Talk2DINOEncoder"]
from . import upstream  # noqa: F401  (registers its upstream benchmark entry; the agreement driver's helpers)
