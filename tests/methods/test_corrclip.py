"""CorrCLIP's parts (``sparseclip_d2.methods.corrclip.encoder``, ``methods/corrclip/parts.py``).

Each part against a hand-written float64 computation: the region restriction (both registered
rules) by loops over token pairs, the DBSCAN region merge against connected components of the
eps-graph (DBSCAN with min_samples 1) written out, the mode label per mask by counting, the
proxy's ``queries+keys`` feature from timm's own modules, and the whole CorrCLIP last block
(main + spatial + semantic branches, ``NORMALIZER entmax`` alpha 1.2 and softmax) in float64
with the mask class tokens run *inside* the token sequence under a boolean attention mask, as
upstream builds it (the encoder runs them as a cross-attention). The ``.npz`` mask files in
upstream's format, the ``MODEL.SPARSECLIP.PROXY.CORRCLIP`` keys and the META_ARCH path. Tiny
towers, random weights, fixed seeds; the comparison with CorrCLIP's own code is in
docs/upstream_agreement.md ("CorrCLIP").
"""
import copy
import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sparseclip_d2.clip import AttentionSpec, build_clip
from sparseclip_d2.proxy import ProxyOptions, build_proxy, to_proxy_input
from sparseclip_d2.methods.corrclip.encoder import (CorrCLIPEncoder, CorrCLIPSettings, REGION_RESTRICTION_REGISTRY,
                                          load_region_mask, merge_regions, region_mode_labels, restrict_to_regions,
                                          upstream_num_spatial, write_region_mask)

from conftest import tiny_cfg
from test_entmax import entmax_bisect_reference  # noqa: E402  (float64 bisection, independent of the kernel)
from test_proxyclip import bilinear_reference  # noqa: E402  (bilinear resize written point by point)
from tiny_models import TINY_CLIP5_NAME

DINO = "sparseclip_tiny_dino8"  # patch 8, native 32 px (4 x 4), CLS


@pytest.fixture(scope="module")
def clip5():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return build_clip(TINY_CLIP5_NAME, "none")


