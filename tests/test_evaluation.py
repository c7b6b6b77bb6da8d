"""Segmentation evaluation through detectron2's public SemSegEvaluator: metrics against a
hand-computed confusion matrix, reduce_zero_label, display names, and the one behaviour of
detectron2 it relies on (ground truth read through PathManager)."""
import numpy as np
import pytest
import torch
from PIL import Image

from conftest import register_sem_seg
from sparseclip_d2.evaluation.build import SparseCLIPSemSegEvaluator, _ConvertedGroundTruth

CLASSES = ["cat, kitty", "dog", "sky, heaven"]


def _register(name, dicts, reduce_zero_label):
    register_sem_seg(name, dicts, CLASSES, reduce_zero_label=reduce_zero_label)


def _one_hot(pred, num_classes=3):
    return torch.nn.functional.one_hot(torch.as_tensor(pred), num_classes).permute(2, 0, 1).float()


def test_metrics_match_a_hand_computed_confusion_with_reduce_zero_label(tmp_path):
    # Stored labels (ADE-style): 0 = "other" -> ignore, v -> v - 1.
    stored = np.array([[1, 1, 2, 0],
                       [1, 2, 2, 3]], np.uint8)
    pred = np.array([[0, 1, 1, 2],
                     [0, 1, 2, 2]])
    Image.fromarray(stored).save(tmp_path / "gt.png")
    _register("evaluation_rzl", [{"file_name": "a.jpg", "sem_seg_file_name": str(tmp_path / "gt.png")}], True)
    ev = SparseCLIPSemSegEvaluator("evaluation_rzl", distributed=False)
    ev.reset()
    ev.process([{"file_name": "a.jpg"}], [{"sem_seg": _one_hot(pred)}])
    res = ev.evaluate()["sem_seg"]
    # gt (after the shift): [[0,0,1,ign],[0,1,1,2]]. Per class (tp, gt, pred over valid pixels):
    # cat: tp 2, gt 3, pred 2 -> IoU 2/3, ACC 2/3; dog: tp 2, gt 3, pred 3 -> IoU 2/4, ACC 2/3;
    # sky: tp 1, gt 1, pred 2 (pixel (1, 2); the ignored pixel's prediction is not counted)
    # -> IoU 1/2, ACC 1.
    assert res["IoU-cat"] == pytest.approx(100 * 2 / 3)
    assert res["IoU-dog"] == pytest.approx(100 * 2 / 4)
    assert res["IoU-sky"] == pytest.approx(50.0)
    assert res["mIoU"] == pytest.approx(100 * (2 / 3 + 2 / 4 + 1 / 2) / 3)
    assert res["pACC"] == pytest.approx(100 * 5 / 7)
    assert res["ACC-cat"] == pytest.approx(100 * 2 / 3) and res["ACC-sky"] == pytest.approx(100.0)
    assert not any(k.endswith(("kitty", "heaven")) for k in res)


def test_size_mismatch_and_foreign_image_raise(tmp_path):
    Image.fromarray(np.zeros((2, 4), np.uint8)).save(tmp_path / "gt.png")
    _register("evaluation_size", [{"file_name": "a.jpg", "sem_seg_file_name": str(tmp_path / "gt.png")}], False)
    ev = SparseCLIPSemSegEvaluator("evaluation_size", distributed=False)
    ev.reset()
    with pytest.raises(ValueError, match=r"prediction \(4, 2\) and ground truth \(2, 4\) of 'a.jpg'"):
        ev.process([{"file_name": "a.jpg"}], [{"sem_seg": torch.zeros(3, 4, 2)}])
    with pytest.raises(KeyError, match="b.jpg"):
        ev.process([{"file_name": "b.jpg"}], [{"sem_seg": torch.zeros(3, 2, 4)}])


def test_pinned_detectron2_reads_ground_truth_through_pathmanager(tmp_path):
    """The behaviour of detectron2 the evaluator relies on: a plain SemSegEvaluator opens
    ``input_file_to_gt_file[...]`` with ``PathManager.open``, so a handler path works."""
    from detectron2.evaluation import SemSegEvaluator

    Image.fromarray(np.array([[0, 3]], np.uint8)).save(tmp_path / "gt.png")
    _register("evaluation_pin", [{"file_name": "a.jpg", "sem_seg_file_name": str(tmp_path / "gt.png")}], False)
    ev = SemSegEvaluator("evaluation_pin", distributed=False)
    ev.input_file_to_gt_file["a.jpg"] = _ConvertedGroundTruth.path(
        str(tmp_path / "gt.png"), num_classes=3, reduce_zero_label=True, ignore_label=255
    )
    ev.reset()
    ev.process([{"file_name": "a.jpg"}], [{"sem_seg": _one_hot(np.array([[1, 2]]))}])
    res = ev.evaluate()["sem_seg"]
    # converted gt: [[ignore, 2]]: only the second pixel counts, and it is right
    assert res["pACC"] == pytest.approx(100.0) and res["IoU-sky, heaven"] == pytest.approx(100.0)


def test_converted_ground_truth_keeps_labels_above_255(tmp_path):
    gt = np.array([[0, 300], [299, 65535]], np.uint16)  # 65535 is not ignore here -> out of range
    Image.fromarray(gt).save(tmp_path / "big.png")
    handler = _ConvertedGroundTruth()
    path = _ConvertedGroundTruth.path(str(tmp_path / "big.png"), num_classes=400, reduce_zero_label=False,
                                      ignore_label=255)
    with pytest.raises(ValueError, match="big.png"):
        handler._open(path, "rb")
    Image.fromarray(gt[:, :1].copy()).save(tmp_path / "ok.png")
    path = _ConvertedGroundTruth.path(str(tmp_path / "ok.png"), num_classes=400, reduce_zero_label=False,
                                      ignore_label=255)
    with Image.open(handler._open(path, "rb")) as im:
        assert np.array(im).tolist() == [[0], [299]]
