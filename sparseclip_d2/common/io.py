"""Atomic file writes: a reader (or a resumed sweep) sees the old file or the new one, never
half of one. Every file the package writes for later reading (JSON, JSON lines, tables,
PNG masks, cache files) goes through :func:`atomic_path`, the one helper; the two text
writers below are built on it."""
import contextlib
import json
import os
import tempfile
from typing import Any, Iterator

__all__ = ["atomic_path", "atomic_write_text", "atomic_write_json"]


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """Yield a temporary path in the folder of ``path`` (created when missing); when the
    block ends without an exception, the temporary file is fsync'ed and moved onto ``path``
    with ``os.replace`` (atomic on POSIX and Windows); when it raises, the temporary file
    is removed and ``path`` is left as it was.

    The temporary name is hidden (``.<name>.<random>.tmp``), so folder globs such as
    ``*.png`` never pick it up; a writer that infers the format from the extension must be
    told the format (``Image.save(tmp, format="PNG")``).

    >>> with atomic_path("out/mask.png") as tmp:      # doctest: +SKIP
    ...     Image.fromarray(mask).save(tmp, format="PNG")
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def atomic_write_text(path: str, text: str) -> str:
    """Write ``text`` (UTF-8, newlines as given) to ``path`` through :func:`atomic_path`.
    Creates the folder. Returns ``path``."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            f.write(text)
    return path


def atomic_write_json(path: str, obj: Any, *, indent: int = 2, allow_nan: bool = False) -> str:
    """``json.dumps`` of ``obj`` written atomically (NaN/inf refused unless ``allow_nan``)."""
    return atomic_write_text(path, json.dumps(obj, indent=indent, allow_nan=allow_nan) + "\n")
