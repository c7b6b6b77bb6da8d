"""Sweeps on a real single-node Slurm cluster: Debian's slurm-wlm and munge, started in a
temporary folder by ``scripts/local_slurm.py`` with its own ports, state and munge socket.
Every sweep goes through ``tools/sweep.py --launcher submitit --submitit-executor slurm``: a
job array whose ``--array-parallelism`` squeue shows, one record per run, ``scancel`` of one
array task and the rerun of that run alone, a requeued (pre-empted) job resuming from its
per-image checkpoint with the metrics of an uninterrupted run, a time limit shorter than the
run, ``--no-wait`` followed by the same command (which adopts the job instead of submitting the
run again) and ``--tables-only``, a second sweep into the same folder refused, and a run of two
Slurm tasks on the one node (two train_net processes joined with gloo) with the metrics of one
process.

No daemon outlives the tests: the cluster is stopped by pid when the module ends (pass or
fail), each test's jobs are cancelled and waited for when it ends, and the cluster's watchdog
stops it if the test process itself is killed (``start(..., owner=os.getpid())``). Every
process a test starts (sweeps, train_net through them) is killed with the test process
(``PR_SET_PDEATHSIG``). Runs are held at a known image with ``SPARSECLIP_FAULT_STOP_AT``
(train_net stops itself once after that image's checkpoint record), so that a test acts while
a run evaluates, whatever the machine's load: every wait is on a state (squeue, a process
state, a file), with deadlines that only a broken cluster reaches. Slurm holds a requeued job
for 120 s (its begin time); the tests set ``StartTime=now`` once the previous attempt is over
and its credential's second has passed (``_release_requeued_job``)."""
import ctypes
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = sys.executable
DEMO = os.path.join(REPO, "configs", "demo.yaml")
SCRIPT = os.path.join(REPO, "scripts", "local_slurm.py")
DEADLINE_S = 900  # any one wait; only a broken cluster or sweep takes this long


def _load_cluster_script():
    spec = importlib.util.spec_from_file_location("local_slurm", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


local_slurm = _load_cluster_script()
_missing = [p for p in local_slurm.REQUIRED_PROGRAMS if shutil.which(p) is None]
pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(os.geteuid() != 0, reason="the local Slurm cluster runs its daemons as root"),
]


@pytest.fixture(autouse=True, scope="module")
def _programs():
    """As root, scripts/setup.sh installs the cluster's programs: missing ones fail, never skip."""
    if _missing:
        pytest.fail(f"{', '.join(_missing)} not installed: run scripts/setup.sh as root (it installs Debian's "
                    "slurm-wlm and munge)", pytrace=False)


def _die_with_the_test():
    """preexec_fn: SIGKILL this child when the test process ends (prctl PR_SET_PDEATHSIG = 1),
    and Ctrl-C's default action (a background pytest ignores SIGINT)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _popen(cmd, env, log):
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                            preexec_fn=_die_with_the_test)


def _run(cmd, env, timeout=DEADLINE_S):
    """``subprocess.run`` whose child dies with the test process."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
                          preexec_fn=_die_with_the_test) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"{cmd} ran past {timeout} s:\n{out[-3000:]}\n{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _end(proc):
    if proc.poll() is None:
        proc.kill()
    proc.wait()


class Cluster:
    def __init__(self, folder, env):
        self.folder, self.env = folder, env

    def run(self, *cmd, check=True):
        proc = subprocess.run(list(cmd), capture_output=True, text=True, env=self.env, timeout=120)
        if check:
            assert proc.returncode == 0, (cmd, proc.stdout, proc.stderr)
        return proc

    def queue(self):
        """[(job id, state, reason)] of the jobs squeue lists as queued or running; None when
        squeue gets no answer within 30 s (once, under a load average of 20 on 2 cores, it hung
        past 120 s while a job ended): a poll that learns nothing, the next one asks again."""
        try:
            proc = subprocess.run(["squeue", "-h", "-r", "-o", "%i|%T|%r"], capture_output=True, text=True,
                                  env=self.env, timeout=30)
        except subprocess.TimeoutExpired:
            return None
        if proc.returncode != 0:
            return None
        return [tuple(line.split("|")) for line in proc.stdout.splitlines() if line.strip()]

    def job_processes(self):
        """The cluster's processes but its daemons and slurmctld's helper (slurmscriptd)."""
        daemons = {local_slurm._read_pid(os.path.join(self.folder, pf)) for pf, _ in local_slurm.DAEMONS.values()}
        ctld = local_slurm._read_pid(os.path.join(self.folder, local_slurm.DAEMONS["slurmctld"][0]))
        return [p for p in local_slurm.leftover_processes(self.folder) if p not in daemons and _parent(p) != ctld]

    def clear(self):
        """Cancel every job and wait until none is listed and no job process is left."""
        self.run("scancel", "--quiet", "--full", "--user", "root", check=False)
        _wait_for(lambda: self.queue() == [] and not self.job_processes(), "the jobs to end", timeout=300)


