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
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..common.progress_file import finish_progress, read_progress
from .progress import FINAL_STATES, ProgressBoard
from .records import base_record
from .runner import INTERRUPTED, RunTask, allow_runs, clear_attempt, execute_run, run_dir, stop_all_runs
from .store import RESULTS_FILE, append_jsonl

__all__ = ["LaunchSettings", "LocalLauncher", "SubmititLauncher", "SubmittedRun", "SUBMITIT_EXECUTORS",
           "submitit_parameters", "parse_minutes", "slurm_states", "SLURM_ACTIVE_STATES", "JOBS_FILE", "SubmissionError"]

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
    per run; ``tasks_per_node`` Slurm tasks per node, each one train_net process of the run
    (> 1: CPU runs only, the processes joined with gloo); ``cpus_per_run``, ``mem_gb`` per node; ``array_parallelism`` runs at a time;
    ``slurm_options`` extra ``#SBATCH`` options (``{account: x, qos: y}``); ``setup`` shell
    lines run in the job before Python (``module load cuda``); ``signal_delay_s`` seconds
    before the time limit at which Slurm signals the job to checkpoint and requeue (submitit's
    ``--signal=USR2@<s>``, default 90)."""

    partition: Optional[str] = None
    time: Optional[int] = None
    gpus_per_run: int = 1
    cpus_per_run: Optional[int] = None
    mem_gb: Optional[float] = None
    nodes: int = 1
    tasks_per_node: int = 1
    array_parallelism: Optional[int] = None
    slurm_options: Dict[str, Any] = field(default_factory=dict)
    setup: List[str] = field(default_factory=list)
    signal_delay_s: Optional[int] = None

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
        elif key in ("gpus_per_run", "cpus_per_run", "nodes", "tasks_per_node", "array_parallelism",
                     "signal_delay_s"):
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
    """``AutoExecutor.update_parameters`` keywords for ``settings`` on ``executor``:
    ``tasks_per_node`` tasks per node (default one, whose train_net starts the node's GPU
    processes with detectron2's launch; several: one CPU train_net process each)."""
    if executor not in SUBMITIT_EXECUTORS:
        raise ValueError(f"unknown submitit executor {executor!r}; valid: {', '.join(SUBMITIT_EXECUTORS)}")
    if executor == "slurm" and settings.time is None:
        raise ValueError("the Slurm executor needs a time limit per run: --time MINUTES (or launcher: {time: ...} "
                         "in the sweep file)")
    if settings.tasks_per_node > 1:
        if executor != "slurm":
            raise ValueError(f"tasks_per_node {settings.tasks_per_node}: several tasks of one run need the Slurm "
                             f"executor (its tasks get their rank from Slurm); the {executor} executor runs one")
        if settings.gpus_per_run:
            raise ValueError(f"tasks_per_node {settings.tasks_per_node} with gpus_per_run {settings.gpus_per_run}: "
                             "several tasks per node are CPU processes (gloo); give --gpus-per-run 0, or use "
                             "gpus_per_run for several GPU processes per node")
    params: Dict[str, Any] = dict(
        name=name, timeout_min=settings.time or LOCAL_NO_LIMIT_MIN, gpus_per_node=settings.gpus_per_run,
        nodes=settings.nodes, tasks_per_node=settings.tasks_per_node, cpus_per_task=settings.cpus_per_run, mem_gb=settings.mem_gb)
    if executor == "slurm":
        params.update(slurm_partition=settings.partition, slurm_array_parallelism=settings.array_parallelism,
                      slurm_additional_parameters=dict(settings.slurm_options) or None,
                      slurm_setup=list(settings.setup) or None, slurm_signal_delay_s=settings.signal_delay_s)
    elif executor == "local":
        params.pop("mem_gb")  # not a local-executor setting
        params.pop("cpus_per_task")
    if not settings.gpus_per_run:
        params.pop("gpus_per_node")  # a CPU run asks for no GPU (no --gpus-per-node, which sbatch may refuse)
    return {k: v for k, v in params.items() if v is not None}


OnDone = Callable[[Dict[str, Any]], None]


class SubmissionError(RuntimeError):
    """The scheduler refused a submission (sbatch's message; nothing of it runs)."""


class LocalLauncher:
    """Runs on this machine (see the module docstring). Interrupted (Ctrl-C, or an exception
    in the sweep), it stops every running train_net (:func:`~.runner.stop_all_runs`: their
    runs are marked ``interrupted`` and get no record) and starts no further run."""

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
        allow_runs()

        def work(task: RunTask):
            mine = [gpus.get() for _ in range(self.gpus_per_run)] if self.num_gpus > 1 else []
            try:
                env = dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(map(str, mine))) if mine else None
                folder = run_dir(task.out_dir, task.run)
                clear_attempt(folder)  # before the board reads it: no progress of an earlier attempt
                board.start(task.run.name, folder)
                record = execute_run(task, env=env)
                if record is not None:  # None: interrupted, no record
                    on_done(record)
            finally:
                for g in mine:
                    gpus.put(g)

        pool = ThreadPoolExecutor(max_workers=self.parallel)
        futures: list = []
        try:
            futures = [pool.submit(work, t) for t in tasks]
            while not all(f.done() for f in futures):
                board.report()
                time.sleep(min(1.0, board.interval))
            for f in futures:
                f.result()  # a bug in the runner surfaces here
        except BaseException:
            for f in futures:
                f.cancel()  # queued runs never start
            stop_all_runs()  # the running ones stop (a terminal's Ctrl-C may have reached them already)
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


