"""GLA-CLIP (2btlFe/GLA-CLIP @ ba74915): the window-set attention, its proxy anchor and dynamic
normalisation, against float64 computations written out row by row on a non-square token grid;
its composition with alpha-entmax; the whole window-set last block on tiny towers; the keys and
their refusals; the stage that hands the encoder all windows of the image. The comparison with
upstream's own code is ``tools/agreement_gla_clip.py`` (docs/upstream_agreement.md)."""
import math

import pytest
import torch

from sparseclip_d2.clip import AttentionSpec
from sparseclip_d2.methods.gla_clip import (WindowSetEncoder, WindowSetSettings, anchor_scores, dynamic_normalise,
                                            window_set_attend, window_set_beta)
from sparseclip_d2.methods.proxyclip import normalize_proxy_scores

from conftest import baseline_cfg, tiny_cfg
from test_entmax import entmax_bisect_reference  # float64 bisection, independent of the kernel
from test_proxyclip import DINO, _proxy, bilinear_reference, proxy_block_inputs64


def window_set_reference(feats, values, thr, iters, beta_alpha, gamma_alpha, normalise):
    """The window-set attention in float64, one query row at a time with explicit sums: ``feats``
    (B, C, h, w), ``values`` (B, S, D); ``normalise`` maps a float64 row of scores to weights.
    Returns ``(out (B, S, D), weights (N, N))``."""
    B, C, h, w = feats.shape
    keys = [feats[b, :, i, j].double() for b in range(B) for i in range(h) for j in range(w)]
    keys = [k / math.sqrt(float(k @ k)) for k in keys]
    vals = values.double().reshape(B * h * w, -1)
    N = len(keys)
    beta = 1.0 + beta_alpha * math.log(1.0 + B)
    out, rows, margins = torch.zeros_like(vals), [], []
    for r in range(N):
        scores = [float(keys[r] @ k) for k in keys]
        count = sum(1 for s in scores if s > thr)
        for _ in range(iters):
            margins += [abs(s - thr) for s in scores]
            mask = [1.0 if s > thr else 0.0 for s in scores]
            if sum(mask) == 0:
                mask[r] = 1.0
            count = sum(mask)
            p = sum(m * k for m, k in zip(mask, keys)) / (count + 1e-6)
            p = p / math.sqrt(float(p @ p))
            scores = [float(p @ k) for k in keys]
        mean = max(sum(scores) / N, 0.0)
        gamma = 1.0 + gamma_alpha / count
        s = [(x - beta * mean) * gamma for x in scores]
        cut = min(max(s), 0.0)
        s = torch.tensor([x if x >= cut else float("-inf") for x in s], dtype=torch.float64)
        wts = normalise(s)
        rows.append(wts)
        out[r] = sum(wts[c] * vals[c] for c in range(N))
    assert min(margins) > 1e-5, "a score sits on the threshold: float32 and float64 masks could differ"
    return out.reshape(B, h * w, -1), torch.stack(rows)


def _inputs(seed=0, B=3, C=6, h=2, w=3, D=4):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, C, h, w, generator=g) + 0.4, torch.randn(B, h * w, D, generator=g)


@pytest.mark.parametrize("normalizer, alpha", [("softmax", 1.5), ("entmax", 1.5), ("entmax", 1.2)])
def test_window_set_attention_matches_float64_rows(normalizer, alpha):
    """3 windows of a 2 x 3 grid (18 keys), blocks of 5 rows (not a divisor): the keys of all windows,
    the anchor, the dynamic beta / gamma, the cut and the normaliser, row by row in float64."""
    feats, values = _inputs()
    s = WindowSetSettings(threshold=0.35, iterations=2, beta_alpha=0.3, gamma_alpha=30.0, block_rows=5)
    spec = AttentionSpec(normalizer=normalizer, alpha=alpha)
    kept = []
    out = window_set_attend(feats, values, s, lambda x: normalize_proxy_scores(x, spec), keep=kept)
    ref_norm = (lambda x: torch.softmax(x, -1)) if normalizer == "softmax" else (
        lambda x: entmax_bisect_reference(x, alpha))
    ref, weights = window_set_reference(feats, values, 0.35, 2, 0.3, 30.0, ref_norm)
    got = torch.cat(kept)
    assert got.shape == (18, 18) and out.shape == (3, 6, 4) and out.dtype == torch.float32
    torch.testing.assert_close(got.double(), weights, rtol=0, atol=1e-5)
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=1e-5)
    # the rows span every window: some weight of a window's rows falls on other windows' keys
    assert float(got[:6, 6:].sum()) > 0.01
    assert bool((got == 0).any())  # the cut (and entmax) give exact zeros, where the reference has them
    assert torch.equal(got == 0, weights == 0)


