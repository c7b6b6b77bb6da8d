"""Segmentation evaluation through detectron2's public SemSegEvaluator on ground truth
converted once, offline: metrics against a hand-computed confusion matrix, the
reduce_zero_label conversion, display names, label maps, and that no PathManager handler or
fake tensor is involved any more."""
import numpy as np
import pytest
import torch
from PIL import Image

from conftest import register_sem_seg
from sparseclip_d2.data.ground_truth import convert_sem_seg_gt
from sparseclip_d2.evaluation.build import SparseCLIPSemSegEvaluator, label_map_scores

CLASSES = ["cat, kitty", "dog", "sky, heaven"]


def _register(name, dicts):
    register_sem_seg(name, dicts, CLASSES)


def _one_hot(pred, num_classes=3):
    return torch.nn.functional.one_hot(torch.as_tensor(pred), num_classes).permute(2, 0, 1).float()


def test_metrics_match_a_hand_computed_confusion_with_reduce_zero_label(tmp_path):
    # Stored labels (ADE-style): 0 = "other" -> ignore, v -> v - 1, converted offline.
    stored = np.array([[1, 1, 2, 0],
                       [1, 2, 2, 3]], np.uint8)
    pred = np.array([[0, 1, 1, 2],
                     [0, 1, 2, 2]])
    Image.fromarray(stored).save(tmp_path / "raw.png")
    convert_sem_seg_gt(str(tmp_path / "raw.png"), str(tmp_path / "gt.png"), num_classes=3, reduce_zero_label=True)
    converted = Image.open(tmp_path / "gt.png")
    assert converted.mode == "L" and np.array(converted).tolist() == [[0, 0, 1, 255], [0, 1, 1, 2]]
    _register("evaluation_rzl", [{"file_name": "a.jpg", "sem_seg_file_name": str(tmp_path / "gt.png")}])
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
    # the label-map output of the same prediction scores the same
    ev.reset()
    ev.process([{"file_name": "a.jpg"}], [{"sem_seg_labels": torch.as_tensor(pred)}])
    assert ev.evaluate()["sem_seg"] == res


def test_size_mismatch_and_foreign_image_raise(tmp_path):
    Image.fromarray(np.zeros((2, 4), np.uint8)).save(tmp_path / "gt.png")
    _register("evaluation_size", [{"file_name": "a.jpg", "sem_seg_file_name": str(tmp_path / "gt.png")}])
    ev = SparseCLIPSemSegEvaluator("evaluation_size", distributed=False)
    ev.reset()
    with pytest.raises(ValueError, match=r"prediction \(4, 2\) and ground truth \(2, 4\) of 'a.jpg'"):
        ev.process([{"file_name": "a.jpg"}], [{"sem_seg": torch.zeros(3, 4, 2)}])
    with pytest.raises(ValueError, match=r"prediction \(4, 2\) and ground truth \(2, 4\) of 'a.jpg'"):
        ev.process([{"file_name": "a.jpg"}], [{"sem_seg_labels": torch.zeros(4, 2, dtype=torch.long)}])
    with pytest.raises(KeyError, match="b.jpg"):
        ev.process([{"file_name": "b.jpg"}], [{"sem_seg": torch.zeros(3, 2, 4)}])


def test_plain_detectron2_evaluator_reads_the_converted_file_as_it_is(tmp_path):
    """The converted file is all a plain SemSegEvaluator needs: no handler, no conversion
    at evaluation time."""
    from detectron2.evaluation import SemSegEvaluator

    Image.fromarray(np.array([[0, 3]], np.uint8)).save(tmp_path / "raw.png")
    convert_sem_seg_gt(str(tmp_path / "raw.png"), str(tmp_path / "gt.png"), num_classes=3, reduce_zero_label=True)
    _register("evaluation_pin", [{"file_name": "a.jpg", "sem_seg_file_name": str(tmp_path / "gt.png")}])
    ev = SemSegEvaluator("evaluation_pin", distributed=False)
    ev.reset()
    ev.process([{"file_name": "a.jpg"}], [{"sem_seg": _one_hot(np.array([[1, 2]]))}])
    res = ev.evaluate()["sem_seg"]
    # converted gt: [[ignore, 2]]: only the second pixel counts, and it is right
    assert res["pACC"] == pytest.approx(100.0) and res["IoU-sky, heaven"] == pytest.approx(100.0)


