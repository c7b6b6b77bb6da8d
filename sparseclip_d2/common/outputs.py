"""Guarded output folders: one run at a time per folder (a lock), and a manifest of what
the runs wrote there, so that a rerun never leaves another run's files beside its own.

``OutputFolder(path, tool)``:

- :meth:`~OutputFolder.acquire` takes an exclusive ``flock`` on ``<path>/.sparseclip.lock``
  (created with the folder). The lock belongs to the open file: the kernel drops it when
  the process ends in any way (``kill -9`` included), so a stale lock cannot block a
  later run. A folder locked by a live run raises :class:`OutputFolderBusy` naming the
  folder and the holder (pid, tool, start time, command line), at once, without waiting.
- ``<path>/.sparseclip_manifest.json`` lists every file the runs of the folder wrote
  (paths relative to the folder), the tool and the run's description. :meth:`begin`
  removes the files an earlier run recorded that this run will not rewrite, before it
  writes anything (a demo rerun with another vocabulary keeps no ``*_labels.png`` whose
  labels meant the old classes); :meth:`record` adds files as they are written (the
  manifest is rewritten atomically, so an interrupted run's files are known too). Files
  the manifest does not list (the user's) are never touched.
- A folder that holds outputs of a run without a manifest (``stale_patterns``, e.g. from a
  version without manifests) is refused by :meth:`begin`: nothing can tell which of
  those files the new run would leave stale.

POSIX only (``fcntl``); everything else is the standard library.
"""
import fnmatch
import json
import os
import sys
import time
from typing import Iterable, List, Optional, Sequence

from .io import atomic_write_json

__all__ = ["LOCK_FILE", "MANIFEST_FILE", "OutputFolder", "OutputFolderBusy", "OutputFolderError", "SkipBad"]

LOCK_FILE = ".sparseclip.lock"
MANIFEST_FILE = ".sparseclip_manifest.json"


class OutputFolderError(OSError):
    """An output folder that cannot be used as it is (names the folder and the fix)."""


class OutputFolderBusy(OutputFolderError):
    """The output folder is locked by another running process."""


