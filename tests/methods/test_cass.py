"""CASS (MICV-yonsei/CASS @ 228ecdd): the spectral parts (``attention/spectral.py``), the CASS last
block (``methods/cass/encoder.py``), the object-presence prompt (``methods/cass/object_presence.py``), the keys
and configs.

Every part against a hand-written float64 computation or a known answer: spectra (numpy),
the Wasserstein cost by loops, the Hungarian assignment by brute force over all permutations,
the singular-value stretch, the low-rank graph (numpy SVD; a randomized SVD is exact on a
rank-q graph), the proxy input against PIL (what upstream calls), the whole CASS block with
``NORMALIZER entmax`` alpha 1.2 (and upstream's softmax) against float64, the object-presence
text and logits by loops. Tiny towers (``tests/tiny_models.py``), random weights, fixed seeds.
The comparison with CASS's own code is in docs/upstream_agreement.md.
"""
import copy
import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sparseclip_d2.attention.spectral import (HEAD_MATCHING_REGISTRY, combine_graphs, get_head_matching,
                                              graph_spectra, low_rank_graph, match_range, scale_singular_values,
                                              spectral_cost)
from sparseclip_d2.clip import AttentionSpec, MixOptions
from sparseclip_d2.common.replay import replaying
from sparseclip_d2.proxy import ProxyOptions, build_proxy
from sparseclip_d2.methods.cass.encoder import CASSEncoder, CASSSettings, cass_proxy_input

from conftest import baseline_cfg, build_tiny_clip, tiny_cfg
from test_entmax import entmax_bisect_reference  # noqa: E402  (float64 bisection, independent of the kernel)
from test_proxyclip import bilinear_reference  # noqa: E402  (bilinear resize written out point by point)

DINO = "sparseclip_tiny_dino8"  # patch 8, width 64, 4 heads: CLIP tiny's width and heads


def _proxy(seed=0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build_proxy(ProxyOptions(name=DINO, feature="keys"))


@pytest.fixture(scope="module")
def clip():
    return build_tiny_clip(0)


def _sym(n, rank, seed):
    a = torch.randn(n, rank, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return a @ a.T


# ------------------------------------------------------------------ spectral parts
def test_spectra_and_cost_match_numpy_and_loops():
    graphs = torch.stack([_sym(7, 5, s) for s in range(3)])
    spectra = graph_spectra(graphs, 4)
    for h in range(3):
        ref = np.sort(np.linalg.eigvalsh(graphs[h].numpy()))[::-1][:4]
        np.testing.assert_allclose(spectra[h].numpy(), ref, rtol=0, atol=1e-10)
    other = graph_spectra(torch.stack([_sym(7, 3, 10 + s) for s in range(3)]), 4)
    cost = spectral_cost(spectra, other)
    for i in range(3):
        for j in range(3):
            def prob(v):
                v = [float(x) for x in v]
                l2 = math.sqrt(sum(x * x for x in v))
                v = [x / l2 for x in v]
                s = sum(abs(x) for x in v)
                return sorted(x / s for x in v)
            w = sum(abs(a - b) for a, b in zip(prob(spectra[i]), prob(other[j])))
            assert abs(float(cost[i, j]) - (1 - w)) < 1e-12


def test_spectral_matching_is_the_cheapest_assignment():
    """Brute force over all 4! assignments of the float32 cost: the matching reaches the minimum
    (a unique one for these seeds), and its weights are 10 (1 - cost[i, pairs[i]])."""
    clip_g = torch.stack([_sym(9, 2 + h, h) for h in range(4)]).float()
    prox_g = torch.stack([_sym(9, 6 - h, 20 + h) for h in range(4)]).float()
    pairs, mix = get_head_matching("spectral")(clip_g, prox_g, k_eigen=5, scale_factor=10.0)
    cost = spectral_cost(graph_spectra(prox_g, 5), graph_spectra(clip_g, 5)).float().double()
    sums = sorted((sum(float(cost[i, p[i]]) for i in range(4)), p) for p in itertools.permutations(range(4)))
    assert sums[1][0] - sums[0][0] > 1e-4, "the test needs a unique optimum"
    assert tuple(pairs.tolist()) == sums[0][1]
    for i in range(4):
        assert abs(float(mix[i]) - 10 * (1 - float(cost[i, pairs[i]]))) < 1e-5
    p2, m2 = get_head_matching("sequential")(clip_g, prox_g, k_eigen=5, scale_factor=10.0)
    assert p2.tolist() == [0, 1, 2, 3] and m2.tolist() == [1.0] * 4
    assert set(n for n, _ in HEAD_MATCHING_REGISTRY) >= {"spectral", "sequential"}
    with pytest.raises(ValueError, match="unknown head matching 'hungary'; valid: .*spectral"):
        get_head_matching("hungary")


def test_singular_value_stretch_known_answer():
    s = torch.tensor([4.0, 2.0, 1.0], dtype=torch.float64)
    out = scale_singular_values(s, 0.5, 1.5)  # 1 -> 0.5, 4 -> 6, 2 -> (1/3) 5.5 + 0.5
    torch.testing.assert_close(out, torch.tensor([6.0, 5.5 / 3 + 0.5, 0.5], dtype=torch.float64), rtol=0, atol=1e-12)
    assert scale_singular_values(s, 1.0, 1.0) is s


def test_low_rank_graph_against_numpy_svd():
    a = _sym(12, 6, 3)
    u, s, vh = np.linalg.svd(a.numpy())
    for low, high in ((1.0, 1.0), (0.5, 1.5)):
        ss = s[:3]
        if (low, high) != (1.0, 1.0):
            ss = (ss - ss.min()) / (ss.max() - ss.min()) * (high * ss.max() - low * ss.min()) + low * ss.min()
        ref = (u[:, :3] * ss) @ vh[:3]
        np.fill_diagonal(ref, 0.0)
        out = low_rank_graph(a, 3, method="exact", low=low, high=high)
        np.testing.assert_allclose(out.numpy(), ref, rtol=0, atol=1e-9)
    # the randomized SVD recovers a rank-3 graph exactly with q = 3
    b = _sym(12, 3, 4)
    torch.manual_seed(0)
    out = low_rank_graph(b, 3, method="randomized", low=1.0, high=1.0)
    ref = b.clone()
    ref.fill_diagonal_(0)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-9)
    with pytest.raises(ValueError, match="SVD rank 13 is invalid"):
        low_rank_graph(b, 13)


def test_match_range_and_combine():
    x = torch.tensor([[1.0, 3.0], [2.0, 5.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.0, 0.5]])
    torch.testing.assert_close(match_range(x, ref), torch.tensor([[-1.0, -0.25], [-0.625, 0.5]], dtype=torch.float64))
    torch.testing.assert_close(combine_graphs(x, 2 * x, 3.0), (6 * x + x) / 4)
    with pytest.raises(ValueError, match="constant"):
        match_range(torch.ones(2, 2), ref)


def test_match_range_fp16_onto_float32_as_upstreams_expression():
    # fp16 keys mapped onto float32 CLIP keys on the CPU (PROXY.CASS.KEY_PRECISION fp16): upstream's
    # `normalized * (k_max - k_min) + k_min` multiplies by the float32 span, then adds k_min rounded to
    # fp16; rounding the span to fp16 first (this function until 2026-12-02) moves ~40 % of the entries
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(4, 64, 16, generator=g) * 2.5).half()
    ref = torch.randn(4, 64, 16, generator=g) * 1.7
    out = match_range(x, ref)
    assert out.dtype == torch.float16
    lo, hi = x.min().float(), x.max().float()
    unit = ((x.float() - lo).half().float() / (hi - lo).half().float()).half()  # fp16 ops, as (x - lo) / (hi - lo)
    span = (ref.max() - ref.min()).item()
    by_hand = ((unit.float() * span).half().float() + ref.min().half().float()).half()
    assert torch.equal(out, by_hand)
    span_rounded = ((unit * torch.tensor(span).half()) + ref.min().half())
    assert (out != span_rounded).float().mean() > 0.2