class SubmittedRun:
    """The callable a submitit job runs: :func:`~.runner.execute_run` of its task. It has
    submitit's ``checkpoint`` method (``submitit.helpers.Checkpointable``'s protocol): when
    Slurm signals a job near its time limit (``--signal USR2@90``), submitit requeues the job
    with the same task, and the requeued attempt resumes train_net from its per-image
    checkpoint. A job pre-empted or requeued by an administrator runs the same task again."""

    def __call__(self, task: RunTask) -> Optional[Dict[str, Any]]:
        return execute_run(task)

    def checkpoint(self, task: RunTask):
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self, task)


#: Slurm job states (squeue ``%T``) of a job that has not ended; any other state has ended.
SLURM_ACTIVE_STATES = frozenset({"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_FED",
                                 "REQUEUE_HOLD", "RESIZING", "SUSPENDED", "SIGNALING", "STAGE_OUT", "STOPPED",
                                 "RESV_DEL_HOLD"})
# PREEMPTED passes on to PENDING when the cluster requeues pre-empted jobs, and ends the job
# when it cancels them: it counts as an end state once squeue has shown it on this many polls.
PREEMPTED_POLLS = 3
# Seconds a finished Slurm job's result file may lag behind its COMPLETED/FAILED state on a
# shared filesystem (submitit's Job._results_timeout_s).
RESULT_LAG_S = 15.0
#: ``<out>/jobs.json``: run key -> the Slurm job that runs it (for adoption by the next call).
JOBS_FILE = "jobs.json"


def slurm_states(environ: Optional[Dict[str, str]] = None) -> Optional[Dict[str, str]]:
    """``{job id: state}`` of this user's Slurm jobs that ``squeue`` still knows (array tasks one
    by one, ``123_4``; finished jobs until ``MinJobAge``), or None when squeue fails. squeue
    rather than sacct: sacct needs the accounting database, which many clusters (and the local
    test cluster) do not run."""
    import getpass
    import subprocess

    try:
        proc = subprocess.run(["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T", "-u", getpass.getuser()],
                              capture_output=True, text=True, timeout=60, env=environ)
    except (OSError, subprocess.SubprocessError) as e:
        logger.warning("squeue failed (%s); job states unknown until the next poll", e)
        return None
    if proc.returncode != 0:
        logger.warning("squeue failed (%s); job states unknown until the next poll", proc.stderr.strip())
        return None
    states = {}
    for line in proc.stdout.splitlines():
        jid, _, state = line.strip().partition("|")
        if jid:
            states[jid] = state.split()[0] if state else "UNKNOWN"
    return states