def _release_requeued_job(cluster, job_id):
    """Release Slurm's 120 s hold of a requeued job (its begin time) once its previous attempt is
    over: no job process of the cluster left, and the clock two seconds on. At the requeue slurmd
    revokes the job's credential and then refuses any credential of that job created in the same
    second or before (Slurm's src/common/slurm_cred.c: revoked when ``cred->ctime <=
    j->revoked``, whole seconds), so a launch at once fails the job with "Killing non-startable
    batch JobId=N: Job credential revoked" (slurmctld.log; seen once, 68 ms after the requeue, at
    load 4). Waiting longer is always safe: this is a lower bound, not a race."""
    _wait_for(lambda: not cluster.job_processes(), "the requeued job's previous attempt to end", timeout=300)
    gone = time.time()
    while time.time() < int(gone) + 2:
        time.sleep(0.1)
    cluster.run("scontrol", "update", f"JobId={job_id}", "StartTime=now")


def _check_gone(folder, ports, runtime=None):
    assert local_slurm.leftover_processes(folder) == [] and local_slurm.watchdog_pid(folder) is None
    assert not any(local_slurm._port_bound(p) for p in ports), ports
    assert local_slurm.runtime_dir(folder) is None
    assert runtime is None or not os.path.exists(runtime), f"the runtime folder {runtime} is left"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("slurm"))
    env = local_slurm.start(folder, owner=os.getpid())
    ports, runtime = local_slurm._ports(folder), local_slurm.runtime_dir(folder)
    try:
        yield Cluster(folder, env)
    finally:
        left = local_slurm.stop(folder, check=False)
        assert not left, f"left after stopping the test cluster: {left}"
        _check_gone(folder, ports, runtime)


@pytest.fixture(autouse=True)
def _no_job_outlives_its_test(request):
    yield
    if "cluster" in request.fixturenames:
        request.getfixturevalue("cluster").clear()


def _sweep_env(cluster, **extra):
    return dict(cluster.env, PYTHONPATH=REPO, SPARSECLIP_TEXT_CACHE="off", **extra)


def _sweep_cmd(f, out, *extra, time_limit="10"):
    return [PY, os.path.join(REPO, "tools", "sweep.py"), str(f), "--output", str(out), "--launcher", "submitit",
            "--submitit-executor", "slurm", "--time", time_limit, "--gpus-per-run", "0", "--cpus-per-run", "1",
            "--progress-interval", "0.5", *extra]


