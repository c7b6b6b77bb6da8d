"""Attention statistics against hand-computed values (sparseclip_d2.evaluation.attention_stats)."""
import math

import numpy as np
import pytest
import torch

from sparseclip_d2.evaluation.attention_stats import (
    ROW_STAT_KEYS,
    AttentionStatsEvaluator,
    image_statistics,
    patch_labels,
    reduce_image_statistics,
    resize_labels,
    row_statistics,
    window_patch_labels,
)
from sparseclip_d2.modeling.attention_record import attention_record, rows_sum_to

# One head, 2x2 grid (4 patches, L = 5 tokens, CLS first). Patch labels: 1, 1, 2, 0 with
# background_index 0: foreground queries are patches 0, 1, 2 (tokens 1, 2, 3).
ROWS = torch.tensor([
    [0.25, 0.25, 0.25, 0.25, 0.0],  # CLS query: never a query of the statistics
    [0.1, 0.4, 0.2, 0.3, 0.0],      # patch 0 (class 1): same 0.2, non 0.3, bg 0, self 0.4, cls 0.1
    [0.0, 0.5, 0.5, 0.0, 0.0],      # patch 1 (class 1): same 0.5, non 0, bg 0, self 0.5, cls 0
    [0.2, 0.2, 0.2, 0.2, 0.2],      # patch 2 (class 2): same 0, non 0.4, bg 0.2, self 0.2, cls 0.2
    [0.0, 0.0, 0.0, 0.0, 1.0],      # patch 3 (background): not a query
], dtype=torch.float32)
LABELS = np.array([[1, 1], [2, 0]])
H1 = -(0.1 * math.log(0.1) + 0.4 * math.log(0.4) + 0.2 * math.log(0.2) + 0.3 * math.log(0.3))
EXPECTED_ROWS = [
    # same, non, bg, self, cls, support, support/L, perplexity
    [0.2, 0.3, 0.0, 0.4, 0.1, 4, 4 / 5, math.exp(H1)],
    [0.5, 0.0, 0.0, 0.5, 0.0, 2, 2 / 5, 2.0],
    [0.0, 0.4, 0.2, 0.2, 0.2, 5, 1.0, 5.0],
]
EXPECTED_MEAN = dict(zip(ROW_STAT_KEYS, np.mean(EXPECTED_ROWS, axis=0)))


def test_hand_computed_rows():
    out = row_statistics(ROWS[None], LABELS, background_index=0)
    assert out.shape == (3, len(ROW_STAT_KEYS))
    np.testing.assert_allclose(out.numpy(), np.array(EXPECTED_ROWS), atol=1e-6)
    # mass columns of a row add up to one
    np.testing.assert_allclose(out[:, :5].sum(1).numpy(), 1.0, atol=1e-6)


def test_background_index_none_and_ignore():
    # Without a background class, label 0 is a foreground class: patch 3 is a query (self 1.0),
    # and patch 2 puts 0.2 on it as non-class mass instead of background.
    out = row_statistics(ROWS[None], LABELS, background_index=None)
    assert out.shape[0] == 4
    np.testing.assert_allclose(out[2, :3].numpy(), [0.0, 0.6, 0.0], atol=1e-6)
    np.testing.assert_allclose(out[3, :5].numpy(), [0.0, 0.0, 0.0, 1.0, 0.0], atol=1e-6)
    # 255 is always background/ignored
    out = row_statistics(ROWS[None], np.array([[1, 1], [2, 255]]), background_index=None)
    np.testing.assert_allclose(out.numpy(), np.array(EXPECTED_ROWS), atol=1e-6)


def test_heads_are_samples_and_sum_sources_normalised():
    # head 2 = uniform rows; rows of a sum source (x2) give the same statistics.
    uniform = torch.full((5, 5), 0.2)
    w = torch.stack([ROWS, uniform]) * 2.0
    out = row_statistics(w, LABELS, background_index=0)
    assert out.shape == (6, len(ROW_STAT_KEYS))
    np.testing.assert_allclose(out[:3].numpy(), np.array(EXPECTED_ROWS), atol=1e-6)
    # uniform head: patch 0 -> same 0.2 (patch 1), non 0.2 (patch 2), bg 0.2, self 0.2, cls 0.2
    np.testing.assert_allclose(out[3].numpy(), [0.2, 0.2, 0.2, 0.2, 0.2, 5, 1.0, 5.0], atol=1e-6)
    np.testing.assert_allclose(out[5, :2].numpy(), [0.0, 0.4], atol=1e-6)