class SubmititLauncher:
    """submitit's executor ``executor`` (see the module docstring); its job files go to
    ``folder`` (``<out>/submitit``). ``wait=False`` submits and returns: the jobs write
    their records themselves, and a later sweep invocation picks them up (Slurm only: local
    jobs belong to this process).

    On Slurm, the jobs' ids are kept in ``<out>/jobs.json`` by run key: a later call of the
    same sweep **adopts** a run's job that is still queued or running (it waits for it instead
    of submitting the run again), so neither ``--no-wait`` nor a sweep that was interrupted
    (Ctrl-C, a lost login session: its jobs go on) leads to a second job for one run. Job
    states come from ``squeue`` (:func:`slurm_states`). Interrupted, a sweep on the local
    executor cancels its jobs (each stops its train_net; the runs are marked ``interrupted``
    and get no record)."""

    def __init__(self, executor: str, folder: str, settings: LaunchSettings, *, sweep_name: str = "sweep",
                 wait: bool = True, poll_s: float = 2.0):
        if executor not in SUBMITIT_EXECUTORS:
            raise ValueError(f"unknown submitit executor {executor!r}; valid: {', '.join(SUBMITIT_EXECUTORS)}")
        if not wait and executor != "slurm":
            raise ValueError(f"--no-wait needs the Slurm executor (the {executor} executor's jobs end with this process)")
        self.executor, self.folder, self.settings, self.wait = executor, folder, settings, wait
        self.parameters = submitit_parameters(settings, executor, f"sweep-{sweep_name}")
        self.name = f"submitit:{executor}"
        self.parallel = settings.array_parallelism or (1 if executor != "slurm" else 0)
        self.poll_s = poll_s
        self.job_ids: List[str] = []
        self.adopted: List[str] = []
        self._states: Dict[str, str] = {}
        self._last_poll = float("-inf")
        self._missing: Dict[str, int] = {}
        self._preempted: Dict[str, int] = {}

    def task_gpus(self) -> int:
        return self.settings.gpus_per_run

    def make_executor(self):
        """The configured ``submitit.AutoExecutor``."""
        import submitit

        ex = submitit.AutoExecutor(folder=self.folder, cluster=self.executor)
        ex.update_parameters(**self.parameters)
        return ex

    # ---------------------------------------------------------------- Slurm job ids by run key
    def _jobs_path(self, tasks: Sequence[RunTask]) -> Optional[str]:
        return os.path.join(tasks[0].out_dir, JOBS_FILE) if tasks else None

    def _read_jobs(self, tasks: Sequence[RunTask]) -> Dict[str, Any]:
        import json

        path = self._jobs_path(tasks)
        try:
            with open(path) as f:
                data = json.load(f)
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError, TypeError):
            return {}

    def _remember(self, tasks: Sequence[RunTask], jobs: list) -> None:
        from ..common.io import atomic_write_json

        known = self._read_jobs(tasks)
        for t, j in zip(tasks, jobs):
            known[t.run.key] = {"job_id": str(j.job_id), "run": t.run.name, "submitted": time.time()}
        atomic_write_json(self._jobs_path(tasks), known, indent=1)

    def _adoptable(self, tasks: Sequence[RunTask]) -> Dict[str, str]:
        """Run key -> job id of the runs whose Slurm job (from an earlier call) has not ended."""
        if self.executor != "slurm" or not tasks:
            return {}
        known = self._read_jobs(tasks)
        candidates = {t.run.key: str(known[t.run.key]["job_id"]) for t in tasks
                      if isinstance(known.get(t.run.key), dict) and known[t.run.key].get("job_id")}
        if not candidates:
            return {}
        states = slurm_states()
        if states is None:
            raise RuntimeError("squeue failed, so this sweep cannot tell whether its earlier jobs "
                               f"({', '.join(sorted(candidates.values()))}) still run; try again when squeue works")
        return {k: j for k, j in candidates.items() if states.get(j) in SLURM_ACTIVE_STATES}

    def _submit(self, ex, tasks: Sequence[RunTask]) -> list:
        for t in tasks:
            clear_attempt(run_dir(t.out_dir, t.run))  # no progress or result of an earlier attempt is read
        fn = SubmittedRun()
        try:
            if self.executor == "slurm" and len(tasks) > 1:
                with ex.batch():  # one job array
                    jobs = [ex.submit(fn, t) for t in tasks]
            else:
                jobs = [ex.submit(fn, t) for t in tasks]
        except Exception as e:  # sbatch's refusal (submitit's FailedJobError holds its stderr)
            text = " ".join(str(e).split()) or type(e).__name__
            hint = " (a cluster without GPUs: --gpus-per-run 0)" if "gres" in text.lower() else ""
            raise SubmissionError(f"{self.name} refused the job(s) of {', '.join(t.run.name for t in tasks)}: "
                                  f"{text}{hint}") from None
        self.job_ids += [str(j.job_id) for j in jobs]
        if self.executor == "slurm":
            self._remember(tasks, jobs)
        for t, j in zip(tasks, jobs):
            logger.info("submitted %s as %s job %s", t.run.name, self.name, j.job_id)
        return jobs

    # ---------------------------------------------------------------- waiting
    def _slurm_ended(self, job) -> Optional[str]:
        """The end state of a Slurm job, or None while it has not ended (squeue, polled at most
        every ``poll_s`` s for all jobs at once)."""
        now = time.time()
        fresh = now - self._last_poll >= self.poll_s
        if fresh:
            states = slurm_states()
            self._last_poll = now
            if states is not None:
                self._states = states
                for jid in list(self._missing) + self.job_ids + self.adopted:
                    self._missing[jid] = 0 if jid in states else self._missing.get(jid, 0) + 1
        jid = str(job.job_id)
        state = self._states.get(jid)
        if state is None:  # purged from squeue (MinJobAge) on two polls: it has ended
            return "ENDED (no longer listed by squeue)" if self._missing.get(jid, 0) >= 2 else None
        if state == "PREEMPTED":
            self._preempted[jid] = self._preempted.get(jid, 0) + (1 if fresh else 0)
            return state if self._preempted[jid] >= PREEMPTED_POLLS else None
        return None if state in SLURM_ACTIVE_STATES else state

    def _finished(self, job) -> Optional[str]:
        """None while the job runs; else "" when it left a result, or the state it ended in."""
        if job.paths.result_pickle.exists():
            return ""
        if self.executor != "slurm":  # job.result() gives the record, or raises why there is none
            return "" if job.done() else None
        state = self._slurm_ended(job)
        if state is None:
            return None
        lag = RESULT_LAG_S if state in ("COMPLETED", "FAILED") else 1.0
        deadline = time.time() + lag
        while time.time() < deadline and not job.paths.result_pickle.exists():
            time.sleep(0.2)
        return "" if job.paths.result_pickle.exists() else state

    def run(self, tasks: Sequence[RunTask], on_done: OnDone, board: ProgressBoard) -> None:
        allow_runs()
        ex = self.make_executor()
        adopt = self._adoptable(tasks)
        pending = []
        if adopt:
            from submitit.slurm.slurm import SlurmJob

            for t in tasks:
                if t.run.key in adopt:
                    job = SlurmJob(folder=self.folder, job_id=adopt[t.run.key])
                    self.adopted.append(adopt[t.run.key])
                    logger.info("run %s: adopting Slurm job %s of an earlier call of this sweep (still %s)",
                                t.run.name, adopt[t.run.key], "queued or running")
                    board.start(t.run.name, run_dir(t.out_dir, t.run))
                    pending.append((t, job))
        waiting = [t for t in tasks if t.run.key not in adopt]
        if not self.wait:
            if waiting:
                self._submit(ex, waiting)
            return
        limit = len(tasks) if self.executor == "slurm" else max(1, self.parallel)
        try:
            while waiting or pending:
                free = limit - len(pending)
                if free > 0 and waiting:
                    batch, waiting = waiting[:free], waiting[free:]
                    for t, j in zip(batch, self._submit(ex, batch)):
                        board.start(t.run.name, run_dir(t.out_dir, t.run))
                        pending.append((t, j))
                for t, j in list(pending):
                    ended = self._finished(j)
                    if ended is None:
                        continue
                    pending.remove((t, j))
                    on_done(_job_record(t, j, ended))
                board.report()
                if pending:
                    time.sleep(min(1.0, board.interval))
        except BaseException:
            self._interrupted([j for _, j in pending], [t for t, _ in pending])
            raise

    def _interrupted(self, jobs: list, tasks: Sequence[RunTask]) -> None:
        """The sweep is interrupted while ``jobs`` run: local jobs are cancelled and waited
        for; Slurm jobs go on (the next call adopts them)."""
        if not jobs:
            return
        if self.executor == "slurm":
            logger.warning("sweep interrupted: its Slurm jobs %s go on and write their records; the same command "
                           "adopts them (scancel %s stops them)", ", ".join(str(j.job_id) for j in jobs),
                           " ".join(sorted({str(j.job_id).split('_')[0] for j in jobs})))
            return
        for j in jobs:
            j.cancel(check=False)
        for t, j in zip(tasks, jobs):
            proc = getattr(j, "_process", None)
            if proc is not None:
                try:
                    proc.wait(timeout=30)
                except Exception:  # still there after 30 s: submitit's controller kills its task after 1 s
                    proc.kill()
                    proc.wait()
            folder = run_dir(t.out_dir, t.run)
            if (read_progress(folder) or {}).get("state") not in FINAL_STATES:
                finish_progress(folder, INTERRUPTED, reason="the sweep was interrupted")
        logger.warning("sweep interrupted: cancelled its %s jobs %s (no record for them; the next call runs them)",
                       self.executor, ", ".join(str(j.job_id) for j in jobs))


