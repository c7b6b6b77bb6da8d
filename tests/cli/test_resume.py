"""tools/train_net.py: a locked OUTPUT_DIR, evaluations that resume after a kill with the
same metrics, and --skip-bad."""
import json
import os
import subprocess
import sys

from test_datasets import make_fake_root

from sparseclip_d2.common.outputs import OutputFolder

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TINY = ["MODEL.SPARSECLIP.CLIP.NAME", "sparseclip-tiny-vit", "MODEL.SPARSECLIP.CLIP.PRETRAINED", "none",
        "MODEL.SPARSECLIP.TEXT.CACHE_DIR", "off", "INPUT.MIN_SIZE_TEST", "64", "DATALOADER.NUM_WORKERS", "0",
        "DATASETS.TEST", '("sparseclip_voc21_val",)']
METRICS = ("mIoU", "fwIoU", "mACC", "pACC", "per_class_IoU")


def train_net(out, data, *flags, env=None):
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "train_net.py"), "--eval-only", *flags,
         "--config-file", "configs/entmax_qq_l14.yaml", *TINY, "OUTPUT_DIR", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=1800,
        env=dict(os.environ, DETECTRON2_DATASETS=str(data), **(env or {})))


def one_error_line(proc):
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, errors
    return errors[0]


def test_second_run_on_a_locked_output_dir_refuses(tmp_path):
    make_fake_root(str(tmp_path / "data"), n=1)
    out = tmp_path / "out"
    with OutputFolder(str(out), "another run"):  # a run in progress holds the folder
        proc = train_net(out, tmp_path / "data")
    line = one_error_line(proc)
    assert line.startswith("train_net.py: error: output: output folder") and "in use by another run" in line
    assert "another run" in line and str(out) in line
    assert not (out / "log.txt").exists() and not (out / "config.yaml").exists()
    # once the holder has gone (its lock dies with it) the folder is usable again
    proc = train_net(out, tmp_path / "data")
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_killed_evaluation_resumes_with_identical_metrics(tmp_path):
    """The run is killed (SIGKILL) right after its 3rd of 6 per-image records; a --restart
    run starts over and is killed after its 1st; the rerun replays that one and evaluates
    the other 5: every metric equals the uninterrupted run's."""
    data = tmp_path / "data"
    make_fake_root(str(data), n=6)
    whole = train_net(tmp_path / "whole", data)
    assert whole.returncode == 0, whole.stderr[-3000:]
    out = tmp_path / "resumed"
    killed = train_net(out, data, env={"SPARSECLIP_FAULT_KILL_AFTER": "3"})
    assert killed.returncode == -9, killed.stderr[-3000:]
    ckpt = out / "inference" / "sparseclip_voc21_val" / "checkpoint"
    assert sorted(p.name for p in ckpt.glob("*.pt")) == [f"{i:08d}.pt" for i in range(3)]
    assert not (out / "results.json").exists()
    # --restart drops the checkpoint: this run starts at image 0 (killed again after 1 record)
    restarted = train_net(out, data, "--restart", env={"SPARSECLIP_FAULT_KILL_AFTER": "1"})
    assert restarted.returncode == -9 and sorted(p.name for p in ckpt.glob("*.pt")) == ["00000000.pt"]
    (ckpt / ".rec.half-written.tmp").write_bytes(b"\x80")  # a temporary file of a killed write is ignored
    resumed = train_net(out, data)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "1 of 6 images already evaluated" in resumed.stderr + resumed.stdout
    a = json.loads((tmp_path / "whole" / "results.json").read_text())["sparseclip_voc21_val"]
    b = json.loads((out / "results.json").read_text())["sparseclip_voc21_val"]
    assert {k: a[k] for k in METRICS} == {k: b[k] for k in METRICS}
    assert b["num_images"] == 6 and b["resumed_images"] == 1 and "resumed_images" not in a
    assert not ckpt.exists()  # finished: the checkpoint is gone


