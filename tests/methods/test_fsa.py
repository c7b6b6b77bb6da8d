"""FSA (chi-chi-zx/FSA @ dbd2da5) on the proxy last block: the top-p nucleus pruning (and the
``top_p`` normaliser), the KL similarity, FSA's scores and ensemble, and the whole FSA last block
(with FSA's softmax and with ``entmax`` alpha 1.2), each against hand-written float64
computations; the ``MODEL.SPARSECLIP.PROXY.FSA`` keys take effect or are refused before any
model is built; the ``configs/baselines/fsa_b16*.yaml`` values. The comparison with FSA's own
code is in docs/upstream_agreement.md ("FSA").
"""
import glob
import math
import os

import pytest
import torch
import torch.nn.functional as F

from sparseclip_d2.attention import get_normalizer, nucleus_mask, nucleus_prune
from sparseclip_d2.clip import AttentionSpec
from sparseclip_d2.methods.fsa import FSAEncoder, FSASettings, fsa_ensemble, fsa_scores, kl_similarity
from sparseclip_d2.methods.proxyclip import ProxyCLIPEncoder

from conftest import build_tiny_clip, tiny_cfg
from test_entmax import entmax_bisect_reference  # noqa: E402  (float64 bisection, independent of the kernel)
from test_proxyclip import DINO, _proxy, bilinear_reference, proxy_block_inputs64, scores_reference  # noqa: E402  (float64 references)


def nucleus_reference(row, p):
    """Kept indices of one row (a list of floats): descending order (ties: lower index first),
    softmax mass accumulated in float64 with math.exp, kept while the running sum is <= p; the
    first always."""
    m = max(row)
    z = sum(math.exp(r - m) for r in row if r != -math.inf)
    order = sorted(range(len(row)), key=lambda j: (-row[j], j))
    kept, cum = set(), 0.0
    for rank, j in enumerate(order):
        cum += (math.exp(row[j] - m) if row[j] != -math.inf else 0.0) / z
        if rank == 0 or cum <= p:
            kept.add(j)
    return kept


def test_nucleus_known_answers():
    # softmax of [3, 1, 2, 0] = [0.6439, 0.0871, 0.2369, 0.0321]; descending 3, 2, 1, 0 with
    # cumulative mass 0.6439, 0.8808, 0.9679, 1.0
    s = torch.tensor([[3.0, 1.0, 2.0, 0.0]], dtype=torch.float64)
    assert nucleus_mask(s, 0.45).tolist() == [[True, False, False, False]]  # the first always
    assert nucleus_mask(s, 0.88).tolist() == [[True, False, False, False]]  # 0.8808 > 0.88
    assert nucleus_mask(s, 0.89).tolist() == [[True, False, True, False]]
    assert nucleus_mask(s, 0.97).tolist() == [[True, True, True, False]]
    assert nucleus_mask(s, 1.0).all()
    pruned = nucleus_prune(s, 0.89)
    assert torch.isneginf(pruned).tolist() == [[False, True, False, True]] and pruned[0, 2] == 2.0
    # the top_p normaliser: softmax mass [0.3, 0.1, 0.05, 0.15, 0.4]; descending 0.4, 0.3 (cum 0.7),
    # 0.15 (0.85): at p 0.75 entries 4 and 0 are kept, weights 0.4 / 0.7 and 0.3 / 0.7; at FSA's
    # default p 0.45 only entry 4
    row = torch.log(torch.tensor([[0.3, 0.1, 0.05, 0.15, 0.4]], dtype=torch.float64)) + 2.0
    assert nucleus_reference(row[0].tolist(), 0.75) == {0, 4}
    w = get_normalizer("top_p")(row, p=0.75)
    assert w.dtype == torch.float32
    torch.testing.assert_close(w.double(), torch.tensor([[3 / 7, 0, 0, 0, 4 / 7]], dtype=torch.float64),
                               rtol=0, atol=1e-6)
    assert get_normalizer("top_p")(row).tolist() == [[0.0, 0.0, 0.0, 0.0, 1.0]]


@pytest.mark.parametrize("p", [0.05, 0.45, 0.7, 0.99])
def test_nucleus_mask_matches_float64_loops(p):
    g = torch.Generator().manual_seed(int(p * 100))
    s = torch.randn(3, 5, 17, generator=g, dtype=torch.float64) * 2
    s[0, 0, 3] = float("-inf")  # masked entries carry no mass and are never kept past the first
    got = nucleus_mask(s, p)
    for idx in torch.cartesian_prod(torch.arange(3), torch.arange(5)):
        row = s[idx[0], idx[1]].tolist()
        assert set(torch.nonzero(got[idx[0], idx[1]]).flatten().tolist()) == nucleus_reference(row, p)


