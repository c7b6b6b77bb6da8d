"""The share of classes with zero IoU and the boundary IoU (evaluation/sem_seg_metrics.py) against
hand computations: planted label maps with an empty class, a class never predicted, ignored
pixels and a one-pixel-wide structure; boundary-iou-api's mask_to_boundary written out with
3x3 erosions; the evaluator, results.json and the tables."""
import math

import numpy as np
import pytest

from sparseclip_d2.evaluation.sem_seg_metrics import SemSegExtraMetrics, boundary_band, dilation_width

IGN = 65535


def _erode3(mask):
    """One 3x3 erosion of a 0/1 map whose outside counts as 0 (written out, no library)."""
    h, w = mask.shape
    p = np.zeros((h + 2, w + 2), dtype=np.int64)
    p[1:-1, 1:-1] = mask
    out = np.ones((h, w), dtype=np.int64)
    for dy in range(3):
        for dx in range(3):
            out &= p[dy:dy + h, dx:dx + w]
    return out


def _mask_to_boundary(mask, d):
    """boundary-iou-api @ 37d2558 boundary_utils.mask_to_boundary: mask - erode(pad(mask, 0), 3x3, d times)."""
    eroded = mask.astype(np.int64)
    for _ in range(d):
        eroded = _erode3(eroded)
    return mask.astype(np.int64) - eroded


def _reference(preds, gts, num_classes, d):
    """Per class over all images, float64: boundary IoU of the class masks (pixels with ignored
    ground truth dropped), zero-IoU share over the classes present in the ground truth."""
    inter = np.zeros(num_classes)
    union = np.zeros(num_classes)
    binter = np.zeros(num_classes)
    bunion = np.zeros(num_classes)
    present = np.zeros(num_classes, dtype=bool)
    for pred, gt in zip(preds, gts):
        valid = gt != IGN
        for c in range(num_classes):
            g, p = (gt == c), (pred == c) & valid
            present[c] |= bool(g.any())
            inter[c] += (g & p).sum()
            union[c] += (g | p).sum()
            bg = _mask_to_boundary(g, d).astype(bool)
            bp = _mask_to_boundary(pred == c, d).astype(bool) & valid
            binter[c] += (bg & bp).sum()
            bunion[c] += (bg | bp).sum()
    zero = present & (inter == 0)
    biou = binter[present] / bunion[present]
    return 100.0 * zero.sum() / present.sum(), 100.0 * biou.mean(), biou


# 6 x 6, classes 0..4: class 2 is a one-pixel-wide vertical line, class 3 appears nowhere (empty),
# class 4 is in the ground truth but never predicted; two ignored pixels.
GT = np.array([
    [0, 0, 0, 2, 1, 1],
    [0, 0, 0, 2, 1, 1],
    [0, 0, 0, 2, 1, 1],
    [0, 0, 0, 2, 1, 1],
    [4, 4, 0, 2, 1, IGN],
    [4, 4, 0, 2, 1, IGN],
])
PRED = np.array([
    [0, 0, 0, 2, 1, 1],
    [0, 0, 0, 2, 1, 1],
    [0, 0, 0, 1, 1, 1],
    [0, 0, 0, 1, 1, 1],
    [0, 0, 0, 2, 1, 1],
    [0, 0, 0, 2, 1, 0],
])


