"""FG-OVD end to end with the tiny random-weight CLIP: configs, the evaluation loop,
tools/train_net.py --eval-only writing top1 / mean_rank / median_rank per split, mHME and the
conventions, and tools/prepare_datasets.py check / train_net failing on missing files before
any model is built."""
import glob
import json
import os
import subprocess
import sys

import pytest

from detectron2.config import get_cfg
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.evaluation import inference_on_dataset
from detectron2.modeling import build_model

import sparseclip_d2  # noqa: F401  (registers the META_ARCHs, loaders, evaluators)
from sparseclip_d2.config import add_sparseclip_config
from sparseclip_d2.data import build_test_loader, check_meta_architecture
from sparseclip_d2.data.datasets.fgovd import register_fgovd_dataset
from sparseclip_d2.evaluation import build_evaluator, build_results, dataset_summary, finalize_summaries, write_results
from sparseclip_d2.evaluation.fgovd_evaluation import fgovd_metrics
from test_fgovd_data import IMAGES, make_benchmark

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPLIT_FILES = {"hard": "1_attributes.json", "medium": "2_attributes.json", "easy": "3_attributes.json"}
TINY = ["MODEL.SPARSECLIP.CLIP.NAME", "sparseclip-tiny-vit", "MODEL.SPARSECLIP.CLIP.PRETRAINED", "none",
        "MODEL.DEVICE", "cpu", "MODEL.SPARSECLIP.FGOVD.RESOLUTION", "64", "DATALOADER.NUM_WORKERS", "0"]


def _base_cfg(config_file):
    cfg = get_cfg()
    add_sparseclip_config(cfg)
    cfg.merge_from_file(config_file)
    return cfg


def test_fgovd_configs_merge():
    files = sorted(glob.glob(os.path.join(REPO, "configs", "fgovd", "*.yaml")))
    names = {os.path.basename(f) for f in files}
    expected = {f"{b}_{s}_{n}.yaml" for b in ("b16", "l14") for s in ("qkv", "qqv", "kkv", "vvv", "qqkk", "qqkkvv")
                for n in ("softmax", "entmax1.2")} | {"Base-FGOVD.yaml", "b16_crop_baseline.yaml"}
    assert names == expected
    sources = {"qkv": "qk", "qqv": "qq", "kkv": "kk", "vvv": "vv", "qqkk": "qq+kk", "qqkkvv": "qq+kk+vv"}
    for f in files:
        cfg = _base_cfg(f)
        assert cfg.MODEL.SPARSECLIP.FGOVD.RESOLUTION == 224
        assert cfg.MODEL.META_ARCHITECTURE == "SparseCLIPFGOVD"
        check_meta_architecture(cfg.MODEL.META_ARCHITECTURE, cfg.DATASETS.TEST)
        name = os.path.basename(f)
        if name == "b16_crop_baseline.yaml":
            assert (cfg.MODEL.SPARSECLIP.FGOVD.PROTOCOL, cfg.MODEL.SPARSECLIP.FGOVD.CONVENTIONS) == ("crop", "fgovd")
            continue
        assert (cfg.MODEL.SPARSECLIP.FGOVD.PROTOCOL, cfg.MODEL.SPARSECLIP.FGOVD.CONVENTIONS) == ("dense", "region_top1")
        if name == "Base-FGOVD.yaml":
            continue
        bb, src, norm = name[:-5].split("_")
        assert cfg.MODEL.SPARSECLIP.CLIP.NAME == {"b16": "ViT-B-16-quickgelu", "l14": "ViT-L-14-quickgelu"}[bb]
        assert cfg.MODEL.SPARSECLIP.ATTENTION.SOURCE == sources[src]
        assert cfg.MODEL.SPARSECLIP.ATTENTION.NORMALIZER == ("softmax" if norm == "softmax" else "entmax")
        assert cfg.MODEL.SPARSECLIP.ATTENTION.ALPHA == 1.2


