"""Atomic file writes: a reader (or a resumed sweep) sees the old file or the new one, never
half of one. Every JSON / JSON-lines / table file the tools write goes through here."""
import json
import os
import tempfile
from typing import Any

__all__ = ["atomic_write_text", "atomic_write_json"]


def atomic_write_text(path: str, text: str) -> str:
    """Write ``text`` to ``path`` through a temporary file in the same folder, fsync, then
    ``os.replace`` (atomic on POSIX and Windows). Creates the folder. Returns ``path``."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return path


def atomic_write_json(path: str, obj: Any, *, indent: int = 2, allow_nan: bool = False) -> str:
    """``json.dumps`` of ``obj`` written atomically (NaN/inf refused unless ``allow_nan``)."""
    return atomic_write_text(path, json.dumps(obj, indent=indent, allow_nan=allow_nan) + "\n")
