"""Sweeps beyond one machine: the store under concurrent writer processes, the Slurm job
script a sweep file gives (written by submitit's own Slurm executor, captured by a stand-in
``sbatch``, never submitted), multi-node launch arguments from the Slurm environment,
submitit's local and debug executors running a real tiny sweep end to end (records, a killed
run resumed, a failing run's record), TensorBoard scalars, progress files, and run keys that
follow the data's contents (a mask regenerated under the same name re-runs, ``--rerun``)."""
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = sys.executable
DEMO = os.path.join(REPO, "configs", "demo.yaml")

# ------------------------------------------------------------------ the store, concurrently
WRITER = r"""
import importlib.util, os, sys, time
# store.py needs only the standard library: load it alone (fast), not the whole package
spec = importlib.util.spec_from_file_location("store", {store!r})
store = importlib.util.module_from_spec(spec)
spec.loader.exec_module(store)
append_jsonl = store.append_jsonl
path, go, writer, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
while not os.path.exists(go):
    time.sleep(0.001)
for i in range(n):
    # 20 kB per record: far beyond PIPE_BUF (4 kB), the size below which O_APPEND writes are atomic anyway
    append_jsonl(path, {{"writer": writer, "i": i, "pad": "x" * 20000}})
"""


def test_concurrent_writer_processes_lose_and_mix_no_record(tmp_path):
    from sparseclip_d2.sweeps.store import read_jsonl

    path, go = str(tmp_path / "results.jsonl"), str(tmp_path / "go")
    script = tmp_path / "writer.py"
    script.write_text(WRITER.format(store=os.path.join(REPO, "sparseclip_d2", "sweeps", "store.py")))
    writers, n = 6, 40
    procs = [subprocess.Popen([PY, str(script), path, go, str(w), str(n)]) for w in range(writers)]
    time.sleep(0.5)  # not a correctness condition: the writers only have to be waiting for GO, or not yet
    open(go, "w").close()
    assert [p.wait(600) for p in procs] == [0] * writers
    with open(path) as f:
        lines = f.read().splitlines()
    assert len(lines) == writers * n
    records = read_jsonl(path)  # every line is one whole record
    assert len(records) == writers * n
    assert sorted((r["writer"], r["i"]) for r in records) == [(w, i) for w in range(writers) for i in range(n)]
    assert all(r["pad"] == "x" * 20000 for r in records)


def test_append_terminates_a_truncated_line_of_a_killed_writer(tmp_path):
    from sparseclip_d2.sweeps.store import append_jsonl, read_jsonl

    p = str(tmp_path / "r.jsonl")
    with open(p, "w") as f:
        f.write('{"run_key": "a", "status": "ok"}\n{"run_key": "b", "sta')
    append_jsonl(p, {"run_key": "c", "status": "ok"})
    assert [r["run_key"] for r in read_jsonl(p)] == ["a", "c"]


# ------------------------------------------------------------------ Slurm parameters
def test_launch_settings_from_the_sweep_file_and_flags():
    from sparseclip_d2.sweeps.launchers import LaunchSettings, parse_minutes, submitit_parameters

    s = LaunchSettings.from_mapping({"partition": "gpu", "time": "1:30:00", "gpus_per_run": 4, "mem_gb": 64,
                                     "slurm_options": {"account": "proj"}}, "f.yaml launcher")
    s.set("array_parallelism", 3, "--array-parallelism")
    s.set("slurm_options", {"qos": "high"}, "--slurm-option")
    p = submitit_parameters(s, "slurm", "sweep-x")
    assert p == {"name": "sweep-x", "timeout_min": 90, "gpus_per_node": 4, "nodes": 1, "tasks_per_node": 1,
                 "mem_gb": 64, "slurm_partition": "gpu", "slurm_array_parallelism": 3,
                 "slurm_additional_parameters": {"account": "proj", "qos": "high"}}
    assert "mem_gb" not in submitit_parameters(s, "local", "x") and "slurm_partition" not in submitit_parameters(s, "local", "x")
    assert [parse_minutes(v, "t") for v in (90, "90", "2-00:00:00", "0:00:30")] == [90, 90, 2880, 1]
    with pytest.raises(ValueError, match="unknown launcher key.*'gpus'.*valid: partition, time"):
        LaunchSettings.from_mapping({"gpus": 2}, "f.yaml launcher")
    with pytest.raises(ValueError, match=r"--time: time must be minutes or \[D-\]H:MM:SS, got '1h'"):
        s.set("time", "1h", "--time")
    with pytest.raises(ValueError, match="f.yaml launcher gpus_per_run: expected an integer >= 0, got -1"):
        s.set("gpus_per_run", -1, "f.yaml launcher")
    with pytest.raises(ValueError, match="needs a time limit per run: --time"):
        submitit_parameters(LaunchSettings(), "slurm", "x")
    with pytest.raises(ValueError, match="unknown submitit executor 'pbs'; valid: slurm, local, debug"):
        submitit_parameters(s, "pbs", "x")
    cpu = LaunchSettings.from_mapping({"time": 5, "gpus_per_run": 0, "tasks_per_node": 2}, "f.yaml launcher")
    assert submitit_parameters(cpu, "slurm", "x")["tasks_per_node"] == 2 and "gpus_per_node" not in \
        submitit_parameters(cpu, "slurm", "x")
    with pytest.raises(ValueError, match="tasks_per_node 2 with gpus_per_run 4: several tasks per node are CPU"):
        s.set("tasks_per_node", 2, "--tasks-per-node") or submitit_parameters(s, "slurm", "x")
    with pytest.raises(ValueError, match="tasks_per_node 2: several tasks of one run need the Slurm executor"):
        submitit_parameters(cpu, "local", "x")


