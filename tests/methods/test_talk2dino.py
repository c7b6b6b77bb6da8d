"""Talk2DINO (``sparseclip_d2/methods/talk2dino``): the projection loader on upstream's key layout (and
on the release file when a checkout is at hand), the CLS scores and the background cleaning against
float64 hand computations, and the pipeline end to end on a tiny DINOv2-reg built through timm's
own class. The comparison with upstream's code is tools/agreement_talk2dino.py."""
import math

import pytest
import torch
import torch.nn.functional as F

from sparseclip_d2.methods.talk2dino import (PROJECTION_KEYS, TextProjection, clean_background, cls_attention_maps,
                                             load_projection, random_projection, sigmoid_masks)

from conftest import tiny_cfg

DINOV2 = "sparseclip_tiny_dinov2"  # timm's VisionTransformer of vit_base_patch14_reg4_dinov2, width 64, depth 2
#: upstream's release file, looked for in a checkout of lorebianchi98/Talk2DINO @ 4918c2d


def _layout(seed=0, c=8, d=6):
    g = torch.Generator().manual_seed(seed)
    return {"linear_layer.weight": torch.randn(d, c, generator=g), "linear_layer.bias": torch.randn(d, generator=g),
            "hidden_layers.0.weight": torch.randn(d, d, generator=g), "hidden_layers.0.bias": torch.randn(d, generator=g)}


def test_projection_loader_reads_upstream_layout(tmp_path):
    sd = _layout()
    path = tmp_path / "proj.pth"
    torch.save(sd, path)
    proj = load_projection(str(path))
    x = torch.randn(3, 8, dtype=torch.float64)
    w1, b1, w2, b2 = (sd[k].double() for k in PROJECTION_KEYS)
    ref = torch.tanh(x @ w1.T + b1) @ w2.T + b2  # Linear, tanh, Linear written out
    assert torch.allclose(proj(x.float()).double(), ref, atol=1e-5)
    legacy = {("linear_layer2." + k.split(".")[-1] if k.startswith("hidden") else k): v for k, v in sd.items()}
    torch.save(legacy, tmp_path / "legacy.pth")  # ProjectionLayer.load_state_dict's older names
    assert torch.equal(load_projection(str(tmp_path / "legacy.pth"))(x.float()), proj(x.float()))


def test_projection_loader_refuses_a_wrong_file(tmp_path):
    torch.save({"weight": torch.zeros(2, 2)}, tmp_path / "wrong.pth")
    with pytest.raises(ValueError, match=r"wrong\.pth.*linear_layer\.weight, linear_layer\.bias, hidden_layers\.0"):
        load_projection(str(tmp_path / "wrong.pth"), "KEYX")
    torch.save([1, 2], tmp_path / "list.pth")
    with pytest.raises(ValueError, match=r"list\.pth.*not a state dict.*linear_layer\.weight"):
        load_projection(str(tmp_path / "list.pth"))
    with pytest.raises(FileNotFoundError, match="KEYX = .*missing.pth"):
        load_projection(str(tmp_path / "missing.pth"), "KEYX")


def test_random_projection_is_seeded_and_loud(caplog):
    a, b = random_projection(3, 8, 6), random_projection(3, 8, 6)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert "RANDOM WEIGHTS" in caplog.text


