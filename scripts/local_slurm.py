#!/usr/bin/env python3
"""A single-node Slurm cluster in one folder, for trying the cluster path of sweeps and for the
tests (Debian's ``slurm-wlm`` and ``munge``, installed by ``scripts/setup.sh``; run as root).

    python scripts/local_slurm.py start /tmp/cluster      # prints: export SLURM_CONF=/tmp/cluster/slurm.conf
    export SLURM_CONF=/tmp/cluster/slurm.conf
    sinfo; python tools/sweep.py configs/sweeps/smoke.yaml --launcher submitit --time 10
    python scripts/local_slurm.py stop /tmp/cluster

``start`` writes into the folder a munge key, a ``slurm.conf`` (its own ``ClusterName``, two
free TCP ports, its own state, pid and log files; ``ProctrackType=proctrack/linuxproc``,
``TaskPlugin=task/none``, ``SelectType=select/cons_tres``, no accounting), starts ``munged``
(its own socket), ``slurmctld`` and ``slurmd``, and waits until ``sinfo`` shows the node idle.
Every command of this cluster (``sbatch``, ``squeue``, ``scancel``, submitit) finds it through
``SLURM_CONF``. Nothing outside the folder is read or written but one short folder of the
cluster's own, made by ``mkdtemp`` under ``/tmp`` and named in ``<folder>/runtime_dir``: it holds
the munge socket and slurmd's spool, where each job step gets a Unix socket
(``<spool>/localnode/localnode_<job>.<step>``). A Unix socket path has at most 107 bytes on
Linux (``sun_path``, ``man 7 unix``), and a folder as deep as pytest-xdist's temporary folders
would pass it: slurmd then logs ``Unix socket path ... is too long`` and no job starts. So two
checkouts can each run one, in folders of any depth.

``stop`` cancels this cluster's jobs and waits for them, then stops each daemon by the pid in
its pid file (SIGTERM, then SIGKILL after a grace period), and finally kills, by pid, any
process still left of this cluster: a job step daemon (``slurmstepd``, started by this
``slurmd``: ``SPARSECLIP_SLURM_DIR=<folder>`` in its environment) or a job process
(``SLURM_CONF=<folder>/slurm.conf`` and a ``SLURM_JOB_ID`` in its environment). It then checks
that no such process remains and that the two ports are free, and exits 1 naming what is left
otherwise. Last it removes the cluster's runtime folder. ``status`` prints the daemons' pids and ``sinfo``.

``start --owner PID`` (the tests: ``start(folder, owner=os.getpid())``) also starts a
watchdog, a small process in its own session that stops the cluster (as ``stop`` does) as
soon as process PID has ended, however it ended: a test process killed with SIGKILL, or a
suite stopped by hand, leaves no daemon behind. ``stop`` ends the watchdog too.

The module is also imported by the tests (``start``, ``stop``, ``cluster_env``).
"""
import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zlib
from typing import Dict, List, Optional

__all__ = ["start", "stop", "status", "cluster_env", "leftover_processes", "watchdog_pid", "runtime_dir", "DAEMONS",
           "REQUIRED_PROGRAMS"]

#: name -> (pid file, log file) inside the cluster folder, in start order.
DAEMONS = {"munged": ("munged.pid", "munged.log"), "slurmctld": ("slurmctld.pid", "slurmctld.log"),
           "slurmd": ("slurmd.pid", "slurmd.log")}
REQUIRED_PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo", "scontrol")
NODE = "localnode"
PARTITION = "local"
MARKER = "SPARSECLIP_SLURM_DIR"
WATCHDOG_PID = "watchdog.pid"
#: the file in the cluster folder that names the cluster's runtime folder (sockets, spool)
RUNTIME_RECORD = "runtime_dir"
RUNTIME_PREFIX = "slurm-"
#: sizeof(sockaddr_un.sun_path) on Linux, terminating NUL included (``man 7 unix``)
SUN_PATH_MAX = 108
WATCHDOG_POLL_S = 0.5
# start() tries again with two other ports when a daemon cannot start (a port taken between the
# choice and the daemon's bind, by any process of the machine)
START_ATTEMPTS = 3

