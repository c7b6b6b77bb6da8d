"""The one rule for the synonyms of a class (pure Python, used by every layer).

A **class string** holds one class: its synonyms separated by ``;`` or ``,`` (the first
one is the name shown): ``"grass; lawn"`` and ``"grass, lawn"`` are the same class
everywhere (``TextClassifier``, the META_ARCH's ``vocabulary``, class-name files, dataset
metadata). Only where a whole vocabulary is ONE text - the demo's ``--classes`` - does the
comma separate classes, so synonyms there need the semicolon: ``"cat, dog, grass; lawn"``
is three classes (``data.image_io.parse_vocabulary``).
"""
import re
from typing import List

__all__ = ["SYNONYM_SEPARATORS", "split_class_name", "first_synonym"]

SYNONYM_SEPARATORS = ";,"
_SPLIT = re.compile(r"[;,]")


def split_class_name(class_name: str) -> List[str]:
    """The synonyms of one class string, stripped, in order (empty parts kept as ``""`` so
    callers can name them): ``"grass; lawn"`` -> ``["grass", "lawn"]``."""
    return [p.strip() for p in _SPLIT.split(class_name)]


def first_synonym(class_name: str) -> str:
    """The displayed name of a class string: its first synonym (``"tv; monitor"`` -> ``"tv"``)."""
    return split_class_name(class_name)[0]
