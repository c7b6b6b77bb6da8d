"""Class-name files shipped as package data (``sparseclip_d2/data/classnames/*.txt``).

One class per line, synonyms comma-separated (the first one is the display name), in
the label order of the dataset: ``background, sky, wall, ...`` is class 0 of VOC21.
Files are read with ``importlib.resources``, never via the working directory.

Besides the project's own files, each baseline's published vocabulary is shipped as a
*class-name set* (sub-folder ``sclip/``, ``clearclip/``, ``naclip/``, ``maskclip/``; sources
in ``classnames/SOURCES.md``): ``load_class_names("voc21", class_set="sclip")``.
"""
from importlib import resources
from typing import List, Optional

from ..common.synonyms import first_synonym, split_class_name

__all__ = ["load_class_names", "available_class_name_files", "display_name", "CLASS_NAME_SETS"]

_PACKAGE = "sparseclip_d2.data"
_FOLDER = "classnames"

#: Upstream vocabularies shipped as data (``MODEL.SPARSECLIP.CLASS_NAMES``); "" = the project's.
CLASS_NAME_SETS = ("sclip", "clearclip", "naclip", "maskclip", "itaclip", "proxyclip", "cliptrase", "sfp",
                   "lposs", "corrclip", "talk2dino")


def _check_set(class_set: Optional[str]) -> Optional[str]:
    if class_set in (None, ""):
        return None
    if class_set not in CLASS_NAME_SETS:
        raise ValueError(f"unknown class-name set {class_set!r}; valid: '' (the project's), "
                         f"{', '.join(CLASS_NAME_SETS)}")
    return class_set


def available_class_name_files(class_set: Optional[str] = None) -> List[str]:
    """Names (without ``.txt``) of the class-name files in the package, or of one class-name
    set (``sclip``, ``clearclip``, ``naclip``, ``maskclip``)."""
    class_set = _check_set(class_set)
    folder = resources.files(_PACKAGE).joinpath(_FOLDER)
    if class_set is not None:
        folder = folder.joinpath(class_set)
    return sorted(p.name[: -len(".txt")] for p in folder.iterdir() if p.name.endswith(".txt"))


def load_class_names(name: str, class_set: Optional[str] = None) -> List[str]:
    """The class list ``name`` (e.g. ``"voc21"``): one string per class with its
    comma-separated synonyms, e.g. ``"tv monitor, television monitor, monitor"``.

    Args:
        name: file name without ``.txt``.
        class_set: None/"" for the project's files, or an upstream set of
            :data:`CLASS_NAME_SETS` (that baseline's published file for the same dataset).
    """
    class_set = _check_set(class_set)
    parts = (_FOLDER, f"{name}.txt") if class_set is None else (_FOLDER, class_set, f"{name}.txt")
    path = resources.files(_PACKAGE).joinpath(*parts)
    if not path.is_file():
        where = "" if class_set is None else f" in the {class_set!r} class-name set"
        raise ValueError(
            f"unknown class-name file {name!r}{where}; valid: {', '.join(available_class_name_files(class_set))}"
        )
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    classes = [", ".join(s for s in split_class_name(line) if s) for line in lines if line]
    if not classes:
        raise ValueError(f"class-name file {name}.txt is empty")
    return classes


def display_name(class_name: str) -> str:
    """The first synonym of a class string (``"tv monitor, monitor"`` or ``"tv monitor; monitor"``
    -> ``"tv monitor"``; :mod:`sparseclip_d2.common.synonyms`)."""
    return first_synonym(class_name)
