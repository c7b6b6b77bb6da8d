"""One sweep at a time per output folder: ``<out>/sweep.lock``.

Two sweeps writing into one folder would run the same keys twice and interleave their
records. :class:`OutputLock` takes an exclusive, non-blocking POSIX lock (``fcntl.lockf``,
which NFS forwards to its lock manager, as :mod:`.store` does) on ``<out>/sweep.lock`` for as
long as a sweep runs (for ``--no-wait``: while it submits). A second sweep on the same folder,
from this machine or another one, is refused at once with the holder's pid, host, start time
and command line, which the holder writes into the file. The kernel releases the lock when
the holder ends, however it ends, so a killed sweep never leaves a stale lock.
"""
import fcntl
import json
import os
import socket
import sys
import time
from typing import Any, Dict, Optional

__all__ = ["LOCK_FILE", "OutputLock", "OutputLockedError"]

LOCK_FILE = "sweep.lock"


class OutputLockedError(RuntimeError):
    """Another sweep holds the output folder's lock."""


class OutputLock:
    """``with OutputLock(out_dir):`` holds ``<out_dir>/sweep.lock`` (see the module docstring).

    Raises:
        OutputLockedError: another process holds it (the message names it).
        OSError: the folder cannot be created or the lock file cannot be written.
    """

    def __init__(self, out_dir: str):
        self.path = os.path.join(out_dir, LOCK_FILE)
        self.fd: Optional[int] = None

    def holder(self) -> Dict[str, Any]:
        """What the holder wrote into the lock file ({} when unreadable)."""
        try:
            with open(self.path) as f:
                data = json.load(f)
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def acquire(self) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            h = self.holder()
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(h["started"])) if "started" in h else "?"
            raise OutputLockedError(
                f"output folder {os.path.dirname(os.path.abspath(self.path))!r} is in use by another sweep "
                f"(pid {h.get('pid', '?')} on {h.get('host', '?')} since {since}: {h.get('command', '?')}); "
                "wait until it ends, or give this sweep another --output") from None
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                "command": " ".join(sys.argv)}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            try:
                fcntl.lockf(self.fd, fcntl.LOCK_UN)
            finally:
                os.close(self.fd)
                self.fd = None

    def __enter__(self) -> "OutputLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
