"""The stage-activity record (common/activity.py) and what the pipeline reports into it, against
hand-known cases on tiny inputs: a first segmentation with one label or two, the window count of a
sliding window, a patch remainder, a probability threshold, a logits stage's changed pixels."""
import pytest
import torch

from sparseclip_d2.common.activity import ActivityRecord, active_record, recording, report


def test_record_merges_calls_and_flags_flat_stages():
    rec = ActivityRecord()
    rec.add("first segmentation", False, labels=1)
    rec.add("first segmentation", True, labels=3)
    rec.add("probability threshold", False, below=0, above=12)
    assert rec.active("first segmentation") and not rec.active("probability threshold")
    assert rec.flat() == ["probability threshold"]
    assert rec.as_dict()["first segmentation"] == {"active": True, "calls": 2, "figures": {"labels": [1, 3]}}
    assert rec.summary() == "first segmentation x2: labels 1-3; probability threshold: below 0, above 12 FLAT"
    with pytest.raises(KeyError, match="reported: first segmentation, probability threshold"):
        rec.active("windows")


def test_report_outside_recording_does_nothing_and_recording_nests():
    report("windows", True, windows=1)  # no record open: nothing, no error
    assert active_record() is None
    with recording() as outer:
        report("a", True)
        with recording() as inner:
            report("b", False)
        report("c", True)
    assert list(outer.stages) == ["a", "c"] and list(inner.stages) == ["b"] and active_record() is None


def _first_segmentation(threshold, logit_scale):
    from sparseclip_d2.dense.first_segmentation import FeedbackSettings, first_segmentation_prior

    # 2 x 2 patches of side 4; patch (0, 0) points at text 0, the other three at text 1
    feats = torch.zeros(1, 2, 2, 2)
    feats[0, 1] = 1.0
    feats[0, :, 0, 0] = torch.tensor([1.0, 0.0])
    text = torch.eye(2)
    images = torch.zeros(1, 3, 8, 8)
    settings = FeedbackSettings(threshold=threshold, pamr_steps=0)
    with recording() as rec:
        first_segmentation_prior(feats, images, text, logit_scale, settings, patch=4)
    return rec


def test_first_segmentation_reports_its_distinct_patch_labels():
    # threshold 0: labels {0, 1} (two); softmax top probability with scale 1 is e / (e + 1) = 0.731,
    # so a threshold of 0.9 sends every patch to label 0 (one label: flat)
    rec = _first_segmentation(0.0, 1.0)
    assert rec.as_dict()["first segmentation"] == {"active": True, "calls": 1, "figures": {"labels": [2]}}
    rec = _first_segmentation(0.9, 1.0)
    assert rec.flat() == ["first segmentation"] and rec.stages["first segmentation"]["figures"]["labels"] == [1]


def test_logits_change_counts_pixels_whose_argmax_moved():
    from sparseclip_d2.modeling.meta_arch import _report_logits_change

    before = torch.zeros(3, 2, 2)
    before[1] = 1.0  # argmax 1 everywhere
    after = before.clone()
    after[2, 0, 1] = 5.0  # one pixel moves to class 2
    with recording() as rec:
        _report_logits_change("pamr", before, before.clone())
        _report_logits_change("pamr", before, after)
    assert rec.as_dict()["pamr"] == {"active": True, "calls": 2, "figures": {"changed_pixels": [0, 1]}}


def _tiny_model(**opts):
    from detectron2.modeling import build_model

    from conftest import tiny_cfg

    return build_model(tiny_cfg(**opts)).eval()


def test_tiny_model_reports_windows_remainder_and_threshold():
    model = _tiny_model(**{"TEST.SLIDING_WINDOW.ENABLED": True, "TEST.SLIDING_WINDOW.CROP_SIZE": 32,
                           "TEST.SLIDING_WINDOW.STRIDE": 16, "MODEL.SPARSECLIP.PROB_THRESHOLD": 0.34})
    g = torch.Generator().manual_seed(0)
    image = torch.randint(0, 256, (3, 48, 64), generator=g, dtype=torch.uint8)
    x = {"image": image, "vocabulary": ["sky", "cat", "road"], "background_index": 0}
    with recording() as rec, torch.no_grad():
        out = model.predict(x)
    d = rec.as_dict()
    # mmseg's grid of a 48 x 64 image, crop 32, stride 16: 2 rows x 3 columns of windows
    assert sum(d["windows"]["figures"]["windows"]) == 6
    assert d["patch remainder"] == {"active": True, "calls": 1,  # reported, never flat (an input property)
                                    "figures": {"size": [[48, 64]], "remainder": [[0, 0]], "mode": ["pad_crop"]}}
    # the scores put 1.0 on the background class where the threshold applied (probabilities are < 1)
    below = int((out.score_maps.scores()[0] == 1.0).sum())
    assert 0 < below < 48 * 64
    fig = d["probability threshold"]["figures"]
    assert fig == {"below": [below], "above": [48 * 64 - below]}
    assert d["probability threshold"]["active"]


def test_tiny_model_whole_image_with_a_patch_remainder_and_the_area_threshold():
    # AREA_THRESHOLD 1.0: no class's arg-max area exceeds the whole image, so every foreground class
    # (2 of 3, background 0 kept) is suppressed
    model = _tiny_model(**{"MODEL.SPARSECLIP.AREA_THRESHOLD": 1.0})
    image = torch.zeros(3, 40, 60, dtype=torch.uint8)
    with recording() as rec, torch.no_grad():
        model.predict({"image": image, "vocabulary": ["sky", "cat", "road"], "background_index": 0})
    d = rec.as_dict()
    assert d["patch remainder"]["active"] and d["patch remainder"]["figures"]["remainder"] == [[8, 12]]
    assert d["windows"]["figures"]["windows"] == [1]
    assert "probability threshold" not in d  # PROB_THRESHOLD 0: no such stage
    assert d["area threshold"] == {"active": True, "calls": 1, "figures": {"suppressed_classes": [2]}}