def _state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _parent(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def _wait_for(predicate, what, timeout=DEADLINE_S):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _held_runs(out):
    """{run folder: pid} of the runs whose train_net has stopped itself (SPARSECLIP_FAULT_STOP_AT)."""
    from sparseclip_d2.evaluation.progress import read_progress

    held = {}
    for folder in (out / "runs").glob("*") if (out / "runs").is_dir() else []:
        p = read_progress(str(folder))
        if p and p.get("pid") and _state(p["pid"]) == "T":
            held[folder] = int(p["pid"])
    return held


def _stopped_train_net(out):
    """(pid, run folder) of a run's train_net once it has stopped itself."""
    folder, pid = next(iter(_wait_for(lambda: _held_runs(out), "train_net to stop itself at its fault-injection "
                                                                 "image").items()))
    return pid, folder


def _records(out):
    from sparseclip_d2.sweeps import read_jsonl

    return read_jsonl(str(out / "results.jsonl"))


def _story(out, cluster=None):
    """What a failed assertion needs to tell a race apart: each run folder's log lines about its
    checkpoint, its progress, the submitit logs' last lines and slurmctld's lines about requeues."""
    lines = []
    for log in sorted(out.glob("runs/*/log.txt")):
        lines += [f"{log.parent.name}: {line}" for line in log.read_text(errors="replace").splitlines()
                  if re.search(r"resum|discard|checkpoint|wrote|Starting|Start inference", line)][-40:]
    for prog in sorted(out.glob("runs/*/progress.json")):
        lines.append(f"{prog.parent.name} progress: {prog.read_text()[:400]}")
    for f in sorted(out.glob("submitit/*_log.*")):
        lines += [f"{f.name}: {line}" for line in f.read_text(errors="replace").splitlines()[-8:]]
    if cluster is not None:
        ctld = os.path.join(cluster.folder, "slurmctld.log")
        if os.path.isfile(ctld):
            with open(ctld, errors="replace") as f:
                lines += [line.rstrip() for line in f if re.search(r"requeue|Requeue|time limit|TIMEOUT|signal", line)][-30:]
    return "\n".join(lines)


def _jobs(out):
    with open(out / "jobs.json") as f:
        return json.load(f)


ONE_RUN = f"base: {DEMO}\nfixed: {{backbone: sparseclip-tiny-vit, pretrained: none, resolution: 64, normalizer: softmax}}\n"


# ------------------------------------------------------------------ the cluster script itself
def test_cluster_script_runs_two_clusters_stops_every_process_and_its_watchdog_cleans_up(tmp_path):
    """Two clusters at once (two checkouts), each on its own ports; a job runs; stop leaves no
    daemon, no job process, no bound port and no runtime folder, and touches nothing of the other
    cluster. The other cluster's owner process is then killed: its watchdog stops that cluster.
    Cluster a lives in a folder so deep that a job step's socket inside it would pass the 107
    bytes of a Unix socket path (as in pytest-xdist's temporary folders): its job still starts,
    because the sockets and the spool live in the cluster's short runtime folder."""
    a, b = str(tmp_path / ("deep_folder_" * 6) / "a"), str(tmp_path / "b")
    assert len(os.path.join(a, "spool", "localnode", "localnode_1.4294967291").encode()) > 107
    owner_b = subprocess.Popen(["sleep", "600"], preexec_fn=_die_with_the_test)
    ports, runtimes = [[], []], [None, None]
    try:
        env_a = local_slurm.start(a, owner=os.getpid())
        ports[0], runtimes[0] = local_slurm._ports(a), local_slurm.runtime_dir(a)
        env_b = local_slurm.start(b, owner=owner_b.pid)
        ports[1], runtimes[1] = local_slurm._ports(b), local_slurm.runtime_dir(b)
        assert len(set(ports[0] + ports[1])) == 4
        assert runtimes[0] != runtimes[1] and all(os.path.isdir(r) and len(r) < 40 for r in runtimes), runtimes
        assert local_slurm.watchdog_pid(a) and local_slurm.watchdog_pid(b)
        job = tmp_path / "job.sh"
        job.write_text(f"#!/bin/bash\necho $$ > {tmp_path}/job_pid\nexec sleep 600\n")
        out = subprocess.run(["sbatch", "-o", "/dev/null", str(job)], capture_output=True, text=True, env=env_a,
                             timeout=60)
        assert out.returncode == 0 and out.stdout.startswith("Submitted batch job"), out.stderr
        job_pid = int(_wait_for(lambda: (tmp_path / "job_pid").exists() and (tmp_path / "job_pid").read_text()
                                .strip(), "the job to start"))
        processes_a = local_slurm.leftover_processes(a)
        assert job_pid in processes_a and len(processes_a) >= 5  # munged, slurmctld, slurmd, slurmstepd, the job
        assert local_slurm.stop(a) == []
        assert _state(job_pid) in (None, "Z") and not any(_state(p) not in (None, "Z") for p in processes_a)
        _check_gone(a, ports[0], runtimes[0])
        assert os.path.isdir(runtimes[1])
        sinfo = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=env_b, timeout=60)
        assert sinfo.stdout.strip() == "idle"  # the other cluster is untouched
        processes_b = local_slurm.leftover_processes(b)
        owner_b.kill()
        owner_b.wait()
        _wait_for(lambda: not local_slurm.leftover_processes(b) and local_slurm.watchdog_pid(b) is None,
                  "the watchdog to stop the cluster of the ended owner", timeout=120)
        assert not any(_state(p) not in (None, "Z") for p in processes_b)
        _wait_for(lambda: not any(local_slurm._port_bound(p) for p in ports[1]), "cluster b's ports to be free", 60)
        assert "stopped; left: nothing" in (tmp_path / "b" / "watchdog.log").read_text()
    finally:
        _end(owner_b)
        local_slurm.stop(a, check=False)
        local_slurm.stop(b, check=False)
    _check_gone(a, ports[0], runtimes[0])
    _check_gone(b, ports[1], runtimes[1])