def test_upstream_proxy_input_matches_pil():
    """``INPUT upstream``: CASS's inverse normalisation, ``astype('uint8')``, PIL's bicubic resize to
    the short side (cass_segmentor.py forward_feature, clip/model.py forward): the same pixels as
    PIL gives, for square windows (no resize) and squashed ones (wide and tall)."""
    from PIL import Image

    proxy = _proxy()
    mean, std = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
    g = torch.Generator().manual_seed(5)
    for H, W in ((48, 48), (48, 80), (72, 96), (96, 72)):  # torch's antialiased bicubic is off by a grey level at 72 x 96
        side = min(H, W)
        rgb = torch.rand(3, H, W, generator=g)
        x = (rgb - torch.tensor(mean).view(3, 1, 1)) / torch.tensor(std).view(3, 1, 1)
        inv = (x * torch.tensor([0.229, 0.224, 0.255]).view(3, 1, 1) + torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1))
        img = Image.fromarray((inv.permute(1, 2, 0).numpy() * 255).astype("uint8")).resize((side, side), Image.BICUBIC)
        px = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).float() / 255
        ref = (px - torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)) / torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
        out = cass_proxy_input(x, mean, std, proxy, "upstream")[0]
        ph, pw = proxy.patch
        ref = ref[:, :side - side % ph, :side - side % pw]
        assert out.shape == ref.shape
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)  # the same uint8 pixels, normalised alike


# ------------------------------------------------------------------ the CASS block
def _brute_pairs(clip_g, prox_g, k, pairs):
    """CASS's matching checked by hand: the cost by loops (numpy spectra); ``pairs`` (the
    registered matching's) must reach the minimum over all permutations. Random tiny towers
    give exact ties (the range-mapped proxy spectra all dominate CLIP's at the same ranks, so
    the cost separates into row + column terms and every assignment costs the same), and any
    minimiser is then CASS's; the unique-optimum case is test_spectral_matching_is_the_cheapest_
    assignment. Returns ``pairs`` and the weights 10 (1 - cost)."""
    H = clip_g.shape[0]

    def prob(g):
        v = np.sort(np.linalg.eigvalsh(g))[::-1][:k]
        v = v / np.sqrt((v * v).sum())
        return np.sort(v / np.abs(v).sum())

    cost = np.array([[1 - np.abs(prob(prox_g[i]) - prob(clip_g[j])).sum() for j in range(H)] for i in range(H)],
                    dtype=np.float32).astype(np.float64)
    best = min(sum(cost[i, p[i]] for i in range(H)) for p in itertools.permutations(range(H)))
    p = [int(j) for j in pairs]
    assert sorted(p) == list(range(H)) and sum(cost[i, p[i]] for i in range(H)) <= best + 1e-6
    return p, [10.0 * (1 - cost[i, p[i]]) for i in range(H)]