def test_no_foreground_gives_no_rows():
    assert row_statistics(ROWS[None], np.array([[0, 0], [255, 0]]), background_index=0).shape == (0, 8)


def test_patch_labels_majority_and_ties():
    labels = np.array([
        [1, 1, 1, 2, 1, 1, 255, 255],
        [1, 255, 2, 255, 255, 255, 255, 3],
    ])
    # patches (2x2): {1,1,1,255} -> 1; {1,2,2,255} -> 2; {1,1,255,255} tie -> 1; {255,255,255,3} -> 255
    assert patch_labels(labels, 2).tolist() == [[1, 2, 1, 255]]
    with pytest.raises(ValueError, match="multiple of patch_size"):
        patch_labels(labels[:, :7], 2)


def test_window_patch_labels_symmetric_padding():
    labels = np.arange(1, 10).reshape(3, 3)
    # 3x3 window, patch 2 -> grid 2x2, padding 1 px bottom and right (ignore):
    # patch (0,0) = {1,2,4,5} all distinct -> smallest 1; (0,1) = {3,255,6,255} -> 255;
    # (1,0) = {7,8,255,255} -> 255; (1,1) = {9,255,255,255} -> 255
    assert window_patch_labels(labels, (0, 3, 0, 3), (2, 2), 2).tolist() == [[1, 255], [255, 255]]
    # a window box inside the image
    assert window_patch_labels(labels, (1, 3, 1, 3), (1, 1), 2).tolist() == [[5]]
    with pytest.raises(ValueError, match="does not pad"):
        window_patch_labels(labels, (0, 3, 0, 3), (3, 3), 2)


def test_resize_labels_nearest():
    gt = np.array([[1, 2], [255, 0]])
    assert resize_labels(gt, (4, 4)).tolist() == [[1, 1, 2, 2], [1, 1, 2, 2], [255, 255, 0, 0], [255, 255, 0, 0]]


def test_image_statistics_whole_image_and_windows():
    gt = LABELS  # 2x2 ground truth; resized image 4x4, patch 2 -> the same 2x2 patch labels
    rec = attention_record([ROWS[None] * 2], (4, 4), 2, source="qq+kk")
    assert rec["rows_sum_to"] == 2 and rec["grids"] == [(2, 2)] and rec["boxes"] == [(0, 4, 0, 4)]
    stats = image_statistics(rec, gt, background_index=0)
    for k in ROW_STAT_KEYS:
        assert stats[k] == pytest.approx(EXPECTED_MEAN[k], abs=1e-6), k
    assert stats["attention_rows"] == 3
    # Two windows (crop 4, stride 2 on a 4x6 image): windows (0,4,0,4) and (0,4,2,6).
    gt6 = np.array([[1, 1, 2], [2, 0, 0]])  # resized to 4x6 -> patch labels [[1,1,2],[2,0,0]]
    rec = attention_record([ROWS[None], ROWS[None]], (4, 6), 2, crop_size=4, stride=2)
    assert rec["boxes"] == [(0, 4, 0, 4), (0, 4, 2, 6)]
    stats = image_statistics(rec, gt6, background_index=0)
    # window 1 labels [[1,1],[2,0]] -> EXPECTED_ROWS; window 2 labels [[1,2],[0,0]]:
    # patch 0 (class 1): same 0, non 0.2 (patch 1, class 2), bg 0.3 (patch 2); patch 1 (class 2):
    # same 0, non 0.5 (patch 0), bg 0
    w2 = row_statistics(ROWS[None], np.array([[1, 2], [0, 0]]), background_index=0).numpy()
    np.testing.assert_allclose(w2[:, :5], [[0.0, 0.2, 0.3, 0.4, 0.1], [0.0, 0.5, 0.0, 0.5, 0.0]], atol=1e-6)
    expected = np.concatenate([np.array(EXPECTED_ROWS), w2]).mean(0)
    np.testing.assert_allclose([stats[k] for k in ROW_STAT_KEYS], expected, atol=1e-6)
    assert stats["attention_rows"] == 5