SLURM_CONF = """\
# Written by scripts/local_slurm.py: a single-node cluster living in {folder}
ClusterName={cluster}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={runtime}/munge.socket
StateSaveLocation={folder}/state
SlurmdSpoolDir={runtime}/spool/%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
# seconds between a job's SIGTERM and its SIGKILL on cancel, requeue or time limit (default 30)
KillWait=5
# a finished job stays visible to squeue for this many seconds (the sweep reads its end state there)
MinJobAge=600
# CPUs as declared below, even when the machine has fewer (a test asks for more tasks than cores)
SlurmdParameters=config_overrides
NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={mem_mb} State=UNKNOWN
PartitionName={partition} Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""


def _free_ports(n: int) -> List[int]:
    """``n`` TCP ports that are free now (the kernel's choice, held together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _port_bound(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


def _mem_mb() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return max(1024, int(line.split()[1]) // 1024 - 512)
    return 4096


def _conf_path(folder: str) -> str:
    return os.path.join(folder, "slurm.conf")


def cluster_env(folder: str, base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """``base`` (default ``os.environ``) with ``SLURM_CONF`` pointing at the cluster in ``folder``."""
    return dict(os.environ if base is None else base, SLURM_CONF=_conf_path(os.path.abspath(folder)))


def _read_pid(path: str) -> Optional[int]:
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except OSError:
        return False


def _environ(pid: int) -> Dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            out[k.decode(errors="replace")] = v.decode(errors="replace")
    return out


def _ports(folder: str) -> List[int]:
    ports = []
    try:
        with open(_conf_path(folder)) as f:
            for line in f:
                if line.startswith(("SlurmctldPort=", "SlurmdPort=")):
                    ports.append(int(line.split("=", 1)[1]))
    except OSError:
        pass
    return ports


def leftover_processes(folder: str) -> List[int]:
    """Pids of the processes of the cluster in ``folder``: its daemons (pid files), the job
    step daemons its slurmd started (``SPARSECLIP_SLURM_DIR=<folder>`` in their environment) and
    its jobs' processes (``SLURM_CONF=<folder>/slurm.conf`` and ``SLURM_JOB_ID``)."""
    folder = os.path.abspath(folder)
    pids = {p for p in (_read_pid(os.path.join(folder, pf)) for pf, _ in DAEMONS.values()) if p and _alive(p)}
    conf = _conf_path(folder)
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        env = _environ(int(entry))
        if env.get(MARKER) == folder or (env.get("SLURM_CONF") == conf and "SLURM_JOB_ID" in env):
            if _alive(int(entry)):
                pids.add(int(entry))
    return sorted(pids)


def _run(cmd: List[str], folder: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, env=cluster_env(folder), timeout=timeout)


def _wait(predicate, timeout: float, step: float = 0.2) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def _log_tail(folder: str, name: str) -> str:
    try:
        with open(os.path.join(folder, DAEMONS[name][1]), errors="replace") as f:
            return "".join(f.readlines()[-15:])
    except OSError:
        return "(no log)"


def start(folder: str, cpus: Optional[int] = None, timeout: float = 60.0, owner: Optional[int] = None) -> Dict[str, str]:
    """Start a cluster in ``folder`` (created; it must not hold a running cluster) and return
    the environment to reach it (:func:`cluster_env`). ``cpus``: CPUs the node declares
    (default: at least 4, so that a test can run several one-CPU jobs at once on a 2-core
    machine). ``owner``: a pid; a watchdog stops the cluster once that process has ended
    (:func:`watch`). On failure every daemon started is stopped and ``RuntimeError`` names the
    daemon and the tail of its log; a daemon that cannot start is tried again on two other
    ports (``START_ATTEMPTS`` in all)."""
    missing = [p for p in REQUIRED_PROGRAMS if shutil.which(p) is None]
    if missing:
        raise RuntimeError(f"local Slurm cluster: {', '.join(missing)} not found; install Debian's slurm-wlm and "
                           "munge (scripts/setup.sh does, as root)")
    folder = os.path.abspath(folder)
    os.makedirs(folder, exist_ok=True)
    if leftover_processes(folder):
        raise RuntimeError(f"local Slurm cluster: {folder} already has a running cluster; stop it first "
                           f"(python scripts/local_slurm.py stop {folder})")
    os.chmod(folder, 0o700)
    os.makedirs(os.path.join(folder, "state"), exist_ok=True)
    key = os.path.join(folder, "munge.key")
    if not os.path.isfile(key):
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
    os.chmod(key, 0o400)
    try:
        _make_runtime_dir(folder)  # inside the try: a failed start removes it with the rest
        if owner is not None:
            _start_watchdog(folder, owner)  # first: whatever happens to the owner from now on, it cleans up
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                _start_daemons(folder, cpus, timeout)
                break
            except _DaemonFailed as e:
                _stop_daemons(folder)
                if attempt == START_ATTEMPTS:
                    raise RuntimeError(str(e)) from None
    except BaseException:
        stop(folder, check=False)
        raise
    return cluster_env(folder)


class _DaemonFailed(RuntimeError):
    pass


def runtime_dir(folder: str) -> Optional[str]:
    """The runtime folder (munge socket, slurmd's spool) recorded for the cluster in ``folder``,
    or None when none is recorded."""
    try:
        with open(os.path.join(os.path.abspath(folder), RUNTIME_RECORD)) as f:
            path = f.read().strip()
    except OSError:
        return None
    return path or None


def _runtime_base() -> str:
    """``/tmp`` (short whatever ``TMPDIR`` says), else the temporary folder Python chooses."""
    return "/tmp" if os.path.isdir("/tmp") and os.access("/tmp", os.W_OK | os.X_OK) else tempfile.gettempdir()


def _make_runtime_dir(folder: str) -> str:
    """Make (or keep, when it still exists: munged kept from a failed attempt uses it) the
    cluster's runtime folder, record it in ``<folder>/runtime_dir`` and check that the longest
    socket path slurmd will make there fits ``sun_path``."""
    path = runtime_dir(folder)
    if not (path and os.path.isdir(path)):
        path = tempfile.mkdtemp(prefix=RUNTIME_PREFIX, dir=_runtime_base())  # mode 0700: munged refuses
        # a socket folder that others can write to
        with open(os.path.join(folder, RUNTIME_RECORD + ".tmp"), "w") as f:
            f.write(path + "\n")
        os.replace(os.path.join(folder, RUNTIME_RECORD + ".tmp"), os.path.join(folder, RUNTIME_RECORD))
    # a job step's socket: <spool>/<node>/<node>_<job id>.<step id>, ids up to 2**32 - 1
    longest = os.path.join(path, "spool", NODE, f"{NODE}_{2 ** 32 - 1}.{2 ** 32 - 1}")
    if len(longest.encode()) >= SUN_PATH_MAX:
        raise RuntimeError(f"local Slurm cluster: the runtime folder {path} is too deep for slurmd's job step "
                           f"sockets ({len(longest.encode())} bytes, at most {SUN_PATH_MAX - 1}); set TMPDIR to "
                           "a shorter folder")
    os.makedirs(os.path.join(path, "spool"), exist_ok=True)
    return path


def _remove_runtime_dir(folder: str) -> None:
    """Remove the recorded runtime folder, only when it is one this script made (a folder named
    ``slurm-*`` directly in the runtime base), and its record."""
    path = runtime_dir(folder)
    if path and os.path.dirname(path) in {_runtime_base(), tempfile.gettempdir()} \
            and os.path.basename(path).startswith(RUNTIME_PREFIX):
        shutil.rmtree(path, ignore_errors=True)
    try:
        os.remove(os.path.join(folder, RUNTIME_RECORD))
    except OSError:
        pass


def _start_daemons(folder: str, cpus: Optional[int], timeout: float) -> None:
    key = os.path.join(folder, "munge.key")
    runtime = _make_runtime_dir(folder)
    ctld_port, slurmd_port = _free_ports(2)
    host = socket.gethostname().split(".")[0]
    with open(_conf_path(folder), "w") as f:
        f.write(SLURM_CONF.format(folder=folder, runtime=runtime, cluster="sc%08x" % zlib.crc32(folder.encode()),
                                  host=host, ctld_port=ctld_port, slurmd_port=slurmd_port, node=NODE,
                                  partition=PARTITION, cpus=cpus or max(4, os.cpu_count() or 1),
                                  mem_mb=_mem_mb()))
    env = dict(cluster_env(folder), **{MARKER: folder})
    commands = {
        "munged": ["munged", "--force", f"--key-file={key}", f"--socket={runtime}/munge.socket",
                   f"--pid-file={folder}/munged.pid", f"--log-file={folder}/munged.log",
                   f"--seed-file={folder}/munged.seed"],
        "slurmctld": ["slurmctld", "-f", _conf_path(folder), "-i"],
        "slurmd": ["slurmd", "-f", _conf_path(folder), "-N", NODE],
    }
    for name, cmd in commands.items():
        pid_file = os.path.join(folder, DAEMONS[name][0])
        if name == "munged" and _read_pid(pid_file) and _alive(_read_pid(pid_file)):
            continue  # kept from a failed attempt (it has no TCP port)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=folder, timeout=timeout)
        if proc.returncode != 0 or not _wait(lambda: (_read_pid(pid_file) or 0) > 0
                                             and _alive(_read_pid(pid_file)), timeout):
            raise _DaemonFailed(f"local Slurm cluster: {name} did not start (exit {proc.returncode}): "
                                f"{(proc.stderr or proc.stdout).strip()}\n{_log_tail(folder, name)}")
    if not _wait(lambda: _run(["sinfo", "-h", "-N", "-o", "%T"], folder).stdout.strip() == "idle", timeout, 0.5):
        raise _DaemonFailed(f"local Slurm cluster: node {NODE} not idle after {timeout:g} s (sinfo: "
                            f"{_run(['sinfo', '-h', '-N', '-o', '%T'], folder).stdout.strip()!r})\n"
                            f"{_log_tail(folder, 'slurmctld')}{_log_tail(folder, 'slurmd')}")


def _stop_daemons(folder: str) -> None:
    """Stop slurmd and slurmctld of a failed start attempt (munged stays for the next one)."""
    for name in ("slurmd", "slurmctld"):
        pid = _read_pid(os.path.join(folder, DAEMONS[name][0]))
        if pid and _alive(pid):
            _terminate([pid], 10.0)
        try:
            os.remove(os.path.join(folder, DAEMONS[name][0]))
        except OSError:
            pass


def _start_time(pid: int) -> Optional[str]:
    """The start time of process ``pid`` (``/proc/<pid>/stat`` field 22), None when it is gone
    or a zombie: with the pid it names one process, whatever pid reuse follows."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]


def watchdog_pid(folder: str) -> Optional[int]:
    """The pid of the cluster's watchdog when it runs, else None."""
    pid = _read_pid(os.path.join(os.path.abspath(folder), WATCHDOG_PID))
    return pid if pid and _alive(pid) else None


def _start_watchdog(folder: str, owner: int) -> None:
    stamp = _start_time(owner)
    if stamp is None:
        raise RuntimeError(f"local Slurm cluster: owner process {owner} does not run")
    env = {k: v for k, v in os.environ.items() if k not in (MARKER, "SLURM_CONF")}
    with open(os.path.join(folder, "watchdog.log"), "a") as log:
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "watch", folder, "--owner", str(owner),
                                 "--owner-start", stamp], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=log, env=env, start_new_session=True, close_fds=True)
    if not _wait(lambda: _read_pid(os.path.join(folder, WATCHDOG_PID)) == proc.pid, 30.0, 0.05):
        proc.kill()
        proc.wait()
        raise RuntimeError(f"local Slurm cluster: the watchdog did not start (log: {folder}/watchdog.log)")


def watch(folder: str, owner: int, owner_start: str) -> int:
    """The watchdog's loop (``local_slurm.py watch``): once process ``owner`` (started at
    ``owner_start``) has ended, stop the cluster; SIGTERM (from :func:`stop`) ends it quietly."""
    folder = os.path.abspath(folder)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with open(os.path.join(folder, WATCHDOG_PID + ".tmp"), "w") as f:
        f.write(f"{os.getpid()}\n")
    os.replace(os.path.join(folder, WATCHDOG_PID + ".tmp"), os.path.join(folder, WATCHDOG_PID))
    while _start_time(owner) == owner_start:
        time.sleep(WATCHDOG_POLL_S)
    print(f"{time.strftime('%H:%M:%S')} owner {owner} ended: stopping the cluster in {folder}", file=sys.stderr)
    left = stop(folder, check=False)
    print(f"{time.strftime('%H:%M:%S')} stopped; left: {left or 'nothing'}", file=sys.stderr)
    return 1 if left else 0


def _terminate(pids: List[int], grace: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if _wait(lambda: not any(_alive(p) for p in pids), grace if sig == signal.SIGTERM else 10.0, 0.1):
            return


def stop(folder: str, check: bool = True, grace: float = 10.0) -> List[str]:
    """Stop the cluster in ``folder`` (see the module docstring); returns what is left (empty
    when all is gone) and raises ``RuntimeError`` naming it when ``check``."""
    folder = os.path.abspath(folder)
    conf_there = os.path.isfile(_conf_path(folder))
    ctld = _read_pid(os.path.join(folder, DAEMONS["slurmctld"][0]))
    if conf_there and ctld and _alive(ctld):
        try:
            _run(["scancel", "--quiet", "--full", "--user", "root"], folder, timeout=20)
            _wait(lambda: _run(["squeue", "-h", "-t", "PD,R,CG,S,CF,RQ,RS,RF,SE,SO,ST", "-o", "%i"], folder, 20)
                  .stdout.strip() == "", 30.0, 0.5)
        except (subprocess.SubprocessError, OSError):
            pass  # the daemons are stopped below whatever the queue says
    for name in ("slurmd", "slurmctld", "munged"):  # reverse start order
        pid = _read_pid(os.path.join(folder, DAEMONS[name][0]))
        if pid and _alive(pid):
            _terminate([pid], grace)
    rest = leftover_processes(folder)
    if rest:
        _terminate(rest, 2.0)
    dog = watchdog_pid(folder)
    if dog and dog != os.getpid():
        _terminate([dog], 5.0)
    left = [f"process {p} ({_cmdline(p)})" for p in leftover_processes(folder)]
    dog = watchdog_pid(folder)
    if dog and dog != os.getpid():
        left.append(f"watchdog {dog}")
    ports = _ports(folder)
    if ports:
        _wait(lambda: not any(_port_bound(p) for p in ports), 10.0, 0.2)
        left += [f"port {p} still bound" for p in ports if _port_bound(p)]
    if not any(item.startswith("process") for item in left):
        _remove_runtime_dir(folder)  # no process of the cluster can still use its sockets
    elif os.path.isdir(runtime_dir(folder) or ""):
        left.append(f"runtime folder {runtime_dir(folder)} (kept: processes still run)")
    if left and check:
        raise RuntimeError(f"local Slurm cluster {folder}: left after stop: {'; '.join(left)}")
    return left


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def status(folder: str) -> str:
    folder = os.path.abspath(folder)
    lines = []
    for name, (pid_file, _) in DAEMONS.items():
        pid = _read_pid(os.path.join(folder, pid_file))
        lines.append(f"{name}: {'pid ' + str(pid) if pid and _alive(pid) else 'not running'}")
    dog = watchdog_pid(folder)
    lines.append(f"watchdog: {'pid ' + str(dog) if dog else 'none'}")
    lines.append(f"runtime folder (sockets, spool): {runtime_dir(folder) or 'none'}")
    if os.path.isfile(_conf_path(folder)):
        lines.append(_run(["sinfo"], folder).stdout.rstrip())
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=("start", "stop", "status", "watch"))
    p.add_argument("folder", help="the cluster's folder (state, config, logs, munge key; the sockets and the spool go "
                   "to a short folder it names in runtime_dir)")
    p.add_argument("--cpus", type=int, default=None, help="CPUs the node declares (default: at least 4)")
    p.add_argument("--owner", type=int, default=None, metavar="PID",
                   help="start: stop the cluster as soon as process PID ends (a watchdog process)")
    p.add_argument("--owner-start", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.action == "watch":
        return watch(args.folder, args.owner, args.owner_start)
    try:
        if args.action == "start":
            start(args.folder, cpus=args.cpus, owner=args.owner)
            print(f"cluster up in {os.path.abspath(args.folder)}; reach it with:\n"
                  f"export SLURM_CONF={_conf_path(os.path.abspath(args.folder))}")
        elif args.action == "stop":
            stop(args.folder)
            print(f"cluster in {os.path.abspath(args.folder)} stopped")
        else:
            print(status(args.folder))
    except RuntimeError as e:
        print(f"local_slurm.py: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