# ------------------------------------------------------------------ job array, parallelism, scancel
THREE_RUNS = f"base: {DEMO}\nfixed: {{backbone: sparseclip-tiny-vit, pretrained: none, normalizer: softmax}}\n" \
             "grid: {resolution: [64, 80, 96]}\n"


def test_job_array_parallelism_one_record_per_run_and_scancel_rerun(cluster, tmp_path):
    """3 runs as one job array with --array-parallelism 2, each held after its image: squeue
    shows 2 tasks running and the third pending on the array's limit, never 3 running. One
    running task is cancelled with scancel: the sweep records it as failed (CANCELLED, no
    record of its own), the others once each as ok. The same command again runs that run alone."""
    f = tmp_path / "three.yaml"
    f.write_text(THREE_RUNS)
    out = tmp_path / "out"
    log = open(tmp_path / "sweep.log", "w")
    driver = _popen(_sweep_cmd(f, out, "--array-parallelism", "2"), _sweep_env(cluster, SPARSECLIP_FAULT_STOP_AT="0"),
                    log)
    snapshots, cancelled, released = [], None, set()
    try:
        deadline = time.time() + DEADLINE_S
        while driver.poll() is None and time.time() < deadline:
            rows = cluster.queue()
            if rows is None:
                continue
            snapshots.append(rows)
            running = sorted(i for i, st, _ in rows if st == "RUNNING")
            limited = [i for i, st, r in rows if st == "PENDING" and r == "JobArrayTaskLimit"]
            held = _held_runs(out)
            if cancelled is None and len(running) == 2 and limited and len(held) == 2:
                cancelled = running[0]  # held: it runs, and cannot end before the cancel
                cluster.run("scancel", cancelled)
            elif cancelled is not None:
                for pid in set(held.values()) - released:  # the others go on
                    os.kill(pid, signal.SIGCONT)
                    released.add(pid)
            time.sleep(0.2)
    finally:
        _end(driver)
        log.close()
    text = (tmp_path / "sweep.log").read_text()
    assert cancelled is not None, (snapshots[-10:], text[-3000:])
    assert driver.returncode == 1 and "runs: 3 total, 0 already finished, 2 ok, 1 failed" in text, text[-4000:]
    running_counts = [sum(st == "RUNNING" for _, st, _ in rows) for rows in snapshots]
    assert max(running_counts) == 2, running_counts
    jobs = _jobs(out)
    by_job = {v["job_id"]: k for k, v in jobs.items()}
    assert cancelled in by_job and len(by_job) == 3 and len({j.split("_")[0] for j in by_job}) == 1  # one array
    records = _records(out)
    assert sorted(r["run_key"] for r in records) == sorted(jobs)  # one record per run
    for r in records:
        if r["run_key"] == by_job[cancelled]:
            assert r["status"] == "failed", r
            assert r["error"]["exit"] == f"submitit job {cancelled} ended in state CANCELLED without a record"
        else:
            assert r["status"] == "ok" and r["launcher"] == "submitit:slurm", r
    # the same command: only the cancelled run is submitted again
    again = _run(_sweep_cmd(f, out, "--array-parallelism", "2"), _sweep_env(cluster))
    assert again.returncode == 0 and "runs: 3 total, 2 already finished, 1 ok, 0 failed" in again.stdout, \
        again.stdout[-3000:] + again.stderr[-3000:]
    submitted = re.findall(r"sweeps\.launchers\] submitted (\S+) as submitit:slurm job", again.stderr)
    assert submitted == [jobs[by_job[cancelled]]["run"]], again.stderr[-3000:]
    records = _records(out)
    assert len(records) == 4 and [r["status"] for r in records if r["run_key"] == by_job[cancelled]] == ["failed", "ok"]
    assert all(sum(r["run_key"] == k for r in records) == 1 for k in jobs if k != by_job[cancelled])