def cass_block_reference(clip, proxy, x, normalizer, rank=3, k=6, low=0.5, high=1.5, temperature=1.0):
    """The CASS last block of one 64 px window (CLIP 4 x 4, DINO B/8 8 x 8), float64 by hand:
    ``(patch embeddings (16, D), CLS embedding (D,), weights (heads, 16, 16))``."""
    mean, std = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
    px = ((x.double() * torch.tensor(std).view(3, 1, 1) + torch.tensor(mean).view(3, 1, 1))
          - torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)) / torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
    m = copy.deepcopy(proxy.model).double()
    with torch.no_grad():  # DINO's last-block keys on 64 px (its position embeddings resized by the proxy, test_proxy.py)
        pos = proxy._pos_embed((8, 8), "cpu", torch.float64)
        t = m.patch_embed.proj(px[None]).flatten(2).transpose(1, 2)
        t = torch.cat([m.cls_token.expand(1, -1, -1), t], 1) + pos
        for blk in m.blocks[:-1]:
            t = blk(t)
        y = m.blocks[-1].norm1(t)
        C = y.shape[-1]
        dk = (y @ m.blocks[-1].attn.qkv.weight[C:2 * C].T + m.blocks[-1].attn.qkv.bias[C:2 * C])[0, 1:]  # (64, C)
        v64 = copy.deepcopy(clip.visual).double()
        enc = CASSEncoder(clip.visual, AttentionSpec(), proxy)
        cpos = enc.positional_embedding((4, 4), "cpu", torch.float32).double()
        z = v64.conv1(x.double()[None]).flatten(2).transpose(1, 2)
        z = torch.cat([v64.class_embedding.view(1, 1, -1), z], 1) + cpos
        z = v64.ln_pre(z)
        for blk in v64.transformer.resblocks[:-1]:
            z = blk(z)
        blk = v64.transformer.resblocks[-1]
        cls = v64.ln_post(blk(z)[0, 0]) @ v64.proj
        y = blk.ln_1(z)[0]
        W, bias = blk.attn.in_proj_weight, blk.attn.in_proj_bias
        H = blk.attn.num_heads
        d = C // H
        kk = (y @ W[C:2 * C].T + bias[C:2 * C])[1:]  # (16, C)
        vv = (y @ W[2 * C:].T + bias[2 * C:])[1:]
    # DINO keys per head, resized 8 x 8 -> 4 x 4, mapped onto CLIP's key range (all heads)
    dkh = torch.stack([bilinear_reference(dk[:, h * d:(h + 1) * d].reshape(8, 8, d), 4, 4).reshape(16, d)
                       for h in range(H)])
    ckh = torch.stack([kk[:, h * d:(h + 1) * d] for h in range(H)])
    dkh = (dkh - dkh.min()) / (dkh.max() - dkh.min()) * (ckh.max() - ckh.min()) + ckh.min()
    cg = torch.stack([ckh[h] @ ckh[h].T / math.sqrt(d) for h in range(H)])
    pg = torch.stack([dkh[h] @ dkh[h].T / math.sqrt(d) for h in range(H)])
    ours = get_head_matching("spectral")(cg.float(), pg.float(), k_eigen=k, scale_factor=10.0)[0]
    pairs, mix = _brute_pairs(cg.numpy(), pg.numpy(), k, ours)
    rows = torch.arange(16)
    prior = torch.exp(-((rows[:, None] // 4 - rows[None] // 4) ** 2 + (rows[:, None] % 4 - rows[None] % 4) ** 2)
                      .double() / (2 * 5.0 ** 2))
    weights, outs = [], []
    for i in range(H):
        u, s, vh = np.linalg.svd(pg[pairs[i]].numpy())
        ss = s[:rank]
        ss = (ss - ss.min()) / (ss.max() - ss.min()) * (high * ss.max() - low * ss.min()) + low * ss.min()
        g = torch.from_numpy((u[:, :rank] * ss) @ vh[:rank])
        g.fill_diagonal_(0)
        g = (g - g.min()) / (g.max() - g.min()) * (cg[i].max() - cg[i].min()) + cg[i].min()
        sc = (mix[i] * g + cg[i]) / (mix[i] + 1) / temperature + prior
        w = entmax_bisect_reference(sc, 1.2) if normalizer == "entmax" else torch.softmax(sc, -1)
        weights.append(w)
        outs.append(w @ vv[:, i * d:(i + 1) * d])
    o = torch.cat(outs, -1) @ blk.attn.out_proj.weight.T + blk.attn.out_proj.bias
    return v64.ln_post(o) @ v64.proj, cls, torch.stack(weights)


@pytest.mark.parametrize("normalizer", ["entmax", "softmax"])
def test_cass_block_matches_float64_reference(clip, normalizer):
    """The whole CASS last block with NORMALIZER entmax 1.2 (and upstream's softmax), KK source,
    gaussian prior std 5, spectral matching, exact rank-3 SVD with the [0.5, 1.5] stretch, no
    residual / FFN, ``INPUT exact``, against float64 by hand; the CLS is the unmodified block's.
    entmax runs at temperature 0.1 (the tiny tower's scores span too little for zeros at 1)."""
    proxy = _proxy()
    t = 0.1 if normalizer == "entmax" else 1.0
    x = torch.randn(3, 64, 64, generator=torch.Generator().manual_seed(4)) * 0.5
    enc = CASSEncoder(clip.visual, AttentionSpec(source="kk", normalizer=normalizer, alpha=1.2, temperature=t,
                                                 prior="gaussian", prior_std=5.0, residual=False, ffn=False), proxy,
                      cass=CASSSettings(rank=3, k_eigen=6, svd="exact", input="exact"))
    tokens, grid, attn = enc.forward_tokens(x[None])
    feats = enc.dense_embedding(tokens, grid)
    ref, cls, w = cass_block_reference(clip, proxy, x, normalizer, temperature=t)
    torch.testing.assert_close(attn[0].double(), w, rtol=0, atol=1e-5)
    torch.testing.assert_close(feats[0].double(), ref.T.reshape(-1, 4, 4), rtol=0, atol=1e-4)
    torch.testing.assert_close(enc.pooled_embedding(tokens)[0].double(), cls, rtol=0, atol=1e-5)
    if normalizer == "entmax":
        assert bool((attn == 0).any()), "entmax 1.2 on the CASS scores gave no exact zeros"


def test_randomized_svd_is_seeded_per_window_and_leaves_the_global_rng(clip):
    proxy = _proxy()
    spec = AttentionSpec(source="kk", prior="gaussian", residual=False, ffn=False)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(6)) * 0.5
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a = CASSEncoder(clip.visual, spec, proxy, cass=CASSSettings(rank=3, k_eigen=6))(x)
    assert torch.equal(torch.get_rng_state(), state)
    b = CASSEncoder(clip.visual, spec, proxy, cass=CASSSettings(rank=3, k_eigen=6))(x[1:])
    torch.testing.assert_close(a[1:], b, rtol=0, atol=0)  # each window draws from SEED alone
    c = CASSEncoder(clip.visual, spec, proxy, cass=CASSSettings(rank=3, k_eigen=6, seed=1))(x)
    assert not torch.equal(a, c)


def test_cass_refuses_what_it_cannot_honour(clip):
    proxy = _proxy()
    with pytest.raises(ValueError, match=r"ATTENTION\.SOURCE 'qq\+kk'"):
        CASSEncoder(clip.visual, AttentionSpec(source="qq+kk"), proxy)
    with pytest.raises(ValueError, match=r"ATTENTION\.MIX\.LAYERS"):
        CASSEncoder(clip.visual, AttentionSpec(mix=MixOptions(layers=(0,))), proxy)
    with torch.random.fork_rng(devices=[]):
        tokens_proxy = build_proxy(ProxyOptions(name=DINO))
    with pytest.raises(ValueError, match="FEATURE keys"):
        CASSEncoder(clip.visual, AttentionSpec(), tokens_proxy)


# ------------------------------------------------------------------ object presence
def test_object_presence_text_and_logits_by_hand():
    from sparseclip_d2.methods.cass.object_presence import (ObjectPresence, object_presence_logits, object_presence_text,
                                                        text_clusters)

    g = torch.Generator().manual_seed(7)
    base = F.normalize(torch.randn(2, 8, generator=g), dim=-1)
    text = F.normalize(torch.cat([base[:1] + 0.05 * torch.randn(2, 8, generator=g),
                                  base[1:] + 0.05 * torch.randn(3, 8, generator=g)]), dim=-1)
    clusters = text_clusters(text, 0.5)
    assert clusters[0] == clusters[1] and len(set(clusters[2:].tolist())) == 1 and clusters[0] != clusters[2]
    assert len(set(text_clusters(text, 0.0).tolist())) == 5  # threshold 0: every synonym alone
    feats = F.normalize(torch.randn(6, 8, generator=g), dim=-1)
    glob = F.normalize(torch.randn(8, generator=g), dim=-1)
    gs = text @ glob
    out = object_presence_text(feats, text, gs, clusters, 0.3, top_k=2)
    ref = text.double().clone()
    for members in ([0, 1], [2, 3, 4]):
        best = max(members, key=lambda s: float(gs[s]))
        sims = [float(feats[n].double() @ text[best].double()) for n in range(6)]
        top = sorted(range(6), key=lambda n: -sims[n])[:2]
        mvec = (feats[top[0]].double() + feats[top[1]].double()) / 2
        mvec = mvec / mvec.norm()
        new = 0.7 * text[best].double() + 0.3 * mvec
        ref[best] = new / new.norm()
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=1e-6)
    p = ObjectPresence(global_weight=0.25, mean_weight=0.3, cluster_threshold=0.5)
    lg = object_presence_logits(feats.T.reshape(1, 8, 2, 3), glob[None], text, clusters, p)
    want = 0.75 * (feats.double() @ ref.T) + 0.25 * gs.double()[None]
    torch.testing.assert_close(lg[0].double(), want.T.reshape(5, 2, 3), rtol=0, atol=1e-6)


