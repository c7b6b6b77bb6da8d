"""One run, wherever it runs: a ``tools/train_net.py --eval-only`` subprocess in the run's
own ``OUTPUT_DIR`` (``<out>/runs/<run id>``), its record appended to ``<out>/results.jsonl``
and its metrics written as TensorBoard scalars.

:func:`execute_run` is the same function for every launcher: the local launcher calls it in
a thread, submitit pickles it with its :class:`RunTask` and calls it inside the job (on a
Slurm node, in a local submitit process, or in-process for submitit's debug executor). It
never raises for a failing run; the failure is the record.

A run with ``gpus > 1`` uses detectron2's ``launch`` inside train_net (``--num-gpus``); in a
Slurm job of several tasks (one per node, or several CPU tasks on one node), each task runs
one train_net and :func:`distributed_args` adds ``--num-machines`` (the tasks),
``--machine-rank`` (the task's rank) and ``--dist-url`` (rank 0's address, handed over in the
run folder); only rank 0 writes the record.

Interruptions. train_net never outlives the process that runs it: it is started through a
small exec wrapper that asks the kernel to SIGKILL it when its parent thread ends
(``PR_SET_PDEATHSIG``), so a runner killed with SIGKILL (by Slurm after ``KillWait``, by
submitit's local controller) takes its train_net with it. A runner that is told to stop
(Ctrl-C, SIGTERM from ``scancel`` or a requeue, submitit's time-limit signal, or
:func:`stop_all_runs` from the local launcher) stops train_net, marks ``progress.json``
``interrupted`` and writes **no record**: an interrupted attempt is neither a result nor a
failure of the run, and the next attempt (a requeue, the sweep's next call) runs it again.
Only a run that ends on its own (exit code, crash, ``--timeout``) gets a record, so a key
has one record per attempt that ran to its end.
"""
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..common.io import atomic_write_text
from ..common.progress_file import PROGRESS_FILE, finish_progress
from .records import base_record, error_summary, ok_record, run_error
from .sweep_file import SweepRun, cli_value
from .store import RESULTS_FILE, append_jsonl

__all__ = ["RunTask", "execute_run", "run_dir", "default_train_net", "distributed_args", "process_layout",
           "rendezvous_url",
           "wait_with_timeout", "allow_runs", "stop_all_runs", "clear_attempt", "INTERRUPTED"]

logger = logging.getLogger(__name__)

# The rendezvous of a multi-process run: rank 0's address in <run folder>/dist_url.<job>.<attempt>,
# and how long the other ranks wait for it (rank 0 may start later than they do).
RENDEZVOUS_FILE = "dist_url"
RENDEZVOUS_WAIT_S = 600.0
#: progress.json state of an attempt stopped from outside (no record is written for it).
INTERRUPTED = "interrupted"
# Seconds between SIGTERM and SIGKILL when a runner stops its train_net.
STOP_GRACE_S = 5.0
# train_net's exit codes when SIGINT / SIGTERM ended it (killed by the signal, or Python's exit
# status after KeyboardInterrupt / a shell's 128 + signal), and how long the runner waits for
# the same stop to reach it before it records the exit as the run's failure.
_STOP_EXITS = (-signal.SIGINT, -signal.SIGTERM, 128 + signal.SIGINT, 128 + signal.SIGTERM)
STOP_SIGNAL_WAIT_S = 1.0
#: Set for train_net by the runner: keep the per-image checkpoint after results.json is written
#: (cli/train_net.py); the runner removes it once the run's record is in results.jsonl.
KEEP_CHECKPOINT_ENV = "SPARSECLIP_KEEP_CHECKPOINT"