def _check_results(results, names, ranks_dir):
    """Every split under the "fgovd" conventions: metrics recomputed from the per-box ranks
    file; mHME = mean top1; N and the conventions recorded.

    names: {split: dataset name}; ranks_dir: {split: directory of fgovd_ranks.json}.
    """
    top1 = {}
    for split, name in names.items():
        entry = results[name]
        for key in ("top1", "mean_rank", "median_rank", "num_boxes", "num_dropped"):
            assert key in entry, (name, key)
        with open(os.path.join(ranks_dir[split], "fgovd_ranks.json")) as f:
            boxes = json.load(f)
        assert sorted(b["ann_id"] for b in boxes) == [101, 103, 104, 105]  # 102 dropped (9 < 10)
        assert all(b["num_negatives"] == 10 for b in boxes)
        expected = fgovd_metrics([b["rank"] for b in boxes], num_dropped=1, median_definition="fgovd")
        for key, value in expected.items():
            assert entry[key] == pytest.approx(value), (name, key)
        assert entry["num_images"] == 3
        assert entry["num_negatives"] == 10
        assert entry["conventions"] == {"min_negatives": "drop", "ties": "miss", "median": "fgovd",
                                        "resize_interpolation": "bicubic", "proposal_matching": "score"}
        top1[split] = entry["top1"]
    mhme = results["fgovd_mHME"]
    assert mhme["mHME"] == pytest.approx(sum(top1.values()) / 3)
    assert {k: mhme[k] for k in SPLIT_FILES} == pytest.approx(top1)


def test_eval_loop_inference_on_dataset(tmp_path):
    """The train_net loop (loader and evaluator builders, inference_on_dataset,
    dataset_summary, finalize_summaries, results.json) run in process on generated splits."""
    root = str(tmp_path / "datasets")
    names = {}
    for split, fname in SPLIT_FILES.items():
        json_file, image_root = make_benchmark(root, fname)
        name = f"_e2e_fgovd_{split}"
        if name in DatasetCatalog.list():
            DatasetCatalog.remove(name)
            MetadataCatalog.remove(name)
        register_fgovd_dataset(name, json_file, image_root, 10, split=split)
        names[split] = name
    cfg = _base_cfg(os.path.join(REPO, "configs", "fgovd", "b16_qqkk_entmax1.2.yaml"))
    cfg.merge_from_list(TINY + ["OUTPUT_DIR", str(tmp_path / "out"), "MODEL.SPARSECLIP.FGOVD.CONVENTIONS", "fgovd"])
    cfg.DATASETS.TEST = tuple(names.values())
    model = build_model(cfg)
    summaries, ranks_dir = {}, {}
    for split, name in names.items():
        dicts = DatasetCatalog.get(name)
        loader = build_test_loader(cfg, name, dicts)
        ranks_dir[split] = os.path.join(cfg.OUTPUT_DIR, "inference", name)
        evaluator = build_evaluator(cfg, name, ranks_dir[split])
        res = inference_on_dataset(model, loader, evaluator)
        summaries[name] = dataset_summary(res, len(dicts), 0.0, evaluator.results_extras())
    path = write_results(build_results(finalize_summaries(summaries), cfg, random_weights=True), cfg.OUTPUT_DIR)
    with open(path) as f:
        results = json.load(f)
    _check_results(results, names, ranks_dir)
    assert results["random_weights"] is True

    # One pass of the model, both presets on the official-schema Hard file: region_top1 keeps
    # box 102 (9 < 10 negatives) and counts ties as hits, fgovd drops it.
    from sparseclip_d2.evaluation.fgovd_evaluation import FGOVDEvaluator
    from sparseclip_d2.modeling.fgovd_conventions import FGOVD_CONVENTION_PRESETS

    name = names["hard"]
    dirs = {p: str(tmp_path / p) for p in ("fgovd", "region_top1")}
    evaluators = [FGOVDEvaluator(name, 10, FGOVD_CONVENTION_PRESETS[p], output_dir=dirs[p]) for p in dirs]
    for batch in build_test_loader(cfg, name, DatasetCatalog.get(name)):
        outputs = model(batch)
        for ev in evaluators:
            ev.process(batch, outputs)
    for ev in evaluators:
        ev.evaluate()
    ranks = {}
    for p, d in dirs.items():
        with open(os.path.join(d, "fgovd_ranks.json")) as f:
            ranks[p] = {b["ann_id"]: b for b in json.load(f)}
    assert sorted(ranks["fgovd"]) == [101, 103, 104, 105] and sorted(ranks["region_top1"]) == [101, 102, 103, 104, 105]
    assert ranks["region_top1"][102]["num_negatives"] == 9
    for aid, box in ranks["fgovd"].items():  # random weights: no exact ties, same ranks
        assert ranks["region_top1"][aid]["rank"] == box["rank"] and box["num_negatives"] == 10