def test_window_set_rows_do_not_depend_on_the_block_size():
    feats, values = _inputs(seed=1)
    outs = [window_set_attend(feats, values, WindowSetSettings(threshold=0.35, block_rows=n),
                              lambda x: torch.softmax(x, -1)) for n in (1, 7, 1024)]
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=1e-6)
    torch.testing.assert_close(outs[0], outs[2], rtol=0, atol=1e-6)


def test_anchor_restores_a_row_with_no_key_above_the_threshold():
    """Unit keys whose cosines are exactly 1 (self) and 0: with threshold 1.0 no entry exceeds it, so
    every row keeps its own key (upstream's gone_proxy_idx restoration), count 1."""
    keys = torch.eye(4)[:3]  # (3, 4)
    scores, counts = anchor_scores(keys, slice(0, 3), threshold=1.0, iterations=2)
    assert torch.equal(counts, torch.ones(3, 1))
    torch.testing.assert_close(scores, torch.eye(3), rtol=0, atol=1e-6)
    scores, counts = anchor_scores(keys, slice(1, 3), threshold=-0.5, iterations=1)  # every key in the mask
    mean = keys.sum(0) / (3 + 1e-6)
    torch.testing.assert_close(scores, (mean / mean.norm()).expand(2, 4) @ keys.T, rtol=0, atol=1e-6)
    assert torch.equal(counts, torch.full((2, 1), 3.0))


def test_dynamic_normalisation_by_hand():
    """Two rows written out: a positive mean (shifted by beta * mean) and a negative one (clamped to
    0); gamma = 1 + 30 / count; entries below min(row max, 0) masked."""
    beta = window_set_beta(6, 0.3)
    assert abs(beta - 1.5837730) < 1e-6  # 1 + 0.3 ln 7
    scores = torch.tensor([[0.5, 0.2, -0.1], [-0.3, -0.2, -0.4]], dtype=torch.float64)
    counts = torch.tensor([[2.0], [1.0]], dtype=torch.float64)
    got = dynamic_normalise(scores, counts, beta, 30.0)
    m = 0.2  # row 0's mean; gamma 1 + 30 / 2 = 16; the cut min(max, 0) = 0 masks the two negatives
    assert (0.2 - beta * m) * 16 < 0 < (0.5 - beta * m) * 16
    row0 = [(0.5 - beta * m) * 16, float("-inf"), float("-inf")]
    row1 = [float("-inf"), -0.2 * 31, float("-inf")]  # mean < 0 -> 0, gamma 31; the cut is the max, -6.2
    torch.testing.assert_close(got, torch.tensor([row0, row1], dtype=torch.float64), rtol=0, atol=1e-12)


def test_fp16_precision_runs_in_half_and_stays_close():
    feats, values = _inputs(seed=2)
    f32 = window_set_attend(feats, values, WindowSetSettings(threshold=0.35), lambda x: torch.softmax(x.float(), -1))
    f16 = window_set_attend(feats, values, WindowSetSettings(threshold=0.35, precision="fp16"),
                            lambda x: torch.softmax(x.float(), -1).half())
    assert f16.dtype == torch.float32
    assert 0 < float((f16 - f32).abs().max()) < 2e-2


@pytest.fixture(scope="module")
def clip():
    from conftest import build_tiny_clip

    return build_tiny_clip(0)


