"""Prompt template sets (a Python module, so no package data is needed).

``OPENAI_IMAGENET_TEMPLATES`` are the 80 ImageNet prompt templates published by OpenAI
with CLIP (the "Prompt Engineering for ImageNet" notebook); SCLIP, ClearCLIP and NACLIP
use them for segmentation. ``MASKCLIP_TEMPLATES`` are MaskCLIP's 85: the 80 followed by
five "... in the scene." templates.
"""
import os
from typing import Dict, List, Tuple

__all__ = ["TEMPLATE_SETS", "OPENAI_IMAGENET_TEMPLATES", "MASKCLIP_TEMPLATES", "get_templates"]

OPENAI_IMAGENET_TEMPLATES: Tuple[str, ...] = (
    "a bad photo of a {}.",
    "a photo of many {}.",
    "a sculpture of a {}.",
    "a photo of the hard to see {}.",
    "a low resolution photo of the {}.",
    "a rendering of a {}.",
    "graffiti of a {}.",
    "a bad photo of the {}.",
    "a cropped photo of the {}.",
    "a tattoo of a {}.",
    "the embroidered {}.",
    "a photo of a hard to see {}.",
    "a bright photo of a {}.",
    "a photo of a clean {}.",
    "a photo of a dirty {}.",
    "a dark photo of the {}.",
    "a drawing of a {}.",
    "a photo of my {}.",
    "the plastic {}.",
    "a photo of the cool {}.",
    "a close-up photo of a {}.",
    "a black and white photo of the {}.",
    "a painting of the {}.",
    "a painting of a {}.",
    "a pixelated photo of the {}.",
    "a sculpture of the {}.",
    "a bright photo of the {}.",
    "a cropped photo of a {}.",
    "a plastic {}.",
    "a photo of the dirty {}.",
    "a jpeg corrupted photo of a {}.",
    "a blurry photo of the {}.",
    "a photo of the {}.",
    "a good photo of the {}.",
    "a rendering of the {}.",
    "a {} in a video game.",
    "a photo of one {}.",
    "a doodle of a {}.",
    "a close-up photo of the {}.",
    "a photo of a {}.",
    "the origami {}.",
    "the {} in a video game.",
    "a sketch of a {}.",
    "a doodle of the {}.",
    "a origami {}.",
    "a low resolution photo of a {}.",
    "the toy {}.",
    "a rendition of the {}.",
    "a photo of the clean {}.",
    "a photo of a large {}.",
    "a rendition of a {}.",
    "a photo of a nice {}.",
    "a photo of a weird {}.",
    "a blurry photo of a {}.",
    "a cartoon {}.",
    "art of a {}.",
    "a sketch of the {}.",
    "a embroidered {}.",
    "a pixelated photo of a {}.",
    "itap of the {}.",
    "a jpeg corrupted photo of the {}.",
    "a good photo of a {}.",
    "a plushie {}.",
    "a photo of the nice {}.",
    "a photo of the small {}.",
    "a photo of the weird {}.",
    "the cartoon {}.",
    "art of the {}.",
    "a drawing of the {}.",
    "a photo of the large {}.",
    "a black and white photo of a {}.",
    "the plushie {}.",
    "a dark photo of a {}.",
    "itap of a {}.",
    "graffiti of the {}.",
    "a toy {}.",
    "itap of my {}.",
    "a photo of a cool {}.",
    "a photo of a small {}.",
    "a tattoo of the {}.",
)

#: MaskCLIP's prompt templates: the 80 above, in the same order, then five scene templates
#: (chongzhou96/MaskCLIP ``tools/maskclip_utils/prompt_engineering.py``, ``prompt_templates``).
MASKCLIP_TEMPLATES: Tuple[str, ...] = OPENAI_IMAGENET_TEMPLATES + (
    "there is a {} in the scene.",
    "there is the {} in the scene.",
    "this is a {} in the scene.",
    "this is the {} in the scene.",
    "this is one {} in the scene.",
)

#: The seven "sub ImageNet" templates of TCL / FreeDA, as lorebianchi98/Talk2DINO @ 4918c2d
#: ``src/open_vocabulary_segmentation/datasets/templates.py`` ``sub_imagenet_template`` holds them
#: (its ``eval*.yml`` ``template: sub_imagenet_template``).
SUB_IMAGENET_TEMPLATES: Tuple[str, ...] = (
    "itap of a {}.",
    "a bad photo of a {}.",
    "a origami {}.",
    "a photo of the large {}.",
    "a {} in a video game.",
    "art of the {}.",
    "a photo of the small {}.",
)

TEMPLATE_SETS: Dict[str, Tuple[str, ...]] = {
    "openai_imagenet": OPENAI_IMAGENET_TEMPLATES,
    "maskclip": MASKCLIP_TEMPLATES,
    "single": ("a photo of a {}.",),
    "none": ("{}",),
    "sub_imagenet": SUB_IMAGENET_TEMPLATES,
}


def _check(templates: List[str], origin: str) -> List[str]:
    if not templates:
        raise ValueError(f"no prompt templates in {origin}")
    for t in templates:
        if "{}" not in t:
            raise ValueError(f"prompt template {t!r} from {origin} has no '{{}}' placeholder for the class name")
    return templates


def get_templates(name_or_path: str) -> List[str]:
    """Prompt templates by set name or from a text file.

    Args:
        name_or_path: ``openai_imagenet`` (80 templates), ``maskclip`` (85), ``single`` (``"a photo of a {}."``),
            ``none`` (``"{}"``, the class text as is), or a path to a UTF-8 text file with one
            template per line (blank lines and lines starting with ``#`` ignored).
    Returns:
        list of templates, each containing ``{}`` where the class name goes.
    """
    key = str(name_or_path).strip()
    if key.lower() in TEMPLATE_SETS:
        return list(TEMPLATE_SETS[key.lower()])
    path = os.path.expanduser(key)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            lines = [ln.strip() for ln in f]
        return _check([ln for ln in lines if ln and not ln.startswith("#")], path)
    raise ValueError(
        f"unknown prompt template set {name_or_path!r}; valid: {', '.join(TEMPLATE_SETS)}, "
        "or the path of an existing text file with one template per line")
