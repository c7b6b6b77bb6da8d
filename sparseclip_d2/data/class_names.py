"""Class-name files shipped as package data (``sparseclip_d2/data/classnames/*.txt``).

One class per line, synonyms comma-separated (the first one is the display name), in
the label order of the dataset: ``background, sky, wall, ...`` is class 0 of VOC21.
Files are read with ``importlib.resources``, never via the working directory.
"""
from importlib import resources
from typing import List

__all__ = ["load_class_names", "available_class_name_files", "display_name"]

_PACKAGE = "sparseclip_d2.data"
_FOLDER = "classnames"


def available_class_name_files() -> List[str]:
    """Names (without ``.txt``) of the class-name files in the package."""
    folder = resources.files(_PACKAGE).joinpath(_FOLDER)
    return sorted(p.name[: -len(".txt")] for p in folder.iterdir() if p.name.endswith(".txt"))


def load_class_names(name: str) -> List[str]:
    """The class list ``name`` (e.g. ``"voc21"``): one string per class with its
    comma-separated synonyms, e.g. ``"tv monitor, television monitor, monitor"``."""
    path = resources.files(_PACKAGE).joinpath(_FOLDER, f"{name}.txt")
    if not path.is_file():
        raise ValueError(
            f"unknown class-name file {name!r}; valid: {', '.join(available_class_name_files())}"
        )
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    classes = [", ".join(s.strip() for s in line.split(",") if s.strip()) for line in lines if line]
    if not classes:
        raise ValueError(f"class-name file {name}.txt is empty")
    return classes


def display_name(class_name: str) -> str:
    """The first synonym of a class string (``"tv monitor, monitor"`` -> ``"tv monitor"``)."""
    return class_name.split(",")[0].strip()