@pytest.mark.parametrize("normalizer", ["softmax", "entmax"])
def test_window_set_last_block_matches_float64(clip, normalizer):
    """The whole last block of two 32 px windows (CLIP 2 x 2, DINO B/8 4 x 4): DINO tokens of both
    windows as keys, CLIP's values resized to 4 x 4 as values, out_proj, ln_post, proj, no residual."""
    proxy = _proxy(DINO)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(4)) * 0.5
    pf, v64, v, blk = proxy_block_inputs64(clip, proxy, x)
    C, H = v.shape[-1], blk.attn.num_heads
    s = WindowSetSettings(threshold=0.5, iterations=2, beta_alpha=0.3, gamma_alpha=30.0)
    enc = WindowSetEncoder(clip.visual, AttentionSpec(normalizer=normalizer, alpha=1.2, residual=False, ffn=False),
                           proxy, settings=s)
    ours = enc(x)
    assert ours.shape == (2, clip.visual.proj.shape[1], 4, 4)
    feats = torch.stack([pf[b].T.reshape(-1, 4, 4) for b in range(2)])
    values = torch.stack([torch.cat([bilinear_reference(v[b, 1:, h * C // H:(h + 1) * C // H].reshape(2, 2, -1), 4, 4)
                                     .reshape(16, -1) for h in range(H)], -1) for b in range(2)])
    norm = (lambda r: torch.softmax(r, -1)) if normalizer == "softmax" else (lambda r: entmax_bisect_reference(r, 1.2))
    o, _ = window_set_reference(feats, values, 0.5, 2, 0.3, 30.0, norm)
    with torch.no_grad():
        o = o @ blk.attn.out_proj.weight.T.double() + blk.attn.out_proj.bias.double()
        ref = v64.ln_post(o) @ v64.proj  # (2, 16, D)
    torch.testing.assert_close(ours.double(), ref.transpose(1, 2).reshape(2, -1, 4, 4), rtol=0, atol=1e-4)


# ------------------------------------------------------------------ keys, stage, configs
GLA = {"MODEL.SPARSECLIP.PROXY.NAME": DINO, "MODEL.SPARSECLIP.PROXY.GLA.ENABLED": "True",
       "MODEL.SPARSECLIP.BLOCK.RESIDUAL": "False", "MODEL.SPARSECLIP.BLOCK.FFN": "False",
       "TEST.SLIDING_WINDOW.ENABLED": "True", "TEST.SLIDING_WINDOW.CROP_SIZE": "32",
       "TEST.SLIDING_WINDOW.STRIDE": "16", "TEST.SLIDING_WINDOW.BATCH_SIZE": "1"}


def _model(**opts):
    from detectron2.modeling import build_model

    return build_model(tiny_cfg(**opts))


@pytest.mark.parametrize("opts, match", [
    ({"MODEL.SPARSECLIP.PROXY.GLA.THRESHOLD": "0.6"}, r"PROXY\.GLA\.THRESHOLD = 0\.6 changes nothing"),
    (dict(GLA, **{"MODEL.SPARSECLIP.PROXY.GLA.THRESHOLD": "1.5"}), r"GLA\.THRESHOLD = 1\.5 is invalid"),
    (dict(GLA, **{"MODEL.SPARSECLIP.PROXY.GLA.ITERATIONS": "-1"}), r"GLA\.ITERATIONS = -1 is invalid"),
    (dict(GLA, **{"MODEL.SPARSECLIP.PROXY.GLA.PRECISION": "bf16"}),
     r"GLA\.PRECISION = 'bf16' is invalid; valid: fp32, fp16"),
    (dict(GLA, **{"MODEL.SPARSECLIP.PROXY.GLA.BLOCK_ROWS": "0"}), r"GLA\.BLOCK_ROWS = 0 is invalid"),
    (dict(GLA, **{"TEST.SLIDING_WINDOW.ENABLED": "False"}), r"SLIDING_WINDOW\.ENABLED = False is invalid"),
    (dict(GLA, **{"MODEL.SPARSECLIP.PROXY.BETA": "1.0"}), r"PROXY\.BETA = 1\.0 changes nothing with .*GLA\.ENABLED"),
    (dict(GLA, **{"MODEL.SPARSECLIP.PROXY.FSA.ENABLED": "True"}), r"two different last blocks"),
    (dict(GLA, **{"MODEL.SPARSECLIP.PATCH_REMAINDER": "truncate"}), r"PATCH_REMAINDER = 'truncate'"),
])
def test_bad_keys_are_refused_before_any_model_is_built(opts, match, monkeypatch):
    import sparseclip_d2.modeling.backbone as mb

    def no_build(cfg):
        raise AssertionError("a model was built before the keys were checked")

    monkeypatch.setattr(mb, "build_clip_from_config", no_build)
    with pytest.raises(ValueError, match=match):
        _model(**opts)


def test_the_stage_gives_the_encoder_every_window_of_the_image_at_once():
    """40 x 56 image, crop 32 / stride 16: 2 x 3 windows in ONE encoder call (BATCH_SIZE 1 notwithstanding);
    the keys take effect on the built encoder."""
    m = _model(**dict(GLA, **{"MODEL.SPARSECLIP.PROXY.GLA.THRESHOLD": "0.4", "MODEL.SPARSECLIP.PROXY.GLA.PRECISION":
                              "fp32", "MODEL.SPARSECLIP.PROXY.GLA.GAMMA_ALPHA": "5.0"}))
    enc = m.encoder
    assert isinstance(enc, WindowSetEncoder) and m.stage("window_set") is not None
    assert (enc.settings.threshold, enc.settings.gamma_alpha, enc.settings.iterations) == (0.4, 5.0, 2)
    calls = []
    real = enc.forward_pass

    def spy(images, *a, **k):
        calls.append(images.shape[0])
        return real(images, *a, **k)
    enc.forward_pass = spy
    out = m([{"image": torch.randint(0, 255, (3, 40, 56), dtype=torch.uint8), "vocabulary": ["a", "b", "c"]}])
    assert out[0]["sem_seg"].shape == (3, 40, 56)
    assert calls == [6]


def test_gla_clip_configs_select_upstreams_values():
    """configs/baselines/gla_clip_b16*.yaml: eight datasets, predict.sh's values, accepted by the checks."""
    import glob
    import os

    from sparseclip_d2.methods import plan_from_config
    from sparseclip_d2.methods.encoders import check_proxy_config

    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "baselines")
    files = sorted(glob.glob(os.path.join(root, "gla_clip_b16*.yaml")))
    assert len(files) == 8
    seen = {}
    for f in files:
        cfg = baseline_cfg(f)
        g = cfg.MODEL.SPARSECLIP.PROXY.GLA
        assert (g.ENABLED, g.THRESHOLD, g.ITERATIONS, g.BETA_ALPHA, g.GAMMA_ALPHA, g.PRECISION) == (
            True, 0.55, 2, 0.3, 30.0, "fp32")
        sw = cfg.TEST.SLIDING_WINDOW
        assert (sw.CROP_SIZE, sw.STRIDE, cfg.MODEL.SPARSECLIP.LOGIT_SCALE) == (224, 112, 40.0)
        check_proxy_config(cfg)
        assert [n for n, _ in plan_from_config(cfg).stages] == ["window_set"]
        seen[cfg.DATASETS.TEST[0]] = (cfg.MODEL.SPARSECLIP.PROB_THRESHOLD, cfg.INPUT.MIN_SIZE_TEST)
    assert seen == {"sparseclip_voc21_val": (0.1, 336), "sparseclip_context60_val": (0.1, 336),
                    "sparseclip_coco_object_val": (0.1, 336), "sparseclip_voc20_val": (0.0, 336),
                    "sparseclip_context59_val": (0.0, 336), "sparseclip_coco_stuff_val": (0.0, 336),
                    "sparseclip_ade20k_val": (0.0, 336), "sparseclip_cityscapes_val": (0.0, 560)}


def test_upstreams_fp16_runs_through_the_meta_arch():
    """PROXY.GLA.PRECISION fp16 with the towers in fp16 (upstream's precision='fp16', vfm.half()):
    the window-set maths in half, finite scores of the right shape, the fp32 model's labels (the same
    random weights, fp16-rounded) on most pixels."""
    x = [{"image": torch.randint(0, 255, (3, 40, 56), dtype=torch.uint8, generator=torch.Generator().manual_seed(1)),
          "vocabulary": ["a", "b", "c"]}]
    outs = {}
    for p in ("fp32", "fp16"):
        torch.manual_seed(0)  # the same random towers
        m = _model(**dict(GLA, **{"MODEL.SPARSECLIP.PROXY.GLA.PRECISION": p, "MODEL.SPARSECLIP.CLIP.PRECISION": p,
                                  "MODEL.SPARSECLIP.PROXY.PRECISION": p}))
        assert m.encoder.settings.precision == p
        outs[p] = m(x)[0]["sem_seg"]
    assert outs["fp16"].shape == (3, 40, 56) and bool(torch.isfinite(outs["fp16"]).all())
    assert float((outs["fp16"].argmax(0) == outs["fp32"].argmax(0)).float().mean()) > 0.9


def test_agreement_driver_row_figures_by_hand():
    """tools/agreement_gla_clip.py ``compare_maps``: agreement, differing pixels, upstream's classes, its
    pixels under the threshold (the threshold stage's activity) and the margins (top-2 gap, and with a
    threshold the distance of the top probability from it), on a 2 x 3 map written out by hand."""
    import importlib.util
    import os

    import numpy as np

    path = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "tools", "agreement_gla_clip.py")
    spec = importlib.util.spec_from_file_location("agreement_gla_clip_under_test", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    # 3 classes x 2 x 3 pixels; each pixel's (top, second): (.5, .3) (.4, .35) (.12, .1) (.6, .2) (.34, .33) (.7, .2)
    probs = np.array([[[0.5, 0.4, 0.12], [0.6, 0.33, 0.7]],
                      [[0.3, 0.35, 0.1], [0.2, 0.34, 0.2]],
                      [[0.2, 0.25, 0.09], [0.2, 0.33, 0.1]]], dtype=np.float64)
    ref = np.array([[0, 0, 0], [0, 1, 0]])
    got = np.array([[0, 1, 0], [0, 1, 2]])  # differs at (0, 1) and (1, 2)
    r0 = tool.compare_maps(got, ref, probs, 0.0)
    assert (r0["differ"], r0["classes"], r0["below"], r0["pixels"]) == (2, 2, 0, 6)
    assert r0["agree"] == pytest.approx(100 * 4 / 6)
    gaps = [0.2, 0.05, 0.02, 0.4, 0.01, 0.5]  # top - second per pixel, row-major
    assert r0["margin"] == pytest.approx(max(0.05, 0.5)) and r0["median_margin"] == pytest.approx(np.median(gaps))
    r1 = tool.compare_maps(got, ref, probs, 0.35)
    assert r1["below"] == 2  # the tops 0.12 and 0.34 are under 0.35
    # with the threshold: min(gap, |top - 0.35|) per pixel
    m = [min(0.2, 0.15), min(0.05, 0.05), min(0.02, 0.23), min(0.4, 0.25), min(0.01, 0.01), min(0.5, 0.35)]
    assert r1["margin"] == pytest.approx(max(m[1], m[5])) and r1["median_margin"] == pytest.approx(np.median(m))


def test_agreement_row_thresholds():
    """The upstream worker's and the driver's thresholds: the config's and 0, 0 alone, or those given."""
    from sparseclip_d2.methods.gla_clip.upstream import run_thresholds

    assert run_thresholds(0.1, {}) == [0.1, 0.0]
    assert run_thresholds(0.0, {}) == [0.0]
    assert run_thresholds(0.1, {"zero_only": True}) == [0.0]
    assert run_thresholds(0.1, {"zero_only": True, "thresholds": [0.05, 0.02, 0.05]}) == [0.05, 0.02]