def _proxy(feature="queries+keys", seed=0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build_proxy(ProxyOptions(name=DINO, feature=feature))


# ------------------------------------------------------------------ parts
def test_region_restriction_matches_loops():
    g = torch.Generator().manual_seed(0)
    s = torch.randn(2, 9, 9, generator=g, dtype=torch.float64)
    labels = torch.tensor([[3, 3, 5, 5, 5, 7, 3, 7, 9], [0, 0, 0, 2, 2, 4, 4, 0, 2]])  # minimum = unsegmented
    for name in ("regions", "regions_strict"):
        got = restrict_to_regions(s, labels, name)
        for b in range(2):
            lo = int(labels[b].min())
            mean = float(s[b].mean())
            for i in range(9):
                for j in range(9):
                    li, lj = int(labels[b, i]), int(labels[b, j])
                    if name == "regions":
                        keep = (li == lj and li != lo) or ((li == lo or lj == lo) and float(s[b, i, j]) > mean)
                    else:
                        keep = li == lj
                    want = float(s[b, i, j]) if keep else -math.inf
                    assert float(got[b, i, j]) == pytest.approx(want, abs=1e-6), (name, b, i, j)
    assert sorted(n for n, _ in REGION_RESTRICTION_REGISTRY) == ["regions", "regions_strict"]
    with pytest.raises(ValueError, match="unknown region restriction 'box'; valid: regions, regions_strict"):
        restrict_to_regions(s, labels, "box")


def _dbscan_min1(dist, eps):
    """DBSCAN with min_samples 1 written out: clusters = connected components of dist <= eps,
    numbered in order of their first point (every point is a core point, none is noise)."""
    n = len(dist)
    out = [-1] * n
    c = 0
    for start in range(n):
        if out[start] != -1:
            continue
        stack, out[start] = [start], c
        while stack:
            i = stack.pop()
            for j in range(n):
                if out[j] == -1 and dist[i][j] <= eps:
                    out[j] = c
                    stack.append(j)
        c += 1
    return out


def test_merge_regions_matches_hand_written_dbscan():
    g = torch.Generator().manual_seed(1)
    h, w, C = 4, 6, 8
    base = F.normalize(torch.randn(3, C, generator=g, dtype=torch.float64), dim=1)
    labels = torch.tensor([[0, 0, 1, 1, 2, 2], [0, 3, 1, 1, 2, 2], [4, 4, 5, 5, 6, 6], [4, 4, 5, 5, 6, 0]])
    # regions 1, 4, 5 near direction 0; 2, 6 near direction 1; 3 alone (direction 2): a merge to find
    near = {1: 0, 2: 1, 3: 2, 4: 0, 5: 0, 6: 1, 0: 2}
    feats = torch.stack([base[near[int(v)]] for v in labels.reshape(-1)])
    feats = F.normalize(feats + 0.05 * torch.randn(feats.shape, generator=g, dtype=torch.float64), dim=1)
    for eps in (0.2, 0.01):
        got = merge_regions(labels, feats.float(), eps=eps, min_samples=1)
        values = sorted(set(labels.reshape(-1).tolist()))
        means = []
        for v in values:
            idx = [k for k in range(h * w) if int(labels.reshape(-1)[k]) == v]
            m = sum(feats[k] for k in idx) / len(idx)
            means.append(m / m.norm())
        means = means[1:]  # the unsegmented region (the minimum) takes no part
        sim = [[float(a @ b) for b in means] for a in means]
        top = max(max(r) for r in sim)
        cluster = _dbscan_min1([[top - x for x in r] for r in sim], eps)
        want = labels.clone()
        for v, c in zip(values[1:], cluster):
            want[labels == v] = 10000 + c
        assert torch.equal(got, want), eps
    assert len(set(merge_regions(labels, feats.float(), 0.2).reshape(-1).tolist())) == 4  # 0 + three clusters
    two = torch.tensor([[0, 0, 1], [1, 1, 0]])  # two labels: nothing to merge
    assert torch.equal(merge_regions(two, feats[:6].float()), two)


def test_region_mode_labels_counts_and_breaks_ties_like_torch_mode():
    labels = torch.tensor([[1, 1, 2, 5], [3, 3, 2, 5], [3, 3, 0, 0]])
    mask = torch.tensor([[7, 7, 7, 9], [4, 4, 7, 9], [4, 4, 2, 2]])  # 2 = the minimum: unsegmented
    got = region_mode_labels(labels, mask)
    want = labels.clone()
    for v in (4, 7, 9):
        sel = mask == v
        vals = labels[sel].tolist()
        counts = {c: vals.count(c) for c in set(vals)}
        best = max(counts.values())
        want[sel] = min(c for c, n in counts.items() if n == best)  # region 7: 1, 1, 2, 2 -> 1
        assert int(want[sel][0]) == int(torch.mode(labels[sel])[0])
    assert torch.equal(got, want) and int(got[0, 2]) == 1 and torch.equal(got[2, 2:], labels[2, 2:])


def test_queries_plus_keys_feature_from_timms_modules():
    proxy = _proxy()
    m = copy.deepcopy(proxy.model).double()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    with torch.no_grad():
        t = m.patch_embed(x)
        t = torch.cat([m.cls_token.expand(2, -1, -1), t], 1) + m.pos_embed  # native 4 x 4 grid
        for blk in m.blocks[:-1]:
            t = blk(t)
        qkv = m.blocks[-1].attn.qkv(m.blocks[-1].norm1(t))  # (B, 17, 3C): CorrCLIP's hooked output
        C = qkv.shape[-1] // 3
        want = (qkv[..., :C] + qkv[..., C:2 * C])[:, 1:]  # qkv[0] + qkv[1] without CLS
        got = proxy(x.float())
    torch.testing.assert_close(got.double(), want.transpose(1, 2).reshape(2, C, 4, 4), rtol=0, atol=1e-5)


def test_npz_masks_in_upstreams_format_and_their_errors(tmp_path):
    m = np.arange(12, dtype=np.int64).reshape(3, 4) % 5
    p = str(tmp_path / "img_001.npz")
    write_region_mask(p, m)
    with np.load(p) as z:  # as corrclip_segmentor.py generate_mask reads it
        assert z.files == ["instance_mask"] and np.array_equal(z["instance_mask"], m)
    assert torch.equal(load_region_mask(p, image_hw=(3, 4)), torch.from_numpy(m))
    key = "MODEL.SPARSECLIP.PROXY.CORRCLIP.MASK_DIR"
    with pytest.raises(FileNotFoundError, match=f"{key}.*no region mask '.*missing.npz'"):
        load_region_mask(str(tmp_path / "missing.npz"))
    with pytest.raises(ValueError, match="is 3x4 \\(HxW\\) but its image is 4x3"):
        load_region_mask(p, image_hw=(4, 3))
    np.savez(str(tmp_path / "other.npz"), mask=m)
    with pytest.raises(ValueError, match="has no array 'instance_mask'"):
        load_region_mask(str(tmp_path / "other.npz"))
    np.savez(str(tmp_path / "big.npz"), instance_mask=m + 10000)
    with pytest.raises(ValueError, match="holds label 10004; valid: labels < 10000"):
        load_region_mask(str(tmp_path / "big.npz"))


# ------------------------------------------------------------------ the last block in float64
def _dino_qk64(proxy, x):
    """The proxy's (queries + keys) features of CLIP-normalised ``x`` (B, 3, 32, 32), float64,
    by timm's own modules at DINO's native 4 x 4 grid: ``(B, 16, C')``."""
    mean, std = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)  # CLIP's
    px = ((x.double() * torch.tensor(std).view(3, 1, 1) + torch.tensor(mean).view(3, 1, 1))
          - torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)) / torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
    m = copy.deepcopy(proxy.model).double()
    with torch.no_grad():
        t = torch.cat([m.cls_token.expand(x.shape[0], -1, -1), m.patch_embed(px)], 1) + m.pos_embed
        for blk in m.blocks[:-1]:
            t = blk(t)
        qkv = m.blocks[-1].attn.qkv(m.blocks[-1].norm1(t))
    C = qkv.shape[-1] // 3
    return (qkv[..., :C] + qkv[..., C:2 * C])[:, 1:]


