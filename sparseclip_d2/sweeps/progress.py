"""What the sweep shows while runs run: one line per run from its ``progress.json`` (written
inside the evaluation, :mod:`sparseclip_d2.evaluation.progress`), when it changed, and an
overall sweep ETA.

The sweep ETA is (the ETAs of the running runs + the waiting runs x the mean duration of a
run) / the runs in parallel; the mean duration is the wall time (from start or submission to
record, startup included) of the runs finished in this invocation, else (elapsed + ETA) of the
running ones. It is None until one of those is known.
"""
import logging
import threading
import time
from typing import Any, Dict, Iterable, List, Optional, Tuple

from ..common.progress_file import read_progress

__all__ = ["hms", "progress_line", "sweep_eta", "ProgressBoard", "PROGRESS_INTERVAL_S", "FINAL_STATES"]

logger = logging.getLogger(__name__)

#: Seconds between two progress reports of the sweep.
PROGRESS_INTERVAL_S = 30.0
#: ``progress.json`` states in which an attempt has ended: ``ok`` / ``failed`` (with the exit
#: code, written by the runner or, for a job that died, by the sweep), ``interrupted`` (stopped
#: from outside; no record) and ``stopped`` (train_net exited before its last image and no runner
#: said more, e.g. train_net run by hand and interrupted).
FINAL_STATES = ("ok", "failed", "interrupted", "stopped")


def hms(seconds: float) -> str:
    """``h:mm:ss``."""
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def progress_line(progress: Optional[Dict[str, Any]]) -> Optional[str]:
    """``"11/50 images, ETA 0:00:51"`` of a progress dict (``"starting"`` before the first
    count, ``"evaluated"`` when all images are done), or None without one."""
    if not progress:
        return None
    done, total, state = progress.get("images_done"), progress.get("images_total"), progress.get("state")
    if total is None:
        return state
    text = f"{done}/{total} images"
    if state in ("evaluated", "ok"):
        return f"{text}, {state}"
    if state == "failed":
        return f"{text}, failed (exit code {progress.get('returncode')})"
    if state in ("interrupted", "stopped"):
        return f"{text}, {state}"
    eta = progress.get("eta_s")
    return text + (f", ETA {hms(eta)}" if eta is not None else ", starting")


def sweep_eta(running: Iterable[Optional[Dict[str, Any]]], waiting: int, finished_seconds: List[float],
              parallel: int) -> Optional[float]:
    """Seconds until the sweep is done (see the module docstring), or None when unknown."""
    running = [p for p in running if p]
    etas = [p["eta_s"] for p in running if p.get("eta_s") is not None]
    if finished_seconds:
        mean = sum(finished_seconds) / len(finished_seconds)
    elif etas:
        mean = sum(p["elapsed_s"] + p["eta_s"] for p in running if p.get("eta_s") is not None) / len(etas)
    else:
        return None
    return (sum(etas) + waiting * mean) / max(1, parallel)


class ProgressBoard:
    """The sweep's console report: runs started, their progress lines and finished records.

    Args:
        total: runs to run in this invocation; parallel: runs at a time; interval: seconds
            between two progress reports.
    """

    def __init__(self, total: int, parallel: int, interval: float = PROGRESS_INTERVAL_S, clock=time.time):
        self.total, self.parallel, self.interval, self.clock = total, max(1, parallel), interval, clock
        self.active: Dict[str, Tuple[str, float]] = {}  # run name -> (run folder, start time)
        self.last_line: Dict[str, str] = {}
        self.finished_seconds: List[float] = []
        self.started = 0
        self._last_report = clock()
        self._lock = threading.Lock()  # the local launcher starts runs from its worker threads

    def start(self, name: str, folder: str) -> None:
        with self._lock:
            self.started += 1
            self.active[name] = (folder, self.clock())
            i = self.started
        logger.info("[%d/%d] starting %s -> %s", i, self.total, name, folder)

    def finish(self, record: Dict[str, Any], summary: str) -> None:
        _, start = self.active.pop(record["run_name"], (None, None))
        wall = self.clock() - start if start is not None else float(record.get("seconds") or 0.0)
        self.finished_seconds.append(wall)
        n = len(self.finished_seconds)
        eta = self.eta()
        tail = f", sweep ETA {hms(eta)}" if eta is not None and n < self.total else ""
        logger.info("[%d/%d] %s: %s (%.1f s%s)", n, self.total, record["run_name"], summary,
                    float(record.get("seconds") or 0.0), tail)

    def eta(self) -> Optional[float]:
        waiting = self.total - len(self.finished_seconds) - len(self.active)
        now, running = self.clock(), []
        for folder, start in self.active.values():
            p = read_progress(folder)
            if p and p.get("eta_s") is not None:  # elapsed: since the run started here (startup included)
                p = dict(p, elapsed_s=max(float(p.get("elapsed_s") or 0.0), now - start))
            running.append(p)
        return sweep_eta(running, waiting, self.finished_seconds, self.parallel)

    def report(self, force: bool = False) -> None:
        """Log the changed progress line of every active run and the sweep ETA, at most every
        ``interval`` s (``force``: now)."""
        now = self.clock()
        if not force and now - self._last_report < self.interval:
            return
        self._last_report = now
        changed = False
        for name, (folder, start) in list(self.active.items()):
            line = progress_line(read_progress(folder))
            if line is not None and line != self.last_line.get(name):
                logger.info("run %s: %s (%.0f s so far)", name, line, now - start)
                self.last_line[name] = line
                changed = True
        eta = self.eta()
        if changed and eta is not None:
            logger.info("sweep: %d running, %d waiting, %d finished; sweep ETA %s", len(self.active),
                        self.total - len(self.finished_seconds) - len(self.active), len(self.finished_seconds),
                        hms(eta))
