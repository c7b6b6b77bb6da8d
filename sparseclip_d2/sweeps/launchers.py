"""Where runs run. Every launcher calls the same :func:`~sparseclip_d2.sweeps.runner.execute_run`
for each run (which writes the run's record), so resume, failure records and the paper join
do not depend on the launcher.

- :class:`LocalLauncher` (``--launcher local``): runs on this machine, one at a time, or
  with ``--num-gpus N`` N / ``gpus_per_run`` at a time, each on its own GPUs
  (``CUDA_VISIBLE_DEVICES``).
- :class:`SubmititLauncher` (``--launcher submitit --submitit-executor slurm|local|debug``):
  submitit's executor of that name (``submitit.AutoExecutor(cluster=...)``). On Slurm the
  runs are one job array (at most ``array_parallelism`` at a time); the local executor
  starts at most ``array_parallelism`` local jobs at a time; the debug executor runs each
  job in this process, one after the other.

:class:`LaunchSettings` holds the cluster settings: the sweep file's ``launcher:`` mapping,
overridden by the command line.
"""
import logging
import os
import queue
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Dict, List, Optional, Sequence

from .progress import ProgressBoard
from .records import base_record
from .runner import RunTask, execute_run, run_dir
from .store import RESULTS_FILE, append_jsonl

__all__ = ["LaunchSettings", "LocalLauncher", "SubmititLauncher", "SUBMITIT_EXECUTORS", "submitit_parameters",
           "parse_minutes"]

logger = logging.getLogger(__name__)

SUBMITIT_EXECUTORS = ("slurm", "local", "debug")
# A local submitit job without a time limit: submitit's LocalExecutor kills a job after
# timeout_min (default 5 min, submitit/local/local.py); a week stands for "no limit".
LOCAL_NO_LIMIT_MIN = 7 * 24 * 60