@pytest.mark.parametrize("name", ["softmax", "entmax"])
def test_nucleus_composes_with_any_normaliser(name):
    """Pruning, then softmax / entmax 1.2 over the kept entries (float64 references): zeros
    outside the nucleus, the normaliser's own weights inside."""
    s = torch.randn(4, 9, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    keep = nucleus_mask(s, 0.6)
    w = get_normalizer(name)(nucleus_prune(s.float(), 0.6), alpha=1.2).double()
    for r in range(4):
        k = keep[r]
        ref = torch.softmax(s[r, k], -1) if name == "softmax" else entmax_bisect_reference(s[r, k], 1.2)
        torch.testing.assert_close(w[r, k], ref, rtol=0, atol=1e-6)
        assert bool((w[r, ~k] == 0).all())


def kl_similarity_reference(patch, uniform):
    """(N, S), (N, S) float64 -> (N, N): 1 / (1 + max(0, sum_c P_ic (log(P_ic + 1e-10) - log(P_jc + 1e-10))))."""
    n, S = patch.shape
    P = []
    for i in range(n):
        d = [float(patch[i, c] - uniform[i, c]) for c in range(S)]
        m = max(d)
        e = [math.exp(x - m) for x in d]
        P.append([x / sum(e) for x in e])
    out = torch.zeros(n, n, dtype=torch.float64)
    for i in range(n):
        for j in range(n):
            kl = sum(P[i][c] * (math.log(P[i][c] + 1e-10) - math.log(P[j][c] + 1e-10)) for c in range(S))
            out[i, j] = 1.0 / (max(kl, 0.0) + 1.0)
    return out


@pytest.mark.parametrize("block_bytes", [None, 2 * 7 * 4 * 4])  # one block; blocks of 2 rows (the last of 1)
def test_kl_similarity_scores_and_ensemble_match_float64(block_bytes, monkeypatch):
    import sparseclip_d2.methods.fsa.encoder as fsa_module

    if block_bytes:
        monkeypatch.setattr(fsa_module, "_KL_BLOCK_BYTES", block_bytes)
    g = torch.Generator().manual_seed(5)
    patch = torch.randn(2, 7, 4, generator=g, dtype=torch.float64) * 3
    uniform = torch.randn(2, 1, 4, generator=g, dtype=torch.float64) * 3
    sim = kl_similarity(patch, uniform)
    for b in range(2):
        ref = kl_similarity_reference(patch[b], uniform[b].expand(7, 4))
        torch.testing.assert_close(sim[b].double(), ref, rtol=0, atol=1e-6)
        assert bool((sim[b].diagonal() == 1).all())  # KL(P_i || P_i) = 0
    sc = fsa_scores(sim, 0.45, 3.0)
    for b in range(2):
        for i in range(7):
            row = sim[b, i].double()
            kept = nucleus_reference(row.tolist(), 0.45)
            for j in range(7):
                want = float(row[j]) * math.exp(3.0 * float(row[j])) if j in kept else -math.inf
                assert math.isclose(float(sc[b, i, j]), want, rel_tol=1e-6) or (want == -math.inf == sc[b, i, j])
    new = torch.softmax(sc, -1)
    vfm = torch.softmax(torch.randn(2, 7, 7, generator=g), -1)
    ens = fsa_ensemble(new, vfm)
    for b in range(2):
        n64, v64 = new[b].double(), vfm[b].double()
        ref = torch.zeros(7, 7, dtype=torch.float64)
        for i in range(7):
            for j in range(7):
                ref[i, j] = (sum(n64[i, k] * v64[k, j] + v64[i, k] * n64[k, j] for k in range(7)) + n64[i, j]) / 3
        torch.testing.assert_close(ens[b].double(), ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(ens.sum(-1), torch.ones(2, 7), rtol=0, atol=1e-5)


# ------------------------------------------------------------------ the whole FSA last block
@pytest.fixture(scope="module")
def clip():
    return build_tiny_clip(0)


def _fsa_block_reference(clip, proxy, x, text, proxy_norm, fsa_norm, lamda=3.0, top_p=0.45):
    """The FSA last block in float64, written out (custom_attn + FSA of chi-chi-zx/FSA @ dbd2da5):
    returns the (B, D, 4, 4) output and the (B, 16, 16) ensemble weights. CLIP 2 x 2 grid, DINO 4 x 4."""
    pf, v64, v, blk = proxy_block_inputs64(clip, proxy, x)
    B, C, H = x.shape[0], v.shape[-1], blk.attn.num_heads
    with torch.no_grad():
        Wo, bo = blk.attn.out_proj.weight, blk.attn.out_proj.bias
        T = F.normalize(text.double(), dim=-1)

        def norm(s, name):
            return entmax_bisect_reference(s, 1.2) if name == "entmax" else torch.softmax(s, -1)

        def branch(w, vh_all):  # heads side by side, out_proj
            return torch.cat([w @ vh for vh in vh_all], -1) @ Wo.T + bo

        def logits(o, scale):
            e = v64.ln_post(o) @ v64.proj
            return scale * (e / e.norm(dim=-1, keepdim=True)) @ T.T

        outs, enss = [], []
        for b in range(B):
            a_vfm = norm(scores_reference(pf[b].T.reshape(-1, 4, 4), 1.2, 3.0), proxy_norm)
            vh_all = [bilinear_reference(v[b, 1:, h * C // H:(h + 1) * C // H].reshape(2, 2, -1), 4, 4).reshape(16, -1)
                      for h in range(H)]
            first = branch(a_vfm, vh_all)
            uniform = torch.full((16, 16), 1.0 / 16, dtype=torch.float64)
            sim = kl_similarity_reference(logits(first, 20.0), logits(branch(uniform, vh_all), 35.0))
            sc = torch.full((16, 16), float("-inf"), dtype=torch.float64)
            for i in range(16):
                for j in nucleus_reference(sim[i].tolist(), top_p):
                    sc[i, j] = sim[i, j] * math.exp(lamda * float(sim[i, j]))
            a_new = norm(sc, fsa_norm)
            ens = (a_new @ a_vfm + a_vfm @ a_new + a_new) / 3
            outs.append((v64.ln_post(branch(ens, vh_all)) @ v64.proj).T.reshape(-1, 4, 4))
            enss.append(ens)
    return torch.stack(outs), torch.stack(enss)


@pytest.mark.parametrize("proxy_norm, fsa_norm", [("softmax", "softmax"), ("entmax", "entmax"),
                                                  ("softmax", "entmax")])
def test_fsa_last_block_matches_float64_reference(clip, proxy_norm, fsa_norm):
    """FSA's softmaxes and NORMALIZER entmax alpha 1.2 (on the proxy scores, on the FSA scores or
    both), no residual / FFN, against float64 by hand."""
    proxy = _proxy(DINO)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(4)) * 0.5
    text = torch.randn(6, clip.visual.proj.shape[1], generator=torch.Generator().manual_seed(2))
    ref, ref_ens = _fsa_block_reference(clip, proxy, x, text, proxy_norm, fsa_norm)
    spec = AttentionSpec(normalizer=proxy_norm, alpha=1.2, residual=False, ffn=False)
    enc = FSAEncoder(clip.visual, spec, proxy, fsa=FSASettings(normalizer="" if fsa_norm == proxy_norm else fsa_norm))
    ours, attn = enc(x, return_attention=True, text_emb=text)
    assert ours.shape == ref.shape == (2, clip.visual.proj.shape[1], 4, 4)
    torch.testing.assert_close(attn[:, 0].double(), ref_ens, rtol=0, atol=1e-5)
    torch.testing.assert_close(ours.double(), ref, rtol=0, atol=1e-4)
    plain = ProxyCLIPEncoder(clip.visual, spec, proxy)(x)
    assert (ours - plain).abs().max() > 1e-3, "FSA changed nothing against ProxyCLIP's block"


def test_fsa_needs_the_class_texts(clip):
    enc = FSAEncoder(clip.visual, AttentionSpec(residual=False, ffn=False), _proxy(DINO))
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    with pytest.raises(ValueError, match="call the encoder with text_emb"):
        enc(x)
    with pytest.raises(ValueError, match=r"text_emb must be \(S, D\)"):
        enc(x, text_emb=torch.ones(3))
    with pytest.raises(ValueError, match=r"TOP_P = 0\.0"):
        FSAEncoder(clip.visual, AttentionSpec(), _proxy(DINO), fsa=FSASettings(top_p=0.0))


# ------------------------------------------------------------------ MODEL.SPARSECLIP.PROXY.FSA keys
def _model(**opts):
    from detectron2.modeling import build_model

    return build_model(tiny_cfg(**opts))


_ON = {"MODEL.SPARSECLIP.PROXY.NAME": DINO, "MODEL.SPARSECLIP.PROXY.FSA.ENABLED": "True",
       "MODEL.SPARSECLIP.BLOCK.RESIDUAL": "False", "MODEL.SPARSECLIP.BLOCK.FFN": "False"}


def test_fsa_keys_take_effect_through_the_meta_arch():
    m = _model(**_ON, **{"MODEL.SPARSECLIP.PROXY.FSA.TOP_P": "0.6", "MODEL.SPARSECLIP.PROXY.FSA.LAMBDA": "4.5",
                         "MODEL.SPARSECLIP.PROXY.FSA.PATCH_SCALE": "10.0",
                         "MODEL.SPARSECLIP.PROXY.FSA.UNIFORM_SCALE": "30.0",
                         "MODEL.SPARSECLIP.PROXY.FSA.NORMALIZER": "entmax"})
    assert isinstance(m.encoder, FSAEncoder)
    assert m.encoder.fsa == FSASettings(top_p=0.6, lamda=4.5, patch_scale=10.0, uniform_scale=30.0,
                                        normalizer="entmax")
    image = {"image": torch.randint(0, 255, (3, 40, 56), dtype=torch.uint8), "vocabulary": ["a", "b", "c"]}
    out = m([image])[0]["sem_seg"]  # the META_ARCH passes its text embeddings into the block
    assert out.shape == (3, 40, 56) and torch.isfinite(out).all()
    plain = _model(**{k: v for k, v in _ON.items() if "FSA" not in k})
    assert type(plain.encoder) is ProxyCLIPEncoder
    assert (plain([image])[0]["sem_seg"] - out).abs().max() > 1e-4


@pytest.mark.parametrize("opts, match", [
    ({"MODEL.SPARSECLIP.PROXY.FSA.ENABLED": "True"}, r"PROXY\.FSA\.ENABLED = True changes nothing without a proxy"),
    ({"MODEL.SPARSECLIP.PROXY.NAME": DINO, "MODEL.SPARSECLIP.PROXY.FSA.TOP_P": "0.5"},
     r"PROXY\.FSA\.TOP_P = 0\.5 changes nothing while .*FSA\.ENABLED is False"),
    (dict(_ON, **{"MODEL.SPARSECLIP.PROXY.FSA.TOP_P": "1.5"}), r"PROXY\.FSA\.TOP_P = 1\.5 is invalid; valid: .*\(0, 1\]"),
    (dict(_ON, **{"MODEL.SPARSECLIP.PROXY.FSA.UNIFORM_SCALE": "0.0"}), r"FSA\.UNIFORM_SCALE = 0\.0 is invalid"),
    (dict(_ON, **{"MODEL.SPARSECLIP.PROXY.FSA.NORMALIZER": "softmin"}),
     r"FSA\.NORMALIZER: unknown attention normalizer 'softmin'; valid: .*top_p"),
    (dict(_ON, **{"TEST.TTA.MODE": "itaclip"}), r"TEST\.TTA\.MODE cannot be combined with MODEL\.SPARSECLIP\.PROXY\.FSA\.ENABLED: the encoder needs the class texts"),
    ({"MODEL.SPARSECLIP.PROXY.NAME": DINO, "MODEL.SPARSECLIP.FEEDBACK.ENABLED": "True"}, r"FEEDBACK\.ENABLED True"),
])
def test_bad_fsa_keys_are_refused_before_any_model_is_built(opts, match, monkeypatch):
    import sparseclip_d2.modeling.backbone as mb

    def no_build(cfg):
        raise AssertionError("a model was built before the keys were checked")

    monkeypatch.setattr(mb, "build_clip_from_config", no_build)
    with pytest.raises(ValueError, match=match):
        _model(**opts)


# ------------------------------------------------------------------ configs
def test_fsa_configs_select_upstreams_values():
    """configs/baselines/fsa_b16*.yaml: FSA's values (chi-chi-zx/FSA @ dbd2da5 FSA_Proxy_segmentor.py,
    configs/cfg_*.py, hyper_param.txt) on ProxyCLIP's protocol, each accepted by the checks."""
    from sparseclip_d2.methods.encoders import check_proxy_config
    from sparseclip_d2.methods.fsa.keys import fsa_settings_from_config

    from conftest import baseline_cfg

    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "baselines")
    got = {}
    for path in sorted(glob.glob(os.path.join(root, "fsa_b16*.yaml"))):
        cfg = baseline_cfg(path)
        opts = check_proxy_config(cfg)
        fsa = fsa_settings_from_config(cfg)
        sc, sw = cfg.MODEL.SPARSECLIP, cfg.TEST.SLIDING_WINDOW
        assert (sc.ATTENTION.NORMALIZER, sc.BLOCK.RESIDUAL, sc.BLOCK.FFN, sc.PROXY.BETA, sc.PROXY.GAMMA) == (
            "softmax", False, False, 1.2, 3.0)
        assert (fsa.top_p, fsa.patch_scale, fsa.uniform_scale, fsa.normalizer) == (0.45, 20.0, 35.0, "")
        names = "" if path.endswith("_ade847.yaml") else "proxyclip"  # ade847: the project's names
        assert (sc.LOGIT_SCALE, sc.TEXT.TEMPLATES, sc.CLASS_NAMES, sc.PIXEL_NORM) == (
            40.0, "openai_imagenet", names, "clip_mmseg")
        got[os.path.basename(path)[len("fsa_b16"):-5] or "base"] = (
            opts.name, fsa.lamda, sc.PROB_THRESHOLD, cfg.INPUT.MIN_SIZE_TEST, sw.CROP_SIZE, sw.STRIDE)
    dino = "vit_base_patch8_224.dino"
    assert got == {
        "base": (dino, 3.0, 0.0, 336, 336, 112),
        "_voc21": (dino, 3.0, 0.2, 336, 336, 112),
        "_context60": (dino, 3.0, 0.14, 336, 336, 112),
        "_coco_object": (dino, 3.0, 0.3, 336, 336, 112),
        "_ade20k": (dino, 3.0, 0.0, 448, 336, 112),
        "_ade847": (dino, 3.0, 0.0, 448, 336, 112),       # cfg_ade847.py
        "_context459": (dino, 3.0, 0.0, 448, 336, 112),   # cfg_context459.py
        "_cityscapes": (dino, 3.0, 0.0, 448, 224, 80),
        "_dinov2": ("vit_base_patch14_reg4_dinov2", 3.0, 0.0, 336, 336, 112),
        "_mae": ("vit_base_patch16_224.mae", 4.5, 0.0, 336, 336, 112),
        "_sam": ("samvit_base_patch16", 3.0, 0.0, 336, 336, 112),
    }


def test_demo_and_predictor_variants_keep_and_name_the_proxy(caplog):
    """A Predictor's attention variants (the demo's --compare) keep the second backbone (and FSA),
    and the demo's "attention:" line and titles name the proxy, not CLIP's q-k."""
    from sparseclip_d2.cli.demo import build_predictors, describe_attention

    cfg = tiny_cfg(**_ON)
    cfg.MODEL.SPARSECLIP.TEXT.TEMPLATES = "single"
    variant = AttentionSpec(normalizer="entmax", alpha=1.2, residual=False, ffn=False)
    base, other = build_predictors(cfg, [("cfg", AttentionSpec.from_config(cfg)), ("entmax", variant)])
    assert isinstance(other.model.encoder, FSAEncoder) and other.model.encoder.proxy is base.model.encoder.proxy
    assert other.model.encoder.fsa == base.model.encoder.fsa and other.model.encoder.spec.normalizer == "entmax"
    line = describe_attention(other, variant)
    assert line.startswith(f"proxy {DINO} tokens of block -1: cosine (S - 1.2 mean S) x 3, negatives -inf, "
                           "entmax \u03b1=1.2") and "FSA: top-p 0.45" in line
    assert other.describe() == f"sparseclip-tiny-vit: {line}"


def test_alpha_warning_knows_fsas_own_normaliser(caplog, monkeypatch):
    """ALPHA with NORMALIZER softmax is reported as ignored, unless FSA's own normaliser reads it;
    top_p ignores ALPHA like softmax."""
    import logging

    import sparseclip_d2.config as config_module

    def warnings(**opts):
        monkeypatch.setattr(config_module, "_WARNED", set())
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=config_module.__name__):
            config_module.check_sparseclip_config(tiny_cfg(**opts))
        return [r.getMessage() for r in caplog.records if r.name == config_module.__name__ and "ALPHA" in r.getMessage()]

    alpha = {"MODEL.SPARSECLIP.ATTENTION.ALPHA": "1.5"}
    assert len(warnings(**_ON, **alpha)) == 1
    assert warnings(**_ON, **alpha, **{"MODEL.SPARSECLIP.PROXY.FSA.NORMALIZER": "entmax"}) == []
    lines = warnings(**alpha, **{"MODEL.SPARSECLIP.ATTENTION.NORMALIZER": "top_p"})
    assert len(lines) == 1 and "ignored by NORMALIZER top_p" in lines[0]