# ------------------------------------------------------------------ keys and configs
_CASS = {"MODEL.SPARSECLIP.PROXY.NAME": DINO, "MODEL.SPARSECLIP.PROXY.FEATURE": "keys",
         "MODEL.SPARSECLIP.PROXY.CASS.ENABLED": "True", "MODEL.SPARSECLIP.PROXY.CASS.RANK": "3",
         "MODEL.SPARSECLIP.PROXY.CASS.K_EIGEN": "6", "MODEL.SPARSECLIP.ATTENTION.SOURCE": "kk",
         "MODEL.SPARSECLIP.ATTENTION.PRIOR": "gaussian", "MODEL.SPARSECLIP.BLOCK.RESIDUAL": "False",
         "MODEL.SPARSECLIP.BLOCK.FFN": "False"}


def _model(**opts):
    from detectron2.modeling import build_model

    return build_model(tiny_cfg(**opts))


def test_cass_and_object_presence_through_the_meta_arch():
    """The keys reach the model; the object-presence logits of the META_ARCH are the part's on
    the encoder's features, with the unmodified tower's CLS of the whole image."""
    from sparseclip_d2.methods.cass.object_presence import object_presence_logits, text_clusters

    op = {"MODEL.SPARSECLIP.OBJECT_PRESENCE.ENABLED": "True", "MODEL.SPARSECLIP.OBJECT_PRESENCE.GLOBAL_WEIGHT": "0.2",
          "MODEL.SPARSECLIP.OBJECT_PRESENCE.MEAN_WEIGHT": "0.1",
          "MODEL.SPARSECLIP.OBJECT_PRESENCE.CLUSTER_THRESHOLD": "0.3"}
    m = _model(**_CASS, **{"MODEL.SPARSECLIP.PROXY.CASS.SINGULAR_SCALE": "[1.0, 1.0]",
                           "MODEL.SPARSECLIP.PROXY.CASS.SVD": "exact", "MODEL.SPARSECLIP.PROXY.CASS.SEED": "3",
                           "MODEL.SPARSECLIP.PROXY.CASS.MATCHING": "sequential",
                           "MODEL.SPARSECLIP.PROXY.CASS.SCALE_FACTOR": "5.0",
                           "MODEL.SPARSECLIP.PROXY.CASS.KEY_PRECISION": "fp16",
                           "MODEL.SPARSECLIP.PROXY.CASS.INPUT": "exact"}, **op)
    c = m.encoder.cass
    assert type(m.encoder).__name__ == "CASSEncoder"
    assert (c.rank, c.k_eigen, c.singular_low, c.singular_high, c.svd, c.seed, c.matching, c.scale_factor,
            c.key_precision, c.input) == (3, 6, 1.0, 1.0, "exact", 3, "sequential", 5.0, "fp16", "exact")
    p = m.head.settings
    assert (p.global_weight, p.mean_weight, p.cluster_threshold, p.top_k, p.global_source) == (0.2, 0.1, 0.3, 2,
                                                                                               "image")
    image = torch.randn(3, 64, 80, generator=torch.Generator().manual_seed(3))
    text = F.normalize(torch.randn(4, 32, generator=torch.Generator().manual_seed(4)), dim=-1)
    with torch.no_grad():
        got = m.synonym_logits(image, text)
        enc = m.head.native_encoder
        tokens, _, _ = enc.forward_tokens(image[None, :, :64, :80])
        glob = F.normalize(enc.pooled_embedding(tokens).float(), dim=-1)
        feats = F.normalize(m.encoder(image[None]).float(), dim=1)
        want = m.logit_scale * object_presence_logits(feats, glob, text, text_clusters(text, 0.3), p)
        want = F.interpolate(want, size=(64, 80), mode="bilinear", align_corners=False)
    torch.testing.assert_close(got, want[0], rtol=0, atol=1e-4)
    w = _model(**_CASS, **op, **{"MODEL.SPARSECLIP.OBJECT_PRESENCE.GLOBAL": "window",
                                 "MODEL.SPARSECLIP.OBJECT_PRESENCE.TOP_K": "3"})
    assert w.head.settings.global_source == "window" and w.head.settings.top_k == 3 and w.head.native_encoder is None