# Runs the command in argv[2:] with PR_SET_PDEATHSIG = SIGKILL (prctl option 1, <linux/prctl.h>):
# the kernel kills it when the thread that started it ends. argv[1] is that parent's pid; if the
# parent is already gone, the wrapper exits instead of running orphaned. It also ignores
# submitit's pre-emption / time-limit signal ($SUBMITIT_PREEMPT_SIGNAL, default USR2): Slurm's
# --signal reaches every process of the job step, and train_net, killed by USR2's default
# action, would end the run as a failure before submitit's handler in the job could requeue it.
_PDEATHSIG_EXEC = (
    "import ctypes, os, signal, sys\n"
    "name = os.environ.get('SUBMITIT_PREEMPT_SIGNAL', 'USR2')\n"
    "sig = getattr(signal, name if name.startswith('SIG') else 'SIG' + name, None)\n"
    "if sig is not None:\n"
    "    signal.signal(sig, signal.SIG_IGN)\n"
    "try:\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)\n"
    "except (OSError, AttributeError):\n"
    "    pass\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(137)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)

# The train_net processes of this process's runners, and whether they are being stopped.
_LIVE: Dict[int, "subprocess.Popen"] = {}
_LIVE_LOCK = threading.Lock()
_STOPPING = threading.Event()


def allow_runs() -> None:
    """Let :func:`execute_run` run again after :func:`stop_all_runs` (the launchers call it when
    they start, so one process can run several sweeps)."""
    _STOPPING.clear()


def stop_all_runs(grace: float = STOP_GRACE_S) -> None:
    """Stop every train_net started by :func:`execute_run` in this process (SIGTERM, SIGKILL
    after ``grace`` s); their runners mark them ``interrupted`` and write no record. Used by
    the local launcher when the sweep is interrupted."""
    _STOPPING.set()
    with _LIVE_LOCK:
        procs = list(_LIVE.values())
    _terminate(procs, grace)


def _terminate(procs, grace: float) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                p.terminate()
                p.send_signal(signal.SIGCONT)  # a stopped process acts on SIGTERM only once continued
            except OSError:
                pass
    deadline = time.time() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def default_train_net() -> str:
    """``tools/train_net.py`` of this checkout."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "tools", "train_net.py")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "-", text).strip("-")[:80] or "run"


def run_dir(out_dir: str, run: SweepRun) -> str:
    """The run's ``OUTPUT_DIR``: ``<out>/runs/<readable name>-<key[:8]>``."""
    return os.path.join(out_dir, "runs", f"{_slug(run.name)}-{run.key[:8]}")


@dataclass
class RunTask:
    """Everything a job needs to run one combination (picklable; sent to submitit jobs).

    ``gpus``: GPUs of the run (0 = CPU or whatever ``MODEL.DEVICE`` picks; >1 = detectron2
    ``launch`` with that many processes per machine). ``launcher``: how it was started, for
    the record (``local``, ``submitit:slurm``, ...)."""

    run: SweepRun
    sweep_name: str
    base: str
    out_dir: str
    train_net: Optional[str] = None
    timeout: Optional[float] = None
    gpus: int = 0
    launcher: str = "local"
    tensorboard: bool = True


def process_layout(environ: Mapping[str, str]) -> Tuple[int, int]:
    """``(processes, rank)`` of a run: the job's Slurm tasks, each running one train_net
    (``SLURM_NTASKS`` and ``SLURM_PROCID``; without ``SLURM_NTASKS``, one task per node:
    ``SLURM_JOB_NUM_NODES`` and ``SLURM_NODEID``); ``(1, 0)`` outside Slurm."""
    nodes = int(environ.get("SLURM_JOB_NUM_NODES", environ.get("SLURM_NNODES", "1")) or 1)
    tasks = int(environ.get("SLURM_NTASKS", "0") or 0) or nodes
    if tasks <= 1:
        return 1, 0
    return tasks, int(environ.get("SLURM_PROCID", environ.get("SLURM_NODEID", "0")) or 0)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def rendezvous_url(folder: str, environ: Mapping[str, str], rank: int, wait: Optional[float] = None) -> str:
    """The ``--dist-url`` of this attempt of a multi-process run: rank 0 takes a port that is
    free on its machine and writes ``tcp://<its host name>:<port>`` into the run folder
    (``dist_url.<job id>.<restart count>``, one file per attempt, earlier attempts' files
    removed); the other ranks wait up to ``wait`` s (default ``RENDEZVOUS_WAIT_S``) for it. The run folder is on the
    filesystem every node shares (the sweep's output folder must be), so no fixed port is
    needed: two clusters, or two runs on one node, never meet on one port."""
    job = re.sub(r"[^\w.-]", "_", environ.get("SLURM_JOB_ID", "0") or "0")
    attempt = re.sub(r"\D", "", environ.get("SLURM_RESTART_COUNT", "0") or "0") or "0"
    name = f"{RENDEZVOUS_FILE}.{job}.{attempt}"
    path = os.path.join(folder, name)
    if rank == 0:
        os.makedirs(folder, exist_ok=True)
        for old in os.listdir(folder):
            if old.startswith(RENDEZVOUS_FILE + ".") and old != name:
                try:
                    os.remove(os.path.join(folder, old))
                except OSError:
                    pass
        url = f"tcp://{socket.gethostname()}:{_free_port()}"
        atomic_write_text(path, url + "\n")
        return url
    wait = RENDEZVOUS_WAIT_S if wait is None else wait
    deadline = time.time() + wait
    while True:
        try:
            with open(path) as f:
                url = f.read().strip()
            if url:
                return url
        except OSError:
            pass
        if time.time() > deadline:
            raise RuntimeError(f"machine rank {rank}: rank 0 wrote no rendezvous address ({path}) in {wait:g} s")
        time.sleep(0.1)


def distributed_args(gpus: int, environ: Mapping[str, str], folder: Optional[str] = None) -> List[str]:
    """train_net's launch arguments for a run of ``gpus`` GPUs per process group member:
    ``--num-gpus`` when > 1, and in a Slurm job of several tasks (several nodes, or several
    CPU tasks on one node: :func:`process_layout`) ``--num-machines`` (the tasks),
    ``--machine-rank`` (this task's rank) and ``--dist-url`` (:func:`rendezvous_url` in the
    run ``folder``)."""
    args = ["--num-gpus", str(gpus)] if gpus > 1 else []
    machines, rank = process_layout(environ)
    if machines > 1:
        if folder is None:
            raise ValueError("a run of several processes needs its run folder for the rendezvous")
        args += ["--num-gpus", str(max(1, gpus))] if gpus <= 1 else []
        args += ["--num-machines", str(machines), "--machine-rank", str(rank),
                 "--dist-url", rendezvous_url(folder, environ, rank)]
    return args


def machine_rank(environ: Mapping[str, str]) -> int:
    return process_layout(environ)[1]


def wait_with_timeout(proc: "subprocess.Popen", timeout: Optional[float]) -> Optional[int]:
    """The exit code of ``proc``; after ``timeout`` s it is killed (and reaped) and None is
    returned."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired as e:
        if e.cmd != proc.args:  # another command's timeout, raised by a signal handler in the wait
            raise
        proc.kill()
        proc.wait()
        return None


def _command(task: RunTask, folder: str, environ: Mapping[str, str]) -> List[str]:
    cmd = [sys.executable, task.train_net or default_train_net(), "--eval-only", "--config-file", task.base]
    cmd += distributed_args(task.gpus, environ, folder)
    for k, v in task.run.opts:
        cmd += [k, cli_value(v)]
    return cmd + ["OUTPUT_DIR", folder]


def clear_attempt(folder: str) -> None:
    """Remove the run folder's ``results.json``, ``error.json`` and ``progress.json`` of an
    earlier attempt (the per-image checkpoint stays: the next attempt resumes from it). The
    launchers call it before they start or submit a run, so no progress line or result of an
    earlier attempt is ever read as this one's."""
    os.makedirs(folder, exist_ok=True)
    for stale in ("results.json", "error.json", PROGRESS_FILE):
        path = os.path.join(folder, stale)
        if os.path.exists(path):
            os.remove(path)


class _Interrupted(Exception):
    """The runner was told to stop (a signal, or :func:`stop_all_runs`)."""


def _on_stop_signal(signum, frame):
    _STOPPING.set()
    with _LIVE_LOCK:
        procs = list(_LIVE.values())
    for p in procs:
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
                p.send_signal(signal.SIGCONT)
            except OSError:
                pass


def _run_process(task: RunTask, folder: str, env: Optional[Dict[str, str]], rank: int) -> Dict[str, Any]:
    """Run train_net to its end. Raises :class:`_Interrupted` when the runner was told to stop,
    and re-raises what interrupted the wait (KeyboardInterrupt, submitit's SystemExit or
    UncompletedJobError) after stopping train_net."""
    environ = env if env is not None else os.environ
    cmd = _command(task, folder, environ)
    suffix = "" if rank == 0 else f".rank{rank}"
    atomic_write_text(os.path.join(folder, f"command{suffix}.txt"), " ".join(cmd) + "\n")
    start = time.time()
    wrapped = [sys.executable, "-c", _PDEATHSIG_EXEC, str(os.getpid()), *cmd]
    with open(os.path.join(folder, f"stdout{suffix}.txt"), "w") as out, \
            open(os.path.join(folder, f"stderr{suffix}.txt"), "w") as err:
        # train_net keeps its per-image checkpoint for the runner to remove once the record is
        # written (remove_run_checkpoints): an attempt stopped in between resumes every image
        child_env = dict(environ, **{KEEP_CHECKPOINT_ENV: "1"})
        proc = subprocess.Popen(wrapped, stdout=out, stderr=err, env=child_env)
        with _LIVE_LOCK:
            _LIVE[proc.pid] = proc
        try:
            if _STOPPING.is_set():
                _terminate([proc], STOP_GRACE_S)
            rc = wait_with_timeout(proc, task.timeout)
            if rc in _STOP_EXITS:
                # Slurm (scancel, requeue) signals every process of the job, a terminal's Ctrl-C
                # every process of its foreground group: the signal that ended train_net may
                # reach this process a moment later. Wait for it before calling this a failure.
                deadline = time.time() + STOP_SIGNAL_WAIT_S
                while not _STOPPING.is_set() and time.time() < deadline:
                    time.sleep(0.02)
        except BaseException:
            _terminate([proc], STOP_GRACE_S)
            raise
        finally:
            with _LIVE_LOCK:
                _LIVE.pop(proc.pid, None)
    if _STOPPING.is_set() and (rc is None or rc != 0):
        raise _Interrupted()
    return {"seconds": round(time.time() - start, 3), "returncode": rc}


def _finish(task: RunTask, folder: str, record: Dict[str, Any]) -> Dict[str, Any]:
    import json

    results_path = os.path.join(folder, "results.json")
    rc = record["returncode"]
    if rc != 0 or not os.path.isfile(results_path):
        record["status"] = "failed"
        record["error"] = run_error(folder, rc, task.timeout)
        tb = record["error"].get("traceback") or record["error"].get("stderr_tail") or ""
        logger.error("run %s failed (%s): %s\n%s\n(stdout/stderr in %s)", task.run.name, record["error"]["exit"],
                     error_summary(record["error"]), tb[-3000:], folder)
        finish_progress(folder, "failed", returncode=rc)
        return record
    with open(results_path) as f:
        ok_record(record, json.load(f))
    finish_progress(folder, "ok", returncode=rc)
    return record


def _interrupted(folder: str, rank: int, why: str) -> None:
    if rank == 0:
        finish_progress(folder, INTERRUPTED, reason=why)
    logger.warning("run in %s interrupted (%s): no record written; the next attempt runs it again", folder, why)


def _requeue_in_flight(e: BaseException) -> bool:
    """Whether ``e`` is submitit's time-limit handler failing in ``scontrol requeue <job>``
    (``SlurmJobEnvironment._requeue``, raised into our wait). slurmctld requeues the job and at
    once signals all of its processes, the ``scontrol`` that asked included: under load the
    signal can kill it before it exits (``CalledProcessError`` with a negative code), seen on the
    local cluster at a load of 8. The requeue may well have happened, so this is an interrupted
    attempt, never the run's failure record: when the job was requeued, the next attempt runs
    the task; when it was not, the sweep finds the job ended without a record and says so."""
    cmd = getattr(e, "cmd", None)
    return (isinstance(e, subprocess.SubprocessError) and isinstance(cmd, (list, tuple))
            and [str(c) for c in cmd[:2]] == ["scontrol", "requeue"])


def execute_run(task: RunTask, env: Optional[Dict[str, str]] = None) -> Optional[Dict[str, Any]]:
    """Run ``task`` as a train_net subprocess (environment ``env``, default this process's)
    and return its record; machine rank 0 also appends it to ``results.jsonl`` and writes
    its TensorBoard scalars. A failed run's record has ``status: failed`` and ``error:
    {type, message, traceback, exit}``.

    An interrupted attempt (see the module docstring) writes no record: in a thread (the
    local launcher's :func:`stop_all_runs`) it returns None; in a process's main thread (a
    submitit job) SIGTERM makes it stop train_net and raise ``SystemExit(143)``, and what
    interrupted it otherwise (Ctrl-C, submitit's requeue ``SystemExit``) is re-raised, so
    that submitit writes no result for it; so is submitit's requeue command failing as Slurm
    signals the job it requeues (:func:`_requeue_in_flight`). submitit's "timed out and cannot be requeued"
    error becomes the run's failure record."""
    folder = run_dir(task.out_dir, task.run)
    rank = machine_rank(env if env is not None else os.environ)
    if rank == 0:
        clear_attempt(folder)
    else:
        os.makedirs(folder, exist_ok=True)
    record = base_record(task.run, task.sweep_name, task.base, folder)
    record["launcher"] = task.launcher
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_stop_signal) if main else None
    start = time.time()
    held = None
    try:
        record.update(_run_process(task, folder, env, rank))
        if main:
            held = _hold_requeue_signal()
    except _Interrupted:
        _interrupted(folder, rank, "stopped by a signal or by the sweep")
        if main:
            raise SystemExit(143)
        return None
    except Exception as e:
        if _requeue_in_flight(e):  # this attempt ends; the requeued one (if any) runs the task again
            _interrupted(folder, rank, f"requeue in flight: {e}")
            if main:
                raise SystemExit(143)
            return None
        # submitit's UncompletedJobError (time limit, not requeued) raised in our wait
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        record.update(seconds=round(time.time() - start, 3), returncode=None, status="failed",
                      error={"type": type(e).__name__, "message": message, "traceback": None,
                             "exit": f"stopped by the job: {message}"})
        if rank == 0:
            finish_progress(folder, "failed", returncode=None)
            append_jsonl(os.path.join(task.out_dir, RESULTS_FILE), record)
        return record
    except BaseException as e:  # Ctrl-C, submitit's SystemExit after a requeue
        _interrupted(folder, rank, type(e).__name__)
        raise
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
    try:
        if rank != 0:
            return record  # the record of a multi-node run is machine rank 0's
        return _record_run(task, folder, record)
    finally:
        if held is not None and not os.environ.get("SUBMITIT_EXECUTOR"):
            signal.signal(*held)  # outside a submitit job: as before


