"""Every config merges; paper and baseline configs say what they reproduce."""
import csv
import glob
import os

import pytest
from conftest import baseline_cfg

from sparseclip_d2.clip import AttentionSpec

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
# detectron2 configs; configs/sweeps/ holds sweep files (checked in tests/sweeps/test_sweep.py)
CONFIGS = sorted(
    p for p in glob.glob(os.path.join(ROOT, "configs", "**", "*.yaml"), recursive=True)
    if os.path.relpath(p, os.path.join(ROOT, "configs")).split(os.sep)[0] != "sweeps"
)


def load(path):
    return baseline_cfg(path)


def test_there_are_configs():
    names = {os.path.relpath(p, os.path.join(ROOT, "configs")) for p in CONFIGS}
    assert {"Base-SparseCLIP.yaml", "entmax_qq_l14.yaml", "demo.yaml"} <= names
    assert len([n for n in names if n.startswith("paper/")]) == 24
    assert len([n for n in names if n.startswith("baselines/")]) >= 4


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: os.path.relpath(p, ROOT))
def test_config_merges_and_is_valid(path):
    from detectron2.data import DatasetCatalog

    from sparseclip_d2.data import check_meta_architecture

    cfg = load(path)
    expected = "SparseCLIPFGOVD" if os.path.relpath(path, ROOT).startswith(os.path.join("configs", "fgovd")) else "SparseCLIP"
    assert cfg.MODEL.META_ARCHITECTURE == expected
    AttentionSpec.from_config(cfg)  # validates source / normaliser / alpha / prior
    for name in cfg.DATASETS.TEST:
        assert name in DatasetCatalog.list(), name
    check_meta_architecture(cfg.MODEL.META_ARCHITECTURE, cfg.DATASETS.TEST)
    with open(path) as f:
        assert f.readline().startswith("#"), "each config starts with a comment saying what it reproduces"


def test_main_config():
    cfg = load(os.path.join(ROOT, "configs", "entmax_qq_l14.yaml"))
    a = cfg.MODEL.SPARSECLIP.ATTENTION
    assert (cfg.MODEL.SPARSECLIP.CLIP.NAME, cfg.MODEL.SPARSECLIP.CLIP.PRETRAINED) == ("ViT-L-14-quickgelu", "openai")
    assert (a.SOURCE, a.NORMALIZER, a.ALPHA, a.NUM_LAYERS) == ("qq", "entmax", 1.2, 1)
    assert cfg.INPUT.MIN_SIZE_TEST == 448 and not cfg.TEST.SLIDING_WINDOW.ENABLED
    assert tuple(cfg.DATASETS.TEST) == ("sparseclip_voc21_val", "sparseclip_context59_val", "sparseclip_ade20k_val")


def test_paper_configs_cover_table_1():
    csv_path = os.path.join(ROOT, "sparseclip_d2", "reference", "paper_results.csv")  # shipped package data
    rows = {(r["backbone"], r["source"], r["normalizer"]) for r in csv.DictReader(open(csv_path)) if r["table"] == "1"}
    src = {"qkv": "qk", "qqv": "qq", "kkv": "kk", "vvv": "vv", "qq+kk": "qq+kk", "qq+kk+vv": "qq+kk+vv"}
    bb = {"B/16": "ViT-B-16-quickgelu", "L/14": "ViT-L-14-quickgelu"}
    found = set()
    for path in glob.glob(os.path.join(ROOT, "configs", "paper", "*.yaml")):
        c = load(path).MODEL.SPARSECLIP
        found.add((c.CLIP.NAME, c.ATTENTION.SOURCE, c.ATTENTION.NORMALIZER))
    assert found == {(bb[b], src[s], n) for b, s, n in rows}


# What each baseline's configs must select (upstream conventions, see configs/baselines/*.yaml).
BASELINES = {
    # method: (preset, templates, class-name set, resize, pixel norm, pos-embed interp, remainder,
    #          datasets covered)
    "sclip": ("sclip", "openai_imagenet", "sclip", "mmseg", "clip_mmseg", "scale_factor", "truncate", 8),
    "clearclip": ("clearclip", "openai_imagenet", "clearclip", "mmseg", "clip_mmseg", "scale_factor", "pad_crop", 8),
    "naclip": ("naclip", "openai_imagenet", "naclip", "mmseg", "clip_mmseg", "scale_factor", "truncate", 8),
    "naclip_pamr": ("naclip", "openai_imagenet", "naclip", "mmseg", "clip_mmseg", "scale_factor", "truncate", 8),
    "maskclip": ("maskclip", "maskclip", "maskclip", "mmseg", "imagenet", "size", "pad_corner", 5),
    "gem": ("gem", "single", "", "detectron2", "clip", "size_antialias", "pad_crop", 8),
    "clipsurgery": ("clipsurgery", "maskclip", "", "detectron2", "clip", "bilinear", "pad_crop", 8),
    "cliptrase": ("cliptrase", "openai_imagenet", "cliptrase", "detectron2", "clip", "scale_factor", "pad_crop", 7),
    "scclip": ("scclip", "openai_imagenet", "sclip", "mmseg", "clip_mmseg", "scale_factor", "truncate", 8),
    "sfp": ("sfp", "openai_imagenet", "sfp", "mmseg", "clip_mmseg", "scale_factor", "truncate", 8),
}