def test_the_proxy_sees_the_whole_window_of_a_truncated_crop():
    """Upstream's DINO sees the whole image while CLIP's conv1 drops the remainder (CASS clip/model.py
    forward): under PATCH_REMAINDER truncate the META_ARCH hands the encoder the whole window
    (``windows=``) and only the proxy reads it. An 64 x 88 image (88 = 5 patches of 16 + 8)."""
    m = _model(**_CASS, **{"MODEL.SPARSECLIP.PATCH_REMAINDER": "truncate", "MODEL.SPARSECLIP.PROXY.CASS.SVD": "exact"})
    assert m.encoder.needs.whole_windows
    seen = []
    keys = m.encoder.proxy_keys
    m.encoder.proxy_keys = lambda window, grid, clip_keys: seen.append(tuple(window.shape)) or keys(window, grid,
                                                                                                      clip_keys)
    image = torch.randn(3, 64, 88, generator=torch.Generator().manual_seed(5))
    text = F.normalize(torch.randn(3, 32, generator=torch.Generator().manual_seed(6)), dim=-1)
    with torch.no_grad():
        got = m.synonym_logits(image, text)
        whole = m.encoder(image[None, :, :, :80], windows=image[None])
        crop = m.encoder(image[None, :, :, :80])
    assert seen == [(3, 64, 88), (3, 64, 88), (3, 64, 80)]  # the META_ARCH's window, then the two calls above
    want = F.interpolate(m.logit_scale * torch.einsum("bdhw,sd->bshw", F.normalize(whole.float(), dim=1), text),
                         size=(64, 88), mode="bilinear", align_corners=False)[0]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    assert not torch.allclose(whole, crop, atol=1e-3)  # the 8 columns the crop drops change the proxy's keys
    with pytest.raises(ValueError, match="not the whole windows"):
        m.encoder(image[None, :, :, :80], windows=image[None, :, :, :72])


