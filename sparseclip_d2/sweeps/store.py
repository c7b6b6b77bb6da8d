"""The sweep's record store: ``<out>/results.jsonl``, one JSON line per finished run.

Several runs may finish at once, in threads, in processes or on different machines writing to
one shared filesystem. :func:`append_jsonl` therefore takes an exclusive POSIX lock
(``fcntl.lockf``, which NFS forwards to its lock manager) on ``results.jsonl.lock`` and adds
the record with one ``write`` to a descriptor opened with ``O_APPEND``, then ``fsync``: a
record is never interleaved with another, never lost, and a writer killed mid-write leaves at
most one truncated last line, which :func:`read_jsonl` skips and the next append terminates.
"""
import fcntl
import json
import logging
import os
import threading
from typing import Any, Dict, List, Sequence

__all__ = ["RESULTS_FILE", "read_jsonl", "append_jsonl", "finished_keys", "failed_keys"]

logger = logging.getLogger(__name__)

RESULTS_FILE = "results.jsonl"
_THREAD_LOCK = threading.Lock()  # lockf locks are per process: threads of one process also serialise here


def read_jsonl(path: str) -> List[Dict[str, Any]]:
    """Records of a JSON-lines file; a corrupt line is skipped with a warning. A missing file
    gives []."""
    if not os.path.isfile(path):
        return []
    out = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                logger.warning("%s:%d is not valid JSON; skipped", path, i)
    return out


def _ends_with_newline(fd: int) -> bool:
    size = os.fstat(fd).st_size
    return size == 0 or os.pread(fd, 1, size - 1) == b"\n"


def append_jsonl(path: str, record: Dict[str, Any]) -> None:
    """Add one record as one line, safely against concurrent writers (see the module
    docstring). Creates the folder and the file."""
    data = json.dumps(record, sort_keys=False, allow_nan=True).encode("utf-8") + b"\n"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with _THREAD_LOCK:
        lock_fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(lock_fd, fcntl.LOCK_EX)
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                if not _ends_with_newline(fd):  # a writer was killed mid-line: end that line first
                    data = b"\n" + data
                written = os.write(fd, data)
                if written != len(data):
                    raise OSError(f"{path}: wrote {written} of {len(data)} bytes of a record")
                os.fsync(fd)
            finally:
                os.close(fd)
        finally:
            fcntl.lockf(lock_fd, fcntl.LOCK_UN)
            os.close(lock_fd)


def finished_keys(records: Sequence[Dict[str, Any]]) -> set:
    """Run keys that have a successful (``status == "ok"``) record."""
    return {r.get("run_key") for r in records if r.get("status") == "ok"}


def failed_keys(records: Sequence[Dict[str, Any]]) -> set:
    """Run keys that have a record other than ``ok``."""
    return {r.get("run_key") for r in records if r.get("status") != "ok"}