def test_reduce_image_statistics():
    a = dict(zip(ROW_STAT_KEYS, [0.1] * 8), attention_rows=3)
    b = dict(zip(ROW_STAT_KEYS, [0.3] * 8), attention_rows=5)
    res = reduce_image_statistics([a, None, b])
    assert res["same_class_mass"] == pytest.approx(0.2)
    assert (res["attention_images"], res["attention_images_without_foreground"], res["attention_rows"]) == (2, 1, 8)
    assert math.isnan(reduce_image_statistics([None])["perplexity"])


def test_rows_sum_to():
    assert rows_sum_to("qk") == 1 and rows_sum_to("qq+kk") == 2 and rows_sum_to("qq+kk+vv") == 3
    assert rows_sum_to("qq+kk", "sum_then_normalize") == 1


def test_evaluator_on_demo_uniform_attention():
    """Uniform attention over the demo photo's grid: per query of class c,
    same = (n_c - 1) / L, non = (F - n_c) / L, bg = B / L, self = cls = 1 / L, support = ppl = L."""
    import sparseclip_d2.data  # noqa: F401 (registers sparseclip_demo)
    from detectron2.data import DatasetCatalog

    from sparseclip_d2.data.datasets.segmentation import load_sem_seg_gt

    d = DatasetCatalog.get("sparseclip_demo")[0]
    H, W, p = 96, 128, 16  # resized image 96x128 -> grid 6x8
    h, w = H // p, W // p
    L = 1 + h * w
    rec = attention_record([torch.full((2, L, L), 1.0 / L)], (H, W), p)
    ev = AttentionStatsEvaluator("sparseclip_demo", distributed=False)
    ev.reset()
    ev.process([d], [{"sem_seg": None, "attention": rec}])
    res = ev.evaluate()["attention_stats"]
    gt = load_sem_seg_gt(d["sem_seg_file_name"], num_classes=21)
    plab = patch_labels(resize_labels(gt, (H, W)), p).reshape(-1)
    fg = plab[(plab != 0) & (plab != 255)]
    F_, B_ = len(fg), h * w - len(fg)
    assert F_ > 0
    counts = {c: int((fg == c).sum()) for c in np.unique(fg)}
    same = sum(n * (n - 1) for n in counts.values()) / (F_ * L)
    non = sum(n * (F_ - n) for n in counts.values()) / (F_ * L)
    assert res["same_class_mass"] == pytest.approx(same)
    assert res["non_class_mass"] == pytest.approx(non)
    assert res["background_mass"] == pytest.approx(B_ / L)
    assert res["self_mass"] == pytest.approx(1 / L) and res["cls_mass"] == pytest.approx(1 / L)
    assert res["support_size"] == pytest.approx(L) and res["perplexity"] == pytest.approx(L, rel=1e-6)
    assert res["attention_images"] == 1 and res["attention_rows"] == 2 * F_
    with pytest.raises(KeyError, match="attention"):
        ev.process([d], [{"sem_seg": None}])


def test_rows_sum_to_uses_the_source_grammar():
    # the paper's names are aliases of single sources; a typo is an error, not "1 term"
    assert rows_sum_to("qqv") == 1 and rows_sum_to("QQ + KK") == 2
    with pytest.raises(ValueError, match="unknown attention source 'qx'"):
        rows_sum_to("qx")