def test_a_sweep_runners_train_net_keeps_its_checkpoint_and_a_rerun_resumes_every_image(tmp_path):
    """Under a sweep's runner (SPARSECLIP_KEEP_CHECKPOINT=1, sweeps/runner.py) a finished run keeps
    its per-image checkpoint: an attempt stopped after results.json but before its record (a
    late requeue) is followed by one that resumes all 3 images, with the same metrics."""
    from sparseclip_d2.sweeps.runner import KEEP_CHECKPOINT_ENV, remove_run_checkpoints

    data = tmp_path / "data"
    make_fake_root(str(data), n=3)
    out = tmp_path / "run"
    first = train_net(out, data, env={KEEP_CHECKPOINT_ENV: "1"})
    assert first.returncode == 0, first.stderr[-3000:]
    ckpt = out / "inference" / "sparseclip_voc21_val" / "checkpoint"
    assert sorted(p.name for p in ckpt.glob("*.pt")) == [f"{i:08d}.pt" for i in range(3)]
    a = json.loads((out / "results.json").read_text())["sparseclip_voc21_val"]
    again = train_net(out, data, env={KEEP_CHECKPOINT_ENV: "1"})
    assert again.returncode == 0, again.stderr[-3000:]
    assert "3 of 3 images already evaluated" in again.stderr + again.stdout
    b = json.loads((out / "results.json").read_text())["sparseclip_voc21_val"]
    assert {k: a[k] for k in METRICS} == {k: b[k] for k in METRICS} and b["resumed_images"] == 3
    remove_run_checkpoints(str(out))  # what the runner does once the record is written
    assert not ckpt.exists() and (out / "results.json").is_file()


def test_checkpoint_of_another_key_is_discarded(tmp_path):
    """Only a checkpoint made with the same config, data and code is resumed."""
    import torch

    from sparseclip_d2.evaluation import checkpoint as ck

    folder = str(tmp_path / "ckpt")
    assert ck._resume_point(folder, "key-a", 4) == 0
    for i in range(2):
        torch.save({"skipped": None}, ck._record_path(folder, i))
    torch.save({"skipped": None}, ck._record_path(folder, 3))  # not contiguous: not resumed past 2
    assert ck._resume_point(folder, "key-a", 4) == 2
    assert ck._resume_point(folder, "key-b", 4) == 0 and os.listdir(folder) == [ck.KEY_FILE]
    dicts = [{"file_name": str(tmp_path / "a.png")}]
    (tmp_path / "a.png").write_bytes(b"1")
    key = ck.checkpoint_key("cfg", "ds", dicts, False)
    assert ck.checkpoint_key("cfg", "ds", dicts, True) != key and ck.checkpoint_key("cfg2", "ds", dicts, False) != key
    (tmp_path / "a.png").write_bytes(b"22")  # the file changed (size / mtime)
    assert ck.checkpoint_key("cfg", "ds", dicts, False) != key


def test_skip_bad_lists_skipped_images_and_without_it_the_run_stops(tmp_path):
    data = tmp_path / "data"
    make_fake_root(str(data), n=3)
    bad = data / "VOCdevkit" / "VOC2012" / "JPEGImages" / "2007_000001.jpg"
    bad.write_bytes(b"not a jpeg" * 20)
    line = one_error_line(train_net(tmp_path / "strict", data))
    assert str(bad) in line and "cannot read image" in line
    proc = train_net(tmp_path / "lenient", data, "--skip-bad")
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads((tmp_path / "lenient" / "results.json").read_text())["sparseclip_voc21_val"]
    assert r["num_images"] == 2 and [s["file"] for s in r["skipped"]] == [str(bad)]
    assert "cannot read image" in r["skipped"][0]["error"]
    log = (tmp_path / "lenient" / "log.txt").read_text()
    assert "skipped 1 of 3 images (--skip-bad)" in log and str(bad) in log


def test_recorded_output_gives_the_evaluator_the_same_labels():
    """A record keeps sem_seg's argmax exactly (PNG, 8- or 16-bit), the rest as it is."""
    import torch

    from sparseclip_d2.evaluation import checkpoint as ck

    g = torch.Generator().manual_seed(0)
    for classes in (3, 300):  # 8-bit and 16-bit label maps
        scores = torch.randn(classes, 23, 31, generator=g)
        rec = ck._reduce_output({"sem_seg": scores, "attention": {"w": torch.arange(4)}})
        out = ck._output_for_evaluator(rec)
        assert torch.equal(out["sem_seg_labels"], scores.argmax(dim=0))
        assert torch.equal(out["attention"]["w"], torch.arange(4)) and "sem_seg" not in out