def _preempt_signal() -> Optional[int]:
    """submitit's pre-emption / time-limit signal ($SUBMITIT_PREEMPT_SIGNAL, default USR2)."""
    name = os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")
    return getattr(signal, name if name.startswith("SIG") else "SIG" + name, None)


def _hold_requeue_signal():
    """Ignore submitit's time-limit signal once train_net has ended (main thread only); returns
    ``(signal, previous handler)``. The run is done: a requeue now would only repeat it, and its
    handler's ``SystemExit`` would drop the finished result before its record is written (seen on
    the local cluster: the signal came 2 s after results.json, and the next attempt evaluated
    every image again). Ignored, not blocked: a blocked signal sent to the process still reaches
    any other thread. Inside a submitit job it stays ignored: the job returns the record and its
    process ends."""
    sig = _preempt_signal()
    if sig is None:
        return None
    return sig, signal.signal(sig, signal.SIG_IGN)


def remove_run_checkpoints(folder: str) -> None:
    """Remove the per-image checkpoints train_net kept in the run folder (``KEEP_CHECKPOINT_ENV``)."""
    import glob
    import shutil

    for path in glob.glob(os.path.join(folder, "inference", "*", "checkpoint")):
        shutil.rmtree(path, ignore_errors=True)


def _record_run(task: RunTask, folder: str, record: Dict[str, Any]) -> Dict[str, Any]:
    """Machine rank 0's end of a run that ended on its own: the record finished, its TensorBoard
    scalars, the record appended, then (an ok run) the checkpoints train_net kept removed."""
    record = _finish(task, folder, record)
    if record["status"] == "ok" and task.tensorboard:
        try:
            from .tensorboard import write_scalars

            write_scalars(folder, record)
        except Exception as e:  # the metrics are in results.jsonl already; say why the events are not
            logger.warning("run %s: TensorBoard scalars not written: %s: %s", task.run.name, type(e).__name__, e)
    append_jsonl(os.path.join(task.out_dir, RESULTS_FILE), record)
    if record["status"] == "ok":
        remove_run_checkpoints(folder)
    return record