# ------------------------------------------------------------------ preemption: requeue resumes
def _voc_tree(root, n=3):
    """A VOCdevkit/VOC2012 tree of ``n`` crops of the demo photo and their masks."""
    import numpy as np
    from PIL import Image

    from sparseclip_d2.data.datasets.demo import build_demo_files

    demo = build_demo_files(str(root / "demo"))
    image, label = np.array(Image.open(demo["file_name"])), np.array(Image.open(demo["sem_seg_file_name"]))
    voc = root / "VOCdevkit" / "VOC2012"
    for sub in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        (voc / sub).mkdir(parents=True)
    names = []
    for i in range(n):
        y, x = 20 * i, 40 * i
        name = f"2026_{i:06d}"
        Image.fromarray(image[y:y + 300, x:x + 400]).save(voc / "JPEGImages" / f"{name}.jpg")
        Image.fromarray(label[y:y + 300, x:x + 400]).save(voc / "SegmentationClass" / f"{name}.png")
        names.append(name)
    (voc / "ImageSets" / "Segmentation" / "val.txt").write_text("\n".join(names) + "\n")
    return str(root)


VOC_RUN = f"base: {DEMO}\nfixed: {{backbone: sparseclip-tiny-vit, pretrained: none, resolution: 64, " \
          "normalizer: softmax, datasets: [sparseclip_voc21_val]}\n"


@pytest.fixture(scope="module")
def voc(tmp_path_factory):
    """(data folder, sweep file, the record of the run on this machine in one uninterrupted
    process): the reference of the requeue and two-task tests."""
    root = tmp_path_factory.mktemp("voc")
    datasets = _voc_tree(root / "data")
    f = root / "voc.yaml"
    f.write_text(VOC_RUN)
    env = dict(os.environ, PYTHONPATH=REPO, SPARSECLIP_TEXT_CACHE="off", DETECTRON2_DATASETS=datasets)
    reference = _run([PY, os.path.join(REPO, "tools", "sweep.py"), str(f), "--output", str(root / "ref")], env)
    assert reference.returncode == 0, reference.stdout[-3000:] + reference.stderr[-3000:]
    (ref,) = _records(root / "ref")
    assert ref["status"] == "ok" and "resumed_images" not in ref["datasets"]["sparseclip_voc21_val"], ref
    return datasets, f, ref


def _metrics(record):
    """The record's metrics, without what differs between attempts (time, resumed images)."""
    return {ds: {k: v for k, v in m.items() if "second" not in k and "time" not in k and k != "resumed_images"}
            for ds, m in record["datasets"].items()}