def test_multi_process_launch_arguments_from_the_slurm_environment(tmp_path, monkeypatch):
    """One task per node (GPU runs) or several CPU tasks on one node: the task count and rank
    come from Slurm, and rank 0 hands its address to the others through the run folder, one
    file per attempt (job id, restart count), earlier attempts' files removed."""
    import socket

    from sparseclip_d2.sweeps import runner
    from sparseclip_d2.sweeps.runner import distributed_args, process_layout

    assert distributed_args(1, {}) == []
    assert distributed_args(4, {}) == ["--num-gpus", "4"]
    assert process_layout({"SLURM_NTASKS": "1", "SLURM_PROCID": "0"}) == (1, 0)
    assert process_layout({"SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1"}) == (2, 1)  # no task count: per node
    assert process_layout({"SLURM_JOB_NUM_NODES": "1", "SLURM_NTASKS": "3", "SLURM_PROCID": "2"}) == (3, 2)
    (tmp_path / "dist_url.7.0").write_text("tcp://old:1\n")  # an earlier attempt's
    node = {"SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "0", "SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "1"}
    rank0 = distributed_args(8, node, str(tmp_path))
    assert rank0[:6] == ["--num-gpus", "8", "--num-machines", "2", "--machine-rank", "0"] and rank0[6] == "--dist-url"
    host, port = rank0[7][len("tcp://"):].rsplit(":", 1)
    assert host == socket.gethostname() and 0 < int(port) < 65536
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dist_url.7.1"]
    assert (tmp_path / "dist_url.7.1").read_text() == rank0[7] + "\n"
    cpu = {"SLURM_JOB_NUM_NODES": "1", "SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_JOB_ID": "7",
           "SLURM_RESTART_COUNT": "1"}
    assert distributed_args(0, cpu, str(tmp_path)) == ["--num-gpus", "1", "--num-machines", "2", "--machine-rank", "1",
                                                       "--dist-url", rank0[7]]
    monkeypatch.setattr(runner, "RENDEZVOUS_WAIT_S", 0.3)
    with pytest.raises(RuntimeError, match=r"machine rank 1: rank 0 wrote no rendezvous address .*dist_url\.7\.2.* 0.3 s"):
        distributed_args(0, dict(cpu, SLURM_RESTART_COUNT="2"), str(tmp_path))


FAKE_SBATCH = """#!/bin/sh
# stands in for Slurm's sbatch: keeps the job script, submits nothing
cp "$1" "$CAPTURE/job_$(ls "$CAPTURE" | wc -l).sh"
echo "Submitted batch job 4242"
"""

SLURM_SWEEP = f"""
base: {DEMO}
fixed: {{backbone: sparseclip-tiny-vit, pretrained: none, normalizer: softmax}}
grid: {{resolution: [64, 96, 128, 160]}}
launcher:
  partition: gpu
  time: 1:30:00
  gpus_per_run: 2
  cpus_per_run: 8
  mem_gb: 32
  slurm_options: {{account: myproj}}
  setup: [module load cuda/12]
"""


