"""PEARL's parts against float64 hand computations: the Procrustes rotation (Newton-Schulz steps and
the SVD against numpy's polar factor), the ``procrustes`` score source on a non-square grid through
the tiny tower's last block with entmax, the text-aware Laplacian propagation against a dense
float64 solve, its stage in the pipeline, the preset and the configs."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sparseclip_d2.attention import attention_weights, polar_factor, procrustes_scores
from sparseclip_d2.clip.spec import PRESETS, AttentionSpec, ProcrustesOptions, parse_attention_spec
from sparseclip_d2.methods.pearl import TLPSettings, text_affinity, text_laplacian_propagation

from conftest import baseline_cfg, build_tiny_clip, tiny_cfg


# ------------------------------------------------------------------------------ the rotation
def _np_polar(M):
    U, _, Vt = np.linalg.svd(M)
    return U @ Vt


def _np_newton_schulz(M, steps, eps=1e-6):
    """pearl/attn.py _polar_unitary_newton_schulz written out in numpy float64."""
    eye = np.eye(M.shape[0])
    A = M.T @ M
    n = max(np.sqrt((A * A).sum()), eps)
    Y, Z = A / n + eps * eye, eye.copy()
    for _ in range(steps):
        T = 0.5 * (3.0 * eye - Z @ Y)
        Y, Z = Y @ T, T @ Z
    return M @ (Z / np.sqrt(n))


def test_svd_solver_is_numpys_polar_factor():
    rng = np.random.default_rng(0)
    M = rng.standard_normal((3, 6, 6))
    R = polar_factor(torch.from_numpy(M), "svd").numpy()
    for b in range(3):
        np.testing.assert_allclose(R[b], _np_polar(M[b]), atol=1e-12)
        np.testing.assert_allclose(R[b].T @ R[b], np.eye(6), atol=1e-12)


def test_newton_schulz_steps_are_upstreams_and_converge_to_the_polar_factor():
    rng = np.random.default_rng(1)
    M = rng.standard_normal((2, 5, 5))
    for steps in (1, 5):
        R = polar_factor(torch.from_numpy(M), "newton_schulz", steps).numpy()
        for b in range(2):
            np.testing.assert_allclose(R[b], _np_newton_schulz(M[b], steps), atol=1e-12)
    # five steps leave a badly conditioned M far from orthogonal (upstream's behaviour) ...
    R5 = polar_factor(torch.from_numpy(M), "newton_schulz", 5).numpy()
    assert np.abs(R5[0] - _np_polar(M[0])).max() > 1e-3
    # ... a well conditioned one (singular values in [0.5, 1]) converges to numpy's polar factor
    Q1, _ = np.linalg.qr(rng.standard_normal((5, 5)))
    Q2, _ = np.linalg.qr(rng.standard_normal((5, 5)))
    W = Q1 @ np.diag([1.0, 0.9, 0.8, 0.6, 0.5]) @ Q2
    R = polar_factor(torch.from_numpy(W)[None], "newton_schulz", 30).numpy()[0]
    np.testing.assert_allclose(R, Q1 @ Q2, atol=1e-5)  # eps I in A/||A|| + eps I bounds the accuracy
    with pytest.raises(ValueError, match="unknown procrustes solver 'qr'; valid: newton_schulz, svd"):
        polar_factor(torch.from_numpy(W), "qr")


def _np_scores(q, k, kk_weight, solver, steps, prefix):
    """pa_attn's logits written out in numpy float64 for one head: q, k (L, d)."""
    d = q.shape[1]
    w = np.linalg.norm(q, axis=1)
    w[:prefix] = 0.0
    w = w / (w.sum() + 1e-6)
    qc, kc = q - (w[:, None] * q).sum(0), k - (w[:, None] * k).sum(0)
    M = kc.T @ qc
    R = _np_polar(M) if solver == "svd" else _np_newton_schulz(M, steps)
    return q @ (k @ R).T / np.sqrt(d) + kk_weight * (kc @ kc.T) / np.sqrt(d)


def _np_entmax(z, alpha, iters=200):
    """alpha-entmax of one row by bisection on the threshold (float64)."""
    r = 1.0 / (alpha - 1.0)
    x = (alpha - 1.0) * z
    lo, hi = x.max() - 1.0, x.max()
    for _ in range(iters):
        t = 0.5 * (lo + hi)
        s = (np.clip(x - t, 0, None) ** r).sum()
        lo, hi = (t, hi) if s > 1 else (lo, t)
    p = np.clip(x - 0.5 * (lo + hi), 0, None) ** r
    return p / p.sum()


