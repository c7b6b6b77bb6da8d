"""Band-wise resize + post-processing (``postprocess.class_scores`` with ``out_size``)
against the straightforward full-size computation: ``F.interpolate`` of the whole
``(S, h, w)`` logits to ``(S, H, W)``, then softmax / max over synonyms / area rule /
probability threshold on the whole image at once."""
from typing import Optional

import pytest
import torch
import torch.nn.functional as F

import sparseclip_d2  # noqa: F401  (registers everything)
from conftest import tiny_cfg
from sparseclip_d2.modeling import class_scores
from sparseclip_d2.modeling.postprocess import bilinear_rows



def reference_scores(logits: torch.Tensor, class_index: torch.Tensor, num_classes: int, out_size, *,
                     prob_threshold: float = 0.0, area_threshold: float = 0.0,
                     background_index: Optional[int] = None) -> torch.Tensor:
    """The full-size computation, written out independently of the package: ``(S, h, w)``
    -> ``(C, H, W)`` (per-class loop for the max over synonyms)."""
    if tuple(out_size) != tuple(logits.shape[-2:]):
        logits = F.interpolate(logits[None], size=tuple(out_size), mode="bilinear", align_corners=False)[0]
    probs = logits.float().softmax(dim=0)
    scores = torch.stack([probs[class_index == c].max(dim=0).values for c in range(num_classes)])
    if area_threshold > 0:
        area = torch.bincount(scores.argmax(dim=0).flatten(), minlength=num_classes).float()
        fg = [c for c in range(num_classes) if c != background_index]
        total = area[fg].sum()
        for c in fg:
            if not area[c] > area_threshold * total:
                scores[c] = 0.0
    if prob_threshold > 0 and background_index is not None:
        low = scores.max(dim=0).values < prob_threshold
        scores[background_index][low] = 1.0
    return scores