@pytest.mark.parametrize("opts, match", [
    ({"MODEL.SPARSECLIP.PROXY.CASS.ENABLED": "True"}, r"PROXY\.CASS\.ENABLED = True changes nothing without a proxy"),
    ({"MODEL.SPARSECLIP.PROXY.CASS.RANK": "4"}, r"PROXY\.CASS\.RANK = 4 changes nothing while"),
    (dict(_CASS, **{"MODEL.SPARSECLIP.PROXY.CASS.SVD": "lanczos"}), r"PROXY\.CASS\.SVD = 'lanczos' is invalid; valid: "
                                                                    "randomized, exact"),
    (dict(_CASS, **{"MODEL.SPARSECLIP.PROXY.CASS.MATCHING": "greedy"}), r"PROXY\.CASS\.MATCHING: unknown head "
                                                                         "matching 'greedy'"),
    (dict(_CASS, **{"MODEL.SPARSECLIP.PROXY.CASS.SINGULAR_SCALE": "[0.5]"}), r"SINGULAR_SCALE = \[0\.5\] is invalid"),
    (dict(_CASS, **{"MODEL.SPARSECLIP.PROXY.CASS.KEY_PRECISION": "bf16"}), r"KEY_PRECISION = 'bf16' is invalid"),
    (dict(_CASS, **{"MODEL.SPARSECLIP.PROXY.CASS.INPUT": "pil"}), r"CASS\.INPUT = 'pil' is invalid"),
    (dict(_CASS, **{"MODEL.SPARSECLIP.PROXY.FEATURE": "tokens"}), r"FEATURE = 'tokens' .* valid: FEATURE keys"),
    (dict(_CASS, **{"MODEL.SPARSECLIP.PROXY.BETA": "1.0"}), r"PROXY\.BETA = 1\.0 changes nothing with"),
    (dict(_CASS, **{"MODEL.SPARSECLIP.PROXY.FSA.ENABLED": "True"}), r"CASS\.ENABLED and .*FSA\.ENABLED are two different last blocks"),
    (dict(_CASS, **{"MODEL.SPARSECLIP.PROXY.TRIDENT.ENABLED": "True"}), r"CASS\.ENABLED and .*TRIDENT\.ENABLED"),
    (dict(_CASS, **{"MODEL.SPARSECLIP.ATTENTION.SOURCE": "qq+kk"}), r"ATTENTION\.SOURCE 'qq\+kk'"),
    (dict(_CASS, **{"MODEL.SPARSECLIP.PROXY.WEIGHTS": "/no/such/dino.pth"}), r"PROXY\.WEIGHTS = '/no/such/dino\.pth'"),
    ({"MODEL.SPARSECLIP.OBJECT_PRESENCE.MEAN_WEIGHT": "0.1"}, r"OBJECT_PRESENCE\.MEAN_WEIGHT = 0\.1 changes nothing"),
    ({"MODEL.SPARSECLIP.OBJECT_PRESENCE.ENABLED": "True", "MODEL.SPARSECLIP.OBJECT_PRESENCE.GLOBAL": "crop"},
     r"OBJECT_PRESENCE\.GLOBAL = 'crop' is invalid; valid: image, window"),
    ({"MODEL.SPARSECLIP.OBJECT_PRESENCE.ENABLED": "True", "MODEL.SPARSECLIP.OBJECT_PRESENCE.GLOBAL_WEIGHT": "1.5"},
     r"GLOBAL_WEIGHT = 1\.5 is invalid; valid: a number in \[0, 1\]"),
    ({"MODEL.SPARSECLIP.OBJECT_PRESENCE.ENABLED": "True", "MODEL.SPARSECLIP.OBJECT_PRESENCE.TOP_K": "0"},
     r"TOP_K = 0 is invalid"),
    ({"MODEL.SPARSECLIP.OBJECT_PRESENCE.ENABLED": "True", "MODEL.SPARSECLIP.FEATURE_SURGERY.ENABLED": "True"},
     r"FEATURE_SURGERY\.ENABLED cannot be combined with MODEL\.SPARSECLIP\.OBJECT_PRESENCE\.ENABLED"),
    ({"MODEL.SPARSECLIP.OBJECT_PRESENCE.ENABLED": "True", "MODEL.SPARSECLIP.OBJECT_PRESENCE.GLOBAL": "window",
      "MODEL.SPARSECLIP.PROXY.NAME": DINO, "MODEL.SPARSECLIP.BLOCK.FFN": "False"}, r"GLOBAL = 'window' reads"),
])
def test_bad_cass_keys_are_refused_before_any_model_is_built(opts, match, monkeypatch):
    import sparseclip_d2.methods.encoders as pc
    from sparseclip_d2.config import check_sparseclip_config

    def no_build(*a, **k):
        raise AssertionError("a model was built before the keys were checked")

    monkeypatch.setattr(pc, "build_proxy", no_build)
    with pytest.raises((ValueError, FileNotFoundError), match=match):
        check_sparseclip_config(tiny_cfg(**opts))