# ---------------------------------------------------------------- towers without / with more prefix tokens
def test_rows_without_a_cls_token_and_with_a_register():
    """SigLIP towers have no prefix token (T = 0); register towers have CLS + registers. The
    patch block of ROWS, renormalised, for T = 0; ROWS with an extra register column for T = 2."""
    patches = ROWS[1:, 1:]  # (4 patches, 4 patches), CLS dropped
    out = row_statistics(patches[None], LABELS, background_index=0, num_prefix_tokens=0)
    # patch 0: 0.4 0.2 0.3 0 over 0.9; patch 1: 0.5 0.5 0 0; patch 2: 0.2 x 4 over 0.8
    H0 = -sum(v / 0.9 * math.log(v / 0.9) for v in (0.4, 0.2, 0.3))
    expected = [[0.2 / 0.9, 0.3 / 0.9, 0.0, 0.4 / 0.9, 0.0, 3, 3 / 4, math.exp(H0)],
                [0.5, 0.0, 0.0, 0.5, 0.0, 2, 2 / 4, 2.0],
                [0.0, 0.5, 0.25, 0.25, 0.0, 4, 1.0, 4.0]]
    np.testing.assert_allclose(out.numpy(), np.array(expected), atol=1e-6)

    # CLS (0.1 for patch 0) plus a register token carrying 0.1 more: cls_mass is the prefix mass
    reg = torch.zeros(6, 6)
    reg[1:, 0] = ROWS[:, 0]
    reg[1:, 2:] = ROWS[:, 1:]
    reg[2, 1] = 0.1  # patch 0's row: register 0.1, CLS 0.1, then 0.4 0.2 0.3 0 (sums to 1.1)
    out = row_statistics(reg[None], LABELS, background_index=0, num_prefix_tokens=2)
    np.testing.assert_allclose(out[0, :5].numpy(), np.array([0.2, 0.3, 0.0, 0.4, 0.2]) / 1.1, atol=1e-6)
    assert out[0, 5] == 5 and out[0, 6] == pytest.approx(5 / 6)
    with pytest.raises(ValueError, match="4 patch labels for 3 patch tokens after 2 prefix"):
        row_statistics(ROWS[None], LABELS, num_prefix_tokens=2)


def test_statistics_and_attention_figure_on_a_siglip_tower():
    """End to end on the tiny SigLIP tower (no CLS token): the record says T = 0, the
    statistics of the real attention are well-formed, cls_mass is 0."""
    import sparseclip_d2.data  # noqa: F401 (registers sparseclip_demo)
    from detectron2.data import DatasetCatalog
    from detectron2.modeling import build_model

    from conftest import tiny_cfg
    from sparseclip_d2.analysis.attention_figures import query_attention
    from sparseclip_d2.clip import parse_attention_spec
    from sparseclip_d2.data.mapper import SparseCLIPTestMapper

    torch.manual_seed(0)
    cfg = tiny_cfg(**{"MODEL.SPARSECLIP.CLIP.NAME": "sparseclip-tiny-siglip", "INPUT.MIN_SIZE_TEST": 64,
                      "TEST.ATTENTION_STATS.ENABLED": True, "DATASETS.TEST": ("sparseclip_demo",)})
    model = build_model(cfg).eval()
    assert model.encoder.num_prefix_tokens == 0
    d = DatasetCatalog.get("sparseclip_demo")[0]
    inp = SparseCLIPTestMapper(cfg, dataset_name="sparseclip_demo")(d)
    with torch.no_grad():
        out = model([inp])[0]
    rec = out["attention"]
    assert rec["num_prefix_tokens"] == 0
    h, w = rec["grids"][0]
    assert tuple(rec["weights"][0].shape[-2:]) == (h * w, h * w)
    ev = AttentionStatsEvaluator("sparseclip_demo", distributed=False)
    ev.reset()
    ev.process([d], [out])
    res = ev.evaluate()["attention_stats"]
    assert res["cls_mass"] == 0.0
    total = res["same_class_mass"] + res["non_class_mass"] + res["background_mass"] + res["self_mass"]
    assert total == pytest.approx(1.0, abs=1e-6)
    assert 1 <= res["support_size"] <= h * w

    image = np.asarray(inp["image"].permute(1, 2, 0).numpy(), dtype=np.uint8)
    res = query_attention(model.clip_model.visual, image, (10.0, 10.0), [parse_attention_spec("qq:entmax:1.2")],
                          resolution=64)[0]
    assert res["cls_mass"] == 0.0 and res["num_tokens"] == res["grid"][0] * res["grid"][1]
    assert res["map"].sum() == pytest.approx(1.0, abs=1e-6)
