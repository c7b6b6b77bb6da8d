"""Text-side class definitions mixed into the class embeddings (ITACLIP's "text expansion").

A definitions file holds one line per class, ``name >=text``, in the format ITACLIP publishes
(m-arda-aydn/ITACLIP @ 521a33c ``llama_generated_texts/*.txt``, read by
``itaclip_segmentor.py`` ``get_aux_text``: the text is what follows the first ``>=``). The
project ships no such file: the user points to one.

Each definition text is encoded like a class name (every prompt template, embeddings
averaged and re-normalised), then every synonym embedding of a class is mixed with its
class's definition embedding:

``e_s <- (1 - w) * e_s + w * d_{class(s)}``  (not re-normalised, as upstream)

with the background class (when the dataset has one) left unchanged and absent from the
file (``itaclip_segmentor.py`` ``__init__``: with a background class the file lists the
other classes in order; without one, every class).
"""
import logging
import os
from typing import List, Optional, Tuple

import torch

__all__ = ["load_definitions", "mix_definitions", "check_definition_options"]

logger = logging.getLogger(__name__)


def load_definitions(path: str) -> List[Tuple[str, str]]:
    """Read a definitions file: ``[(name, text)]`` in file order.

    Raises:
        FileNotFoundError: no such file (named).
        ValueError: a line without ``>=`` or with an empty text, or an empty file, naming the
            file and the line number.
    """
    path = os.path.expanduser(str(path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"class definitions file {path!r} does not exist (MODEL.SPARSECLIP.TEXT.DEFINITIONS)")
    out = []
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines = lines[:-1]  # the final newline
    for n, line in enumerate(lines, start=1):
        if ">=" not in line:
            raise ValueError(f"{path}:{n}: {line!r} is not 'name >=definition' (ITACLIP's format: one class a line)")
        name, text = line.split(">=", 1)[0], line.split(">=")[1]  # upstream keeps what follows the first '>='
        if not text.strip():
            raise ValueError(f"{path}:{n}: class {name.strip()!r} has an empty definition")
        out.append((name.strip(), text))
    if not out:
        raise ValueError(f"class definitions file {path!r} is empty")
    return out


def mix_definitions(emb: torch.Tensor, class_index: torch.Tensor, definition_emb: torch.Tensor, weight: float,
                    background_index: Optional[int] = None, *, what: str = "definitions") -> torch.Tensor:
    """Mix each synonym embedding with its class's definition embedding.

    Args:
        emb: ``(S, D)`` synonym embeddings.
        class_index: ``(S,)`` long, the class of each synonym (classes ``0..C-1``).
        definition_emb: ``(K, D)`` one embedding per class in class order, skipping
            ``background_index``: ``K = C - 1`` with a background class, else ``C``.
        weight: the definitions' share ``w`` in [0, 1].
        background_index: the dataset's background class (left unchanged), or None.
        what: how to name the definitions in errors (e.g. the file).
    Returns:
        ``(S, D)`` float32 ``(1 - w) * emb + w * definition_emb[row of class]``.
    Raises:
        ValueError: ``weight`` outside [0, 1] or a count mismatch (both counts named).
    """
    w = float(weight)
    if not 0.0 <= w <= 1.0:
        raise ValueError(f"definition weight must be in [0, 1], got {weight!r}")
    num_classes = int(class_index.max()) + 1
    expected = num_classes - (1 if background_index is not None else 0)
    if definition_emb.shape[0] != expected:
        bg = f" besides the background class {background_index}" if background_index is not None else ""
        raise ValueError(f"{what}: {definition_emb.shape[0]} definitions for a vocabulary of {num_classes} classes; "
                         f"expected one per class{bg}, {expected} in all, in class order")
    rows = class_index.clone()
    if background_index is not None:
        rows = rows - (class_index > background_index).long()
    out = emb.float().clone()
    keep = class_index != background_index if background_index is not None else torch.ones_like(class_index, dtype=torch.bool)
    mixed = (1.0 - w) * emb.float() + w * definition_emb.float()[rows.clamp(min=0)]
    out[keep] = mixed[keep]
    return out


def check_definition_options(cfg) -> None:
    """Validate ``MODEL.SPARSECLIP.TEXT.DEFINITIONS`` / ``DEFINITION_WEIGHT`` (ITACLIP's class
    definitions); ``ValueError`` / ``FileNotFoundError`` naming the key, the value and the valid
    choices; a weight without a file is logged."""
    sc = cfg.MODEL.SPARSECLIP
    dw = sc.TEXT.DEFINITION_WEIGHT
    if isinstance(dw, bool) or not isinstance(dw, (int, float)) or not 0.0 <= float(dw) <= 1.0:
        raise ValueError(f"MODEL.SPARSECLIP.TEXT.DEFINITION_WEIGHT = {dw!r} is invalid; valid: a number in [0, 1]")
    if sc.TEXT.DEFINITIONS:
        load_definitions(sc.TEXT.DEFINITIONS)
        if float(dw) == 0.0:
            raise ValueError(f"MODEL.SPARSECLIP.TEXT.DEFINITIONS = {sc.TEXT.DEFINITIONS!r} is set but "
                             "MODEL.SPARSECLIP.TEXT.DEFINITION_WEIGHT is 0, so it would change nothing; valid: a "
                             "weight in (0, 1] (ITACLIP: 0.05-0.2)")
    elif float(dw) != 0.0:
        # the ITACLIP configs carry upstream's weight; the definitions file is the user's to give
        logger.warning("MODEL.SPARSECLIP.TEXT.DEFINITION_WEIGHT = %s is unused: no MODEL.SPARSECLIP.TEXT.DEFINITIONS "
                       "file ('name >=definition' lines, e.g. ITACLIP's llama_generated_texts/<dataset>_*.txt) is "
                       "given, so no class definitions are mixed in", dw)