def test_cass_configs_select_upstreams_values():
    """configs/baselines/cass_b16*.yaml: CASS's protocol (MICV-yonsei/CASS @ 228ecdd) with each of its
    eight dataset configs' values, accepted by the checks run before any model is built."""
    import glob
    import os

    from sparseclip_d2.config import check_sparseclip_config

    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "baselines")
    got = {}
    for path in sorted(glob.glob(os.path.join(root, "cass_b16*.yaml"))):
        cfg = baseline_cfg(path)
        cfg.MODEL.SPARSECLIP.PROXY.WEIGHTS = "none"
        check_sparseclip_config(cfg)
        sc, sw, c, o = cfg.MODEL.SPARSECLIP, cfg.TEST.SLIDING_WINDOW, cfg.MODEL.SPARSECLIP.PROXY.CASS, \
            cfg.MODEL.SPARSECLIP.OBJECT_PRESENCE
        assert (sc.ATTENTION.SOURCE, sc.ATTENTION.NORMALIZER, sc.ATTENTION.PRIOR, sc.ATTENTION.PRIOR_STD,
                sc.BLOCK.RESIDUAL, sc.BLOCK.FFN) == ("kk", "softmax", "gaussian", 5.0, False, False)
        assert (sc.PROXY.NAME, sc.PROXY.FEATURE, sc.PROXY.LAYER, c.ENABLED, c.MATCHING, c.K_EIGEN, c.SCALE_FACTOR,
                c.RANK, c.SVD, c.INPUT) == ("vit_base_patch8_224.dino", "keys", -1, True, "spectral", 20, 10.0, 10,
                                            "randomized", "upstream")
        assert (sc.LOGIT_SCALE, sc.TEXT.TEMPLATES, sc.CLASS_NAMES, sc.PIXEL_NORM, sc.PAMR.STEPS, o.ENABLED,
                o.TOP_K) == (40.0, "openai_imagenet", "naclip", "clip_mmseg", 0, True, 2)
        got[os.path.basename(path)[len("cass_b16"):-5] or "base"] = (
            o.GLOBAL_WEIGHT, o.MEAN_WEIGHT, o.CLUSTER_THRESHOLD, o.GLOBAL, list(c.SINGULAR_SCALE), sc.PROB_THRESHOLD,
            cfg.INPUT.MIN_SIZE_TEST, sw.ENABLED, sw.CROP_SIZE, sw.STRIDE, cfg.DATASETS.TEST)
    s = [0.5, 1.5]
    assert got == {  # configs/cfg_<dataset>.py; the base file is cfg_context59.py
        "base": (0.25, 0.04, 0.09, "image", s, 0.0, 336, True, 224, 112, ("sparseclip_context59_val",)),
        "_voc21": (0.1, 0.03, 0.10, "window", s, 0.1, 336, False, 224, 112, ("sparseclip_voc21_val",)),
        "_voc20": (0.4, 0.02, 0.10, "image", [1.0, 1.0], 0.0, 336, True, 224, 112, ("sparseclip_voc20_val",)),
        "_context60": (0.25, 0.04, 0.09, "image", s, 0.1, 336, True, 224, 112, ("sparseclip_context60_val",)),
        "_coco_object": (0.25, 0.01, 0.10, "image", s, 0.1, 336, True, 224, 112, ("sparseclip_coco_object_val",)),
        "_coco_stuff": (0.2, 0.02, 0.02, "image", s, 0.0, 336, True, 224, 112, ("sparseclip_coco_stuff_val",)),
        "_ade20k": (0.3, 0.05, 0.06, "image", s, 0.0, 336, True, 224, 112, ("sparseclip_ade20k_val",)),
        "_cityscapes": (0.1, 0.03, 0.14, "window", [1.0, 1.0], 0.0, 560, True, 224, 112,
                        ("sparseclip_cityscapes_val",)),
    }