def test_hand_computed_planted_maps():
    """d = 1 on the 6 x 6 maps above, counted by hand.

    Class 0: GT has 14 px (cols 0-2 rows 0-3, col 2 rows 4-5); its band (d = 1) is all of them but
    the interior (1,1), (2,1): 12 px, all predicted 0. PRED's class 0 = cols 0-2 (18 px) + (5,5); its
    band is all but (1,1), (2,1), (3,1), (4,1): 14 px + (5,5), which is ignored -> 14 px. Band
    intersection: GT's 12 band pixels but (3,1), which is on GT's contour (next to the 4s) and inside
    PRED's block -> 11. Union 12 + 14 - 11 = 15: 11/15.
    Class 1 (rows 0-5 col 4, rows 0-3 col 5; 10 px, all on the contour): GT band = 10 px. PRED class
    1: col 4 all rows, col 5 rows 0-4, plus (2,3), (3,3) -> (4,5) ignored -> valid band pixels: col 4
    (6), col 5 rows 0-3 (4), (2,3), (3,3) = 12, all of them boundary. Intersection 10; union 12: 10/12.
    Class 2 (one-pixel-wide line, 6 px, all boundary): PRED keeps rows 0, 1, 4, 5: 4 px. 4/6.
    Class 3: absent from both: left out. Class 4: 4 px in GT, 0 predicted: boundary IoU 0, IoU 0.
    Present classes 0, 1, 2, 4; zero IoU: class 4 -> 25 %. Boundary IoU = mean(11/15, 10/12, 4/6, 0).
    """
    m = SemSegExtraMetrics(5, IGN, dilation_pixels=1)
    m.update(PRED, GT)
    r = m.results(["a", "b", "c", "d", "e"])
    expected = [11 / 15, 10 / 12, 4 / 6, 0.0]
    assert r["classes_present"] == 4 and r["zero_IoU_classes"] == 1
    assert r["zero_IoU_share"] == pytest.approx(25.0)
    assert r["boundary_IoU"] == pytest.approx(100 * np.mean(expected))
    assert [r[f"BoundaryIoU-{n}"] for n in "abce"] == pytest.approx([100 * e for e in expected])
    assert math.isnan(r["BoundaryIoU-d"])  # the empty class
    share, biou, _ = _reference([PRED], [GT], 5, 1)
    assert (share, biou) == (pytest.approx(r["zero_IoU_share"]), pytest.approx(r["boundary_IoU"]))


def test_band_equals_per_class_mask_to_boundary():
    """The band of every class at once equals the union of boundary-iou-api's per-class boundaries."""
    rng = np.random.default_rng(0)
    for d in (1, 2, 3):
        labels = rng.integers(0, 4, (13, 17))
        labels[4:10, 3:12] = 5  # a block with an interior
        expected = np.zeros(labels.shape, dtype=bool)
        for c in np.unique(labels):
            expected |= _mask_to_boundary(labels == c, d).astype(bool)
        assert np.array_equal(boundary_band(labels, d), expected), d


