"""One run, wherever it runs: a ``tools/train_net.py --eval-only`` subprocess in the run's
own ``OUTPUT_DIR`` (``<out>/runs/<run id>``), its record appended to ``<out>/results.jsonl``
and its metrics written as TensorBoard scalars.

:func:`execute_run` is the same function for every launcher: the local launcher calls it in
a thread, submitit pickles it with its :class:`RunTask` and calls it inside the job (on a
Slurm node, in a local submitit process, or in-process for submitit's debug executor). It
never raises for a failing run; the failure is the record.

A run with ``gpus > 1`` uses detectron2's ``launch`` inside train_net (``--num-gpus``); in a
Slurm allocation of several nodes, :func:`distributed_args` adds ``--num-machines``,
``--machine-rank`` and ``--dist-url`` from the Slurm environment, and only machine rank 0
writes the record.
"""
import logging
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional

from ..common.io import atomic_write_text
from ..evaluation.progress import PROGRESS_FILE, finish_progress
from .records import base_record, error_summary, ok_record, run_error
from .sweep_file import SweepRun, cli_value
from .store import RESULTS_FILE, append_jsonl

__all__ = ["RunTask", "execute_run", "run_dir", "default_train_net", "distributed_args", "first_slurm_host",
           "wait_with_timeout"]

logger = logging.getLogger(__name__)

# Slurm's first port for the rendezvous of a multi-node run; the job id picks one of 10000.
DIST_PORT_BASE = 29500


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


def first_slurm_host(nodelist: str) -> str:
    """The first host name of a Slurm node list (``gpu[003-005,9],cpu1`` -> ``gpu003``)."""
    m = re.match(r"([^,\[]+)(\[([^\]]+)\])?", nodelist.strip())
    if not m:
        raise ValueError(f"cannot read the Slurm node list {nodelist!r}")
    prefix, ranges = m.group(1), m.group(3)
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def distributed_args(gpus: int, environ: Mapping[str, str]) -> List[str]:
    """train_net's detectron2 ``launch`` arguments for a run of ``gpus`` GPUs per machine:
    ``--num-gpus`` when > 1, and in a Slurm job of several nodes ``--num-machines``
    (``SLURM_JOB_NUM_NODES``), ``--machine-rank`` (``SLURM_NODEID``) and ``--dist-url``
    (``tcp://<first node of SLURM_JOB_NODELIST>:<29500 + job id mod 10000>``)."""
    args = ["--num-gpus", str(gpus)] if gpus > 1 else []
    nodes = int(environ.get("SLURM_JOB_NUM_NODES", environ.get("SLURM_NNODES", "1")) or 1)
    if nodes > 1:
        host = first_slurm_host(environ["SLURM_JOB_NODELIST"])
        job_id = re.sub(r"\D", "", environ.get("SLURM_JOB_ID", "0")) or "0"
        port = DIST_PORT_BASE + int(job_id) % 10000
        args += ["--num-gpus", str(max(1, gpus))] if gpus <= 1 else []
        args += ["--num-machines", str(nodes), "--machine-rank", environ.get("SLURM_NODEID", "0"),
                 "--dist-url", f"tcp://{host}:{port}"]
    return args


def machine_rank(environ: Mapping[str, str]) -> int:
    nodes = int(environ.get("SLURM_JOB_NUM_NODES", environ.get("SLURM_NNODES", "1")) or 1)
    return int(environ.get("SLURM_NODEID", "0")) if nodes > 1 else 0


def wait_with_timeout(proc: "subprocess.Popen", timeout: Optional[float]) -> Optional[int]:
    """The exit code of ``proc``; after ``timeout`` s it is killed (and reaped) and None is
    returned."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def _command(task: RunTask, folder: str, environ: Mapping[str, str]) -> List[str]:
    cmd = [sys.executable, task.train_net or default_train_net(), "--eval-only", "--config-file", task.base]
    cmd += distributed_args(task.gpus, environ)
    for k, v in task.run.opts:
        cmd += [k, cli_value(v)]
    return cmd + ["OUTPUT_DIR", folder]


def _start_clean(folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    for stale in ("results.json", "error.json", PROGRESS_FILE):
        path = os.path.join(folder, stale)
        if os.path.exists(path):
            os.remove(path)  # never read a result (or a progress) of an earlier attempt


def _run_process(task: RunTask, folder: str, env: Optional[Dict[str, str]], rank: int) -> Dict[str, Any]:
    environ = env if env is not None else os.environ
    cmd = _command(task, folder, environ)
    suffix = "" if rank == 0 else f".rank{rank}"
    atomic_write_text(os.path.join(folder, f"command{suffix}.txt"), " ".join(cmd) + "\n")
    start = time.time()
    with open(os.path.join(folder, f"stdout{suffix}.txt"), "w") as out, \
            open(os.path.join(folder, f"stderr{suffix}.txt"), "w") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        rc = wait_with_timeout(proc, task.timeout)
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


def execute_run(task: RunTask, env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Run ``task`` as a train_net subprocess (environment ``env``, default this process's)
    and return its record; machine rank 0 also appends it to ``results.jsonl`` and writes
    its TensorBoard scalars. A failed run's record has ``status: failed`` and ``error:
    {type, message, traceback, exit}``."""
    folder = run_dir(task.out_dir, task.run)
    rank = machine_rank(env if env is not None else os.environ)
    if rank == 0:
        _start_clean(folder)
    else:
        os.makedirs(folder, exist_ok=True)
    record = base_record(task.run, task.sweep_name, task.base, folder)
    record["launcher"] = task.launcher
    record.update(_run_process(task, folder, env, rank))
    if rank != 0:
        return record  # the record of a multi-node run is machine rank 0's
    record = _finish(task, folder, record)
    if record["status"] == "ok" and task.tensorboard:
        try:
            from .tensorboard import write_scalars

            write_scalars(folder, record)
        except Exception as e:  # the metrics are in results.jsonl already; say why the events are not
            logger.warning("run %s: TensorBoard scalars not written: %s: %s", task.run.name, type(e).__name__, e)
    append_jsonl(os.path.join(task.out_dir, RESULTS_FILE), record)
    return record