@pytest.mark.parametrize("method", list(BASELINES))
def test_baseline_configs_select_their_upstream_conventions(method):
    preset_name, templates, names, resize, norm, interp, remainder, n_datasets = BASELINES[method]
    preset = AttentionSpec.preset(preset_name)
    paths = glob.glob(os.path.join(ROOT, "configs", "baselines", f"{method}_b16*.yaml"))
    assert paths
    datasets = set()
    for path in paths:
        cfg = load(path)
        sc = cfg.MODEL.SPARSECLIP
        spec = AttentionSpec.from_config(cfg)
        for field in ("source", "normalizer", "residual", "ffn", "prior", "prior_std", "sum_mode", "parallel_layers",
                      "parallel_cls", "qkv_norm", "cosine_scale", "self_iterations"):
            assert spec.settings()[field] == preset.settings()[field], (path, field)
        got = (sc.TEXT.TEMPLATES, sc.CLASS_NAMES, cfg.INPUT.RESIZE_MODE, sc.PIXEL_NORM, sc.CLIP.POS_EMBED_INTERP,
               sc.PATCH_REMAINDER)
        assert got == (templates, names, resize, norm, interp, remainder), path
        assert (sc.PAMR.STEPS, list(sc.PAMR.DILATIONS)) == ((10, [8, 16]) if method == "naclip_pamr" else (0, [8, 16]))
        text = open(path).read()
        assert "ASSUMED" not in text.upper(), path
        assert "@ " in text.split("_BASE_")[0], f"{path} names no upstream commit in its header"
        datasets |= set(cfg.DATASETS.TEST)
    assert len(datasets) == n_datasets


def test_baseline_protocol_values_from_upstream_configs():
    c = lambda name: load(os.path.join(ROOT, "configs", "baselines", name + ".yaml"))  # noqa: E731
    v = c("naclip_b16_voc21")  # sinahmr/NACLIP configs/cfg_voc21.py
    assert (v.TEST.SLIDING_WINDOW.ENABLED, v.MODEL.SPARSECLIP.PROB_THRESHOLD, v.MODEL.SPARSECLIP.AREA_THRESHOLD) == (
        False, 0.1, 0.0)
    assert not c("naclip_b16_voc20").TEST.SLIDING_WINDOW.ENABLED
    assert "sparseclip_coco_stuff_val" in c("naclip_b16").DATASETS.TEST and c("naclip_b16").INPUT.MIN_SIZE_TEST == 336
    city = c("clearclip_b16_cityscapes").TEST.SLIDING_WINDOW
    assert (city.ENABLED, city.CROP_SIZE, city.STRIDE) == (True, 224, 224)
    m = c("maskclip_b16")
    assert (m.TEST.SLIDING_WINDOW.ENABLED, m.INPUT.MIN_SIZE_TEST, m.INPUT.MAX_SIZE_TEST) == (False, 512, 2048)
    assert (m.MODEL.SPARSECLIP.CLIP.VISION_ACT, m.MODEL.SPARSECLIP.CLIP.VISION_LN_EPS) == ("gelu", 1e-6)
    ctx = c("maskclip_b16_context59").INPUT
    assert (ctx.MIN_SIZE_TEST, ctx.MAX_SIZE_TEST) == (520, 520)
    cs = c("maskclip_b16_cityscapes").INPUT
    assert (cs.MIN_SIZE_TEST, cs.MAX_SIZE_TEST) == (512, 1024)


def test_paper_configs_keep_the_project_conventions():
    for path in glob.glob(os.path.join(ROOT, "configs", "paper", "*.yaml")):
        cfg = load(path)
        sc = cfg.MODEL.SPARSECLIP
        assert (cfg.INPUT.RESIZE_MODE, sc.PIXEL_NORM, sc.CLIP.POS_EMBED_INTERP, sc.PATCH_REMAINDER, sc.CLASS_NAMES,
                sc.PAMR.STEPS, sc.CLIP.VISION_ACT, sc.CLIP.VISION_LN_EPS) == (
            "detectron2", "clip", "size", "pad_crop", "", 0, "", 0.0), path


def test_cliptrase_configs_hold_its_two_protocols():
    """leaves162/CLIPtrase @ 2b7de61 clip_self_correlation.py self_clip_test: 224 px with DBSCAN
    eps 0.7 / min 3 and 336 px with 1.1 / 7; the CLS-logit product on VOC20 only."""
    c = lambda name: load(os.path.join(ROOT, "configs", "baselines", name + ".yaml"))  # noqa: E731
    for name, size, eps, mn in (("cliptrase_b16", 224, 0.7, 3), ("cliptrase_b16_voc20", 224, 0.7, 3),
                                ("cliptrase_b16_336", 336, 1.1, 7), ("cliptrase_b16_336_voc20", 336, 1.1, 7)):
        cfg = c(name)
        v = cfg.MODEL.SPARSECLIP.CLUSTER_VOTE
        assert (cfg.INPUT.CENTER_CROP_TEST, v.ENABLED, v.EPS, v.MIN_SAMPLES, v.LAYER, v.UPSAMPLE, v.MEDIAN_SIZE) == (
            size, True, eps, mn, -2, 4, 7), name
        voc20 = name.endswith("voc20")
        assert cfg.MODEL.SPARSECLIP.CLS_LOGIT_PRODUCT is voc20, name
        assert ("sparseclip_voc20_val" in cfg.DATASETS.TEST) is voc20, name
        assert (cfg.MODEL.SPARSECLIP.LOGIT_SCALE, cfg.TEST.SLIDING_WINDOW.ENABLED) == (0.0, False), name
