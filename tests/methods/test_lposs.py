"""LPOSS / LPOSS+ label propagation (sparseclip_d2/propagation/) against hand-written float64
computations: the kNN graph, the geometric and feature affinity, the normalisation, the
conjugate-gradient solve (against a dense numpy solve and scipy's cg), the Lab colour
conversion (known answers), the pixel graph, the joint propagation across windows, and the
whole META_ARCH path composed after an SCLIP last block with entmax (alpha 1.2) against a
float64 reference of that composition; then the config keys and their refusals."""
import math
import sys
import os

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from conftest import tiny_cfg  # noqa: E402
from test_mixing_and_taps import _tower64  # noqa: E402  (float64 reference of the tiny tower's blocks)

from sparseclip_d2.methods.lposs import LabelPropagationSettings, propagate_patches, propagate_pixels  # noqa: E402
from sparseclip_d2.propagation import (  # noqa: E402
    conjugate_gradient, knn_affinity, knn_search, normalized_affinity, patch_centres, pixel_affinity,
    propagation_operator, rgb_to_lab)

TINY_VFM = "sparseclip_tiny_mae"  # timm vit_base_patch16_224's architecture (DINO B/16's), width 64, depth 2


# ------------------------------------------------------------------ float64 references, written out
def _knn64(f, k):
    """Indices of the k largest inner products per row (float64 Gram matrix, stable sort)."""
    g = f.astype(np.float64) @ f.astype(np.float64).T
    return np.argsort(-g, axis=1, kind="stable")[:, :k], g


def _affinity64(f, centres, k, sigma, pw, gamma):
    n = f.shape[0]
    idx, g = _knn64(f, k)
    w = np.zeros((n, n))
    for i in range(n):
        for j in idx[i]:
            d = math.sqrt((centres[i, 0] - centres[j, 0]) ** 2 + (centres[i, 1] - centres[j, 1]) ** 2)
            w[i, j] = max(g[i, j], 0.0) ** gamma * math.exp(-sigma * d ** pw)
    return w + w.T


def _normalize64(w):
    w = w.copy()
    np.fill_diagonal(w, 0)
    s = w.sum(1)
    s[s == 0] = 1
    d = 1 / np.sqrt(s)
    return w * d[:, None] * d[None, :]


def _cg64(a, b, tol, maxiter):
    """Textbook conjugate gradient on one column (x0 = 0), stopping before a step when ||r|| < tol ||b||."""
    x = np.zeros_like(b)
    if not np.linalg.norm(b):
        return x  # scipy's cg: a zero right-hand side returns 0
    r = b.copy()
    p = None
    rho_old = None
    for _ in range(maxiter):
        if np.linalg.norm(r) < tol * np.linalg.norm(b):
            break
        rho = r @ r
        p = r.copy() if p is None else r + (rho / rho_old) * p
        q = a @ p
        step = rho / (p @ q)
        x = x + step * p
        r = r - step * q
        rho_old = rho
    return x


def _lp64(w, y, alpha, tol=1e-6, maxiter=10):
    a = np.eye(w.shape[0]) - alpha * _normalize64(w)
    return np.stack([_cg64(a, y[:, c], tol, maxiter) for c in range(y.shape[1])], 1)


# ------------------------------------------------------------------ the graph
def test_knn_search_is_exact_and_sorted():
    rng = np.random.default_rng(0)
    f = rng.standard_normal((40, 8)).astype(np.float32)
    f /= np.linalg.norm(f, axis=1, keepdims=True)
    sims, idx = knn_search(f, 7)
    ref, g = _knn64(f, 7)
    assert (idx == ref).all()
    np.testing.assert_allclose(sims, np.take_along_axis(g, ref, 1), atol=1e-6)
    assert (idx[:, 0] == np.arange(40)).all()  # each node is its own first neighbour
    with pytest.raises(ValueError, match="k = 41 is invalid for 40 nodes"):
        knn_search(f, 41)


