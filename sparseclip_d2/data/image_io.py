"""Robust image reading and the demo's vocabulary syntax.

:func:`read_image_rgb` turns whatever a user or a dataset hands over (grayscale, palette,
RGBA, CMYK, 16-bit, EXIF-rotated photos) into one well-defined array: ``(H, W, 3)`` uint8
RGB in the orientation a photo viewer shows. Errors name the file.

Conversion rules (by PIL mode of the first frame):

======================  ==================================================================
``RGB``                 as is
``L``, ``1``            gray replicated to R = G = B (``1``: 0 / 255)
``LA``, ``RGBA``,       alpha **dropped**: the stored colour of every pixel is kept, even
``RGBa``, ``La``,       where it is (semi-)transparent. (Compositing on a background would
``PA``, ``P`` + tRNS    invent colours the photo does not have; fully transparent pixels keep
                        whatever colour the file stores for them.)
``P``                   palette looked up (colours of the palette)
``CMYK``, ``YCbCr``,    PIL's conversion to RGB
``LAB``, ``HSV``
``I;16``, ``I;16L``,    16-bit unsigned: scaled by the dtype range, ``round(v * 255 / 65535)``
``I;16B``, ``I;16N``    (= ``round(v / 257)``), never clipped
``I``                   32-bit signed container: when all values lie in [0, 65535] (16-bit
                        data as PIL opens some 16-bit PNG/TIFF files) scaled as 16-bit,
                        otherwise by the int32 range ``(v + 2**31) * 255 / (2**32 - 1)``
``F``                   32-bit float: values in [0, 1] scaled by 255; otherwise min-max
                        scaled to [0, 255] (a warning is logged), never clipped
======================  ==================================================================

The EXIF orientation tag (JPEG, TIFF, PNG eXIf, WebP) is applied first with
``PIL.ImageOps.exif_transpose``. Multi-frame files (GIF, TIFF stacks) give their first frame.
"""
import logging
import os
import re
from typing import List

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

__all__ = ["ImageReadError", "read_image_rgb", "to_rgb_array", "parse_vocabulary", "VocabularyError",
           "INPUT_FORMATS", "check_input_format", "convert_channel_order"]

logger = logging.getLogger(__name__)

_ALPHA_MODES = ("LA", "La", "RGBA", "RGBa", "PA")
_UINT16_MODES = ("I;16", "I;16L", "I;16B", "I;16N")


#: Channel orders of ``INPUT.FORMAT`` (detectron2's key) that the package accepts.
INPUT_FORMATS = ("RGB", "BGR")


def check_input_format(value, key: str = "INPUT.FORMAT") -> str:
    """Return ``value`` when it is one of :data:`INPUT_FORMATS`; else raise ``ValueError``
    naming ``key``, the value and the valid choices. The one check of the channel order
    for the config, the mappers and the META_ARCHs."""
    if value not in INPUT_FORMATS:
        raise ValueError(f"{key} = {value!r} is invalid; valid: {', '.join(INPUT_FORMATS)}")
    return value


def convert_channel_order(image: np.ndarray, src: str, dst: str) -> np.ndarray:
    """``(H, W, 3)`` image in channel order ``src`` -> ``dst`` (both checked with
    :func:`check_input_format`); the same array when they are equal, else a C-contiguous
    copy with the channels reversed."""
    check_input_format(src, "source channel order")
    check_input_format(dst, "target channel order")
    if src == dst:
        return image
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"expected an (H, W, 3) image to reorder channels, got shape {image.shape}")
    return np.ascontiguousarray(image[:, :, ::-1])


class ImageReadError(OSError):
    """An image file exists but cannot be read or decoded; the message names the file."""


class BadInputFile(RuntimeError):
    """A dataset's image or ground-truth file cannot be read (raised by the test mapper,
    naming the file and the dataset); ``--skip-bad`` evaluations skip exactly these. A
    class of its own so that it survives a DataLoader worker (torch re-raises the type)."""


class VocabularyError(ValueError):
    """A vocabulary string is empty, has an empty entry or a duplicate name."""