def test_cls_scores_and_background_cleaning_match_float64():
    g = torch.Generator().manual_seed(1)
    B, heads, d, P, h, w, N = 2, 3, 4, 5, 2, 3, 4
    C = heads * d
    T = P + h * w
    qkv = torch.randn(B, T, 3 * C, generator=g, dtype=torch.float64)
    scale = d ** -0.5
    A = cls_attention_maps(qkv.float(), heads, P, scale).double()
    for b in range(B):
        for m in range(heads):
            q = qkv[b, 0, m * d:(m + 1) * d] * scale
            for p in range(h * w):
                k = qkv[b, P + p, C + m * d:C + (m + 1) * d]
                assert abs(A[b, m, p] - float((q * k).sum())) < 1e-5
    feats = torch.randn(B, C, h, w, generator=g, dtype=torch.float64)
    text = F.normalize(torch.randn(N, C, generator=g, dtype=torch.float64), dim=-1)
    mask = sigmoid_masks(feats.float(), text.float()).double()
    lam = 0.2
    got = clean_background(mask.float(), feats.float(), A.float(), text.float(), lam).double()
    for b in range(B):
        f = feats[b].reshape(C, -1)
        fn = f / f.norm(dim=0, keepdim=True)
        M = torch.sigmoid(text @ fn)  # (N, hw)
        assert torch.allclose(mask[b].reshape(N, -1), M, atol=1e-6)
        e = torch.stack([sum(A[b, m, p] * f[:, p] for p in range(h * w)) / (h * w) for m in range(heads)])
        e = e / e.norm(dim=1, keepdim=True)
        s = torch.exp(text @ e.T)
        s = s / s.sum(dim=1, keepdim=True)  # softmax over heads
        a = torch.zeros(N, h * w, dtype=torch.float64)
        for n in range(N):
            for p in range(h * w):
                a[n, p] = sum(s[n, m] * A[b, m, p] for m in range(heads)) / s[n].sum()
        a = torch.exp(a) / torch.exp(a).sum(dim=1, keepdim=True)
        lo, hi = float(a.min()), float(a.max())
        hi = max(hi, hi - lo)
        a = (a - lo) / hi * (float(M.max()) - float(M.min())) + float(M.min())
        ref = (M + lam * a) / (1 + lam)
        assert torch.allclose(got[b].reshape(N, -1), ref, atol=1e-5)


def _cfg(**kw):
    opts = {"MODEL.SPARSECLIP.PROXY.NAME": DINOV2, "MODEL.SPARSECLIP.PROXY.POS_EMBED_INTERP": "size_antialias",
            "MODEL.SPARSECLIP.PROXY.TALK2DINO.ENABLED": True, "MODEL.SPARSECLIP.PROXY.TALK2DINO.SIZE": 28,
            "MODEL.SPARSECLIP.PROXY.TALK2DINO.BACKGROUND_CLEAN": True,
            "MODEL.SPARSECLIP.PROXY.TALK2DINO.PAMR_DILATIONS": [1, 2], "MODEL.SPARSECLIP.PROXY.TALK2DINO.PAMR_STEPS": 2,
            "TEST.SLIDING_WINDOW.ENABLED": True, "TEST.SLIDING_WINDOW.CROP_SIZE": 24,
            "TEST.SLIDING_WINDOW.STRIDE": 12}
    opts.update(kw)
    return tiny_cfg(**opts)


def test_pipeline_end_to_end_matches_hand_composition():
    from detectron2.modeling import build_model

    torch.manual_seed(0)
    model = build_model(_cfg(**{"MODEL.SPARSECLIP.PROXY.TALK2DINO.BACKGROUND_SCORE": 0.5})).eval()
    assert model.head_name == "talk2dino" and "Talk2DINO" in model.describe()
    vocab = ["background", "cat", "dog, puppy"]
    img = torch.randint(0, 256, (3, 24, 36), generator=torch.Generator().manual_seed(2)).float()
    with torch.no_grad():
        out = model.predict({"image": img, "vocabulary": vocab, "background_index": 0, "height": 24, "width": 36})
        # the hand composition: template-mean text through the projection, then per window DINO tokens,
        # masks, cleaning, align_corners=True resize, PAMR on 0-255 RGB, windows averaged, argmax
        head = model.head
        clf = model.text_classifier()
        raw = torch.stack([torch.stack([clf.model.encode_text(clf.tokenizer([t.replace("{}", s)]))[0]
                                        for t in clf.templates]).mean(0) for s in ["cat", "dog", "puppy"]])
        text = F.normalize(head.projection(raw.float()), dim=-1)
        image = (img - model.pixel_mean) / model.pixel_std
        summed = torch.zeros(4, 24, 36)
        count = torch.zeros(24, 36)
        from sparseclip_d2.dense.pamr import pamr
        for x1 in (0, 12):
            win = image[None, :, :, x1:x1 + 24]
            feats, scores = model.encoder.dino_tokens(win)
            m = clean_background(sigmoid_masks(feats, text), feats, scores, text, 0.2)
            m = F.interpolate(m, size=(24, 24), mode="bilinear", align_corners=True)
            m = pamr(img[None, :, :, x1:x1 + 24], m, 2, (1, 2))[0]
            summed[0, :, x1:x1 + 24] += 0.5
            summed[1:, :, x1:x1 + 24] += m
            count[:, x1:x1 + 24] += 1
        probs = (summed / count).softmax(0)
        cls = torch.stack([probs[0], probs[1], probs[2:].max(0).values])
        ref = cls.argmax(0)
    assert torch.equal(out.label_map(), ref)
    assert len(set(ref.unique().tolist())) >= 2  # not a constant map