@pytest.mark.parametrize("d", [1, 2, 4])
def test_random_maps_against_the_float64_reference(d):
    rng = np.random.default_rng(d)
    preds, gts = [], []
    for h, w in ((11, 14), (9, 9), (16, 7)):
        gt = np.repeat(np.repeat(rng.integers(0, 6, (h // 2 + 1, w // 2 + 1)), 2, 0), 2, 1)[:h, :w]
        gt[rng.random((h, w)) < 0.1] = IGN
        pred = np.where(rng.random((h, w)) < 0.7, np.where(gt == IGN, 0, gt), rng.integers(0, 7, (h, w)))
        preds.append(pred)
        gts.append(gt)
    m = SemSegExtraMetrics(7, IGN, dilation_pixels=d)
    for p, g in zip(preds, gts):
        m.update(p, g)
    r = m.results()
    share, biou, _ = _reference(preds, gts, 7, d)
    assert r["zero_IoU_share"] == pytest.approx(share) and r["boundary_IoU"] == pytest.approx(biou)


def test_dilation_width_follows_boundary_iou_api():
    assert dilation_width(1536, 2048) == 51          # 0.02 * 2560 = 51.2
    assert dilation_width(6, 6) == 1                 # round(0.17) = 0 -> at least 1
    assert dilation_width(100, 100, 0.05) == 7       # round(7.07)
    assert dilation_width(100, 100, 0.05, pixels=3) == 3
    with pytest.raises(ValueError, match="predicted labels must lie in"):
        SemSegExtraMetrics(2, IGN).update(np.array([[2]]), np.array([[0]]))


def test_evaluator_results_json_and_tables(tmp_path):
    """The evaluator reports both metrics from the real ground-truth files (uint16 TIFF, ignore 65535,
    a label map too large for one-hot scores given in bands), results.json keeps them and the sweep
    and paper tables show them."""
    import torch
    from PIL import Image

    from sparseclip_d2.analysis.tables import compare_with_paper, sweep_markdown
    from sparseclip_d2.data.datasets import register_sem_seg_dataset
    from sparseclip_d2.evaluation import build
    from sparseclip_d2.evaluation.build import SparseCLIPSemSegEvaluator
    from sparseclip_d2.evaluation.results import dataset_summary

    gt_path = str(tmp_path / "gt.tif")
    Image.fromarray(GT.astype(np.uint16)).save(gt_path, format="TIFF")
    img = str(tmp_path / "img.jpg")
    register_sem_seg_dataset("metrics_tiff_ds", lambda: [{"file_name": img, "sem_seg_file_name": gt_path}],
                             class_names=["a", "b", "c", "d", "e"], background_index=None, dataset_root=str(tmp_path),
                             prepare_command="-", ignore_label=IGN)
    results = {}
    for name, limit in (("one_hot", 1 << 30), ("bands", 20)):
        build.ONE_HOT_MAX_BYTES = limit
        try:
            ev = SparseCLIPSemSegEvaluator("metrics_tiff_ds", distributed=False, output_dir=str(tmp_path / name),
                                           boundary_iou=(0.0, 1))
            ev.reset()
            ev.process([{"file_name": img}], [{"sem_seg_labels": torch.from_numpy(PRED)}])
            results[name] = ev.evaluate()["sem_seg"]
        finally:
            build.ONE_HOT_MAX_BYTES = 64 << 20
    assert results["one_hot"] == pytest.approx(results["bands"], nan_ok=True)
    assert (tmp_path / "bands" / "sem_seg_predictions.json").read_text() == \
        (tmp_path / "one_hot" / "sem_seg_predictions.json").read_text()
    r = results["bands"]
    assert r["zero_IoU_share"] == pytest.approx(25.0)
    assert r["boundary_IoU"] == pytest.approx(100 * np.mean([11 / 15, 10 / 12, 4 / 6, 0.0]))
    entry = dataset_summary({"sem_seg": r}, 1, 0.5)
    assert entry["zero_IoU_share"] == pytest.approx(25.0) and entry["boundary_dilation_pixels"] == 1
    assert entry["per_class_boundary_IoU"]["c"] == pytest.approx(100 * 4 / 6)
    row = dict(run="r", dataset="ade847", status="ok", metric="mIoU", value=entry["mIoU"], **entry)
    md = sweep_markdown([row], "t")
    assert "| zero_IoU_share | boundary_IoU |" in md and "25.00" in md
    cmp = compare_with_paper([row], paper=[])
    assert cmp[0]["zero_IoU_share"] == pytest.approx(25.0) and cmp[0]["boundary_IoU"] == entry["boundary_IoU"]


def test_boundary_keys_take_effect_and_bad_values_are_refused():
    from detectron2.config import get_cfg

    from sparseclip_d2.config import add_sparseclip_config, check_sparseclip_config
    from sparseclip_d2.evaluation.build import boundary_iou_setting

    cfg = get_cfg()
    add_sparseclip_config(cfg)
    assert boundary_iou_setting(cfg) == (0.02, 0)  # boundary-iou-api's default ratio
    cfg.TEST.BOUNDARY_IOU.DILATION_PIXELS = 3
    assert boundary_iou_setting(cfg) == (0.02, 3)
    cfg.TEST.BOUNDARY_IOU.ENABLED = False
    assert boundary_iou_setting(cfg) is None
    m = SemSegExtraMetrics(5, IGN, boundary=False)
    m.update(PRED, GT)
    assert "boundary_IoU" not in m.results() and m.results()["zero_IoU_share"] == pytest.approx(25.0)
    cfg.TEST.BOUNDARY_IOU.DILATION_RATIO = 1.5
    with pytest.raises(ValueError, match=r"TEST.BOUNDARY_IOU.DILATION_RATIO = 1.5 is invalid; valid: a number in \[0, 1\]"):
        check_sparseclip_config(cfg)
