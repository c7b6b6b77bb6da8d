"""Running a sweep: pick the runs without an ``ok`` record (resume), hand them to a launcher,
report progress, and count the outcomes."""
import logging
import os
import threading
from typing import Any, Dict, Optional

from .launchers import LocalLauncher
from .lock import OutputLock
from .progress import PROGRESS_INTERVAL_S, ProgressBoard
from .records import error_summary
from .runner import RunTask
from .sweep_file import Sweep
from .store import RESULTS_FILE, failed_keys, finished_keys, read_jsonl
from .validate import SweepValidationError

__all__ = ["run_sweep"]

logger = logging.getLogger(__name__)


def _todo(sweep: Sweep, records, retry_failed: bool, rerun: bool):
    if rerun:
        return list(sweep.runs)
    done, failed_before = finished_keys(records), failed_keys(records)
    return [r for r in sweep.runs if r.key not in done and (retry_failed or r.key not in failed_before)]


def run_sweep(sweep: Sweep, out_dir: str, *, num_gpus: int = 0, train_net: Optional[str] = None,
              retry_failed: bool = True, timeout: Optional[float] = None, on_record=None, launcher=None,
              rerun: bool = False, progress_interval: float = PROGRESS_INTERVAL_S,
              tensorboard: bool = True) -> Dict[str, int]:
    """Run every unfinished combination; each run appends its record to
    ``<out_dir>/results.jsonl``.

    Args:
        num_gpus: for the default launcher (``LocalLauncher(num_gpus)``): 0/1 = one run at a
            time; N > 1 = N runs at a time, each on its own GPU.
        retry_failed: re-run combinations whose only records are failures.
        timeout: seconds per run before it is killed (and recorded as killed).
        on_record: called with each new record (e.g. to rewrite the tables).
        launcher: a :mod:`~sparseclip_d2.sweeps.launchers` launcher (default local).
        rerun: run every combination again, finished or not (new records are added).
        tensorboard: write each finished run's metrics as TensorBoard scalars.

    Returns:
        ``{"total", "skipped", "ok", "failed"}`` counts of this invocation (and
        ``"submitted"`` when the launcher does not wait).

    Raises:
        SweepValidationError: some runs are invalid (nothing is run).
        OutputLockedError: another sweep is running into ``out_dir`` (nothing is run).
    """
    if sweep.invalid_runs:
        raise SweepValidationError(sweep.invalid_runs)
    launcher = launcher or LocalLauncher(num_gpus)
    with OutputLock(out_dir):  # one sweep per output folder; the records are read under it
        return _run_locked(sweep, out_dir, launcher, train_net=train_net, retry_failed=retry_failed,
                           timeout=timeout, on_record=on_record, rerun=rerun, progress_interval=progress_interval,
                           tensorboard=tensorboard)


def _run_locked(sweep: Sweep, out_dir: str, launcher, *, train_net, retry_failed, timeout, on_record, rerun,
                progress_interval, tensorboard) -> Dict[str, int]:
    jsonl = os.path.join(out_dir, RESULTS_FILE)
    todo = _todo(sweep, read_jsonl(jsonl), retry_failed, rerun)
    counts = {"total": len(sweep.runs), "skipped": len(sweep.runs) - len(todo), "ok": 0, "failed": 0}
    logger.info("sweep %s: %d runs, %d already finished, %d to run (%s) -> %s", sweep.name, len(sweep.runs),
                counts["skipped"], len(todo), launcher.name, jsonl)
    for run in todo:
        for w in run.warnings:
            logger.warning("run %s: %s", run.name, w)
    tasks = [RunTask(run=r, sweep_name=sweep.name, base=sweep.base, out_dir=out_dir, train_net=train_net,
                     timeout=timeout, gpus=launcher.task_gpus(), launcher=launcher.name, tensorboard=tensorboard)
             for r in todo]
    board = ProgressBoard(len(todo), getattr(launcher, "parallel", 1) or len(todo), progress_interval)
    lock = threading.Lock()

    def on_done(record: Dict[str, Any]) -> None:
        with lock:
            counts["ok" if record["status"] == "ok" else "failed"] += 1
            board.finish(record, "ok" if record["status"] == "ok" else f"FAILED: {error_summary(record.get('error'))}")
            if on_record is not None:
                on_record(record)

    launcher.run(tasks, on_done, board)
    if not getattr(launcher, "wait", True):
        counts["submitted"] = len(tasks) - len(getattr(launcher, "adopted", []))
        counts["adopted"] = len(getattr(launcher, "adopted", []))
    return counts
