"""Layer 1: score sources x normalisers x priors against hand-written computations."""
import math

import pytest
import torch

from sparseclip_d2.attention import (
    NORMALIZER_REGISTRY,
    PRIOR_REGISTRY,
    SCORE_SOURCE_REGISTRY,
    alpha_entmax,
    attention_weights,
    build_prior,
    canonical_source,
    get_normalizer,
    parse_source,
)


def _qkv(B=2, H=3, L=9, d=8, seed=0, scale=2.0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [(scale * torch.randn(B, H, L, d, generator=g)).to(dtype) for _ in range(3)]


def _hand_scores(a, b):
    """Plain loops over (batch, head): (a_i . b_j) / sqrt(d)."""
    B, H, L, d = a.shape
    out = torch.empty(B, H, L, L, dtype=torch.float64)
    for bi in range(B):
        for h in range(H):
            out[bi, h] = a[bi, h].double() @ b[bi, h].double().T / math.sqrt(d)
    return out


def _hand_sparsemax(z):
    """Sparsemax of each row by the textbook sort / cumsum rule (Martins & Astudillo 2016)."""
    z = z.double()
    zs, _ = torch.sort(z, dim=-1, descending=True)
    ks = torch.arange(1, z.shape[-1] + 1, dtype=z.dtype)
    cs = zs.cumsum(-1)
    support = (1 + ks * zs) > cs
    k = support.sum(-1, keepdim=True)
    tau = (cs.gather(-1, k - 1) - 1) / k
    return torch.clamp(z - tau, min=0)


PAIRS = {"qk": (0, 1), "qq": (0, 0), "kk": (1, 1), "vv": (2, 2)}


@pytest.mark.parametrize("source", list(PAIRS))
@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_pair_sources_softmax_match_hand(source, temperature):
    qkv = _qkv()
    a, b = (qkv[i] for i in PAIRS[source])
    ref = torch.softmax(_hand_scores(a, b) / temperature, dim=-1)
    w = attention_weights(*qkv, source=source, normalizer="softmax", temperature=temperature)
    assert w.dtype == torch.float32 and w.shape == (2, 3, 9, 9)
    torch.testing.assert_close(w.double(), ref, atol=1e-6, rtol=0)


def test_paper_aliases_and_canonical_names():
    assert canonical_source("QQV") == "qq" and canonical_source("qq + kk") == "qq+kk"
    assert parse_source("qkv+vvv") == ("qk", "vv") and canonical_source("v-only") == "identity"
    qkv = _qkv()
    torch.testing.assert_close(attention_weights(*qkv, source="kkv"), attention_weights(*qkv, source="kk"))


def test_sparsemax_matches_textbook_and_entmax15_matches_entmax_package():
    entmax_pkg = pytest.importorskip("entmax")
    qkv = _qkv(scale=3.0)
    s = _hand_scores(qkv[0], qkv[1])
    w2 = attention_weights(*qkv, source="qk", normalizer="sparsemax", alpha=1.3)  # alpha ignored
    torch.testing.assert_close(w2.double(), _hand_sparsemax(s), atol=1e-5, rtol=0)
    assert (w2 == 0).any(), "sparsemax of peaky scores must have exact zeros"
    w15 = attention_weights(*qkv, source="qk", normalizer="entmax", alpha=1.5)
    torch.testing.assert_close(w15.double(), entmax_pkg.entmax15(s, dim=-1), atol=1e-5, rtol=0)
    w12 = attention_weights(*qkv, source="qk", normalizer="entmax", alpha=1.2)
    ref12 = entmax_pkg.entmax_bisect(s, alpha=1.2, dim=-1, n_iter=100)
    torch.testing.assert_close(w12.double(), ref12, atol=1e-5, rtol=0)
    # alpha = 1 is softmax
    w1 = attention_weights(*qkv, source="qk", normalizer="entmax", alpha=1.0)
    torch.testing.assert_close(w1.double(), torch.softmax(s, -1), atol=1e-6, rtol=0)


def test_sum_modes():
    qkv = _qkv()
    q, k, v = qkv
    sqq, skk, svv = _hand_scores(q, q), _hand_scores(k, k), _hand_scores(v, v)
    w = attention_weights(*qkv, source="qq+kk")
    torch.testing.assert_close(w.double(), torch.softmax(sqq, -1) + torch.softmax(skk, -1), atol=1e-6, rtol=0)
    torch.testing.assert_close(w.sum(-1), torch.full((2, 3, 9), 2.0), atol=1e-5, rtol=0)
    w3 = attention_weights(*qkv, source="qq+kk+vv", normalizer="sparsemax")
    ref3 = _hand_sparsemax(sqq) + _hand_sparsemax(skk) + _hand_sparsemax(svv)
    torch.testing.assert_close(w3.double(), ref3, atol=1e-5, rtol=0)
    ws = attention_weights(*qkv, source="qq+kk", sum_mode="sum_then_normalize", temperature=2.0)
    torch.testing.assert_close(ws.double(), torch.softmax((sqq + skk) / 2.0, -1), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="normalize_then_sum"):
        attention_weights(*qkv, source="qq+kk", sum_mode="average")


@pytest.mark.parametrize("normalizer", ["softmax", "entmax", "sparsemax", "random_matched"])
def test_identity_source_is_identity(normalizer):
    qkv = _qkv()
    w = attention_weights(*qkv, source="identity", normalizer=normalizer, temperature=0.5)
    assert torch.equal(w, torch.eye(9).expand(2, 3, 9, 9))
    # inside a sum, the identity term contributes I
    ws = attention_weights(*qkv, source="qq+identity", normalizer=normalizer,
                           generator=torch.Generator().manual_seed(0))
    wq = attention_weights(*qkv, source="qq", normalizer=normalizer, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(ws, wq + torch.eye(9))


def test_prior_is_added_after_scaling():
    qkv = _qkv()
    prior = torch.randn(9, 9, generator=torch.Generator().manual_seed(3))
    s = _hand_scores(qkv[1], qkv[1])
    w = attention_weights(*qkv, source="kk", prior=prior, temperature=0.5)
    torch.testing.assert_close(w.double(), torch.softmax(s / 0.5 + prior.double(), -1), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match=r"\(9, 9\)"):
        attention_weights(*qkv, source="kk", prior=torch.zeros(8, 8))


def test_gaussian_prior_matches_hand_loop():
    h, w, std = 3, 4, 1.5
    p = build_prior("gaussian", (h, w), std=std)
    assert p.shape == (13, 13) and p.dtype == torch.float32
    assert torch.all(p[0] == 0) and torch.all(p[:, 0] == 0)
    for i in range(h * w):
        for j in range(h * w):
            ri, ci, rj, cj = i // w, i % w, j // w, j % w
            ref = math.exp(-((ri - rj) ** 2 + (ci - cj) ** 2) / (2 * std ** 2))
            assert abs(p[1 + i, 1 + j].item() - ref) < 1e-6
    assert build_prior("none", (h, w)) is None
    with pytest.raises(ValueError, match="std"):
        build_prior("gaussian", (h, w), std=0)


def test_random_matched_support_reproducible_and_softmax_over_kept():
    qkv = _qkv(scale=3.0)
    s = _hand_scores(qkv[0], qkv[1]).float()
    ent = alpha_entmax(s, 1.2, dim=-1)
    w = attention_weights(*qkv, normalizer="random_matched", alpha=1.2, generator=torch.Generator().manual_seed(7))
    k_ent, k_rnd = (ent > 0).sum(-1), (w > 0).sum(-1)
    assert torch.equal(k_ent, k_rnd)
    assert (k_ent < 9).any(), "test scores must make entmax sparse"
    # the kept entries get a softmax of their scores
    keep = w > 0
    ref = torch.softmax(s.masked_fill(~keep, float("-inf")), -1)
    torch.testing.assert_close(w, ref, atol=1e-6, rtol=0)
    # not simply entmax's own support
    assert not torch.equal(keep, ent > 0)
    # seeded -> reproducible; another seed -> another mask
    w_again = attention_weights(*qkv, normalizer="random_matched", alpha=1.2, generator=torch.Generator().manual_seed(7))
    assert torch.equal(w, w_again)
    w_other = attention_weights(*qkv, normalizer="random_matched", alpha=1.2, generator=torch.Generator().manual_seed(8))
    assert not torch.equal(w, w_other)
    # batch independence: the first image alone gives the same weights
    w0 = attention_weights(*(t[:1] for t in qkv), normalizer="random_matched", alpha=1.2,
                           generator=torch.Generator().manual_seed(7))
    assert torch.equal(w0, w[:1])


def test_random_matched_never_picks_masked_entries():
    norm = get_normalizer("random_matched")
    s = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    s[:, 3:] = float("-inf")
    w = norm(s, alpha=1.05, generator=torch.Generator().manual_seed(0))
    assert torch.all(w[:, 3:] == 0)
    torch.testing.assert_close(w.sum(-1), torch.ones(4))


@pytest.mark.parametrize("normalizer", ["softmax", "entmax", "sparsemax", "random_matched"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs_give_float32_finite_weights(normalizer, dtype):
    q, k, v = _qkv(scale=20.0, dtype=dtype)  # large scores overflow fp16 if not upcast
    w = attention_weights(q, k, v, source="qq+kk", normalizer=normalizer)
    assert w.dtype == torch.float32 and torch.isfinite(w).all()
    torch.testing.assert_close(w.sum(-1), torch.full(w.shape[:-1], 2.0), atol=1e-4, rtol=0)
    ref = attention_weights(q.float(), k.float(), v.float(), source="qq+kk", normalizer=normalizer)
    assert torch.equal(w, ref)  # the scores are computed from the same values in float32


def test_unknown_names_list_valid_choices():
    qkv = _qkv()
    with pytest.raises(ValueError, match=r"unknown attention source 'qx'.*identity, kk, procrustes, qk, qq, vv, or sums like qq\+kk"):
        attention_weights(*qkv, source="qx")
    with pytest.raises(ValueError, match=r"unknown attention source 'qx'"):
        attention_weights(*qkv, source="qq+qx")
    with pytest.raises(ValueError, match=r"unknown attention normalizer 'softmin'.*entmax, random_matched, softmax, sparsemax"):
        attention_weights(*qkv, normalizer="softmin")
    with pytest.raises(ValueError, match=r"unknown attention prior 'box'; valid: gaussian, none"):
        build_prior("box", (2, 2))
    with pytest.raises(ValueError, match=r"alpha must be in \[1, 2\].*2.5"):
        attention_weights(*qkv, normalizer="entmax", alpha=2.5)
    with pytest.raises(ValueError, match="temperature"):
        attention_weights(*qkv, temperature=0)
    with pytest.raises(ValueError, match="shape"):
        attention_weights(qkv[0], qkv[1][:, :, :4], qkv[2])


def test_registries_hold_the_documented_names():
    assert {n for n, _ in SCORE_SOURCE_REGISTRY} == {"qk", "qq", "kk", "vv", "identity", "procrustes"}
    assert {n for n, _ in NORMALIZER_REGISTRY} == {"softmax", "entmax", "sparsemax", "random_matched", "top_p"}
    assert {n for n, _ in PRIOR_REGISTRY} == {"none", "gaussian"}
