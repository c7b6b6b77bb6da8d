"""User-facing inputs are validated before the model is built, with errors naming the key,
the value and the valid range; no ``assert`` guards anything in the package or the tools."""
import ast
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import sparseclip_d2
from detectron2.config import get_cfg
from detectron2.modeling import build_model

from sparseclip_d2.config import check_sparseclip_config
from sparseclip_d2.dense import windows as sliding_window
from sparseclip_d2.modeling.backbone import resolve_device

ROOT = Path(__file__).resolve().parents[2]
TINY = ["MODEL.SPARSECLIP.CLIP.NAME", "sparseclip-tiny-vit", "MODEL.SPARSECLIP.CLIP.PRETRAINED", "none",
        "MODEL.SPARSECLIP.TEXT.CACHE_DIR", "off", "MODEL.DEVICE", "cpu"]


def make_cfg(*opts):
    cfg = get_cfg()
    sparseclip_d2.add_sparseclip_config(cfg)
    cfg.merge_from_file(str(ROOT / "configs" / "Base-SparseCLIP.yaml"))
    cfg.merge_from_list(TINY + list(opts))
    return cfg


BAD = [
    (("TEST.SLIDING_WINDOW.ENABLED", "True", "TEST.SLIDING_WINDOW.CROP_SIZE", "112",
      "TEST.SLIDING_WINDOW.STRIDE", "200"),
     r"TEST.SLIDING_WINDOW.STRIDE = 200 is invalid; valid: an integer in \[1, 112\]"),
    (("TEST.SLIDING_WINDOW.STRIDE", "0"), r"STRIDE = 0 .*\[1, 448\]"),
    (("TEST.SLIDING_WINDOW.CROP_SIZE", "-5"), r"CROP_SIZE = -5 .*\[1, inf\)"),
    (("TEST.SLIDING_WINDOW.BATCH_SIZE", "0"), r"BATCH_SIZE = 0"),
    (("MODEL.SPARSECLIP.LOGIT_SCALE", "-1.0"), r"LOGIT_SCALE = -1.0 .*\[0, inf\)"),  # 0 = the model's own scale
    (("MODEL.SPARSECLIP.PROB_THRESHOLD", "1.5"), r"PROB_THRESHOLD = 1.5 .*\[0, 1\]"),
    (("MODEL.SPARSECLIP.AREA_THRESHOLD", "-0.1"), r"AREA_THRESHOLD = -0.1 .*\[0, 1\]"),
    (("MODEL.SPARSECLIP.TEXT.BATCH_SIZE", "0"), r"TEXT.BATCH_SIZE = 0"),
    (("INPUT.MIN_SIZE_TEST", "-1"), r"INPUT.MIN_SIZE_TEST = -1"),
    (("INPUT.FORMAT", "'BGRA'"), r"INPUT.FORMAT = 'BGRA' is invalid; valid: RGB, BGR"),
    (("MODEL.SPARSECLIP.CLIP.PRECISION", "fp8"), r"PRECISION = 'fp8' .*valid: fp32, fp16, bf16"),
    (("MODEL.DEVICE", "tpu"), r"MODEL.DEVICE = 'tpu' is not a supported device; valid: cpu, cuda"),
    (("TEST.MAX_IMAGES", "-3"), r"TEST.MAX_IMAGES = -3"),
]


@pytest.mark.parametrize("opts, match", BAD)
def test_bad_values_rejected_before_the_model_is_built(opts, match, monkeypatch):
    cfg = make_cfg(*opts)
    with pytest.raises(ValueError, match=match):
        check_sparseclip_config(cfg)

    # build_model fails with the same error before any CLIP model is built.
    from sparseclip_d2.modeling import backbone

    def must_not_build(*args, **kwargs):
        raise AssertionError("the CLIP model was built before the config was validated")

    monkeypatch.setattr(backbone, "build_clip", must_not_build)
    with pytest.raises(ValueError, match=match):
        build_model(cfg)


def test_good_config_passes():
    check_sparseclip_config(make_cfg("TEST.SLIDING_WINDOW.ENABLED", "True",
                                     "TEST.SLIDING_WINDOW.CROP_SIZE", "112",
                                     "TEST.SLIDING_WINDOW.STRIDE", "112"))