def read_image_rgb(path: str) -> np.ndarray:
    """Read an image file as ``(H, W, 3)`` uint8 RGB, EXIF orientation applied.

    Args:
        path: the image file (any format PIL reads).

    Returns:
        ``(H, W, 3)`` uint8 C-contiguous array; H, W after the EXIF rotation. See the module
        docstring for how each PIL mode is converted.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        IsADirectoryError: ``path`` is a folder.
        ImageReadError: the file is not an image PIL can identify, or it is truncated or
            corrupt, or its mode cannot be converted to RGB.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"image file not found: {path!r}")
    if os.path.isdir(path):
        raise IsADirectoryError(f"expected an image file, got the folder {path!r}")
    try:
        with Image.open(path) as img:
            if getattr(img, "n_frames", 1) > 1:
                logger.info("%s has %d frames; using the first", path, img.n_frames)
            img.load()
            try:
                img = ImageOps.exif_transpose(img)
            except Exception as e:  # a malformed EXIF block must not hide the pixels
                logger.warning("ignoring the unreadable EXIF orientation of %s: %s", path, e)
            return to_rgb_array(img, name=path)
    except UnidentifiedImageError as e:
        raise ImageReadError(f"cannot identify image file {path!r}: not an image format PIL can read") from e
    except ImageReadError:
        raise
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise ImageReadError(f"cannot read image file {path!r} (corrupt or truncated?): {e}") from e


def to_rgb_array(img: Image.Image, name: str = "<image>") -> np.ndarray:
    """Convert a loaded PIL image to ``(H, W, 3)`` uint8 RGB by the rules of this module.

    Args:
        img: a PIL image (orientation already applied).
        name: how to name the image in errors and log lines.

    Raises:
        ImageReadError: the mode has no conversion to RGB.
    """
    mode = img.mode
    if mode == "RGB":
        out = np.asarray(img, dtype=np.uint8)
    elif mode in _UINT16_MODES or mode in ("I", "F"):
        gray = _scale_high_depth(np.asarray(img), mode, name)
        out = np.repeat(gray[:, :, None], 3, axis=2)
    elif mode in ("L", "1"):
        gray = np.asarray(img.convert("L"), dtype=np.uint8)
        out = np.repeat(gray[:, :, None], 3, axis=2)
    elif mode in _ALPHA_MODES or (mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA") if mode not in ("RGBA",) else img
        out = np.asarray(rgba, dtype=np.uint8)[:, :, :3]
    else:
        try:
            out = np.asarray(img.convert("RGB"), dtype=np.uint8)
        except (ValueError, OSError) as e:
            raise ImageReadError(f"cannot convert image {name!r} of PIL mode {mode!r} to RGB: {e}") from e
    if out.ndim != 3 or out.shape[2] != 3:
        raise ImageReadError(f"image {name!r} (mode {mode!r}) gave an array of shape {out.shape}, not (H, W, 3)")
    return np.ascontiguousarray(out)


def _scale_high_depth(a: np.ndarray, mode: str, name: str) -> np.ndarray:
    """``(H, W)`` 16-bit / int32 / float32 values -> uint8 by the dtype range (no clipping)."""
    if mode in _UINT16_MODES:
        v = a.astype(np.float64) * (255.0 / 65535.0)
    elif mode == "I":
        v = a.astype(np.float64)
        if v.size and v.min() >= 0 and v.max() <= 65535:
            v = v * (255.0 / 65535.0)
        else:
            v = (v + 2.0 ** 31) * (255.0 / (2.0 ** 32 - 1))
    else:  # "F"
        v = a.astype(np.float64)
        if not np.all(np.isfinite(v)):
            raise ImageReadError(f"float image {name!r} holds NaN or infinite values")
        lo, hi = (float(v.min()), float(v.max())) if v.size else (0.0, 1.0)
        if lo >= 0.0 and hi <= 1.0:
            v = v * 255.0
        else:
            logger.warning("float image %s has values in [%g, %g], not [0, 1]: scaled min-max to 0-255", name, lo, hi)
            v = (v - lo) * (255.0 / (hi - lo)) if hi > lo else np.zeros_like(v)
    return np.rint(v).astype(np.uint8)


def parse_vocabulary(text: str) -> List[str]:
    """Parse the demo's ``--classes`` syntax into the internal vocabulary format.

    Syntax: **commas** (or newlines) separate classes, **semicolons** separate the synonyms
    of one class; the first synonym is the display name. Surrounding white space is
    dropped and inner runs of white space collapse to one space.

    >>> parse_vocabulary("cat, dog, grass; lawn, sky")
    ['cat', 'dog', 'grass, lawn', 'sky']

    Returns:
        one string per class, synonyms joined by ``", "`` (the format of the META_ARCH's
        ``vocabulary`` input and of ``TextClassifier``).

    Raises:
        VocabularyError: the text is empty, a class or a synonym is empty (``"cat,,dog"``,
            ``"cat;"``), or a name occurs twice (case-insensitive, as class or synonym).
    """
    if not isinstance(text, str):
        raise VocabularyError(f"vocabulary must be a string like 'cat, dog; puppy, sky', got {text!r}")
    if not text.strip():
        raise VocabularyError("empty vocabulary: give classes like --classes 'cat, dog; puppy, sky'")
    classes, seen = [], {}
    entries = re.split(r"[,\n]", text.strip())
    for i, entry in enumerate(entries):
        if not entry.strip():
            raise VocabularyError(
                f"empty class at position {i + 1} of {text!r}: commas separate classes, "
                "semicolons separate synonyms (e.g. 'cat, dog; puppy, sky')"
            )
        synonyms = []
        for syn in entry.split(";"):
            syn = " ".join(syn.split())
            if not syn:
                raise VocabularyError(f"empty synonym in class {entry.strip()!r} of {text!r}")
            key = syn.lower()
            if key in seen:
                raise VocabularyError(
                    f"duplicate name {syn!r} in {text!r} (class {len(classes) + 1} repeats class {seen[key] + 1})"
                )
            seen[key] = len(classes)
            synonyms.append(syn)
        classes.append(", ".join(synonyms))
    return classes
