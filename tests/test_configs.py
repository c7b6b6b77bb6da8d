"""Every config merges; paper and baseline configs say what they reproduce."""
import csv
import glob
import os

import pytest
from detectron2.config import get_cfg

import sparseclip_d2
from sparseclip_d2.clip import AttentionSpec

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
# detectron2 configs; configs/sweeps/ holds sweep files (checked in tests/test_sweep.py)
CONFIGS = sorted(
    p for p in glob.glob(os.path.join(ROOT, "configs", "**", "*.yaml"), recursive=True)
    if os.path.relpath(p, os.path.join(ROOT, "configs")).split(os.sep)[0] != "sweeps"
)


def load(path):
    cfg = get_cfg()
    sparseclip_d2.add_sparseclip_config(cfg)
    cfg.merge_from_file(path)
    return cfg


def test_there_are_configs():
    names = {os.path.relpath(p, os.path.join(ROOT, "configs")) for p in CONFIGS}
    assert {"Base-SparseCLIP.yaml", "entmax_qq_l14.yaml", "demo.yaml"} <= names
    assert len([n for n in names if n.startswith("paper/")]) == 24
    assert len([n for n in names if n.startswith("baselines/")]) >= 4


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: os.path.relpath(p, ROOT))
def test_config_merges_and_is_valid(path):
    from detectron2.data import DatasetCatalog

    cfg = load(path)
    assert cfg.MODEL.META_ARCHITECTURE == "SparseCLIP"
    AttentionSpec.from_config(cfg)  # validates source / normaliser / alpha / prior
    for name in cfg.DATASETS.TEST:
        assert name in DatasetCatalog.list(), name
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


@pytest.mark.parametrize("method", ["sclip", "clearclip", "naclip", "maskclip"])
def test_baseline_configs_match_presets(method):
    preset = AttentionSpec.preset(method)
    paths = glob.glob(os.path.join(ROOT, "configs", "baselines", f"{method}_b16*.yaml"))
    assert paths
    datasets = set()
    for path in paths:
        cfg = load(path)
        spec = AttentionSpec.from_config(cfg)
        for field in ("source", "normalizer", "residual", "ffn", "prior", "prior_std", "sum_mode"):
            assert getattr(spec, field) == getattr(preset, field), (path, field)
        assert cfg.MODEL.SPARSECLIP.TEXT.TEMPLATES == "openai_imagenet" and cfg.TEST.SLIDING_WINDOW.ENABLED
        datasets |= set(cfg.DATASETS.TEST)
    assert len(datasets) == 8  # the eight usual benchmarks