def test_requeued_job_resumes_from_its_checkpoint_with_the_metrics_of_an_uninterrupted_run(cluster, voc, tmp_path):
    """Pre-emption: ``scontrol requeue`` of the running job while train_net is after image 0 of
    3. The attempt writes no record; the requeued job resumes from the per-image checkpoint
    (1 image resumed) and its metrics equal those of the same run without interruption."""
    datasets, f, ref = voc
    out = tmp_path / "out"
    log = open(tmp_path / "sweep.log", "w")
    driver = _popen(_sweep_cmd(f, out), _sweep_env(cluster, DETECTRON2_DATASETS=datasets,
                                                   SPARSECLIP_FAULT_STOP_AT="0"), log)
    try:
        pid, folder = _stopped_train_net(out)
        assert (folder / "inference" / "sparseclip_voc21_val" / "checkpoint" / "00000000.pt").is_file()
        (job_id,) = [v["job_id"] for v in _jobs(out).values()]
        cluster.run("scontrol", "requeue", job_id)
        # Slurm holds a requeued job until now + 120 s (its begin time): release it once it may start
        _wait_for(lambda: any(i == job_id and st == "PENDING" for i, st, _ in cluster.queue() or []),
                  "the job to be requeued")
        _release_requeued_job(cluster, job_id)
        assert driver.wait(DEADLINE_S) == 0
    finally:
        _end(driver)
        log.close()
    text = (tmp_path / "sweep.log").read_text()
    assert "runs: 1 total, 0 already finished, 1 ok, 0 failed" in text, text[-4000:]
    assert _state(pid) in (None, "Z")
    (record,) = _records(out)  # the interrupted attempt wrote none
    assert record["status"] == "ok" and record["datasets"]["sparseclip_voc21_val"]["resumed_images"] == 1, record
    assert json.loads((folder / "progress.json").read_text())["state"] == "ok"
    assert ref["run_key"] == record["run_key"]
    assert _metrics(record) == _metrics(ref)


# ------------------------------------------------------------------ two tasks of one job, gloo on the CPU
def test_two_task_job_on_one_node_gives_the_metrics_of_one_process(cluster, voc, tmp_path):
    """``--tasks-per-node 2``: one job of two Slurm tasks on the one node, each a train_net
    process (``--num-machines 2``, ranks 0 and 1, joined with gloo on the CPU through rank 0's
    address in the run folder). Each process evaluates its shard; rank 0 alone writes the one
    record, whose metrics equal those of one process."""
    datasets, f, ref = voc
    out = tmp_path / "out"
    result = _run(_sweep_cmd(f, out, "--tasks-per-node", "2"), _sweep_env(cluster, DETECTRON2_DATASETS=datasets))
    assert result.returncode == 0 and "runs: 1 total, 0 already finished, 1 ok, 0 failed" in result.stdout, \
        result.stdout[-3000:] + result.stderr[-3000:]
    (record,) = _records(out)
    assert record["status"] == "ok" and record["launcher"] == "submitit:slurm", record
    (folder,) = (out / "runs").iterdir()
    for rank in (0, 1):
        command = (folder / ("command.txt" if rank == 0 else f"command.rank{rank}.txt")).read_text()
        assert f"--num-machines 2 --machine-rank {rank} --dist-url tcp://" in command, command
    assert "World size: 2" in (folder / "log.txt").read_text()
    assert len(list(folder.glob("dist_url.*"))) == 1
    assert _metrics(record) == _metrics(ref)
    assert record["datasets"]["sparseclip_voc21_val"]["num_images"] == 3


# ------------------------------------------------------------------ --no-wait, adoption, lock, --tables-only
def test_no_wait_then_the_same_command_adopts_the_job_and_a_second_sweep_is_refused(cluster, tmp_path):
    """``--no-wait`` submits and exits. The same command, while the job still runs, waits for
    that job instead of submitting the run again; a third sweep into the same folder meanwhile
    is refused (the folder's lock). One job, one record; ``--tables-only`` writes the tables."""
    f = tmp_path / "one.yaml"
    f.write_text(ONE_RUN)
    out = tmp_path / "out"
    submit = _run(_sweep_cmd(f, out, "--no-wait"), _sweep_env(cluster, SPARSECLIP_FAULT_STOP_AT="0"))
    assert submit.returncode == 0, submit.stdout[-3000:] + submit.stderr[-3000:]
    (job_id,) = [v["job_id"] for v in _jobs(out).values()]
    assert f"runs: 1 total, 0 already finished, 1 submitted (submitit:slurm jobs {job_id})" in submit.stdout
    pid, folder = _stopped_train_net(out)  # the job is held at image 0
    log = open(tmp_path / "adopt.log", "w")
    adopter = _popen(_sweep_cmd(f, out), _sweep_env(cluster), log)
    try:
        from sparseclip_d2.sweeps.lock import OutputLock

        _wait_for(lambda: OutputLock(str(out)).holder().get("pid") == adopter.pid, "the second call to take the lock")
        third = _run(_sweep_cmd(f, out), _sweep_env(cluster))
        assert third.returncode == 2 and f"is in use by another sweep (pid {adopter.pid} " in third.stderr, \
            third.stdout[-2000:] + third.stderr[-2000:]
        os.kill(pid, signal.SIGCONT)  # let the held run finish
        assert adopter.wait(DEADLINE_S) == 0
    finally:
        _end(adopter)
        log.close()
    text = (tmp_path / "adopt.log").read_text()
    assert f"adopting Slurm job {job_id}" in text and "submitted " not in text, text[-4000:]
    assert "runs: 1 total, 0 already finished, 1 ok, 0 failed" in text, text[-4000:]
    assert [v["job_id"] for v in _jobs(out).values()] == [job_id]
    assert {p.name.split("_submitted")[0] for p in (out / "submitit").glob("*_submitted.pkl")} == {job_id}
    (record,) = _records(out)
    assert record["status"] == "ok"
    tables = _run(_sweep_cmd(f, out, "--tables-only"), _sweep_env(cluster))
    assert tables.returncode == 0, tables.stdout[-3000:] + tables.stderr[-3000:]
    assert f"| {record['run_name']} |" in (out / "results.md").read_text()
    assert len(_records(out)) == 1