class OutputFolder:
    """Lock and manifest of one output folder (see the module docstring).

    Args:
        path: the folder (created by :meth:`acquire`).
        tool: the writing tool's name (``"demo.py"``, ``"train_net.py"``), in messages.
        stale_patterns: glob patterns of this tool's outputs; a folder holding such a file
            but no manifest is refused by :meth:`begin`.
    """

    def __init__(self, path: str, tool: str, stale_patterns: Sequence[str] = (), option: str = "the output folder"):
        self.path = os.path.abspath(path)
        self.tool = tool
        self.option = option  # how the user gave the path (OUTPUT_DIR, --output), in messages
        self.stale_patterns = tuple(stale_patterns)
        self._lock_file = None
        self._files: List[str] = []
        self._run: dict = {}

    # ------------------------------------------------------------------ lock
    @property
    def locked(self) -> bool:
        return self._lock_file is not None

    def acquire(self) -> "OutputFolder":
        """Create the folder and take its lock; raises :class:`OutputFolderBusy` when another
        process holds it. Re-entrant within one object."""
        import fcntl

        if self._lock_file is not None:
            return self
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise OutputFolderError(f"output folder {self.path!r} ({self.option}) is a file, not a folder: choose "
                                    "another path")
        lock_path = os.path.join(self.path, LOCK_FILE)
        try:
            os.makedirs(self.path, exist_ok=True)
            f = open(lock_path, "a+", encoding="utf-8")
        except OSError as e:
            raise OutputFolderError(
                f"cannot write the output folder {self.path!r} ({self.option}): {e.strerror or e}"
                f"{f' ({e.filename!r})' if e.filename and os.path.abspath(e.filename) != self.path else ''}; "
                f"choose a folder you can write to with {self.option} DIR") from None
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            f.close()
            raise OutputFolderBusy(
                f"output folder {self.path!r} is in use by another run ({holder}); two runs writing one folder "
                f"would mix their files and logs: wait for it to finish, or choose another output folder") from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}, {self.tool}, since {time.strftime('%Y-%m-%d %H:%M:%S')}, "
                f"command: {' '.join(sys.argv)[:300]}\n")
        f.flush()
        self._lock_file = f
        return self

    def release(self) -> None:
        """Drop the lock (also dropped by the kernel when the process ends)."""
        if self._lock_file is not None:
            import fcntl

            try:
                fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_UN)
            finally:
                self._lock_file.close()
                self._lock_file = None

    def __enter__(self) -> "OutputFolder":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    # ------------------------------------------------------------------ manifest
    @property
    def manifest_path(self) -> str:
        return os.path.join(self.path, MANIFEST_FILE)

    def read_manifest(self) -> Optional[dict]:
        """The manifest of the folder, or None when there is none.

        Raises:
            OutputFolderError: the manifest is not valid JSON of the expected layout.
        """
        if not os.path.exists(self.manifest_path):
            return None
        try:
            with open(self.manifest_path, encoding="utf-8") as f:
                data = json.load(f)
            if not isinstance(data, dict) or not isinstance(data.get("files", []), list):
                raise ValueError("not a manifest")
        except (OSError, ValueError) as e:
            raise OutputFolderError(f"{self.manifest_path} is unreadable ({e}); delete it and the outputs it "
                                    f"listed, or choose another output folder") from e
        return data

    def _relative(self, path: str) -> str:
        rel = os.path.relpath(os.path.abspath(path), self.path)
        if rel.startswith(os.pardir):
            raise ValueError(f"{path!r} is outside the output folder {self.path!r}")
        return rel

    def begin(self, run: dict, keep: Iterable[str] = ()) -> List[str]:
        """Start a run in the (locked) folder: remove what earlier runs recorded except the
        files in ``keep`` (paths; this run rewrites or continues them), and write a manifest
        for this run (``run``: a JSON-able description). Returns the removed paths.

        Raises:
            OutputFolderError: the folder holds this tool's outputs but no manifest.
        """
        if not self.locked:
            raise RuntimeError("OutputFolder.begin() needs the lock: call acquire() first")
        old = self.read_manifest()
        if old is None and self.stale_patterns:
            found = sorted(f for f in os.listdir(self.path)
                           if any(fnmatch.fnmatch(f, p) for p in self.stale_patterns))
            if found:
                shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
                raise OutputFolderError(
                    f"output folder {self.path!r} holds outputs of an earlier run without a manifest ({shown}); "
                    f"they could be left beside this run's and be taken for them: empty the folder or choose "
                    f"another one")
        keep_rel = {self._relative(p) for p in keep}
        removed = []
        for rel in (old or {}).get("files", []):
            path = os.path.join(self.path, rel)
            if rel in keep_rel or self._relative(path) != rel:
                continue
            if os.path.isfile(path) or os.path.islink(path):
                os.remove(path)
                removed.append(path)
        self._run = dict(run)
        self._files = sorted(keep_rel & set((old or {}).get("files", [])))
        self._write()
        return removed

    def record(self, paths: Iterable[str]) -> None:
        """Add written files to the manifest (rewritten atomically)."""
        changed = False
        for p in paths:
            rel = self._relative(p)
            if rel not in self._files:
                self._files.append(rel)
                changed = True
        if changed:
            self._write()

    def _write(self) -> None:
        atomic_write_json(self.manifest_path, {"tool": self.tool, "run": self._run, "files": list(self._files)})


class SkipBad:
    """``--skip-bad`` for a loop over input files: ``with skip.guard(path): ...`` lets an
    exception of ``errors`` (an unreadable file) propagate unless ``enabled``; when enabled
    it is logged as a warning naming the file, remembered in :attr:`skipped`
    (``[{"file", "error"}]``, for results.json) and the loop goes on."""

    def __init__(self, enabled: bool, errors: tuple, logger=None):
        import logging

        self.enabled = bool(enabled)
        self.errors = tuple(errors)
        self.skipped: List[dict] = []
        self.logger = logger or logging.getLogger(__name__)

    def guard(self, path: str):
        import contextlib

        @contextlib.contextmanager
        def _guard():
            try:
                yield
            except self.errors as e:
                if not self.enabled:
                    raise
                message = " ".join(str(e).split())
                self.skipped.append({"file": str(path), "error": message})
                self.logger.warning("skipped %s (--skip-bad): %s", path, message)

        return _guard()

    def summary(self, total: int) -> None:
        """Log the count of skipped files (nothing when none was skipped)."""
        if self.skipped:
            self.logger.warning("skipped %d of %d input(s) (--skip-bad): %s", len(self.skipped), total,
                                ", ".join(s["file"] for s in self.skipped))