@pytest.mark.parametrize("solver", ["newton_schulz", "svd"])
def test_procrustes_source_matches_hand_scores(solver):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 4, generator=g, dtype=torch.float64) for _ in range(3))
    got = procrustes_scores(q, k, kk_weight=0.3, solver=solver, iterations=5, prefix_tokens=1)
    for b in range(2):
        for h in range(3):
            ref = _np_scores(q[b, h].numpy(), k[b, h].numpy(), 0.3, solver, 5, 1)
            np.testing.assert_allclose(got[b, h].numpy(), ref, atol=1e-10)
    # the registered source is the same, in float32, with its options passed by attention_weights
    w = attention_weights(q, k, v, source="procrustes", source_options={"procrustes": dict(
        kk_weight=0.3, solver=solver, iterations=5, prefix_tokens=1)})
    torch.testing.assert_close(w, torch.softmax(got, -1).float(), atol=1e-6, rtol=0)
    # the options take effect: another kk weight, no prefix token
    other = attention_weights(q, k, v, source="procrustes", source_options={"procrustes": dict(
        kk_weight=0.0, solver=solver, iterations=5, prefix_tokens=0)})
    assert (other - w).abs().max() > 1e-3


def test_preset_last_block_on_a_non_square_grid_with_entmax_matches_hand_computation():
    """The tiny tower's last block with the pearl preset under entmax 1.5 on a 3 x 5 patch grid:
    its weights equal the float64 hand scores (CLS weighted 0) through a bisection entmax, and its
    output (no residual, no FFN) equals out_proj(weights @ v)."""
    from sparseclip_d2.clip.encoder import DenseCLIPEncoder

    model = build_tiny_clip()
    spec = AttentionSpec.preset("pearl", normalizer="entmax", alpha=1.5, procrustes_kk_weight=0.3)
    enc = DenseCLIPEncoder(model.visual, spec)
    images = torch.randn(1, 3, 48, 80, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        p = enc.forward_pass(images, tap_layers=(enc.depth - 1,))
        q, k, v = enc.block_qkv(-1, p.taps[enc.depth - 1], p.grid)
    assert p.grid == (3, 5) and q.shape[2] == 16
    heads = q.shape[1]
    ref = np.stack([np.stack([_np_entmax(row, 1.5) for row in _np_scores(
        q[0, h].double().numpy(), k[0, h].double().numpy(), 0.3, "newton_schulz", 5, 1)]) for h in range(heads)])
    np.testing.assert_allclose(p.attn[0].double().numpy(), ref, atol=2e-5)
    assert (p.attn == 0).any(), "entmax 1.5 should give exact zeros here"
    # the spec's options reach the block: the default kk weight 0.08 gives other weights
    enc2 = DenseCLIPEncoder(model.visual, AttentionSpec.preset("pearl", normalizer="entmax", alpha=1.5))
    with torch.no_grad():
        assert (enc2.forward_pass(images).attn - p.attn).abs().max() > 1e-4


@pytest.mark.parametrize("normalizer", ["softmax", "entmax", "sparsemax", "random_matched", "top_p"])
def test_procrustes_composes_with_every_normaliser(normalizer):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 9, 4, generator=g) for _ in range(3))
    opts = {"procrustes": dict(kk_weight=0.08, solver="newton_schulz", iterations=5, prefix_tokens=1)}
    w = attention_weights(q, k, v, source="procrustes", normalizer=normalizer, alpha=1.5, source_options=opts)
    s = procrustes_scores(q, k, **opts["procrustes"])
    from sparseclip_d2.attention import get_normalizer

    ref = get_normalizer(normalizer)(s, alpha=1.5, generator=torch.Generator().manual_seed(0))
    if normalizer != "random_matched":
        torch.testing.assert_close(w, ref.float(), atol=1e-6, rtol=0)
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 2, 9), atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------ the spec
def test_preset_and_configs_are_upstreams():
    spec = PRESETS["pearl"]
    assert (spec.source, spec.normalizer, spec.residual, spec.ffn) == ("procrustes", "softmax", False, False)
    assert spec.procrustes == ProcrustesOptions(kk_weight=0.08, solver="newton_schulz", iterations=5)
    assert spec.source_options(1) == {"procrustes": dict(kk_weight=0.08, solver="newton_schulz", iterations=5,
                                                         prefix_tokens=1)}
    assert AttentionSpec.from_config(baseline_cfg("pearl_b16")) == spec
    for name, kk in (("pearl_b16_cityscapes", 0.3), ("pearl_b16_ade20k", 0.3), ("pearl_b16_voc21", 0.08)):
        assert AttentionSpec.from_config(baseline_cfg(name)) == spec.replace(procrustes_kk_weight=kk), name
    city = baseline_cfg("pearl_b16_cityscapes")
    assert (city.MODEL.SPARSECLIP.TLP.GRID, city.INPUT.MIN_SIZE_TEST) == (224, 560)
    assert baseline_cfg("pearl_b16_voc21").MODEL.SPARSECLIP.TLP.ENABLED
    assert not baseline_cfg("pearl_b16_voc21_no_tlp").MODEL.SPARSECLIP.TLP.ENABLED