def test_converted_ground_truth_keeps_labels_above_255(tmp_path):
    gt = np.array([[0, 300], [299, 65535]], np.uint16)  # 65535 is not ignore here -> out of range
    Image.fromarray(gt).save(tmp_path / "big.png")
    with pytest.raises(ValueError, match="big.png"):
        convert_sem_seg_gt(str(tmp_path / "big.png"), str(tmp_path / "big_out.png"), num_classes=400,
                           reduce_zero_label=False)
    assert not (tmp_path / "big_out.png").exists()
    Image.fromarray(gt[:, :1].copy()).save(tmp_path / "ok.png")
    convert_sem_seg_gt(str(tmp_path / "ok.png"), str(tmp_path / "ok_out.png"), num_classes=400,
                       reduce_zero_label=False)
    with Image.open(tmp_path / "ok_out.png") as im:
        assert np.array(im).tolist() == [[0], [299]]
    # and SemSegEvaluator scores 16-bit labels as they are
    classes = [f"c{i}" for i in range(400)]
    register_sem_seg("evaluation_16bit", [{"file_name": "a.jpg", "sem_seg_file_name": str(tmp_path / "ok_out.png")}],
                     classes)
    ev = SparseCLIPSemSegEvaluator("evaluation_16bit", distributed=False)
    ev.reset()
    ev.process([{"file_name": "a.jpg"}], [{"sem_seg_labels": torch.tensor([[0], [5]])}])
    res = ev.evaluate()["sem_seg"]
    assert res["IoU-c0"] == pytest.approx(100.0) and res["IoU-c299"] == pytest.approx(0.0)
    assert res["pACC"] == pytest.approx(50.0)


def test_label_map_scores_argmax_is_the_label_map():
    labels = torch.tensor([[0, 4, 2], [4, 4, 1]])
    scores = label_map_scores(labels)
    assert scores.dtype == torch.uint8 and scores.shape == (5, 2, 3)
    assert torch.equal(scores.argmax(dim=0), labels) and int(scores.sum()) == 6
    with pytest.raises(ValueError, match="negative label -1"):
        label_map_scores(torch.tensor([[0, -1]]))
    with pytest.raises(ValueError, match=r"\(H, W\)"):
        label_map_scores(torch.zeros(2, 2, 2, dtype=torch.long))


def test_evaluator_uses_public_api_only():
    """No PathManager handler, no object standing in for a tensor, no reduce_zero_label at
    evaluation time (a dataset that asks for it is refused, naming the fix)."""
    import inspect

    from detectron2.data import MetadataCatalog

    import sparseclip_d2.evaluation.build as build

    src = inspect.getsource(build)
    assert "PathHandler" not in src and "register_handler" not in src and "def argmax" not in src
    register_sem_seg("evaluation_rzl_meta", [], CLASSES)
    MetadataCatalog.get("evaluation_rzl_meta").set(reduce_zero_label=True)
    with pytest.raises(ValueError, match="reduce_zero_label=True.*convert the masks once"):
        SparseCLIPSemSegEvaluator("evaluation_rzl_meta", distributed=False)


def test_out_of_range_or_rgb_ground_truth_is_named_not_miscounted(tmp_path):
    Image.fromarray(np.array([[0, 3]], np.uint8)).save(tmp_path / "three.png")  # 3 == C: SemSegEvaluator's ignore slot
    Image.fromarray(np.zeros((1, 2, 3), np.uint8)).save(tmp_path / "rgb.png")
    for f, match in (("three.png", r"three\.png.*\[3\]"), ("rgb.png", r"rgb\.png.*mode 'RGB'")):
        _register("evaluation_bad", [{"file_name": "a.jpg", "sem_seg_file_name": str(tmp_path / f)}])
        ev = SparseCLIPSemSegEvaluator("evaluation_bad", distributed=False)
        ev.reset()
        with pytest.raises(ValueError, match=match):
            ev.process([{"file_name": "a.jpg"}], [{"sem_seg": torch.zeros(3, 1, 2)}])
