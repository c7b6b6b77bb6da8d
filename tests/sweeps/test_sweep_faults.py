"""The faults a sweep meets on one machine (issue 45): Ctrl-C of the sweep (its runs are stopped,
never orphaned, and the rerun records each key once), two sweeps on one output folder (the
second is refused), progress that never shows an earlier attempt, ``progress.json`` ending in a
final state on every exit path, one-line errors for sweep-file mistakes, and ``--num-gpus``
checked as train_net checks it.

Runs are interrupted at a known image with ``SPARSECLIP_FAULT_STOP_AT`` (train_net stops itself
with SIGSTOP after that image's checkpoint record), so nothing here depends on timing. The
progress tests use a small stand-in for train_net (``--train-net``): it writes progress.json and
results.json as train_net does, in a fraction of a second."""
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = sys.executable
DEMO = os.path.join(REPO, "configs", "demo.yaml")
ONE_RUN = f"base: {DEMO}\nfixed: {{backbone: sparseclip-tiny-vit, pretrained: none, resolution: 64, normalizer: softmax}}\n"


def _env(**extra):
    return dict(os.environ, PYTHONPATH=REPO, SPARSECLIP_TEXT_CACHE="off", **extra)


def _state(pid):
    """A process's state letter (``R``, ``S``, ``T`` stopped, ``Z`` zombie), or None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _parent(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _gone(pid):
    return _state(pid) in (None, "Z")


def _wait_for(predicate, what, timeout=600):
    deadline = time.time() + timeout  # generous: only a broken sweep takes this long
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _stopped_train_net(out):
    """(pid, run folder) of the run's train_net once it has stopped itself after image 0."""
    from sparseclip_d2.evaluation.progress import read_progress

    def find():
        for folder in (out / "runs").glob("*") if (out / "runs").is_dir() else []:
            p = read_progress(str(folder))
            if p and p.get("pid") and _state(p["pid"]) == "T":
                return int(p["pid"]), folder
        return None

    return _wait_for(find, "train_net to stop itself after image 0")