def corrclip_reference64(clip, proxy, x, masks, normalizer, tau=4.0, weights=(1.0, 0.5), eps=0.2):
    """CorrCLIP's last block of each 32 px window by hand in float64 (upstream's formulation:
    the mask class tokens prepended to the sequence, a boolean mask letting each read only CLS
    and its region's patches, every block run on the whole sequence). CLIP grid 2 x 2, DINO 4 x 4.
    Returns ``(B, D, 4, 4)`` and the ``(B, 16, 16)`` weights."""
    v64 = copy.deepcopy(clip.visual).double()
    enc = CorrCLIPEncoder(clip.visual, AttentionSpec(residual=False, ffn=False), proxy)
    pos = enc.positional_embedding((2, 2), "cpu", torch.float32).double()  # (tested in test_encoder.py)
    depth = len(v64.transformer.resblocks)
    ns = upstream_num_spatial(depth)
    qk = _dino_qk64(proxy, x)
    outs, all_w = [], []
    for b in range(x.shape[0]):
        f = qk[b] / qk[b].norm(dim=1, keepdim=True)
        sim = f @ f.T
        lab4 = masks[b][0::8, 0::8].long()  # 'nearest' 32 -> 4
        merged = merge_regions(lab4, f.float(), eps=eps)  # (tested above against a written-out DBSCAN)
        lab = merged.reshape(-1)
        lo, mean = int(lab.min()), float(sim.mean())
        s = torch.full_like(sim, -math.inf)
        for i in range(16):
            for j in range(16):
                li, lj = int(lab[i]), int(lab[j])
                if (li == lj and li != lo) or ((li == lo or lj == lo) and float(sim[i, j]) > mean):
                    s[i, j] = sim[i, j] * tau
        w = entmax_bisect_reference(s, 1.2) if normalizer == "entmax" else torch.softmax(s, -1)
        all_w.append(w)
        lab2 = merged[0::2, 0::2].reshape(-1)  # 'nearest' 4 -> 2 (CLIP's grid)
        vals = sorted(set(lab2.tolist()))
        M = len(vals)
        with torch.no_grad():
            t = v64.conv1(x[b:b + 1].double()).flatten(2).transpose(1, 2)
            t = v64.ln_pre(torch.cat([v64.class_embedding.view(1, 1, -1), t], 1) + pos)  # (1, 5, C)
            seq = torch.cat([t[:, :1].expand(1, M, -1), t], 1)  # [mct x M, CLS, 4 patches]
            allow = torch.zeros(M + 5, M + 5, dtype=torch.bool)
            allow[M:, M:] = True
            for r, v in enumerate(vals):
                allow[r, M] = True
                allow[r, M + 1:] = lab2 == v
            add = torch.zeros(M + 5, M + 5, dtype=torch.float64).masked_fill(~allow, -math.inf)
            spatial = []
            for i, blk in enumerate(v64.transformer.resblocks[:-1]):
                seq = blk(seq, attn_mask=add)
                if depth - 2 - ns <= i <= depth - 3:
                    spatial.append(seq[:, M:])
            blk = v64.transformer.resblocks[-1]
            mct = blk(seq, attn_mask=add)[0, :M]
            C = t.shape[-1]
            H = blk.attn.num_heads
            Wv, bv = blk.attn.in_proj_weight[2 * C:], blk.attn.in_proj_bias[2 * C:]
            branch = []
            for stream in (seq[:, M:], torch.stack(spatial).mean(0)):
                v = blk.ln_1(stream)[0] @ Wv.T + bv  # (5, C)
                heads = []
                for hh in range(H):
                    vh = v[1:, hh * C // H:(hh + 1) * C // H].reshape(2, 2, -1)
                    heads.append(w @ bilinear_reference(vh, 4, 4).reshape(16, -1))
                branch.append(torch.cat(heads, -1) @ blk.attn.out_proj.weight.T + blk.attn.out_proj.bias)
            region_of = [vals.index(int(lab2[(i // 4 // 2) * 2 + (i % 4) // 2])) for i in range(16)]
            sem = torch.stack([mct[r] for r in region_of])
            tok = (v64.ln_post(branch[0]) + v64.ln_post(branch[1]) * weights[0] + v64.ln_post(sem) * weights[1])
            outs.append((tok @ v64.proj).T.reshape(-1, 4, 4))
    return torch.stack(outs), torch.stack(all_w)


@pytest.mark.parametrize("normalizer", ["entmax", "softmax"])
def test_corrclip_last_block_matches_float64_reference(clip5, normalizer):
    """The whole CorrCLIP block (NORMALIZER entmax alpha 1.2, and CorrCLIP's softmax) against
    float64 by hand, two windows with different regions (one with unsegmented pixels)."""
    proxy = _proxy()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(4)) * 0.5
    masks = torch.zeros(2, 32, 32, dtype=torch.long)
    masks[0, :16, :16], masks[0, :16, 16:], masks[0, 16:, :] = 1, 2, 3  # every pixel labelled: 1 (the min) is unsegmented
    masks[1, :, :8], masks[1, :, 8:20], masks[1, :16, 20:] = 0, 5, 6
    masks[1, 16:, 20:] = 8
    enc = CorrCLIPEncoder(clip5.visual, AttentionSpec(normalizer=normalizer, alpha=1.2, residual=False, ffn=False),
                          proxy)
    assert enc.num_spatial == 1  # upstream's rule on 5 blocks: depth - 4
    with torch.no_grad():
        ours, attn = enc(x, return_attention=True, region_masks=masks)
    ref, w = corrclip_reference64(clip5, proxy, x, masks, normalizer)
    torch.testing.assert_close(attn[:, 0].double(), w, rtol=0, atol=1e-5)
    torch.testing.assert_close(ours.double(), ref, rtol=0, atol=1e-4)
    assert bool(torch.isfinite(ours).all())
    if normalizer == "entmax":
        zero = attn[:, 0] == 0
        assert bool(zero.any()) and bool((zero == (w == 0)).all())


def test_branch_weights_and_restriction_take_effect(clip5):
    proxy = _proxy()
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(5)) * 0.5
    masks = torch.zeros(1, 32, 32, dtype=torch.long)
    masks[0, 8:, 8:] = 4
    masks[0, 20:, :] = 7
    spec = AttentionSpec(residual=False, ffn=False)
    out = {}
    for name, s in (("base", CorrCLIPSettings()), ("nosem", CorrCLIPSettings(semantic_weight=0.0)),
                    ("nosp", CorrCLIPSettings(spatial_weight=0.0)), ("strict", CorrCLIPSettings(restriction="regions_strict"))):
        with torch.no_grad():
            out[name] = CorrCLIPEncoder(clip5.visual, spec, proxy, settings=s)(x, region_masks=masks)
    for name in ("nosem", "nosp", "strict"):
        assert not torch.allclose(out[name], out["base"]), name
    with pytest.raises(ValueError, match="NUM_SPATIAL = 4.*valid: 1 .. 3"):
        CorrCLIPEncoder(clip5.visual, spec, proxy, settings=CorrCLIPSettings(num_spatial=4))
    with pytest.raises(ValueError, match="BLOCK.RESIDUAL False"):
        CorrCLIPEncoder(clip5.visual, AttentionSpec(), proxy)


# ------------------------------------------------------------------ keys and the META_ARCH
CORR = {"MODEL.SPARSECLIP.CLIP.NAME": TINY_CLIP5_NAME, "MODEL.SPARSECLIP.PROXY.NAME": DINO,
        "MODEL.SPARSECLIP.PROXY.FEATURE": "queries+keys", "MODEL.SPARSECLIP.PROXY.CORRCLIP.ENABLED": "True",
        "MODEL.SPARSECLIP.BLOCK.RESIDUAL": "False", "MODEL.SPARSECLIP.BLOCK.FFN": "False"}


def _cfg(mask_dir, **opts):
    return tiny_cfg(**dict(CORR, **{"MODEL.SPARSECLIP.PROXY.CORRCLIP.MASK_DIR": str(mask_dir)}, **opts))


@pytest.mark.parametrize("opts, exc, match", [
    ({"MODEL.SPARSECLIP.PROXY.CORRCLIP.ENABLED": "False"}, ValueError,
     "CORRCLIP.MASK_DIR = .* changes nothing while MODEL.SPARSECLIP.PROXY.CORRCLIP.ENABLED is False"),
    ({"MODEL.SPARSECLIP.PROXY.CORRCLIP.MASK_DIR": "/no/such/dir"}, FileNotFoundError,
     "CORRCLIP.MASK_DIR = '/no/such/dir': no such directory"),
    ({"MODEL.SPARSECLIP.PROXY.CORRCLIP.RESTRICTION": "boxes"}, ValueError,
     "RESTRICTION = 'boxes' is invalid; valid: regions, regions_strict"),
    ({"MODEL.SPARSECLIP.PROXY.CORRCLIP.TAU": "0.0"}, ValueError, "TAU = 0.0 is invalid; valid: a number > 0"),
    ({"MODEL.SPARSECLIP.PROXY.CORRCLIP.NUM_SPATIAL": "0"}, ValueError, "NUM_SPATIAL = 0 is invalid"),
    ({"MODEL.SPARSECLIP.PROXY.CORRCLIP.DBSCAN_MIN_SAMPLES": "0"}, ValueError, "DBSCAN_MIN_SAMPLES = 0 is invalid"),
    ({"MODEL.SPARSECLIP.PROXY.FSA.ENABLED": "True"}, ValueError,
     r"PROXY\.CORRCLIP\.ENABLED and MODEL\.SPARSECLIP\.PROXY\.FSA\.ENABLED are two different last blocks"),
    ({"MODEL.SPARSECLIP.PROXY.TRIDENT.ENABLED": "True"}, ValueError, "TRIDENT"),
    ({"MODEL.SPARSECLIP.PROXY.CASS.ENABLED": "True"}, ValueError, "CASS"),
    ({"MODEL.SPARSECLIP.BLOCK.FFN": "True"}, ValueError, "cannot be combined with MODEL.SPARSECLIP.BLOCK.FFN"),
    ({"MODEL.SPARSECLIP.PROXY.BETA": "1.0"}, ValueError, "BETA = 1.0 changes nothing with"),
    ({"MODEL.SPARSECLIP.PROXY.NAME": ""}, ValueError, "CORRCLIP.ENABLED = True changes nothing without a proxy"),
])
def test_bad_corrclip_keys_are_refused_before_any_model_is_built(tmp_path, opts, exc, match, monkeypatch):
    from sparseclip_d2.config import check_sparseclip_config
    import sparseclip_d2.modeling.backbone as mb

    monkeypatch.setattr(mb, "build_clip_from_config", lambda cfg: pytest.fail("a model was built"))
    if opts.get("MODEL.SPARSECLIP.PROXY.CORRCLIP.ENABLED") == "False":
        opts = dict(opts, **{"MODEL.SPARSECLIP.PROXY.CORRCLIP.MASK_DIR": str(tmp_path)})
    cfg = _cfg(tmp_path)
    for k, v in opts.items():
        cfg.merge_from_list([k, v])
    with pytest.raises(exc, match=match):
        check_sparseclip_config(cfg)


def test_corrclip_through_the_meta_arch(tmp_path, monkeypatch):
    """The META_ARCH reads <MASK_DIR>/<stem>.npz (relative MASK_DIR under $DETECTRON2_DATASETS),
    cuts it into the windows beside the image, and each mask region gets one label; a missing
    file names the key and the path."""
    from detectron2.modeling import build_model

    monkeypatch.setenv("DETECTRON2_DATASETS", str(tmp_path))
    os.makedirs(tmp_path / "masks")
    H, W = 40, 56  # not multiples of 16: padded windows, masks padded with 10000
    mask = np.zeros((H, W), dtype=np.int64)
    mask[:20, :30], mask[20:, :30], mask[:, 30:] = 1, 2, 3
    mask[:6, :6] = 0  # unsegmented: keeps its own labels
    write_region_mask(str(tmp_path / "masks" / "photo.npz"), mask)
    cfg = _cfg("masks", **{"TEST.SLIDING_WINDOW.ENABLED": "True", "TEST.SLIDING_WINDOW.CROP_SIZE": "32",
                           "TEST.SLIDING_WINDOW.STRIDE": "16", "MODEL.SPARSECLIP.PROB_THRESHOLD": "0.0"})
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    assert type(model.encoder).__name__ == "CorrCLIPEncoder" and model.encoder.settings.mask_dir == "masks"
    img = torch.randint(0, 255, (3, H, W), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    x = {"image": img, "height": H, "width": W, "file_name": "/any/where/photo.jpg",
         "vocabulary": ["cat", "dog", "sky", "road", "tree"]}
    with torch.no_grad():
        labels = model([x])[0]["sem_seg_labels"]
    assert labels.shape == (H, W)
    for v in (1, 2, 3):
        assert torch.unique(labels[torch.from_numpy(mask) == v]).numel() == 1, v
    with torch.no_grad():
        given = model([dict(x, region_mask=torch.from_numpy(mask))])[0]["sem_seg_labels"]
    assert torch.equal(given, labels)
    with pytest.raises(FileNotFoundError, match=r"CORRCLIP.MASK_DIR: no region mask '.*masks/other.npz'"):
        with torch.no_grad():
            model([dict(x, file_name="/x/other.png")])


def test_dense_logits_cuts_and_pads_the_side_map_like_the_image():
    """The region mask is cut into the same windows as the image and padded with 10000 where
    the image is zero-padded (corrclip_segmentor.py forward_slide)."""
    from sparseclip_d2.dense.windows import dense_logits, symmetric_pad, window_grid

    H, W = 40, 70
    image = torch.randn(3, H, W, generator=torch.Generator().manual_seed(6))
    side = torch.arange(H * W).reshape(H, W)
    seen = []

    def fn(crops, masks):
        seen.append((crops.clone(), masks.clone()))
        return torch.zeros(crops.shape[0], 2, crops.shape[-2] // 16, crops.shape[-1] // 16)

    dense_logits(image, fn, patch_size=16, crop_size=36, stride=20, batch_size=2, side=side, side_pad_value=10000)
    windows = window_grid(H, W, 36, 20)
    l, r, t, b = symmetric_pad(36, 36, 16)  # 36 -> 48: 6 px each side
    got = [m for _, ms in seen for m in ms]
    assert len(got) == len(windows) == 6
    for (y1, y2, x1, x2), m in zip(windows, got):
        want = torch.full((48, 48), 10000, dtype=side.dtype)
        want[t:t + 36, l:l + 36] = side[y1:y2, x1:x2]
        assert torch.equal(m, want)


# zdk258/CorrCLIP @ 103bc18 CorrCLIPv1/configs/cfg_*.py: dataset -> (prob_thd, Resize short side,
# slide_crop, slide_stride, instance_mask_path folder)
UPSTREAM_CONFIGS = {
    "corrclip_b16": ("sparseclip_voc20_val", 0.0, 336, 336, 112, "voc"),
    "corrclip_b16_voc21": ("sparseclip_voc21_val", 0.2, 336, 336, 112, "voc"),
    "corrclip_b16_context60": ("sparseclip_context60_val", 0.15, 336, 336, 112, "context"),
    "corrclip_b16_context59": ("sparseclip_context59_val", 0.0, 336, 336, 112, "context"),
    "corrclip_b16_coco_object": ("sparseclip_coco_object_val", 0.25, 336, 336, 112, "coco"),
    "corrclip_b16_coco_stuff": ("sparseclip_coco_stuff_val", 0.0, 336, 336, 112, "coco"),
    "corrclip_b16_ade20k": ("sparseclip_ade20k_val", 0.0, 448, 336, 112, "ade"),
    "corrclip_b16_cityscapes": ("sparseclip_cityscapes_val", 0.0, 448, 224, 112, "city"),
}


def test_corrclip_configs_select_upstreams_values():
    import glob

    from conftest import baseline_cfg

    root = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "baselines")
    assert {os.path.basename(p)[:-5] for p in glob.glob(os.path.join(root, "corrclip_b16*.yaml"))} == set(UPSTREAM_CONFIGS)
    for name, (dataset, thd, short, crop, stride, folder) in UPSTREAM_CONFIGS.items():
        cfg = baseline_cfg(name)
        sc, c = cfg.MODEL.SPARSECLIP, cfg.MODEL.SPARSECLIP.PROXY.CORRCLIP
        assert tuple(cfg.DATASETS.TEST) == (dataset,) and sc.PROB_THRESHOLD == thd, name
        assert (cfg.INPUT.MIN_SIZE_TEST, cfg.TEST.SLIDING_WINDOW.CROP_SIZE, cfg.TEST.SLIDING_WINDOW.STRIDE) == (
            short, crop, stride), name
        assert c.ENABLED and c.MASK_DIR == f"region_masks/{folder}", name
        assert (c.TAU, c.SPATIAL_WEIGHT, c.SEMANTIC_WEIGHT, c.NUM_SPATIAL, c.DBSCAN_EPS, c.DBSCAN_MIN_SAMPLES,
                c.RESTRICTION, c.MODE_VOTE) == (4.0, 1.0, 0.5, -1, 0.2, 1, "regions", True), name
        assert (sc.CLIP.NAME, sc.CLIP.PRETRAINED, sc.PROXY.NAME, sc.PROXY.FEATURE, sc.PROXY.LAYER) == (
            "ViT-B-16-quickgelu", "metaclip_fullcc", "vit_base_patch8_224.dino", "queries+keys", -1), name
        assert (sc.CLASS_NAMES, sc.TEXT.TEMPLATES, sc.LOGIT_SCALE, sc.PIXEL_NORM, sc.PATCH_REMAINDER) == (
            "corrclip", "openai_imagenet", 40.0, "clip_mmseg", "pad_crop"), name
        assert (sc.CLIP.PRECISION, sc.PROXY.PRECISION) == ("fp32", "fp32"), name
        spec = AttentionSpec.from_config(cfg)
        assert (spec.normalizer, spec.residual, spec.ffn, spec.num_layers) == ("softmax", False, False, 1), name
        assert "103bc18" in open(os.path.join(root, name + ".yaml")).read().split("_BASE_")[0], name