def test_keys_are_refused_while_off_and_checked():
    from sparseclip_d2.methods import plan_from_config
    from sparseclip_d2.methods.encoders import check_proxy_config

    with pytest.raises(ValueError, match=r"TALK2DINO.LAMBDA_BG = 0.5 changes nothing while .*TALK2DINO.ENABLED is False"):
        check_proxy_config(tiny_cfg(**{"MODEL.SPARSECLIP.PROXY.NAME": DINOV2,
                                       "MODEL.SPARSECLIP.PROXY.TALK2DINO.LAMBDA_BG": 0.5}))
    with pytest.raises(ValueError, match=r"PAMR_DILATIONS = \[0\] is invalid"):
        plan_from_config(_cfg(**{"MODEL.SPARSECLIP.PROXY.TALK2DINO.PAMR_DILATIONS": [0]}))
    with pytest.raises(ValueError, match=r"PROB_THRESHOLD"):
        check_proxy_config(_cfg(**{"MODEL.SPARSECLIP.PROB_THRESHOLD": 0.3}))
    with pytest.raises(ValueError, match=r"ATTENTION / BLOCK keys .*entmax"):
        check_proxy_config(_cfg(**{"MODEL.SPARSECLIP.ATTENTION.NORMALIZER": "entmax"}))


def test_the_benchmark_entry_draws_the_projection_random_projection_draws(tmp_path):
    from sparseclip_d2.methods.talk2dino.upstream import write_random_projection

    path = write_random_projection(str(tmp_path / "p.pth"), seed=4, clip_dim=8, dino_dim=6)
    ours = random_projection(4, 8, 6)
    theirs = load_projection(path)
    assert all(torch.equal(ours.state_dict()[k], theirs.state_dict()[k]) for k in PROJECTION_KEYS)


def _agreement_tool():
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools",
                        "agreement_talk2dino.py")
    spec = importlib.util.spec_from_file_location("agreement_talk2dino_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_agreement_forcing_sets_the_background_score_of_the_voc21_config():
    from sparseclip_d2.benchmarks.project import project_cfg

    tool = _agreement_tool()
    assert tool.forcing_opts(None) == []
    assert project_cfg("talk2dino_voc21.yaml", []).MODEL.SPARSECLIP.PROXY.TALK2DINO.BACKGROUND_SCORE == 0.55
    forced = project_cfg("talk2dino_voc21.yaml", tool.forcing_opts(tool.FORCING["bg050"]))
    assert forced.MODEL.SPARSECLIP.PROXY.TALK2DINO.BACKGROUND_SCORE == 0.5
    # the driver's inputs are tools/agreement.py's: voc_wide is the 250 x 375 crop of the VOC photo
    photos = tool._photos(("voc", "voc_wide"))
    assert photos["voc"].shape == (375, 500, 3) and photos["voc_wide"].shape == (250, 375, 3)
    assert (photos["voc_wide"] == photos["voc"][60:310, 60:435]).all()