# ------------------------------------------------------------------ a time limit shorter than the run
def test_time_limit_shorter_than_the_run_requeues_and_resumes_or_records_why(cluster, voc, tmp_path):
    """``--time 1`` (Slurm's shortest limit, a minute) for a run that holds after image 0 of 3:
    Slurm sends the job submitit's time-limit signal (USR2, ``--signal-delay 10``), which
    train_net ignores and submitit's handler in the job answers with a checkpoint and a requeue
    (the test releases Slurm's 120 s hold of each requeued job). Each requeued attempt resumes
    from the per-image checkpoint. The run ends with exactly one record: ok (images resumed),
    or failed with the reason (submitit's "timed-out too many times", or Slurm's TIMEOUT),
    never killed by the signal itself and never two records."""
    datasets, f, _ = voc
    out = tmp_path / "out"
    # --time 1 with --signal-delay 10: slurmctld checks time limits every 30 s and signals a job at
    # the first check within (delay + 30) s of its limit, so 20-50 s after the start (measured here:
    # 21 and 48 s; with 30 s, 24 and 27 s; with the default 90 s, at once): after submitit's handler
    # is in place (the job's first second), and before the limit
    cmd = _sweep_cmd(f, out, "--signal-delay", "10", time_limit="1")
    log = open(tmp_path / "sweep.log", "w")
    driver = _popen(cmd, _sweep_env(cluster, DETECTRON2_DATASETS=datasets, SPARSECLIP_FAULT_STOP_AT="0"), log)
    requeued = 0
    try:
        _wait_for(lambda: (out / "jobs.json").is_file(), "the job to be submitted")
        (job_id,) = [v["job_id"] for v in _jobs(out).values()]
        deadline = time.time() + DEADLINE_S
        while driver.poll() is None and time.time() < deadline:
            if any(i == job_id and st == "PENDING" and r == "BeginTime" for i, st, r in cluster.queue() or []):
                _release_requeued_job(cluster, job_id)  # skip Slurm's 120 s hold
                requeued += 1
            time.sleep(0.5)
    finally:
        _end(driver)
        log.close()
    text = (tmp_path / "sweep.log").read_text()
    assert requeued >= 1, text[-4000:]  # the first attempt, held at image 0, was requeued by the time limit
    (record,) = _records(out)
    if record["status"] == "ok":
        resumed = record["datasets"]["sparseclip_voc21_val"].get("resumed_images", 0)
        assert driver.returncode == 0 and resumed >= 1, (record, text[-3000:], _story(out, cluster))
    else:
        reason = record["error"]["message"] + " " + record["error"]["exit"]
        assert "timed-out too many times" in reason or "TIMEOUT" in reason, (record["error"], _story(out, cluster))
    assert "SIGUSR2" not in json.dumps(record)
    (folder,) = (out / "runs").iterdir()
    assert json.loads((folder / "progress.json").read_text())["state"] in ("ok", "failed")