def _logits(S: int, h: int, w: int, class_index: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """Random smooth-ish logits with a per-class bias so that class areas are uneven (the
    area rule then suppresses some classes)."""
    g = torch.Generator().manual_seed(seed)
    bias = torch.tensor([0.0, 1.5, -1.0, 0.7, -2.0, 0.3])[class_index]
    return 3.0 * torch.randn(S, h, w, generator=g) + bias.view(-1, 1, 1)


CLASS_INDEX = torch.tensor([0, 1, 1, 2, 3, 3, 3, 4, 5])  # S = 9 synonyms, C = 6 classes
C = 6

SIZES = [
    ((7, 9), (23, 31)),     # upscaling, non-integer ratios
    ((8, 10), (16, 20)),    # upscaling x2
    ((40, 50), (13, 17)),   # downscaling, non-integer ratios
    ((12, 15), (12, 15)),   # no resize
    ((12, 30), (12, 7)),    # width only
    ((10, 30), (25, 30)),   # height only
    ((10, 30), (25, 11)),   # height up, width down
    ((5, 6), (1, 8)),       # one output row
    ((1, 7), (9, 14)),      # one input row
]
RULES = [
    dict(),
    dict(area_threshold=0.12, background_index=None),
    dict(prob_threshold=0.45, background_index=0),
    dict(area_threshold=0.12, prob_threshold=0.45, background_index=2),
]


@pytest.mark.parametrize("in_size,out_size", SIZES)
@pytest.mark.parametrize("rules", RULES)
@pytest.mark.parametrize("band_rows", [1, 4, 7, None])
def test_band_wise_equals_full_size(in_size, out_size, rules, band_rows):
    logits = _logits(len(CLASS_INDEX), *in_size, CLASS_INDEX)
    expected = reference_scores(logits, CLASS_INDEX, C, out_size, **rules)
    got = class_scores(logits, CLASS_INDEX, C, out_size=out_size, band_rows=band_rows, **rules)
    assert got.shape == (C, *out_size) and got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    assert torch.equal(got.argmax(dim=0), expected.argmax(dim=0))


def test_the_rules_are_exercised_by_the_fixture():
    """The RULES above change the result on these logits (otherwise the comparisons with
    rules on would prove nothing more than the ones without)."""
    logits = _logits(len(CLASS_INDEX), 7, 9, CLASS_INDEX)
    plain = reference_scores(logits, CLASS_INDEX, C, (23, 31))
    cut = reference_scores(logits, CLASS_INDEX, C, (23, 31), area_threshold=0.12)
    suppressed = [c for c in range(C) if (cut[c] == 0).all() and not (plain[c] == 0).all()]
    assert 0 < len(suppressed) < C
    thr = reference_scores(logits, CLASS_INDEX, C, (23, 31), prob_threshold=0.45, background_index=0)
    changed = (thr.argmax(0) != plain.argmax(0)).float().mean()
    assert 0 < changed < 1
    got = class_scores(logits, CLASS_INDEX, C, out_size=(23, 31), band_rows=2, area_threshold=0.12)
    assert all((got[c] == 0).all() for c in suppressed)


@pytest.mark.parametrize("in_size,out_size", [(5, 17), (17, 5), (3, 3), (1, 4), (6, 4), (7, 10), (10, 25),
                                              (2000, 4000), (3000, 4000), (683, 500), (333, 2999)])
def test_bilinear_rows_match_pytorch(in_size, out_size):
    """Interpolating the identity along the height gives the resize matrix; its row r must
    be (1 - lam) at i0 and lam at i1."""
    eye = torch.eye(in_size).view(1, 1, in_size, in_size)
    matrix = F.interpolate(eye, size=(out_size, in_size), mode="bilinear", align_corners=False)[0, 0]
    i0, i1, lam = bilinear_rows(in_size, out_size, 0, out_size)
    mine = torch.zeros(out_size, in_size)
    mine[torch.arange(out_size), i0] += 1 - lam
    mine[torch.arange(out_size), i1] += lam
    torch.testing.assert_close(mine, matrix, rtol=0, atol=1e-6)
    # Where the two source rows differ the weights are PyTorch's, bit for bit.
    inner = i0 != i1
    rows = torch.arange(out_size)[inner]
    assert torch.equal(matrix[rows, i1[inner]], lam[inner])
    assert torch.equal(matrix[rows, i0[inner]], 1 - lam[inner])
    # A sub-range gives the same rows.
    a, b, c = bilinear_rows(in_size, out_size, out_size // 2, out_size)
    assert torch.equal(a, i0[out_size // 2:]) and torch.equal(b, i1[out_size // 2:]) and torch.equal(c, lam[out_size // 2:])


def test_bad_arguments():
    logits = torch.zeros(2, 4, 4)
    idx = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="band_rows"):
        class_scores(logits, idx, 2, band_rows=0)
    with pytest.raises(ValueError, match="resize"):
        class_scores(logits, idx, 2, out_size=(0, 4))


def _tiny_model(**opts):
    from detectron2.modeling import build_model

    cfg = tiny_cfg(**opts)
    torch.manual_seed(0)
    return build_model(cfg)


@pytest.mark.parametrize("out_size", [(150, 190), (30, 41), (64, 80)])
def test_meta_arch_output_unchanged(out_size):
    """The META_ARCH output (tiny random-weight CLIP, sliding window) equals the full-size
    F.interpolate + whole-image post-processing of the model's own synonym logits."""
    model = _tiny_model(**{"TEST.SLIDING_WINDOW.ENABLED": True, "TEST.SLIDING_WINDOW.CROP_SIZE": 48,
                           "TEST.SLIDING_WINDOW.STRIDE": 32, "MODEL.SPARSECLIP.AREA_THRESHOLD": 0.1})
    vocabulary = ["background", "cat, kitten", "dog", "sky, clouds", "road", "tree"]
    torch.manual_seed(1)
    img = torch.randint(0, 256, (3, 64, 80), dtype=torch.uint8)
    x = {"image": img, "height": out_size[0], "width": out_size[1], "vocabulary": vocabulary,
         "background_index": 0}
    with torch.no_grad():
        emb, class_index = model.text_classifier_for(vocabulary)
        logits = model.synonym_logits(model.normalize_image(img), emb)
    # Random weights give near-uniform probabilities: a threshold near the median of the
    # per-pixel maximum sends about half the pixels to the background. It is put in the widest gap
    # between neighbouring maxima near the median, so that no pixel sits on it: the model's own
    # forward (windows batched as it batches them) may differ from these logits in the last bit.
    plain = reference_scores(logits, class_index, len(vocabulary), out_size)
    maxima = plain.max(dim=0).values.flatten().sort().values
    n = maxima.numel()
    lo, hi = int(n * 0.45), int(n * 0.55)
    gaps = maxima[lo + 1:hi + 1] - maxima[lo:hi]
    i = lo + int(gaps.argmax())
    assert float(gaps.max()) > 1e-5, "no gap near the median to put the threshold in"
    model.prob_threshold = float((maxima[i] + maxima[i + 1]) / 2)
    expected = reference_scores(logits, class_index, len(vocabulary), out_size, prob_threshold=model.prob_threshold,
                                area_threshold=0.1, background_index=0)
    assert (expected.argmax(0) != plain.argmax(0)).any()
    got = model([x])[0]["sem_seg"]
    assert got.shape == (len(vocabulary), *out_size)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    assert torch.equal(got.argmax(dim=0), expected.argmax(dim=0))


@pytest.mark.parametrize("area, thr, bg", [(0.0, 0.0, None), (0.2, 0.0, None), (0.0, 0.4, 0), (0.15, 0.4, 2)])
def test_score_maps_bands_match_class_scores(area, thr, bg):
    """ScoreMaps: band labels equal the argmax of class_scores (rules included), band
    probabilities are the raw max-over-synonym softmax (rules not applied), any band height."""
    from sparseclip_d2.modeling.postprocess import ScoreMaps

    g = torch.Generator().manual_seed(3)
    logits = torch.randn(7, 13, 17, generator=g) * 2
    class_index = torch.tensor([0, 0, 1, 2, 3, 3, 4])
    kwargs = dict(prob_threshold=thr, area_threshold=area, background_index=bg, out_size=(41, 29))
    full = class_scores(logits, class_index, 5, **kwargs)
    # independent reference for the raw probabilities: full-size resize, softmax, max per class
    big = torch.nn.functional.interpolate(logits[None], size=(41, 29), mode="bilinear", align_corners=False)[0]
    soft = big.softmax(0)
    raw = torch.stack([soft[class_index == c].max(0).values for c in range(5)])
    for rows in (1, 5, 41):
        maps = ScoreMaps(logits, class_index, 5, band_rows=rows, **kwargs)
        assert maps.shape == (5, 41, 29)
        assert torch.equal(maps.labels(), full.argmax(0))
        probs = torch.cat([p for _, _, p, _ in maps.bands()], dim=1)
        torch.testing.assert_close(probs, raw, atol=1e-5, rtol=0)
        rules = maps.rules()
        assert rules["prob_threshold"] == (thr if bg is not None else 0.0)
        assert rules["area_threshold"] == area


def test_meta_arch_returns_labels_above_the_score_budget(tmp_path):
    """Above TEST.SEM_SEG_SCORES_MAX_MB the META_ARCH returns the label map (equal to the
    argmax of the scores it returns below the budget) and the evaluator scores it the same."""
    import numpy as np
    from PIL import Image

    from conftest import register_sem_seg
    from detectron2.modeling import build_model

    from sparseclip_d2.evaluation.build import SparseCLIPSemSegEvaluator

    g = torch.Generator().manual_seed(5)
    image = torch.randint(0, 256, (3, 70, 90), dtype=torch.uint8, generator=g)
    x = {"image": image, "height": 140, "width": 180, "vocabulary": ["sky", "grass, lawn", "dog"]}
    outputs = {}
    for budget in ("1024.0", "0.01"):
        torch.manual_seed(0)
        model = build_model(tiny_cfg(**{"TEST.SEM_SEG_SCORES_MAX_MB": budget}))
        outputs[budget] = model([dict(x)])[0]
    assert set(outputs["1024.0"]) == {"sem_seg"} and set(outputs["0.01"]) == {"sem_seg_labels"}
    labels = outputs["0.01"]["sem_seg_labels"]
    assert labels.shape == (140, 180) and torch.equal(labels, outputs["1024.0"]["sem_seg"].argmax(0))

    gt = tmp_path / "gt.png"
    Image.fromarray(labels.numpy().astype(np.uint8)).save(gt)
    register_sem_seg("bands_budget_test", [{"file_name": "x.png", "sem_seg_file_name": str(gt)}],
                     ["sky", "grass, lawn", "dog"])
    results = []
    for out in outputs.values():
        ev = SparseCLIPSemSegEvaluator("bands_budget_test", distributed=False)
        ev.reset()
        ev.process([{"file_name": "x.png", "sem_seg_file_name": str(gt)}], [out])
        results.append(ev.evaluate()["sem_seg"])
    assert results[0] == results[1] and results[0]["pACC"] == 100.0