def test_procrustes_options_are_checked_and_inert_ones_named():
    with pytest.raises(ValueError, match=r"unknown procrustes_solver \(MODEL.SPARSECLIP.ATTENTION.PROCRUSTES.SOLVER\) "
                                         r"'qr'; valid: newton_schulz, svd"):
        AttentionSpec.from_settings(source="procrustes", procrustes_solver="qr")
    with pytest.raises(ValueError, match=r"procrustes_iterations .*ITERATIONS\) must be an integer >= 1, got 0"):
        AttentionSpec.from_settings(source="procrustes", procrustes_iterations=0)
    with pytest.raises(ValueError, match=r"procrustes_kk_weight .*KK_WEIGHT\) must be a finite number, got nan"):
        AttentionSpec.from_settings(source="procrustes", procrustes_kk_weight=float("nan"))
    with pytest.raises(ValueError, match="procrustes_kk_weight=0.3 changes nothing without the procrustes source"):
        parse_attention_spec("qq:procrustes_kk_weight=0.3")
    with pytest.raises(ValueError, match="procrustes_iterations=3 changes nothing with procrustes_solver 'svd'"):
        parse_attention_spec("pearl:procrustes_solver=svd:procrustes_iterations=3")
    spec = parse_attention_spec("pearl:entmax:1.3:procrustes_solver=svd")
    assert (spec.normalizer, spec.alpha, spec.procrustes.solver) == ("entmax", 1.3, "svd")
    # a tapped layer's source can be procrustes too: its options are then read
    mixed = AttentionSpec.from_settings(source="qk", mix_layers=(0,), mix_source="procrustes", procrustes_kk_weight=0.3)
    assert mixed.inert_settings() == [] and mixed.source_options(1)["procrustes"]["kk_weight"] == 0.3


# ------------------------------------------------------------------------------ TLP
def _np_tlp(image, logits, S, s, cg_steps=None):
    """pearl/prop.py TLP written out in numpy float64 for B = 1 without pooling: the weights by
    loops over the pixel pairs, the dense (diag(Cw) + tau L) matrix, then np.linalg.solve per class,
    or ``cg_steps`` conjugate-gradient steps over all classes at once from the logits (with
    upstream's 1e-12 guards)."""
    C, H, W = logits.shape
    e = np.exp(logits - logits.max(0))
    p = e / e.sum(0)
    conf = p.max(0)
    d = np.diag(S)  # einsum('cc,...'): the diagonal only
    agree = np.clip((d[:, None, None] * p * p).sum(0), 0, 1)
    Cw = np.maximum(conf, 0.05) ** 2 * (1 + agree)
    gray = 0.299 * image[0] + 0.587 * image[1] + 0.114 * image[2]
    gx, gy = np.abs(np.diff(gray, axis=1)), np.abs(np.diff(gray, axis=0))
    gx, gy = gx / (gx.mean() + 1e-6), gy / (gy.mean() + 1e-6)
    N = H * W
    A = np.diag(Cw.ravel())
    for (i, j, i2, j2, g) in ([(i, j, i, j + 1, gx[i, j]) for i in range(H) for j in range(W - 1)]
                              + [(i, j, i + 1, j, gy[i, j]) for i in range(H - 1) for j in range(W)]):
        gain = 1 + np.clip((p[:, i2, j2] * d * p[:, i, j]).sum(), 0, 1)
        wgt = min(max(np.exp(-s.edge_constant * g) * gain, 0.0), 1.0)
        a, b = i * W + j, i2 * W + j2
        A[a, a] += s.tau * wgt
        A[b, b] += s.tau * wgt
        A[a, b] -= s.tau * wgt
        A[b, a] -= s.tau * wgt
    assert A.shape == (N, N)
    if cg_steps is not None:
        B, X = Cw.ravel() * logits.reshape(C, N), logits.reshape(C, N).copy()
        R = B - X @ A.T
        P, rs = R.copy(), (R * R).sum()
        for _ in range(cg_steps):
            AP = P @ A.T
            a = rs / ((P * AP).sum() + 1e-12)
            X, R = X + a * P, R - a * AP
            rs_new = (R * R).sum()
            P, rs = R + rs_new / (rs + 1e-12) * P, rs_new
        return X.reshape(C, H, W)
    return np.stack([np.linalg.solve(A, (Cw * logits[c]).ravel()).reshape(H, W) for c in range(C)])