def test_object_presence_keeps_no_state_between_images():
    """The image embedding of OBJECT_PRESENCE GLOBAL image is each image's own: a second image's
    logits do not depend on the image before it, windows encoded without an image context use
    their own embedding (also on a model that never saw an image), and label propagation after
    it gets the image's context too."""
    from sparseclip_d2.methods.cass.object_presence import object_presence_logits, text_clusters

    op = {"MODEL.SPARSECLIP.OBJECT_PRESENCE.ENABLED": "True", "MODEL.SPARSECLIP.OBJECT_PRESENCE.GLOBAL_WEIGHT": "0.3",
          "MODEL.SPARSECLIP.OBJECT_PRESENCE.CLUSTER_THRESHOLD": "0.3"}
    m = _model(**op)
    a = torch.randn(3, 64, 80, generator=torch.Generator().manual_seed(5))
    b = torch.randn(3, 64, 80, generator=torch.Generator().manual_seed(6))
    text = F.normalize(torch.randn(4, 32, generator=torch.Generator().manual_seed(7)), dim=-1)
    f = _model(**op)
    f.load_state_dict(m.state_dict())
    with torch.no_grad():
        fresh = f.encode_logits(b[None], text)  # no image context: the window is the image
        alone = m.synonym_logits(b, text)
        m.synonym_logits(a, text)
        after_a = m.synonym_logits(b, text)
        direct = m.encode_logits(b[None], text)
        enc = m.head.native_encoder
        glob = F.normalize(enc.pooled_embedding(enc.forward_tokens(b[None])[0]).float(), dim=-1)
        want = m.logit_scale * object_presence_logits(F.normalize(m.encoder(b[None]).float(), dim=1), glob, text,
                                                      text_clusters(text, 0.3), m.head.settings)
        with pytest.raises(ValueError, match="context of 4 synonyms for 3 text embeddings"):
            m.encode_logits(b[None], text[:3], context=m.head.image_context(m, b, text))
    torch.testing.assert_close(after_a, alone, rtol=0, atol=0)
    torch.testing.assert_close(direct, want, rtol=0, atol=1e-5)
    torch.testing.assert_close(fresh, want, rtol=0, atol=1e-5)


def test_spectral_head_matching_replays_a_recorded_tie_and_refuses_a_costlier_assignment():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(6, 6, generator=g, dtype=torch.float64)
    graph = (a + a.T).float()
    match = get_head_matching("spectral")
    # every head the same graph on both sides: a constant cost matrix, every assignment ties
    same = graph.expand(3, 6, 6).clone()
    own, _ = match(same, same, k_eigen=4)
    with replaying({"assignment": [[2, 0, 1]]}) as replay:
        pairs, mix = match(same, same, k_eigen=4)
    assert own.tolist() == [0, 1, 2] and pairs.tolist() == [2, 0, 1] and replay.log[0]["replayed"]
    assert torch.allclose(mix, mix[0].expand(3))  # the weights are the (constant) cost's
    # three different graphs: the cheapest assignment is unique, a costlier one is refused
    proxy = torch.stack([graph, graph @ graph / 6, torch.diag(torch.arange(1.0, 7.0))])
    clip = torch.stack([proxy[2] * 2, proxy[0] + 0.1, proxy[1]])
    cost = spectral_cost(graph_spectra(proxy, 4), graph_spectra(clip, 4)).float()
    own, _ = match(clip, proxy, k_eigen=4)
    totals = {p: sum(float(cost[i, p[i]]) for i in range(3)) for p in [(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0),
                                                                      (2, 0, 1), (2, 1, 0)]}
    worst = max(totals, key=totals.get)
    assert totals[worst] - totals[tuple(own.tolist())] > 1e-3
    with replaying({"assignment": [list(worst)]}) as replay:
        pairs, _ = match(clip, proxy, k_eigen=4)
    assert pairs.tolist() == own.tolist() and not replay.log[0]["replayed"]
    assert replay.log[0]["delta"] == pytest.approx(totals[worst] - totals[tuple(own.tolist())], abs=1e-6)


def test_a_replayed_random_state_gives_the_draws_of_that_state(clip):
    """Under the agreement driver's replay, each window's randomized SVD starts from upstream's
    recorded generator state instead of SEED: a state recorded after manual_seed(5) gives SEED 5."""
    proxy = _proxy()
    spec = AttentionSpec(source="kk", prior="gaussian", residual=False, ffn=False)
    x = torch.randn(1, 3, 48, 48, generator=torch.Generator().manual_seed(6)) * 0.5
    five = CASSEncoder(clip.visual, spec, proxy, cass=CASSSettings(rank=3, k_eigen=6, seed=5))(x)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        state = torch.get_rng_state().tolist()
    with replaying({"random state": [state]}) as replay:
        got = CASSEncoder(clip.visual, spec, proxy, cass=CASSSettings(rank=3, k_eigen=6, seed=0))(x)
    torch.testing.assert_close(got, five, rtol=0, atol=0)
    assert replay.unused() == {} and replay.log[-1]["name"] == "random state"