def _last_line(path) -> str:
    """The last non-empty line of a job's log (``srun: error: node1: task 0: Killed``), or ""."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def _job_record(task: RunTask, job, ended: str) -> Dict[str, Any]:
    """The record a finished job returned, or, when the job ended without one (killed,
    cancelled, pre-empted, out of time or memory), a failure record written here."""
    error: Optional[BaseException] = None
    if ended == "":
        try:
            record = job.task(0).result()  # rank 0's record (the only one) when the job has several tasks
            if record is not None:
                return record
        except Exception as e:  # submitit's FailedJobError / UncompletedJobError: no record from the job
            error = e
    folder = run_dir(task.out_dir, task.run)
    record = base_record(task.run, task.sweep_name, task.base, folder)
    state = ended or getattr(job, "state", "?")
    text = str(error).strip() if error is not None else ""
    last = _last_line(job.paths.stderr)
    message = text.splitlines()[0] if text else (type(error).__name__ if error is not None else
                                                  f"no result from the job (state {state})"
                                                  + (f"; its log ends: {last}" if last else ""))
    record.update(launcher=task.launcher, job_id=str(job.job_id), seconds=0.0, returncode=None, status="failed",
                  error={"type": type(error).__name__ if error is not None else None, "message": message,
                         "traceback": None,
                         "exit": f"submitit job {job.job_id} ended in state {state} without a record",
                         "job_stderr": str(job.paths.stderr)})
    append_jsonl(os.path.join(task.out_dir, RESULTS_FILE), record)
    if (read_progress(folder) or {}).get("state") not in FINAL_STATES:
        finish_progress(folder, "failed", returncode=None)
    logger.error("run %s: job %s ended without a record (%s): %s (job log %s)", task.run.name, job.job_id,
                 state, message, job.paths.stderr)
    return record