def test_slurm_job_script_of_a_sweep_file(tmp_path):
    """tools/sweep.py --launcher submitit (Slurm, the default executor) writes one job array
    whose #SBATCH lines come from the sweep file's launcher: mapping and the flags."""
    bin_dir, capture = tmp_path / "bin", tmp_path / "capture"
    bin_dir.mkdir()
    capture.mkdir()
    (bin_dir / "sbatch").write_text(FAKE_SBATCH)
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")  # submitit looks for srun to detect a cluster
    for f in ("sbatch", "srun"):
        os.chmod(bin_dir / f, 0o755)
    f = tmp_path / "s.yaml"
    f.write_text(SLURM_SWEEP)
    out = tmp_path / "out"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", CAPTURE=str(capture), PYTHONPATH=REPO,
               SPARSECLIP_TEXT_CACHE="off")
    proc = subprocess.run([PY, os.path.join(REPO, "tools", "sweep.py"), str(f), "--output", str(out),
                           "--launcher", "submitit", "--array-parallelism", "3", "--slurm-option", "qos=high",
                           "--no-wait"], capture_output=True, text=True, env=env, cwd=REPO, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "runs: 4 total, 0 already finished, 4 submitted (submitit:slurm jobs 4242_0, 4242_1, 4242_2, 4242_3)" \
        in proc.stdout
    scripts = sorted(capture.iterdir())
    assert len(scripts) == 1  # one job array, not four jobs
    text = scripts[0].read_text()
    sbatch = set(re.findall(r"^#SBATCH (\S+)$", text, flags=re.M))
    for line in ("--partition=gpu", "--time=90", "--gpus-per-node=2", "--cpus-per-task=8", "--mem=32GB",
                 "--nodes=1", "--ntasks-per-node=1", "--array=0-3%3", "--account=myproj", "--qos=high",
                 "--job-name=sweep-s"):
        assert line in sbatch, (line, sorted(sbatch))
    assert "module load cuda/12" in text and "-m submitit.core._submit" in text
    # the pickled jobs are execute_run on each run, with 2 GPUs (train_net --num-gpus 2 in the job)
    pickles = sorted((out / "submitit").glob("4242_*_submitted.pkl"))
    assert len(pickles) == 4
    with open(pickles[0], "rb") as fh:
        delayed = pickle.load(fh)
    assert type(delayed.function).__name__ == "SubmittedRun" and hasattr(delayed.function, "checkpoint")
    task = delayed.args[0]
    assert task.gpus == 2 and task.launcher == "submitit:slurm" and task.out_dir == str(out)
    assert not (out / "results.jsonl").exists()  # nothing ran


# ------------------------------------------------------------------ end to end through submitit
E2E_SWEEP = f"""
base: {DEMO}
fixed: {{backbone: sparseclip-tiny-vit, pretrained: none, resolution: 64, normalizer: softmax}}
variants: [{{name: good}}, {{name: bad, precision: fp8}}]
"""


def _sweep_cmd(f, out, *extra):
    return [PY, os.path.join(REPO, "tools", "sweep.py"), str(f), "--output", str(out), "--launcher", "submitit",
            "--progress-interval", "0.2", *extra]


def _env():
    return dict(os.environ, PYTHONPATH=REPO, SPARSECLIP_TEXT_CACHE="off")


def _wait_for_train_net(run_glob, deadline_s=900):
    """The pid of the train_net process of the run folder matching ``run_glob`` once it is
    evaluating (its progress.json exists)."""
    from sparseclip_d2.evaluation.progress import read_progress

    deadline = time.time() + deadline_s
    while time.time() < deadline:
        for folder in run_glob():
            p = read_progress(str(folder))
            if p and p.get("state") == "running" and p.get("pid"):
                return int(p["pid"]), folder
        time.sleep(0.1)
    raise AssertionError("the run never started evaluating")


def _proc_state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _check_tensorboard(record):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(record["output_dir"])
    acc.Reload()
    miou = acc.Scalars("sparseclip_demo/mIoU")
    assert [(e.step, e.value) for e in miou] == [(0, pytest.approx(record["datasets"]["sparseclip_demo"]["mIoU"]))]


@pytest.mark.parametrize("executor", ["local", "debug"])
def test_submitit_executor_runs_kills_resumes_and_records_failures(tmp_path, executor):
    """Through submitit's local (own processes) or debug (this process) executor, the code
    path of Slurm: the good run is killed while it evaluates (local: its submitit job and its
    train_net; debug: its train_net), the bad run raises inside train_net; both get failure
    records. The resumed sweep re-runs both: the good one finishes (record, TensorBoard
    scalars, progress.json ok), the bad one fails again with its own exception."""
    from sparseclip_d2.sweeps import read_jsonl

    f = tmp_path / "e2e.yaml"
    f.write_text(E2E_SWEEP)
    out = tmp_path / "out"
    driver = subprocess.Popen(_sweep_cmd(f, out, "--submitit-executor", executor), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=_env(), cwd=REPO)
    pid, folder = _wait_for_train_net(lambda: (out / "runs").glob("good*"))
    if executor == "local":  # the job process is the parent of train_net: kill it alone, as Slurm would
        job_pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        os.kill(job_pid, signal.SIGKILL)
        deadline = time.time() + 60  # train_net goes with its job (PR_SET_PDEATHSIG), never orphaned
        while _proc_state(pid) not in (None, "Z") and time.time() < deadline:
            time.sleep(0.05)
        assert _proc_state(pid) in (None, "Z")
    else:
        os.kill(pid, signal.SIGKILL)
    stdout, _ = driver.communicate(timeout=1800)
    assert driver.returncode == 1, stdout[-4000:]
    assert "runs: 2 total, 0 already finished, 0 ok, 2 failed" in stdout, stdout[-4000:]
    recs = read_jsonl(str(out / "results.jsonl"))
    assert sorted(r["run_name"] for r in recs) == ["bad:precision=fp8", "good:base"]
    by = {r["run_name"]: r for r in recs}
    good, bad = by["good:base"], by["bad:precision=fp8"]
    assert good["status"] == "failed" and good["launcher"] == f"submitit:{executor}"
    if executor == "local":
        assert good["error"]["exit"].startswith("submitit job ") and "without a record" in good["error"]["exit"]
    else:
        assert good["error"]["exit"] == "killed by signal SIGKILL"
    assert bad["status"] == "failed" and bad["error"]["type"] == "ValueError" and "fp8" in bad["error"]["message"]
    assert not os.path.exists(os.path.join(good["output_dir"], "results.json"))
    assert json.loads((folder / "progress.json").read_text())["state"] == "failed"  # a final state, not running
    # resumed: both re-run (neither has an ok record); the good one finishes
    proc = subprocess.run(_sweep_cmd(f, out, "--submitit-executor", executor), capture_output=True, text=True,
                          env=_env(), cwd=REPO, timeout=1800)
    assert "runs: 2 total, 0 already finished, 1 ok, 1 failed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    recs = read_jsonl(str(out / "results.jsonl"))
    assert len(recs) == 4
    final = {r["run_name"]: r for r in recs[2:]}
    assert final["good:base"]["status"] == "ok" and final["good:base"]["run_key"] == good["run_key"]
    assert final["bad:precision=fp8"]["status"] == "failed"
    assert "| good:base |" in (out / "results.md").read_text()
    _check_tensorboard(final["good:base"])
    progress = json.loads((folder / "progress.json").read_text())
    assert (progress["state"], progress["images_done"], progress["images_total"], progress["returncode"]) == \
        ("ok", 1, 1, 0)
    # a third call has nothing to do but the failure, which --no-retry-failed skips
    proc = subprocess.run(_sweep_cmd(f, out, "--submitit-executor", executor, "--no-retry-failed"),
                          capture_output=True, text=True, env=_env(), cwd=REPO, timeout=1800)
    assert proc.returncode == 0 and "runs: 2 total, 2 already finished, 0 ok, 0 failed" in proc.stdout


# ------------------------------------------------------------------ data contents in the run key
def test_content_hashes_are_cached_by_size_and_mtime(tmp_path):
    from sparseclip_d2.sweeps.identity import ContentHashes

    a, b = tmp_path / "a.png", tmp_path / "b.png"
    a.write_bytes(b"one")
    b.write_bytes(b"two")
    cache = str(tmp_path / "hashes.json")
    h = ContentHashes(cache)
    first = h.sha256(str(a)), h.sha256(str(b))
    h.save()
    assert h.hashed == 2
    h2 = ContentHashes(cache)
    assert (h2.sha256(str(a)), h2.sha256(str(b))) == first and h2.hashed == 0  # served from the cache
    a.write_bytes(b"ONE")  # same size, new content and mtime
    os.utime(a, ns=(os.stat(a).st_atime_ns, os.stat(a).st_mtime_ns + 1_000_000))
    assert h2.sha256(str(a)) != first[0] and h2.hashed == 1
    import hashlib
    assert h2.sha256(str(a)) == hashlib.sha256(b"ONE").hexdigest()[:16]


def test_regenerated_mask_under_the_same_name_reruns_and_rerun_flag(tmp_path):
    """A resumed sweep re-runs a run whose data changed in content only;
    ``--rerun`` re-runs a finished run."""
    import numpy as np
    from PIL import Image

    from sparseclip_d2.sweeps import read_jsonl

    demo = tmp_path / "demo"
    env = dict(_env(), SPARSECLIP_DEMO_DIR=str(demo))
    f = tmp_path / "s.yaml"
    f.write_text(f"base: {DEMO}\nfixed: {{backbone: sparseclip-tiny-vit, pretrained: none, resolution: 64, "
                 "normalizer: softmax}\n")
    out = tmp_path / "out"
    cmd = [PY, os.path.join(REPO, "tools", "sweep.py"), str(f), "--output", str(out)]

    def sweep(*extra):
        proc = subprocess.run(cmd + list(extra), capture_output=True, text=True, env=env, cwd=REPO, timeout=1800)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout

    assert "runs: 1 total, 0 already finished, 1 ok, 0 failed" in sweep()
    assert "runs: 1 total, 1 already finished, 0 ok, 0 failed" in sweep()
    mask_path = demo / "voc_demo_label.png"
    mask = np.array(Image.open(mask_path))
    mask[: mask.shape[0] // 2] = 0  # the top half becomes background: the file name stays
    Image.fromarray(mask).save(mask_path)
    assert "runs: 1 total, 0 already finished, 1 ok, 0 failed" in sweep()
    recs = read_jsonl(str(out / "results.jsonl"))
    assert len(recs) == 2 and recs[0]["run_key"] != recs[1]["run_key"]
    assert recs[0]["identity"]["data"]["sparseclip_demo"]["files_sha256"] == \
        recs[1]["identity"]["data"]["sparseclip_demo"]["files_sha256"]  # same file list, other contents
    assert recs[0]["datasets"]["sparseclip_demo"]["mIoU"] != recs[1]["datasets"]["sparseclip_demo"]["mIoU"]
    assert os.path.isfile(out / "data_hashes.json")
    assert "runs: 1 total, 0 already finished, 1 ok, 0 failed" in sweep("--rerun")
    assert len(read_jsonl(str(out / "results.jsonl"))) == 3


# ------------------------------------------------------------------ progress.json from inside the evaluation
def test_run_progress_counts_images_over_datasets_and_ranks(tmp_path, monkeypatch):
    from sparseclip_d2.evaluation import progress as prog

    monkeypatch.setattr(prog, "WRITE_INTERVAL_S", 0.0)  # write on every count
    import itertools

    clock = itertools.count(100.0)  # time.time() ticks 1 s per call
    monkeypatch.setattr(prog.time, "time", lambda: float(next(clock)))
    rp = prog.RunProgress(str(tmp_path), {"a": 5, "b": 3}, world_size=2, is_main=True)
    first = prog.read_progress(str(tmp_path))
    assert (first["state"], first["images_done"], first["images_total"], first["eta_s"]) == ("running", 0, 8, None)
    ev_a = rp.evaluator("a")
    ev_a.reset()
    ev_a.process([{}], [{}])  # rank 0 did 1 image: 2 over both ranks
    p = prog.read_progress(str(tmp_path))
    assert (p["dataset"], p["images_done"]) == ("a", 2)
    ev_a.process([{}, {}], [{}, {}])  # 3 on rank 0: 6 over both ranks, capped at the dataset's 5
    p = prog.read_progress(str(tmp_path))
    assert p["images_done"] == 5
    # elapsed since the first count (the clock ticks 1 s per call); eta = elapsed / done * left
    assert p["eta_s"] == pytest.approx(p["elapsed_s"] / 5 * 3)
    assert ev_a.evaluate() == {}  # adds no metric
    ev_b = rp.evaluator("b")
    ev_b.reset()
    ev_b.process([{}], [{}])
    assert prog.read_progress(str(tmp_path))["images_done"] == 5 + 2
    ev_b.evaluate()
    p = prog.read_progress(str(tmp_path))
    assert (p["state"], p["images_done"], p["datasets_done"], p["datasets_total"]) == ("evaluated", 8, 2, 2)
    prog.finish_progress(str(tmp_path), "ok", returncode=0)
    p = prog.read_progress(str(tmp_path))
    assert (p["state"], p["returncode"], p["images_done"]) == ("ok", 0, 8)
    # a non-main rank writes nothing
    other = tmp_path / "rank1"
    other.mkdir()
    prog.RunProgress(str(other), {"a": 5}, world_size=2, is_main=False).evaluator("a").reset()
    assert prog.read_progress(str(other)) is None