def parse_minutes(value: Any, where: str) -> int:
    """Minutes from ``90``, ``"90"``, ``"1:30:00"`` or ``"2-00:00:00"`` (Slurm's forms)."""
    if isinstance(value, bool):
        raise ValueError(f"{where}: time must be minutes or [D-]H:MM:SS, got {value!r}")
    if isinstance(value, (int, float)):
        minutes = float(value)
    else:
        m = re.fullmatch(r"(?:(\d+)-)?(\d+):(\d{1,2}):(\d{1,2})|(\d+(?:\.\d+)?)", str(value).strip())
        if not m:
            raise ValueError(f"{where}: time must be minutes or [D-]H:MM:SS, got {value!r}")
        if m.group(5) is not None:
            minutes = float(m.group(5))
        else:
            days, h, mi, s = (int(g or 0) for g in m.groups()[:4])
            minutes = days * 1440 + h * 60 + mi + s / 60
    if minutes <= 0:
        raise ValueError(f"{where}: time must be > 0 minutes, got {value!r}")
    return int(-(-minutes // 1))


@dataclass
class LaunchSettings:
    """Cluster settings of a sweep (``launcher:`` in the sweep file; command-line flags win).

    ``time`` minutes per run (Slurm ``--time``; required on Slurm); ``gpus_per_run`` GPUs
    per node of a run (detectron2 ``launch`` inside the job when > 1); ``nodes`` machines
    per run; ``cpus_per_run``, ``mem_gb`` per node; ``array_parallelism`` runs at a time;
    ``slurm_options`` extra ``#SBATCH`` options (``{account: x, qos: y}``); ``setup`` shell
    lines run in the job before Python (``module load cuda``)."""

    partition: Optional[str] = None
    time: Optional[int] = None
    gpus_per_run: int = 1
    cpus_per_run: Optional[int] = None
    mem_gb: Optional[float] = None
    nodes: int = 1
    array_parallelism: Optional[int] = None
    slurm_options: Dict[str, Any] = field(default_factory=dict)
    setup: List[str] = field(default_factory=list)

    @classmethod
    def from_mapping(cls, mapping: Dict[str, Any], where: str) -> "LaunchSettings":
        """Settings from a ``launcher:`` mapping (unknown keys and bad values named)."""
        valid = [f.name for f in fields(cls)]
        unknown = sorted(set(mapping) - set(valid))
        if unknown:
            raise ValueError(f"{where}: unknown launcher key(s) {unknown}; valid: {', '.join(valid)}")
        s = cls()
        for k, v in mapping.items():
            s.set(k, v, where)
        return s

    def set(self, key: str, value: Any, where: str) -> None:
        """Set one setting, checked; ``None`` leaves it unchanged. ``where`` names the source in
        errors (a flag such as ``--time``, or ``sweep file 'x.yaml' launcher``)."""
        if value is None:
            return
        name = where if where.startswith("--") else f"{where} {key}"
        if key == "time":
            value = parse_minutes(value, name)
        elif key in ("gpus_per_run", "cpus_per_run", "nodes", "array_parallelism"):
            low = 0 if key == "gpus_per_run" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name}: expected an integer >= {low}, got {value!r}")
        elif key == "mem_gb":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{name}: expected a number of GB > 0, got {value!r}")
        elif key == "slurm_options":
            if not isinstance(value, dict):
                raise ValueError(f"{name}: expected a mapping (e.g. {{account: myproj}}), got {value!r}")
            value = {**self.slurm_options, **{str(k).replace("-", "_"): v for k, v in value.items()}}
        elif key == "setup":
            if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
                raise ValueError(f"{name}: expected a list of shell lines, got {value!r}")
        elif key == "partition":
            value = str(value)
        setattr(self, key, value)


def submitit_parameters(settings: LaunchSettings, executor: str, name: str) -> Dict[str, Any]:
    """``AutoExecutor.update_parameters`` keywords for ``settings`` on ``executor``: one task
    per node (its train_net starts the node's GPU processes with detectron2's launch)."""
    if executor not in SUBMITIT_EXECUTORS:
        raise ValueError(f"unknown submitit executor {executor!r}; valid: {', '.join(SUBMITIT_EXECUTORS)}")
    if executor == "slurm" and settings.time is None:
        raise ValueError("the Slurm executor needs a time limit per run: --time MINUTES (or launcher: {time: ...} "
                         "in the sweep file)")
    params: Dict[str, Any] = dict(
        name=name, timeout_min=settings.time or LOCAL_NO_LIMIT_MIN, gpus_per_node=settings.gpus_per_run,
        nodes=settings.nodes, tasks_per_node=1, cpus_per_task=settings.cpus_per_run, mem_gb=settings.mem_gb)
    if executor == "slurm":
        params.update(slurm_partition=settings.partition, slurm_array_parallelism=settings.array_parallelism,
                      slurm_additional_parameters=dict(settings.slurm_options) or None,
                      slurm_setup=list(settings.setup) or None)
    elif executor == "local":
        params.pop("mem_gb")  # not a local-executor setting
        params.pop("cpus_per_task")
    return {k: v for k, v in params.items() if v is not None}


OnDone = Callable[[Dict[str, Any]], None]


class LocalLauncher:
    """Runs on this machine (see the module docstring)."""

    name = "local"

    def __init__(self, num_gpus: int = 0, gpus_per_run: int = 1):
        self.num_gpus = num_gpus
        self.gpus_per_run = max(1, gpus_per_run)
        if num_gpus > 1 and self.gpus_per_run > num_gpus:
            raise ValueError(f"gpus_per_run={gpus_per_run} is more than --num-gpus {num_gpus}")
        self.parallel = max(1, num_gpus // self.gpus_per_run) if num_gpus > 1 else 1

    def task_gpus(self) -> int:
        return self.gpus_per_run if self.num_gpus >= 1 else 0

    def run(self, tasks: Sequence[RunTask], on_done: OnDone, board: ProgressBoard) -> None:
        gpus: "queue.Queue[int]" = queue.Queue()
        for g in range(max(0, self.num_gpus)):
            gpus.put(g)

        def work(task: RunTask):
            mine = [gpus.get() for _ in range(self.gpus_per_run)] if self.num_gpus > 1 else []
            try:
                env = dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(map(str, mine))) if mine else None
                board.start(task.run.name, run_dir(task.out_dir, task.run))
                on_done(execute_run(task, env=env))
            finally:
                for g in mine:
                    gpus.put(g)

        pool = ThreadPoolExecutor(max_workers=self.parallel)
        try:
            futures = [pool.submit(work, t) for t in tasks]
            while not all(f.done() for f in futures):
                board.report()
                time.sleep(min(1.0, board.interval))
            for f in futures:
                f.result()  # a bug in the runner surfaces here
        finally:  # on Ctrl-C no queued run starts (the running one gets the terminal's SIGINT)
            pool.shutdown(wait=True, cancel_futures=True)


class SubmititLauncher:
    """submitit's executor ``executor`` (see the module docstring); its job files go to
    ``folder`` (``<out>/submitit``). ``wait=False`` submits and returns: the jobs write
    their records themselves, and a later sweep invocation picks them up (Slurm only: local
    jobs belong to this process)."""

    def __init__(self, executor: str, folder: str, settings: LaunchSettings, *, sweep_name: str = "sweep",
                 wait: bool = True):
        if executor not in SUBMITIT_EXECUTORS:
            raise ValueError(f"unknown submitit executor {executor!r}; valid: {', '.join(SUBMITIT_EXECUTORS)}")
        if not wait and executor != "slurm":
            raise ValueError(f"--no-wait needs the Slurm executor (the {executor} executor's jobs end with this process)")
        self.executor, self.folder, self.settings, self.wait = executor, folder, settings, wait
        self.parameters = submitit_parameters(settings, executor, f"sweep-{sweep_name}")
        self.name = f"submitit:{executor}"
        self.parallel = settings.array_parallelism or (1 if executor != "slurm" else 0)
        self.job_ids: List[str] = []

    def task_gpus(self) -> int:
        return self.settings.gpus_per_run

    def make_executor(self):
        """The configured ``submitit.AutoExecutor``."""
        import submitit

        ex = submitit.AutoExecutor(folder=self.folder, cluster=self.executor)
        ex.update_parameters(**self.parameters)
        return ex

    def _submit(self, ex, tasks: Sequence[RunTask]) -> list:
        if self.executor == "slurm" and len(tasks) > 1:
            with ex.batch():  # one job array
                jobs = [ex.submit(execute_run, t) for t in tasks]
        else:
            jobs = [ex.submit(execute_run, t) for t in tasks]
        self.job_ids += [str(j.job_id) for j in jobs]
        for t, j in zip(tasks, jobs):
            logger.info("submitted %s as %s job %s", t.run.name, self.name, j.job_id)
        return jobs

    def run(self, tasks: Sequence[RunTask], on_done: OnDone, board: ProgressBoard) -> None:
        ex = self.make_executor()
        if not self.wait:
            self._submit(ex, tasks)
            return
        limit = len(tasks) if self.executor == "slurm" else max(1, self.parallel)
        waiting, pending = list(tasks), []
        while waiting or pending:
            free = limit - len(pending)
            if free > 0 and waiting:
                batch, waiting = waiting[:free], waiting[free:]
                for t, j in zip(batch, self._submit(ex, batch)):
                    board.start(t.run.name, run_dir(t.out_dir, t.run))
                    pending.append((t, j))
            for t, j in [p for p in pending if p[1].done()]:
                pending.remove((t, j))
                on_done(_job_record(t, j))
            board.report()
            if pending:
                time.sleep(min(1.0, board.interval))


def _job_record(task: RunTask, job) -> Dict[str, Any]:
    """The record a finished job returned, or, when the job died without one (killed,
    pre-empted, out of time or memory), a failure record written here."""
    try:
        return job.result()
    except Exception as e:  # submitit's UncompletedJobError / FailedJobError: the job ended without a record
        folder = run_dir(task.out_dir, task.run)
        record = base_record(task.run, task.sweep_name, task.base, folder)
        state = getattr(job, "state", "?")
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        record.update(launcher=task.launcher, job_id=str(job.job_id), seconds=0.0, returncode=None, status="failed",
                      error={"type": type(e).__name__, "message": message, "traceback": None,
                             "exit": f"submitit job {job.job_id} ended in state {state} without a record",
                             "job_stderr": str(job.paths.stderr)})
        append_jsonl(os.path.join(task.out_dir, RESULTS_FILE), record)
        logger.error("run %s: job %s ended without a record (%s): %s (job log %s)", task.run.name, job.job_id,
                     state, message, job.paths.stderr)
        return record