def test_tlp_matches_a_dense_float64_solve_on_a_non_square_image():
    rng = np.random.default_rng(0)
    C, H, W = 3, 5, 7
    text = rng.standard_normal((C, 6))
    image, logits = rng.standard_normal((3, H, W)), 0.5 * rng.standard_normal((C, H, W))
    s = TLPSettings(grid=80, cg_steps=200, edge_constant=2.0, tau=0.7)  # round(5 / 80) = 1: no pooling
    S = text_affinity(torch.from_numpy(text), s.text_temperature, s.diagonal_boost)
    # the text affinity written out: row softmax of the cosines / 0.5, + 10 I, rows renormalised
    t = text / np.linalg.norm(text, axis=1, keepdims=True)
    e = np.exp((t @ t.T) / 0.5)
    S_ref = e / e.sum(1, keepdims=True) + 10 * np.eye(C)
    np.testing.assert_allclose(S.numpy(), S_ref / (S_ref.sum(1, keepdims=True) + 1e-6), atol=1e-12)
    got = text_laplacian_propagation(torch.from_numpy(image)[None], torch.from_numpy(logits)[None], S, s)[0]
    # converged up to the 1e-12 guards of upstream's CG divisions (they stall it near |r|^2 ~ 1e-12)
    np.testing.assert_allclose(got.numpy(), _np_tlp(image, logits, S.numpy(), s), atol=1e-6)
    # upstream's 25 steps, written out on the dense matrix
    s25 = TLPSettings(grid=80, cg_steps=25, edge_constant=2.0, tau=0.7)
    got25 = text_laplacian_propagation(torch.from_numpy(image)[None], torch.from_numpy(logits)[None], S, s25)[0]
    np.testing.assert_allclose(got25.numpy(), _np_tlp(image, logits, S.numpy(), s25, cg_steps=25), atol=1e-10)
    # what the code computes: only the diagonal of S is read (einsum 'cc,bcij->bcij')
    off = S + torch.from_numpy(rng.uniform(0, 0.1, (C, C))) * (1 - torch.eye(C, dtype=torch.float64))
    again = text_laplacian_propagation(torch.from_numpy(image)[None], torch.from_numpy(logits)[None], off, s)[0]
    torch.testing.assert_close(again, got, atol=0, rtol=0)
    # 25 steps (upstream's) are not the solve yet: the step count takes effect
    short = text_laplacian_propagation(torch.from_numpy(image)[None], torch.from_numpy(logits)[None], S,
                                       TLPSettings(grid=80, cg_steps=1, edge_constant=2.0, tau=0.7))[0]
    assert (short - got).abs().max() > 1e-6


def test_tlp_pools_to_the_grid_and_upsamples():
    """grid 3 on a 7 x 10 image: pooled by round(7/3) x round(10/3) = 2 x 3 (a 3 x 3 grid, the
    remainder dropped as avg_pool2d does), solved there, bilinearly upsampled back."""
    rng = np.random.default_rng(2)
    C, H, W = 2, 7, 10
    image, logits = rng.standard_normal((3, H, W)), rng.standard_normal((C, H, W))
    s = TLPSettings(grid=3, cg_steps=100)
    S = text_affinity(torch.from_numpy(rng.standard_normal((C, 4))), s.text_temperature, s.diagonal_boost)

    def pool(x):
        return x[:, :6, :9].reshape(x.shape[0], 3, 2, 3, 3).mean(axis=(2, 4))

    small = _np_tlp(pool(image), pool(logits), S.numpy(), s, cg_steps=100)
    ref = F.interpolate(torch.from_numpy(small)[None], size=(H, W), mode="bilinear", align_corners=False)[0]
    got = text_laplacian_propagation(torch.from_numpy(image)[None], torch.from_numpy(logits)[None], S, s)[0]
    np.testing.assert_allclose(got.numpy(), ref.numpy(), atol=1e-9)