def test_train_net_eval_only(tmp_path):
    root = str(tmp_path / "datasets")
    for fname in SPLIT_FILES.values():
        make_benchmark(root, fname)
    out = str(tmp_path / "out")
    env = dict(os.environ, DETECTRON2_DATASETS=root, SPARSECLIP_TEXT_CACHE="off")
    cmd = [sys.executable, os.path.join(REPO, "tools", "train_net.py"), "--eval-only", "--config-file",
           os.path.join(REPO, "configs", "fgovd", "b16_qqkk_entmax1.2.yaml"), *TINY, "OUTPUT_DIR", out,
           "DATASETS.TEST", "('sparseclip_fgovd_hard', 'sparseclip_fgovd_medium', 'sparseclip_fgovd_easy')",
           "MODEL.SPARSECLIP.FGOVD.CONVENTIONS", "fgovd"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert any(folder == "train2017" for _, _, _, folder in IMAGES)  # images in both COCO folders
    with open(os.path.join(out, "results.json")) as f:
        results = json.load(f)
    names = {s: f"sparseclip_fgovd_{s}" for s in SPLIT_FILES}
    _check_results(results, names, {s: os.path.join(out, "inference", n) for s, n in names.items()})
    assert "mHME" in proc.stdout + proc.stderr


def _run(args, env, timeout=1800):
    return subprocess.run([sys.executable, *args], cwd=REPO, env=dict(os.environ, **env),
                          capture_output=True, text=True, timeout=timeout)


def test_missing_image_caught_by_check_and_before_the_model(tmp_path):
    root = str(tmp_path / "datasets")
    for fname in SPLIT_FILES.values():
        make_benchmark(root, fname)
    env = {"DETECTRON2_DATASETS": root, "SPARSECLIP_TEXT_CACHE": "off"}
    check = [os.path.join(REPO, "tools", "prepare_datasets.py"), "check", "--root", root]
    ok = _run(check + ["sparseclip_fgovd_hard", "sparseclip_fgovd_easy"], env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "sparseclip_fgovd_hard: ready" in ok.stdout
    os.remove(os.path.join(root, "coco", "train2017", "000000000002.png"))
    bad = _run(check + ["sparseclip_fgovd_hard"], env)
    assert bad.returncode != 0
    assert "1 of 3 images" in bad.stdout and "train2017/000000000002.png" in bad.stdout
    assert "train2017.zip" in bad.stdout
    # a missing JSON: the expected path and where to get it
    os.remove(os.path.join(root, "fg-ovd", "benchmarks", "2_attributes.json"))
    bad = _run(check + ["sparseclip_fgovd_medium"], env)
    assert bad.returncode != 0 and "2_attributes.json" in bad.stdout and "lorebianchi98/FG-OVD" in bad.stdout

    cmd = [os.path.join(REPO, "tools", "train_net.py"), "--eval-only", "--config-file",
           os.path.join(REPO, "configs", "fgovd", "b16_qqkk_entmax1.2.yaml"), *TINY, "OUTPUT_DIR", str(tmp_path / "o"),
           "DATASETS.TEST", "('sparseclip_fgovd_hard',)"]
    proc = _run(cmd, env)
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("train_net.py: error: data:") and "000000000002.png" in last and "train2017.zip" in last
    assert "Traceback" not in proc.stderr and "RANDOM WEIGHTS" not in proc.stderr  # before the model


def test_fgovd_dataset_with_segmentation_model_rejected(tmp_path):
    root = str(tmp_path / "datasets")
    make_benchmark(root, "1_attributes.json")
    cmd = [os.path.join(REPO, "tools", "train_net.py"), "--eval-only", "--config-file",
           os.path.join(REPO, "configs", "demo.yaml"), *TINY, "OUTPUT_DIR", str(tmp_path / "o"),
           "DATASETS.TEST", "('sparseclip_fgovd_hard',)"]
    proc = _run(cmd, {"DETECTRON2_DATASETS": root})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "MODEL.META_ARCHITECTURE SparseCLIPFGOVD, not SparseCLIP" in proc.stderr
