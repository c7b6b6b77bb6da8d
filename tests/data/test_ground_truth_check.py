"""Every ground-truth mask is checked before inference: mode, size
against its image (EXIF orientation applied), label range over the histogram; each bad
file named in one error; usable masks cached per run by (path, size, mtime)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from conftest import register_sem_seg
from sparseclip_d2.data.ground_truth import (
    BAD_LIST_FILE, CHECK_CACHE_FILE, GroundTruthError, check_ground_truth, find_bad_ground_truth, mask_problem)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def _image(path, h, w, orientation=None):
    im = Image.fromarray(np.zeros((h, w, 3), np.uint8))
    if orientation is None:
        im.save(path)
    else:
        exif = Image.Exif()
        exif[0x0112] = orientation
        im.save(path, exif=exif.tobytes())


def _mask(path, array, mode=None):
    a = np.asarray(array)
    Image.fromarray(a if mode is None else a.astype(np.uint8), mode).save(path)


def test_mask_problems_by_hand(tmp_path):
    t = tmp_path
    _image(t / "a.jpg", 20, 30)
    _mask(t / "ok.png", np.array([[0, 2, 255]], np.uint8).repeat(20, 0).repeat(10, 1))
    assert mask_problem(str(t / "ok.png"), str(t / "a.jpg"), num_classes=3) is None
    pal = Image.fromarray(np.full((20, 30), 1, np.uint8), "L").convert("P")  # palette mask: index = label
    pal.save(t / "pal.png")
    assert mask_problem(str(t / "pal.png"), str(t / "a.jpg"), num_classes=3) is None
    _mask(t / "seven.png", np.full((20, 30), 7, np.uint8))
    assert mask_problem(str(t / "seven.png"), str(t / "a.jpg"), num_classes=3) == (
        f"mask {t / 'seven.png'} holds labels [7] outside [0, 3) and != ignore 255")
    _mask(t / "three.png", np.full((20, 30), 3, np.uint8))  # == C: SemSegEvaluator's ignore slot
    assert "labels [3]" in mask_problem(str(t / "three.png"), str(t / "a.jpg"), num_classes=3)
    _mask(t / "rgb.png", np.zeros((20, 30, 3), np.uint8))
    assert "has PIL mode 'RGB'" in mask_problem(str(t / "rgb.png"), str(t / "a.jpg"), num_classes=3)
    _mask(t / "small.png", np.zeros((10, 30), np.uint8))
    assert mask_problem(str(t / "small.png"), str(t / "a.jpg"), num_classes=3) == (
        f"mask {t / 'small.png'} is 30x10 but its image {t / 'a.jpg'} is 30x20")
    (t / "junk.png").write_bytes(b"not a png at all")
    assert "cannot be read" in mask_problem(str(t / "junk.png"), str(t / "a.jpg"), num_classes=3)
    assert "image" in mask_problem(str(t / "ok.png"), str(t / "missing.jpg"), num_classes=3)
    # 16-bit masks: the full range is checked, not a 256-bin histogram
    Image.fromarray(np.array([[0, 300]], np.uint16)).save(t / "wide.png")
    assert mask_problem(str(t / "wide.png"), None, num_classes=400) is None
    Image.fromarray(np.array([[0, 65535]], np.uint16)).save(t / "wide_bad.png")
    assert "labels [65535]" in mask_problem(str(t / "wide_bad.png"), None, num_classes=400)


def test_exif_rotated_image_is_compared_as_the_mapper_sees_it(tmp_path):
    _image(tmp_path / "rot.jpg", 20, 30, orientation=6)  # stored 30 wide, shown 20 wide x 30 high
    _mask(tmp_path / "shown.png", np.zeros((30, 20), np.uint8))
    _mask(tmp_path / "stored.png", np.zeros((20, 30), np.uint8))
    assert mask_problem(str(tmp_path / "shown.png"), str(tmp_path / "rot.jpg"), num_classes=1) is None
    assert "is 30x20 but its image" in mask_problem(str(tmp_path / "stored.png"), str(tmp_path / "rot.jpg"),
                                                    num_classes=1)
    from sparseclip_d2.data.image_io import read_image_rgb

    assert read_image_rgb(str(tmp_path / "rot.jpg")).shape[:2] == (30, 20)  # the mapper agrees


def _dataset(tmp_path, n, bad=()):
    dicts = []
    for i in range(n):
        image, mask = tmp_path / f"{i}.jpg", tmp_path / f"{i}.png"
        _image(image, 8, 12)
        _mask(mask, np.full((8, 12), 9 if i in bad else i % 3, np.uint8))
        dicts.append({"file_name": str(image), "sem_seg_file_name": str(mask)})
    return dicts


def test_cache_is_keyed_by_size_and_mtime_and_the_check_code(tmp_path):
    dicts = _dataset(tmp_path, 3)
    cache = str(tmp_path / "run" / CHECK_CACHE_FILE)
    assert find_bad_ground_truth("x", dicts, num_classes=3, cache_file=cache) == ([], {"checked": 3, "cached": 0})
    assert find_bad_ground_truth("x", dicts, num_classes=3, cache_file=cache) == ([], {"checked": 3, "cached": 3})
    # a mask regenerated under the same name (same size in bytes, newer mtime) is checked again
    _mask(tmp_path / "1.png", np.full((8, 12), 9, np.uint8))
    os.utime(tmp_path / "1.png", ns=(2 ** 62, 2 ** 62))
    problems, stats = find_bad_ground_truth("x", dicts, num_classes=3, cache_file=cache)
    assert stats == {"checked": 3, "cached": 2} and len(problems) == 1 and "1.png holds labels [9]" in problems[0]
    # the bad mask is not remembered as usable; a cache written by other check code is ignored
    assert find_bad_ground_truth("x", dicts, num_classes=3, cache_file=cache)[1]["cached"] == 2
    # another class count is another key (one entry per mask: the latest check's)
    assert find_bad_ground_truth("x", dicts, num_classes=4, cache_file=cache)[1] == {"checked": 3, "cached": 0}
    assert find_bad_ground_truth("x", dicts, num_classes=4, cache_file=cache)[1] == {"checked": 3, "cached": 2}
    data = json.load(open(cache))
    data["version"] = "other-code"
    json.dump(data, open(cache, "w"))
    assert find_bad_ground_truth("x", dicts, num_classes=4, cache_file=cache)[1]["cached"] == 0
    open(cache, "w").write("{ half a file")
    assert find_bad_ground_truth("x", dicts, num_classes=4, cache_file=cache)[1]["cached"] == 0


def test_check_names_every_bad_file_in_one_error(tmp_path):
    dicts = _dataset(tmp_path, 25, bad=set(range(2, 25)))
    register_sem_seg("gt_check_many", dicts, ["a", "b", "c"])
    run = tmp_path / "run"
    with pytest.raises(GroundTruthError) as info:
        check_ground_truth("gt_check_many", dicts, cache_dir=str(run))
    msg = str(info.value)
    assert msg.startswith("23 of 25 ground-truth masks of dataset 'gt_check_many' are unusable")
    assert "\n" not in msg and "... and 3 more" in msg and str(run / BAD_LIST_FILE) in msg
    assert f"{tmp_path / '2.png'} holds labels [9]" in msg and f"{tmp_path / '0.png'}" not in msg
    listed = (run / BAD_LIST_FILE).read_text().splitlines()
    assert len(listed) == 23 and listed[-1].startswith(f"mask {tmp_path / '24.png'}")
    assert isinstance(info.value, ValueError) and len(info.value.problems) == 23
    # the usable masks were remembered even though the check failed
    assert check_ground_truth("gt_check_many", dicts[:2], cache_dir=str(run)) == {"checked": 2, "cached": 2}
    assert check_ground_truth("sparseclip_fgovd_hard", [{"file_name": "x"}]) == {"checked": 0, "cached": 0}


def test_prepare_check_reads_every_mask_by_default(tmp_path):
    from sparseclip_d2.prepare import check as module

    dicts = _dataset(tmp_path, 12, bad={1})  # 8 evenly spaced picks of 12 skip index 1
    register_sem_seg("gt_check_all", dicts, ["a", "b", "c"])
    problems = module.check_masks("gt_check_all", dicts)
    assert len(problems) == 1 and "1.png holds labels [9]" in problems[0]
    assert module.check_masks("gt_check_all", dicts, sample=8) == []


def test_train_net_stops_before_the_model_with_one_line(tmp_path):
    from test_datasets import make_fake_root

    data = tmp_path / "data"
    make_fake_root(str(data), n=3)
    masks = data / "VOCdevkit" / "VOC2012" / "SegmentationClass"
    Image.fromarray(np.zeros((40, 56, 3), np.uint8)).save(masks / "2007_000000.png")  # an RGB mask
    lab = np.zeros((40, 56), np.uint8)
    lab[3, 4] = 21  # voc21 has 0..20
    Image.fromarray(lab).save(masks / "2007_000002.png")
    out = tmp_path / "out"
    tiny = ["MODEL.SPARSECLIP.CLIP.NAME", "sparseclip-tiny-vit", "MODEL.SPARSECLIP.CLIP.PRETRAINED", "none",
            "MODEL.SPARSECLIP.TEXT.CACHE_DIR", "off", "INPUT.MIN_SIZE_TEST", "64", "DATALOADER.NUM_WORKERS", "0"]
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "train_net.py"), "--eval-only", "--config-file",
         "configs/Base-SparseCLIP.yaml", *tiny, "DATASETS.TEST", '("sparseclip_voc21_val",)', "OUTPUT_DIR", str(out)],
        cwd=ROOT, env=dict(os.environ, DETECTRON2_DATASETS=str(data)), capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "RANDOM WEIGHTS" not in proc.stderr  # before the model
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith("train_net.py: error: data: 2 of 3 ground-truth masks"), errors
    assert "2007_000000.png has PIL mode 'RGB'" in errors[0] and "2007_000002.png holds labels [21]" in errors[0]
    assert not (out / "results.json").exists() and (out / "error.json").exists()