def test_tlp_stage_in_the_pipeline_after_any_method():
    """TLP after SCLIP's attention on the tiny tower: the stage divides by the logit scale, propagates
    the output-size logits with the synonyms' text affinity and scales back; the label map follows."""
    from detectron2.modeling import build_model

    cfg = tiny_cfg(**{"MODEL.SPARSECLIP.ATTENTION.SOURCE": "qq+kk", "MODEL.SPARSECLIP.TLP.ENABLED": "True",
                      "MODEL.SPARSECLIP.TLP.GRID": "20", "MODEL.SPARSECLIP.LOGIT_SCALE": "40.0"})
    model = build_model(cfg).eval()
    stage = model.stage("text_laplacian")
    assert stage is not None and stage.settings.grid == 20 and "grid 20" in model.describe()
    image = torch.randint(0, 256, (3, 64, 96), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    x = {"image": image, "height": 80, "width": 120, "vocabulary": ["cat", "dog, puppy", "sky"]}
    with torch.no_grad():
        inputs = model.image_inputs(x)
        logits, _ = model.working_logits(inputs)
        got = stage(model, inputs, logits)
        img = F.interpolate(inputs.image[None], size=(80, 120), mode="bilinear", align_corners=False)
        full = F.interpolate(logits[None], size=(80, 120), mode="bilinear", align_corners=False)
        S = text_affinity(inputs.text_emb, 0.5, 10.0)
        ref = text_laplacian_propagation(img, full / 40.0, S, stage.settings)[0] * 40.0
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
        assert got.shape == (4, 80, 120)  # one row per synonym
        assert (got - full[0]).abs().max() > 1e-3
        with pytest.raises(ValueError, match="MODEL.SPARSECLIP.TLP.ENABLED: the logits have 3 rows but there are 4"):
            stage(model, inputs, logits[:3])
        labels = model.predict(x).label_map()
    assert labels.shape == (80, 120)


@pytest.mark.parametrize("key, value, match", [
    ("MODEL.SPARSECLIP.TLP.GRID", "0", r"MODEL.SPARSECLIP.TLP.GRID = 0 is invalid; valid: an integer in \[1, inf\)"),
    ("MODEL.SPARSECLIP.TLP.TEXT_TEMPERATURE", "0.0", r"TLP.TEXT_TEMPERATURE = 0.0 is invalid; valid: a number in \(0"),
    ("MODEL.SPARSECLIP.TLP.CG_STEPS", "-1", r"TLP.CG_STEPS = -1 is invalid; valid: an integer in \[0, inf\)"),
    ("MODEL.SPARSECLIP.TLP.TAU", "-1.0", r"TLP.TAU = -1.0 is invalid; valid: a number in \[0, inf\)"),
])
def test_tlp_bad_values_name_the_key(key, value, match):
    from sparseclip_d2.config import check_sparseclip_config

    with pytest.raises(ValueError, match=match):
        check_sparseclip_config(tiny_cfg(**{"MODEL.SPARSECLIP.TLP.ENABLED": "True", key: value}))


def test_tlp_keys_refused_while_off():
    from sparseclip_d2.config import check_sparseclip_config

    with pytest.raises(ValueError, match=r"MODEL.SPARSECLIP.TLP.GRID = 224 changes nothing while "
                                         r"MODEL.SPARSECLIP.TLP.ENABLED is False"):
        check_sparseclip_config(tiny_cfg(**{"MODEL.SPARSECLIP.TLP.GRID": "224"}))


def test_the_agreement_variant_tlp_off_builds_on_every_pearl_config():
    """``--force tlp_off`` switches TLP off on each of PEARL's dataset configs, Cityscapes too, whose
    ``TLP.GRID 224`` would be refused as a key that changes nothing once TLP is off."""
    from sparseclip_d2.benchmarks.project import project_cfg
    from sparseclip_d2.methods import STAGES, UPSTREAM

    entry = UPSTREAM.get("pearl")
    opts = entry.forcing["tlp_off"][0]
    assert list(opts[:2]) == ["MODEL.SPARSECLIP.TLP.ENABLED", "False"]
    from sparseclip_d2.methods.pearl.propagation import TLPSettings

    # the grid is put back at the settings' own default (pearl_ovss.py grid=80)
    assert dict(zip(opts[2::2], opts[3::2]))["MODEL.SPARSECLIP.TLP.GRID"] == str(TLPSettings().grid) == "80"
    stage = STAGES.get("text_laplacian")
    assert stage.settings_from_config(project_cfg("pearl_b16_cityscapes.yaml", [])).grid == 224
    for config in entry.configs:
        assert stage.settings_from_config(project_cfg(config, list(opts))) is None, config