def _default_sigint():
    """preexec_fn: SIGINT's default action in the child, as under a terminal. A test run in the
    background (``cmd &`` in a non-interactive shell, nohup, some CI runners) ignores SIGINT, and
    so would its children: a Python started that way never sees a KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _sweep_cmd(f, out, *extra):
    return [PY, os.path.join(REPO, "tools", "sweep.py"), str(f), "--output", str(out), "--progress-interval", "0.2",
            *extra]


LAUNCHERS = {"local": [], "submitit-local": ["--launcher", "submitit", "--submitit-executor", "local"]}


@pytest.mark.parametrize("launcher, target", [("submitit-local", "group"), ("submitit-local", "sweep"),
                                              ("local", "group")])
def test_ctrl_c_stops_the_runs_and_the_rerun_records_each_key_once(tmp_path, launcher, target):
    """Ctrl-C of a sweep (SIGINT to its whole process group, as a terminal sends it, or to the
    sweep's process alone) while a run evaluates: the sweep stops its runs (submitit's local job
    controller, the job process and train_net are all gone when it has exited), the run's
    progress.json says ``interrupted``, and no record is written. The immediate rerun (after the
    issue's case: SIGINT to the sweep alone, whose submitit job used to go on with PPID 1) runs
    it once: one ok record for the key."""
    from sparseclip_d2.evaluation.progress import read_progress
    from sparseclip_d2.sweeps import read_jsonl

    f = tmp_path / "one.yaml"
    f.write_text(ONE_RUN)
    out = tmp_path / "out"
    log = open(tmp_path / "sweep.log", "w")
    driver = subprocess.Popen(_sweep_cmd(f, out, *LAUNCHERS[launcher]), stdout=log, stderr=subprocess.STDOUT,
                              env=_env(SPARSECLIP_FAULT_STOP_AT="0"), cwd=REPO, start_new_session=True,
                              preexec_fn=_default_sigint)
    try:
        pid, folder = _stopped_train_net(out)
        chain = [pid]
        if launcher == "submitit-local":  # train_net <- submitit job process <- submitit's local controller
            chain += [_parent(pid), _parent(_parent(pid))]
            assert "submitit.local._local" in open(f"/proc/{chain[2]}/cmdline").read().replace("\0", " ")
        if target == "group":
            os.killpg(driver.pid, signal.SIGINT)
        else:
            os.kill(driver.pid, signal.SIGINT)
        assert driver.wait(600) != 0
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
        log.close()
    text = (tmp_path / "sweep.log").read_text()
    _wait_for(lambda: all(_gone(p) for p in chain), f"processes {chain} to end", timeout=60)
    assert (read_progress(str(folder)) or {}).get("state") == "interrupted", text[-3000:]
    assert read_jsonl(str(out / "results.jsonl")) == [], text[-3000:]
    assert "interrupted" in text
    if (launcher, target) != ("submitit-local", "sweep"):
        return  # the rerun is the same for every way of stopping: run it once (the case)
    rerun = subprocess.run(_sweep_cmd(f, out, *LAUNCHERS[launcher]), capture_output=True, text=True, env=_env(),
                           cwd=REPO, timeout=1800)
    assert rerun.returncode == 0 and "runs: 1 total, 0 already finished, 1 ok, 0 failed" in rerun.stdout, \
        rerun.stdout[-3000:] + rerun.stderr[-3000:]
    records = read_jsonl(str(out / "results.jsonl"))
    assert [r["status"] for r in records] == ["ok"]
    assert read_progress(str(folder))["state"] == "ok"


def _load_lock_module():
    spec = importlib.util.spec_from_file_location("sweep_lock", os.path.join(REPO, "sparseclip_d2", "sweeps", "lock.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


HOLDER = r"""
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("lock", {lock!r})
lock = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lock)
with lock.OutputLock(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.read()  # until the test closes stdin
"""


def _load_sweep_tool():
    spec = importlib.util.spec_from_file_location("sweep_tool", os.path.join(REPO, "tools", "sweep.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_second_sweep_on_the_same_output_folder_is_refused(tmp_path, capsys):
    """One sweep per output folder: while another process holds ``<out>/sweep.lock``, a sweep
    into the same folder exits 2 with one line naming the holder, before running anything; the
    lock goes with its holder."""
    from sparseclip_d2.sweeps.lock import OutputLock, OutputLockedError

    out = tmp_path / "out"
    holder = subprocess.Popen([PY, "-c", HOLDER.format(lock=os.path.join(REPO, "sparseclip_d2", "sweeps", "lock.py")),
                               str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(OutputLockedError, match=rf"is in use by another sweep \(pid {holder.pid} on "):
            OutputLock(str(out)).acquire()
        f = tmp_path / "one.yaml"
        f.write_text(ONE_RUN)
        rc = _load_sweep_tool().main([str(f), "--output", str(out)])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and err[0].startswith("sweep.py: error: output folder ") \
            and f"(pid {holder.pid} " in err[0], err
        assert not (out / "runs").exists() and not (out / "results.jsonl").exists()
    finally:
        holder.stdin.close()
        holder.wait(60)
    with OutputLock(str(out)):  # released with its holder
        pass


# ------------------------------------------------------------------ progress and its final states
FAKE_TRAIN_NET = r"""
import json, os, sys, time
out = sys.argv[sys.argv.index("OUTPUT_DIR") + 1]
mode = os.environ["FAKE_MODE"]

def progress(state, done):
    tmp = os.path.join(out, "progress.json.tmp")
    with open(tmp, "w") as f:
        json.dump({"state": state, "images_done": done, "images_total": 2, "dataset": "d", "datasets_done": 0,
                   "datasets_total": 1, "elapsed_s": 0.1, "eta_s": 0.1, "updated": time.time(),
                   "pid": os.getpid()}, f)
    os.replace(tmp, os.path.join(out, "progress.json"))

progress("running", 1)
if mode == "hang":
    time.sleep(600)
if mode == "fail":
    sys.exit(3)
time.sleep(float(os.environ.get("FAKE_SECONDS", "0")))
progress("evaluated", 2)
with open(os.path.join(out, "results.json"), "w") as f:
    json.dump({"d": {"mIoU": 50.0}, "config": {}}, f)
if os.environ.get("SPARSECLIP_KEEP_CHECKPOINT") == "1":  # as train_net: the runner removes it after the record
    os.makedirs(os.path.join(out, "inference", "d", "checkpoint"))
"""


def _task(tmp_path, timeout=None, name="r"):
    from sparseclip_d2.sweeps import RunTask, SweepRun

    fake = tmp_path / "fake_train_net.py"
    fake.write_text(FAKE_TRAIN_NET)
    run = SweepRun(name=name, params={}, opts=[], key=f"key-{name}")
    return RunTask(run=run, sweep_name="s", base=DEMO, out_dir=str(tmp_path / "out"), train_net=str(fake),
                   timeout=timeout, tensorboard=False)


@pytest.mark.parametrize("mode, timeout, state, exit_text", [
    ("ok", None, "ok", None), ("fail", None, "failed", "exited with code 3"),
    ("hang", 1.0, "failed", "timed out after 1 s and was killed")])
def test_progress_ends_in_the_runs_final_state(tmp_path, monkeypatch, mode, timeout, state, exit_text):
    from sparseclip_d2.evaluation.progress import read_progress
    from sparseclip_d2.sweeps import execute_run, read_jsonl
    from sparseclip_d2.sweeps.runner import run_dir

    monkeypatch.setenv("FAKE_MODE", mode)
    task = _task(tmp_path, timeout)
    record = execute_run(task)
    p = read_progress(run_dir(task.out_dir, task.run))
    assert p["state"] == state and record["status"] == ("ok" if state == "ok" else "failed")
    if exit_text:
        assert record["error"]["exit"] == exit_text
    assert read_jsonl(os.path.join(task.out_dir, "results.jsonl")) == [record]


def test_a_stopped_run_is_marked_interrupted_and_gets_no_record(tmp_path, monkeypatch):
    """The local launcher's stop (what Ctrl-C of the sweep calls): the runner's train_net is
    stopped, its progress says ``interrupted``, no record is written, and execute_run returns
    None; allow_runs lets the next run run."""
    from sparseclip_d2.evaluation.progress import read_progress
    from sparseclip_d2.sweeps import execute_run
    from sparseclip_d2.sweeps.runner import allow_runs, run_dir, stop_all_runs

    monkeypatch.setenv("FAKE_MODE", "hang")
    task = _task(tmp_path)
    folder = run_dir(task.out_dir, task.run)
    result = {}
    worker = threading.Thread(target=lambda: result.update(record=execute_run(task)))
    worker.start()
    try:
        pid = _wait_for(lambda: (read_progress(folder) or {}).get("pid"), "the stand-in's progress")
        stop_all_runs()
    finally:
        worker.join(120)
        allow_runs()
    assert result == {"record": None}
    assert _gone(pid)
    assert read_progress(folder)["state"] == "interrupted"
    assert not os.path.exists(os.path.join(task.out_dir, "results.jsonl"))
    monkeypatch.setenv("FAKE_MODE", "ok")
    assert execute_run(task)["status"] == "ok"


def test_progress_lines_never_show_an_earlier_attempt(tmp_path, monkeypatch, caplog):
    """--rerun of a finished run: its earlier progress.json ("2/2 images, ok") is gone before the
    sweep reads the folder, so the first line it prints is this attempt's."""
    from sparseclip_d2.sweeps import LocalLauncher
    from sparseclip_d2.sweeps.progress import ProgressBoard
    from sparseclip_d2.sweeps.runner import run_dir

    monkeypatch.setenv("FAKE_MODE", "ok")
    monkeypatch.setenv("FAKE_SECONDS", "1.0")
    task = _task(tmp_path)
    folder = run_dir(task.out_dir, task.run)
    os.makedirs(folder)
    with open(os.path.join(folder, "progress.json"), "w") as f:  # an earlier attempt's last word
        json.dump({"state": "ok", "images_done": 99, "images_total": 99, "eta_s": 0.0, "returncode": 0}, f)
    board = ProgressBoard(total=1, parallel=1, interval=0.01)
    records = []
    with caplog.at_level("INFO", logger="sparseclip_d2.sweeps.progress"):
        LocalLauncher().run([task], records.append, board)
    assert [r["status"] for r in records] == ["ok"]
    assert "99/99" not in caplog.text
    assert "run r: 1/2 images" in caplog.text


def test_train_net_interrupted_by_hand_leaves_a_final_progress_state(tmp_path):
    """train_net alone (no sweep), Ctrl-C while it evaluates: its progress.json says ``stopped``,
    not ``running``."""
    from sparseclip_d2.evaluation.progress import read_progress

    out = tmp_path / "run"
    proc = subprocess.Popen([PY, os.path.join(REPO, "tools", "train_net.py"), "--eval-only", "--config-file", DEMO,
                             "MODEL.SPARSECLIP.CLIP.NAME", "sparseclip-tiny-vit", "MODEL.SPARSECLIP.CLIP.PRETRAINED",
                             "none", "INPUT.MIN_SIZE_TEST", "64", "OUTPUT_DIR", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(SPARSECLIP_FAULT_STOP_AT="0"),
                            preexec_fn=_default_sigint)
    try:
        _wait_for(lambda: _state(proc.pid) == "T", "train_net to stop itself after image 0")
        assert read_progress(str(out))["state"] == "running"
        proc.send_signal(signal.SIGINT)
        proc.send_signal(signal.SIGCONT)
        assert proc.wait(120) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert read_progress(str(out))["state"] == "stopped"


# ------------------------------------------------------------------ one-line errors
@pytest.mark.parametrize("content, args, message", [
    (None, [], "sweep.py: error: sweep file '{f}' not found"),
    ("", [], "sweep.py: error: sweep file '{f}' is empty; it needs at least 'base: <config file>'"),
    ("grid: {alpha: [1.2]}\n", [], "sweep.py: error: sweep file '{f}' lacks 'base' (the base config file)"),
    ("base: nowhere.yaml\n", [], "sweep.py: error: sweep file '{f}': base config 'nowhere.yaml' not found"),
    ("base: [unclosed\n", [], "sweep.py: error: sweep file '{f}' is not valid YAML: "),
    (ONE_RUN, ["--output", "{blocker}/out"], "sweep.py: error: --output '{blocker}/out' cannot be written: "),
    (ONE_RUN, ["--num-gpus", "2"], "sweep.py: error: --num-gpus 2 needs 2 GPUs on this machine; it has "),
])
def test_sweep_file_mistakes_are_one_line_errors(tmp_path, capsys, content, args, message):
    import torch

    if "--num-gpus" in args and torch.cuda.device_count() >= 2:
        pytest.skip("this machine has 2 GPUs: --num-gpus 2 is valid here")
    f = tmp_path / "s.yaml"
    if content is not None:
        f.write_text(content)
    blocker = tmp_path / "a_file"
    blocker.write_text("")  # a file where --output wants a folder
    argv = [str(f)] + [a.format(blocker=blocker) for a in args]
    if "--output" not in args:
        argv += ["--output", str(tmp_path / "out")]
    rc = _load_sweep_tool().main(argv)
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith(message.format(f=str(f), blocker=blocker)), err
    assert "Traceback" not in captured.out + captured.err


@pytest.mark.parametrize("error", ["killed", "timeout"])
def test_requeue_command_failing_in_the_time_limit_handler_is_an_interrupted_attempt(tmp_path, monkeypatch, error):
    """submitit's time-limit handler runs ``scontrol requeue <job>`` inside the job's wait; slurmctld
    requeues the job and signals its processes, and under load that signal can kill the scontrol
    before it exits (seen on the local cluster: ``CalledProcessError`` with code -15). A handler
    raising that, or scontrol's timeout, during the wait ends the attempt as interrupted:
    train_net is stopped, SystemExit(143) (submitit then writes no result), no record. Submitit's
    own "timed-out too many times" error stays the run's failure record."""
    from sparseclip_d2.evaluation.progress import read_progress
    from sparseclip_d2.sweeps import execute_run, read_jsonl
    from sparseclip_d2.sweeps.runner import run_dir

    def handler(signum, frame):  # what submitit's SlurmJobEnvironment._requeue raises
        cmd = ["scontrol", "requeue", "7"]
        if error == "killed":
            raise subprocess.CalledProcessError(-signal.SIGTERM, cmd)
        raise subprocess.TimeoutExpired(cmd, 60)

    monkeypatch.setenv("FAKE_MODE", "hang")
    task = _task(tmp_path)
    folder = run_dir(task.out_dir, task.run)
    previous = signal.signal(signal.SIGUSR2, handler)
    try:
        def fire(earlier=None):  # once this attempt's stand-in runs (its pid in progress.json)
            _wait_for(lambda: (read_progress(folder) or {}).get("pid") not in (None, earlier),
                      "the stand-in's progress")
            os.kill(os.getpid(), signal.SIGUSR2)

        threading.Thread(target=fire, daemon=True).start()
        with pytest.raises(SystemExit) as e:
            execute_run(task)
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert e.value.code == 143
    p = read_progress(folder)
    assert p["state"] == "interrupted" and "requeue in flight" in p["reason"], p
    assert _gone(p["pid"])
    assert not os.path.exists(os.path.join(task.out_dir, "results.jsonl"))

    class UncompletedJobError(RuntimeError):  # submitit.core.utils' error: the run's failure record
        pass

    def too_many(signum, frame):
        raise UncompletedJobError("Job not requeued because: timed-out too many times.")

    previous = signal.signal(signal.SIGUSR2, too_many)
    try:
        threading.Thread(target=fire, args=(p["pid"],), daemon=True).start()
        record = execute_run(task)
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert record["status"] == "failed" and "timed-out too many times" in record["error"]["exit"], record
    assert read_jsonl(os.path.join(task.out_dir, "results.jsonl")) == [record]


def test_a_finished_run_holds_the_requeue_signal_and_its_checkpoint_goes_after_the_record(tmp_path, monkeypatch):
    """Once train_net has ended, submitit's time-limit signal (USR2) is ignored: a requeue then would
    drop the finished result before its record (seen on the local cluster) and repeat the run.
    Inside a submitit job (SUBMITIT_EXECUTOR set) it stays ignored as the job returns; elsewhere the
    handler is restored. train_net is told to keep its checkpoint, which goes once the record is written."""
    from sparseclip_d2.sweeps import execute_run, read_jsonl
    from sparseclip_d2.sweeps.runner import run_dir

    calls = []

    def handler(*a):
        calls.append(a)

    previous = signal.signal(signal.SIGUSR2, handler)
    try:
        monkeypatch.setenv("FAKE_MODE", "ok")
        monkeypatch.delenv("SUBMITIT_EXECUTOR", raising=False)
        task = _task(tmp_path, name="outside")
        record = execute_run(task)
        folder = run_dir(task.out_dir, task.run)
        assert record["status"] == "ok" and os.path.isfile(os.path.join(folder, "results.json"))
        assert not os.path.exists(os.path.join(folder, "inference", "d", "checkpoint"))
        assert signal.getsignal(signal.SIGUSR2) is handler  # restored
        monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
        task = _task(tmp_path, name="inside")
        record = execute_run(task)
        assert record["status"] == "ok" and signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN  # to the job's end
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(0.2)
        assert calls == []
        assert [r["run_name"] for r in read_jsonl(os.path.join(task.out_dir, "results.jsonl"))] == ["outside", "inside"]
    finally:
        signal.signal(signal.SIGUSR2, previous)