def test_bad_device_is_named_not_a_weight_error():
    with pytest.raises(ValueError, match=r"MODEL.DEVICE = 'tpu' .*valid: cpu, cuda, cuda:N"):
        resolve_device("tpu")
    assert resolve_device("cpu") == "cpu"


def test_window_grid_rejects_stride_above_crop():
    with pytest.raises(ValueError, match=r"stride 200 is larger than crop_size 112"):
        sliding_window.window_grid(300, 300, 112, 200)


def test_no_assert_in_package_and_tools():
    """``assert`` vanishes under ``python -O``: it must guard nothing (user input or not)."""
    found = []
    for folder in ("sparseclip_d2", "tools"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            found += [f"{path.relative_to(ROOT)}:{node.lineno}" for node in ast.walk(tree)
                      if isinstance(node, ast.Assert)]
    assert not found, "assert statements (use explicit checks raising errors): " + ", ".join(found)


def test_prepare_datasets_id_tables():
    """The constant tables of tools/prepare_datasets.py (sparseclip_d2.prepare; checked here, not by asserts)."""
    from sparseclip_d2.prepare.context import CONTEXT59_DETAIL_IDS
    from sparseclip_d2.prepare.convert import STUFF_IDS, THING_IDS

    assert len(THING_IDS) == 80 and len(STUFF_IDS) == 91
    ids = list(CONTEXT59_DETAIL_IDS)
    assert len(ids) == 59 and ids == sorted(set(ids))


def test_demo_stride_above_crop_under_python_O(tmp_path):
    """Under ``python -O`` (asserts off) the bad stride still fails with a clear error, rc 2,
    and writes nothing (it used to exit 0 with NaN probabilities labelled class 0)."""
    image = tmp_path / "in.png"
    Image.fromarray(np.zeros((64, 96, 3), dtype=np.uint8)).save(image)
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-O", str(ROOT / "tools" / "demo.py"), "--input", str(image), "--classes",
         "sky, grass", "--output", str(out), "--opts", *TINY, "TEST.SLIDING_WINDOW.ENABLED", "True",
         "TEST.SLIDING_WINDOW.CROP_SIZE", "112", "TEST.SLIDING_WINDOW.STRIDE", "200"],
        capture_output=True, text=True, env=env, timeout=3600)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "TEST.SLIDING_WINDOW.STRIDE = 200 is invalid; valid: an integer in [1, 112]" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()


@pytest.mark.parametrize("name", ["sparseclip-tiny-vit", "ViT-B-16-quickgelu"])
def test_unreadable_checkpoint_names_the_file(tmp_path, name):
    from sparseclip_d2.clip import build_clip

    bad = tmp_path / "garbage.pt"
    bad.write_bytes(bytes(range(256)) * 64)
    with pytest.raises(ValueError, match=r"PRETRAINED '.*garbage.pt' is not a checkpoint: .* \(it starts with "):
        build_clip(name, str(bad))


def test_prepare_datasets_check_validates_a_sample_of_masks(tmp_path):
    from conftest import register_sem_seg
    from sparseclip_d2.prepare import check as module

    dicts = []
    for i, (mask_hw, value) in enumerate([((20, 30), 1), ((20, 30), 7), ((30, 20), 0), ((20, 30), 255)]):
        image, mask = tmp_path / f"{i}.jpg", tmp_path / f"{i}.png"
        Image.fromarray(np.zeros((20, 30, 3), dtype=np.uint8)).save(image)
        Image.fromarray(np.full(mask_hw, value, dtype=np.uint8)).save(mask)
        dicts.append({"file_name": str(image), "sem_seg_file_name": str(mask)})
    register_sem_seg("check_masks_test", dicts, ["a", "b", "c"])
    problems = module.check_masks("check_masks_test", dicts, sample=8)
    assert len(problems) == 2
    assert "1.png" in problems[0] and "[7]" in problems[0]  # label 7 of 3 classes
    assert "2.png is 20x30 but its image" in problems[1] and "2.jpg is 30x20" in problems[1]
    assert module.check_masks("check_masks_test", dicts[:1] + dicts[3:], sample=8) == []
    assert module.check_masks("check_masks_test", dicts, sample=1) == []  # only the first record