def test_knn_affinity_and_normalisation_match_hand_loops():
    rng = np.random.default_rng(1)
    f = rng.standard_normal((12, 5)).astype(np.float32)
    f /= np.linalg.norm(f, axis=1, keepdims=True)
    centres = patch_centres([(0, 0), (0, 32)], [(2, 3), (2, 3)], [(16, 16), (16, 16)])
    assert centres[0].tolist() == [8, 8] and centres[4].tolist() == [24, 24] and centres[6].tolist() == [8, 40]
    w = knn_affinity(f, centres, k=4, sigma=0.01, pix_dist_pow=1.0, gamma=3.0)
    ref = _affinity64(f, centres, 4, 0.01, 1.0, 3.0)
    np.testing.assert_allclose(w.toarray(), ref, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(normalized_affinity(w).toarray(), _normalize64(ref), rtol=1e-5, atol=1e-7)
    # k above the number of nodes (a small image) is clipped to it (upstream fails on faiss's -1 index)
    np.testing.assert_array_equal(knn_affinity(f, centres, k=50, sigma=0.01, pix_dist_pow=1.0, gamma=3.0).toarray(),
                                  knn_affinity(f, centres, k=12, sigma=0.01, pix_dist_pow=1.0, gamma=3.0).toarray())
    # a node with no edge keeps degree 1 (upstream S[S == 0] = 1): its row and column stay 0
    w2 = sp.csr_matrix(np.array([[5.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 2.0]]))
    np.testing.assert_allclose(normalized_affinity(w2).toarray(), [[0, 1, 0], [1, 0, 0], [0, 0, 0]])


def test_conjugate_gradient_matches_dense_solve_and_scipy_column_by_column():
    rng = np.random.default_rng(2)
    n = 30
    a = rng.random((n, n)) * (rng.random((n, n)) < 0.3)
    wn = sp.csr_matrix(_normalize64(a + a.T))
    op = propagation_operator(wn, 0.95)
    lmat = np.eye(n) - 0.95 * wn.toarray()
    b = rng.standard_normal((n, 4))
    b[:, 2] = 0  # a zero right-hand side gives 0
    full = conjugate_gradient(op, b, tol=1e-12, maxiter=500)
    np.testing.assert_allclose(full, np.linalg.solve(lmat, b), atol=1e-9)
    np.testing.assert_allclose(conjugate_gradient(op, b, tol=1e-6, maxiter=10, columns_per_solve=3),
                               conjugate_gradient(op, b, tol=1e-6, maxiter=10), atol=1e-12)  # blocks of columns
    for maxiter in (1, 3, 10):
        ours = conjugate_gradient(op, b, tol=1e-6, maxiter=maxiter)
        for c in range(4):
            ref, _ = spla.cg(sp.csr_matrix(lmat), b[:, c], rtol=1e-6, maxiter=maxiter)
            np.testing.assert_allclose(ours[:, c], ref, atol=1e-12)
            np.testing.assert_allclose(ours[:, c], _cg64(lmat, b[:, c], 1e-6, maxiter), atol=1e-12)
    # a column that converges early stops (the others go on)
    b2 = np.stack([lmat[:, 0], b[:, 0]], 1)  # L e_0: CG finds e_0 up to the tolerance
    out = conjugate_gradient(op, b2, tol=1e-3, maxiter=50)
    np.testing.assert_allclose(out[:, 1], _cg64(lmat, b[:, 0], 1e-3, 50), atol=1e-12)


def test_rgb_to_lab_known_answers():
    # CIE Lab (D65) of the sRGB primaries and of white/black (e.g. Bruce Lindbloom's calculator:
    # red 53.24 / 80.09 / 67.20, green 87.73 / -86.18 / 83.18, blue 32.30 / 79.19 / -107.86)
    rgb = torch.tensor([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 1], [0, 0, 0]], dtype=torch.float64).T[:, None, :]
    lab = rgb_to_lab(rgb)[:, 0].T
    want = torch.tensor([[53.24, 80.09, 67.20], [87.73, -86.18, 83.18], [32.30, 79.19, -107.86],
                         [100.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(lab, want, atol=0.06, rtol=0)
    with pytest.raises(ValueError, match=r"\(3, H, W\)"):
        rgb_to_lab(torch.zeros(4, 2, 2))


def test_pixel_affinity_matches_hand_loops():
    g = torch.Generator().manual_seed(3)
    rgb = torch.rand(3, 4, 5, generator=g)
    lab = (rgb_to_lab(rgb.double()) / torch.tensor([100.0, 128.0, 128.0], dtype=torch.float64).view(3, 1, 1)).numpy()
    h, w = 4, 5
    for n in (1, 2):
        ref = np.zeros((h * w, h * w))
        for y in range(h):
            for x in range(w):
                for dy in range(-n, n + 1):
                    for dx in range(-n, n + 1):
                        yy, xx = y + dy, x + dx
                        if (dy, dx) != (0, 0) and 0 <= yy < h and 0 <= xx < w:
                            d = np.sqrt(((lab[:, y, x] - lab[:, yy, xx]) ** 2).sum())
                            ref[y * w + x, yy * w + xx] = np.exp(-d / 0.1)
        got = pixel_affinity(rgb, neighbourhood=n, tau=0.1)
        np.testing.assert_allclose(got.toarray(), ref, rtol=1e-4, atol=1e-7)
        assert got.nnz == int((ref > 0).sum())


def test_pixel_stage_matches_dense_reference():
    g = torch.Generator().manual_seed(4)
    rgb, logits = torch.rand(3, 5, 6, generator=g), torch.randn(3, 5, 6, generator=g)
    s = LabelPropagationSettings(kind="lposs_plus", radius=5, tau=0.2, alpha=0.9)
    w = pixel_affinity(rgb, neighbourhood=2, tau=0.2).toarray()
    ref = _lp64(w, logits.double().reshape(3, -1).T.numpy(), 0.9)
    out = propagate_pixels(logits, rgb, s)
    np.testing.assert_allclose(out.reshape(3, -1).T.numpy(), ref, rtol=1e-5, atol=1e-6)


def test_patch_stage_is_joint_across_windows_and_matches_dense_reference():
    g = torch.Generator().manual_seed(5)
    logits = [torch.randn(3, 2, 3, generator=g) for _ in range(2)]
    feats = [torch.randn(6, 2, 3, generator=g) for _ in range(2)]
    origins, cells = [(0, 0), (0, 16)], [(16, 16), (16, 16)]
    s = LabelPropagationSettings(k=5, sigma=0.02, gamma=2.0, alpha=0.9)
    out = propagate_patches(logits, feats, origins, cells, s)
    y = np.concatenate([l.double().flatten(1).T.numpy() for l in logits])
    f = np.concatenate([t.double().flatten(1).T.numpy() for t in feats])
    f /= np.linalg.norm(f, axis=1, keepdims=True)
    ref = _lp64(_affinity64(f, patch_centres(origins, [(2, 3)] * 2, cells), 5, 0.02, 1.0, 2.0), y, 0.9)
    np.testing.assert_allclose(torch.cat([o.flatten(1).T for o in out]).numpy(), ref, rtol=1e-5, atol=1e-6)
    # the second window's logits reach the first window's patches (one graph for all windows)
    moved = propagate_patches([logits[0], logits[1] + 5.0], feats, origins, cells, s)
    assert (moved[0] - out[0]).abs().max() > 1e-3


# ------------------------------------------------------------------ through the META_ARCH
def _lp_model(**opts):
    from detectron2.modeling import build_model

    base = {"MODEL.SPARSECLIP.LABEL_PROPAGATION.KIND": "lposs",
            "MODEL.SPARSECLIP.LABEL_PROPAGATION.VFM.NAME": TINY_VFM,
            "MODEL.SPARSECLIP.LABEL_PROPAGATION.VFM.WEIGHTS": "none",
            "MODEL.SPARSECLIP.LABEL_PROPAGATION.K": "6", "MODEL.SPARSECLIP.LABEL_PROPAGATION.SIGMA": "0.02",
            "MODEL.SPARSECLIP.PATCH_REMAINDER": "pad_corner",
            "TEST.SLIDING_WINDOW.ENABLED": "True", "TEST.SLIDING_WINDOW.CROP_SIZE": "64",
            "TEST.SLIDING_WINDOW.STRIDE": "32", "TEST.SLIDING_WINDOW.BATCH_SIZE": "2"}
    base.update(opts)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return build_model(tiny_cfg(**base))


def test_lposs_after_sclip_with_entmax_matches_float64_reference():
    """SCLIP's last block (qq + kk) with entmax alpha 1.2, then LPOSS: the META_ARCH's propagated
    logits against the float64 tower, the float64 graph and CG, and the window merge by hand."""
    m = _lp_model(**{"MODEL.SPARSECLIP.ATTENTION.SOURCE": "qq+kk", "MODEL.SPARSECLIP.ATTENTION.NORMALIZER": "entmax",
                     "MODEL.SPARSECLIP.ATTENTION.ALPHA": "1.2", "MODEL.SPARSECLIP.LOGIT_SCALE": "40.0"})
    g = torch.Generator().manual_seed(6)
    raw = torch.randint(0, 256, (3, 64, 128), dtype=torch.uint8, generator=g)
    text = F.normalize(torch.randn(4, m.encoder.embed_dim, generator=g), dim=-1)
    image = m.normalize_image(raw)
    with torch.no_grad():
        ours = m.working_logits(m.image_inputs_for(raw, text))[0]
        windows = [(0, 64, 0, 64), (0, 64, 32, 96), (0, 64, 64, 128)]
        crops = torch.stack([image[:, y1:y2, x1:x2] for (y1, y2, x1, x2) in windows])
        feats64, _ = _tower64(m.clip_model.visual, crops, source="qq+kk", mix_layers=(), mix_source="qk",
                              mix_weight=0.0, mix_scale=1.0, residual=True, ffn=True, alpha=1.2)
        logits64 = 40.0 * torch.einsum("ndhw,sd->nshw", F.normalize(feats64, dim=1), text.double())
        vfm = m.stage("label_propagation").propagation.vfm_features(crops, 64)  # the proxy backbone (tests/methods/test_proxyclip.py)
    y = logits64.flatten(2).permute(0, 2, 1).reshape(-1, 4).numpy()
    f = vfm.double().flatten(2).permute(0, 2, 1).reshape(-1, vfm.shape[1]).numpy()
    f /= np.linalg.norm(f, axis=1, keepdims=True)
    centres = np.array([(8 + 16 * i, x1 + 8 + 16 * j) for (_, _, x1, _) in windows for i in range(4) for j in range(4)],
                       dtype=np.float64)
    lp = torch.from_numpy(_lp64(_affinity64(f, centres, 6, 0.02, 1.0, 3.0), y, 0.95)).T.reshape(4, 3, 4, 4)
    full, count = torch.zeros(4, 64, 128, dtype=torch.float64), torch.zeros(1, 64, 128, dtype=torch.float64)
    for n, (y1, y2, x1, x2) in enumerate(windows):
        full[:, y1:y2, x1:x2] += F.interpolate(lp[:, n][None], size=(64, 64), mode="bilinear", align_corners=False)[0]
        count[:, y1:y2, x1:x2] += 1
    ref = full / count
    assert ours.shape == (4, 64, 128) and ours.dtype == torch.float32
    torch.testing.assert_close(ours.double(), ref, atol=2e-4 * float(ref.abs().max()), rtol=0)
    # and the output of forward is these logits' class scores
    out = m([{"image": raw, "vocabulary": ["a", "b", "c", "d"]}])[0]["sem_seg"]
    assert out.shape == (4, 64, 128) and torch.isfinite(out).all()


def test_lposs_plus_is_the_pixel_stage_after_lposs():
    g = torch.Generator().manual_seed(7)
    raw = torch.randint(0, 256, (3, 64, 96), dtype=torch.uint8, generator=g)
    plain = _lp_model()
    plus = _lp_model(**{"MODEL.SPARSECLIP.LABEL_PROPAGATION.KIND": "lposs_plus",
                        "MODEL.SPARSECLIP.LABEL_PROPAGATION.RADIUS": "5", "MODEL.SPARSECLIP.LABEL_PROPAGATION.TAU": "0.1"})
    text = F.normalize(torch.randn(3, plain.encoder.embed_dim, generator=g), dim=-1)
    with torch.no_grad():
        a = plain.working_logits(plain.image_inputs_for(raw, text))[0]
        b = plus.working_logits(plus.image_inputs_for(raw, text))[0]
    want = propagate_pixels(a, raw.double() / 255.0, plus.stage("label_propagation").propagation.settings)
    torch.testing.assert_close(b, want, atol=1e-5, rtol=1e-5)
    assert (a - b).abs().max() > 1e-4


@pytest.mark.parametrize("rule", ["after_resize", "before_resize"])
def test_label_map_reduces_synonyms_where_reduce_synonyms_says(rule):
    """The label map of score_maps against float64 by hand from the propagated logits: "before_resize"
    (LPOSS's order) takes the max over each class's synonyms at the working resolution, then the
    bilinear resize (half-pixel centres, written out) to the output size; "after_resize" resizes the
    synonyms first. Both against the same propagated logits; the two orders differ on some pixels."""
    m = _lp_model(**{"MODEL.SPARSECLIP.LABEL_PROPAGATION.REDUCE_SYNONYMS": rule})
    g = torch.Generator().manual_seed(12)  # a draw on which the two orders differ (on 6 pixels)
    raw = torch.randint(0, 256, (3, 64, 128), dtype=torch.uint8, generator=g)
    text = F.normalize(torch.randn(7, m.encoder.embed_dim, generator=g), dim=-1)  # 7 synonyms of 4 classes
    class_of = [0, 0, 0, 1, 2, 2, 3]
    m.text_classifier_for = lambda vocabulary, templates=None, background_index=None: (text, torch.tensor(class_of))
    out_h, out_w = 41, 97
    x = {"image": raw, "vocabulary": ["a, b, c", "d", "e, f", "g"], "height": out_h, "width": out_w}
    with torch.no_grad():
        y = m.working_logits(m.image_inputs_for(raw, text))[0].double().numpy()  # (7, 64, 128), each synonym its own row
        labels = m.score_maps(x).labels().numpy()

    def resize64(a):  # bilinear, align_corners False: src = (dst + 0.5) * in / out - 0.5, clamped at 0
        c, h, w = a.shape
        out = np.zeros((c, out_h, out_w))
        for i in range(out_h):
            sy = max((i + 0.5) * h / out_h - 0.5, 0.0)
            y0 = min(int(math.floor(sy)), h - 1)
            y1, ly = min(y0 + 1, h - 1), sy - y0
            for j in range(out_w):
                sx = max((j + 0.5) * w / out_w - 0.5, 0.0)
                x0 = min(int(math.floor(sx)), w - 1)
                x1, lx = min(x0 + 1, w - 1), sx - x0
                out[:, i, j] = ((1 - ly) * ((1 - lx) * a[:, y0, x0] + lx * a[:, y0, x1])
                                + ly * ((1 - lx) * a[:, y1, x0] + lx * a[:, y1, x1]))
        return out

    def class_max(a):
        return np.stack([np.max(a[[s for s, c in enumerate(class_of) if c == k]], axis=0) for k in range(4)])

    before = resize64(class_max(y)).argmax(0)
    after = class_max(resize64(y)).argmax(0)
    assert (before != after).any()  # the orders differ here, so the test tells them apart
    want = before if rule == "before_resize" else after
    assert labels.shape == (out_h, out_w)
    np.testing.assert_array_equal(labels, want)


# ------------------------------------------------------------------ config keys
LP_KEYS = {  # key -> (value, settings field, expected)
    "MODEL.SPARSECLIP.LABEL_PROPAGATION.K": ("7", "k", 7),
    "MODEL.SPARSECLIP.LABEL_PROPAGATION.SIGMA": ("0.05", "sigma", 0.05),
    "MODEL.SPARSECLIP.LABEL_PROPAGATION.PIX_DIST_POW": ("2.0", "pix_dist_pow", 2.0),
    "MODEL.SPARSECLIP.LABEL_PROPAGATION.GAMMA": ("2.0", "gamma", 2.0),
    "MODEL.SPARSECLIP.LABEL_PROPAGATION.ALPHA": ("0.9", "alpha", 0.9),
    "MODEL.SPARSECLIP.LABEL_PROPAGATION.TOL": ("1.0e-4", "tol", 1e-4),
    "MODEL.SPARSECLIP.LABEL_PROPAGATION.MAX_ITER": ("5", "max_iter", 5),
    "MODEL.SPARSECLIP.LABEL_PROPAGATION.TAU": ("0.2", "tau", 0.2),
    "MODEL.SPARSECLIP.LABEL_PROPAGATION.RADIUS": ("7", "radius", 7),
    "MODEL.SPARSECLIP.LABEL_PROPAGATION.REDUCE_SYNONYMS": ("before_resize", "reduce_synonyms", "before_resize"),
}


def test_label_propagation_keys_reach_the_model():
    m = _lp_model(**{k: v for k, (v, _, _) in LP_KEYS.items()}, **{
        "MODEL.SPARSECLIP.LABEL_PROPAGATION.KIND": "lposs_plus", "MODEL.SPARSECLIP.LABEL_PROPAGATION.VFM.LAYER": "0",
        "MODEL.SPARSECLIP.LABEL_PROPAGATION.VFM.FEATURE": "keys"})
    s = m.stage("label_propagation").propagation.settings
    assert s.kind == "lposs_plus" and s.stages == ("patch_knn", "pixel_lab")
    for key, (value, field, want) in LP_KEYS.items():
        assert getattr(s, field) == want, key
    assert m.stage("label_propagation").propagation.vfm.name == TINY_VFM and m.stage("label_propagation").propagation.vfm.layer == 0
    assert m.stage("label_propagation").propagation.vfm.feature == "keys"
    assert m.stage("label_propagation").propagation.describe() == f"then LPOSS+ (k 7, {TINY_VFM} keys)"
    from detectron2.modeling import build_model

    assert build_model(tiny_cfg()).stage("label_propagation") is None


@pytest.mark.parametrize("opts, error, match", [
    ({"MODEL.SPARSECLIP.LABEL_PROPAGATION.KIND": "lpos"}, ValueError,
     r"LABEL_PROPAGATION\.KIND = 'lpos' is invalid; valid: '' \(off\), lposs, lposs_plus"),
    ({"MODEL.SPARSECLIP.LABEL_PROPAGATION.K": "0"}, ValueError, r"LABEL_PROPAGATION\.K = 0 is invalid"),
    ({"MODEL.SPARSECLIP.LABEL_PROPAGATION.ALPHA": "1.0"}, ValueError, r"ALPHA = 1\.0 is invalid; valid: a number in \[0, 1\)"),
    ({"MODEL.SPARSECLIP.LABEL_PROPAGATION.RADIUS": "2"}, ValueError, r"RADIUS = 2 is invalid"),
    ({"MODEL.SPARSECLIP.LABEL_PROPAGATION.VFM.NAME": ""}, ValueError, r"VFM\.NAME is empty"),
    ({"MODEL.SPARSECLIP.LABEL_PROPAGATION.REDUCE_SYNONYMS": "before"}, ValueError,
     r"LABEL_PROPAGATION\.REDUCE_SYNONYMS = 'before' is invalid; valid: after_resize, before_resize"),
    ({"MODEL.SPARSECLIP.LABEL_PROPAGATION.VFM.FEATURE": "attention"}, ValueError,
     r"LABEL_PROPAGATION\.VFM\.FEATURE = 'attention' is invalid; valid: tokens, keys, queries, values"),
    ({"MODEL.SPARSECLIP.LABEL_PROPAGATION.VFM.WEIGHTS": "/nonexistent/dino.pth"}, FileNotFoundError,
     r"LABEL_PROPAGATION\.VFM\.WEIGHTS = '/nonexistent/dino\.pth': no such file"),
    ({"MODEL.SPARSECLIP.PAMR.STEPS": "10"}, ValueError, r"LABEL_PROPAGATION\.KIND cannot be combined with MODEL\.SPARSECLIP\.PAMR\.STEPS"),
    ({"MODEL.SPARSECLIP.CLUSTER_VOTE.ENABLED": "True", "TEST.SLIDING_WINDOW.ENABLED": "False"}, ValueError,
     r"cannot be combined with MODEL\.SPARSECLIP\.CLUSTER_VOTE\.ENABLED"),
    ({"MODEL.SPARSECLIP.LABEL_PROPAGATION.KIND": "", "MODEL.SPARSECLIP.LABEL_PROPAGATION.K": "5"}, ValueError,
     r"LABEL_PROPAGATION\.K = 5, .* changes nothing while MODEL\.SPARSECLIP\.LABEL_PROPAGATION\.KIND is ''"),
])
def test_bad_label_propagation_keys_are_refused_before_any_model_is_built(opts, error, match, monkeypatch):
    from sparseclip_d2.config import check_sparseclip_config
    from sparseclip_d2.proxy import second_backbone

    base = {"MODEL.SPARSECLIP.LABEL_PROPAGATION.KIND": "lposs", "MODEL.SPARSECLIP.LABEL_PROPAGATION.VFM.NAME": TINY_VFM,
            "MODEL.SPARSECLIP.LABEL_PROPAGATION.VFM.WEIGHTS": "none"}
    base.update(opts)
    monkeypatch.setattr(second_backbone, "build_proxy", lambda *a, **k: pytest.fail("a VFM was built"))
    with pytest.raises(error, match=match):
        check_sparseclip_config(tiny_cfg(**base))


def test_lposs_configs_carry_upstreams_values():
    from conftest import baseline_cfg

    for name in ("lposs_b16", "lposs_plus_b16_voc21"):
        cfg = baseline_cfg(name)
        lp = cfg.MODEL.SPARSECLIP.LABEL_PROPAGATION
        assert (lp.K, lp.SIGMA, lp.PIX_DIST_POW, lp.GAMMA, lp.ALPHA, lp.TOL, lp.MAX_ITER, lp.TAU, lp.RADIUS) == (
            400, 0.01, 1.0, 3.0, 0.95, 1e-6, 10, 0.01, 13)  # LPOSS configs/lposs.yaml, lposs_eval.py dfs_search
        assert (lp.VFM.NAME, lp.VFM.FEATURE, lp.VFM.LAYER) == ("vit_base_patch16_224.dino", "values", -1)
        sw = cfg.TEST.SLIDING_WINDOW
        assert (sw.ENABLED, sw.CROP_SIZE, sw.STRIDE, cfg.INPUT.MIN_SIZE_TEST) == (True, 224, 112, 448)
        assert cfg.MODEL.SPARSECLIP.CLIP.PRETRAINED == "laion2b_s34b_b88k" and cfg.MODEL.SPARSECLIP.LOGIT_SCALE == 1.0
        assert lp.REDUCE_SYNONYMS == "before_resize"  # lposs_eval.py: reduce_to_true_classes, then resize
    assert baseline_cfg("lposs_b16").MODEL.SPARSECLIP.LABEL_PROPAGATION.KIND == "lposs"
    assert baseline_cfg("lposs_plus_b16_voc21").MODEL.SPARSECLIP.LABEL_PROPAGATION.KIND == "lposs_plus"


def test_lposs_after_object_presence_uses_each_images_own_embedding():
    """LPOSS after CASS's object-presence prompt (GLOBAL image): every window of an image gets that
    image's embedding, so an image's propagated logits do not depend on the image before it."""
    m = _lp_model(**{"MODEL.SPARSECLIP.OBJECT_PRESENCE.ENABLED": "True",
                     "MODEL.SPARSECLIP.OBJECT_PRESENCE.GLOBAL_WEIGHT": "0.4"})
    g = torch.Generator().manual_seed(8)
    a, b = (torch.randint(0, 256, (3, 64, 128), dtype=torch.uint8, generator=g) for _ in range(2))
    text = F.normalize(torch.randn(4, m.encoder.embed_dim, generator=g), dim=-1)
    with torch.no_grad():
        alone = m.working_logits(m.image_inputs_for(b, text))[0]
        m.working_logits(m.image_inputs_for(a, text))[0]
        after_a = m.working_logits(m.image_inputs_for(b, text))[0]
    torch.testing.assert_close(after_a, alone, rtol=0, atol=0)
