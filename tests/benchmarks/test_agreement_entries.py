"""The agreement rows the mmseg-harness entries (SCLIP, ClearCLIP, NACLIP with and without PAMR) and
CLIPtrase's folder entry declare: every project config's first dataset is the one of the upstream
config it is compared with, PAMR is on upstream exactly where the project config runs it, CLIPtrase's
protocol settings are the project config's, and the stage-forcing variant changes the threshold
on both sides. The expected names are written here by hand from the upstream checkouts' file names
(wangf3014/SCLIP b56bd30, mc-lan/ClearCLIP ad68a40, sinahmr/NACLIP 0cac3a6: ``configs/cfg_*.py``;
leaves162/CLIPtrase 2b7de61: ``configs/dataset_cfg.py`` ``dataset_info`` keys)."""
import pytest

from sparseclip_d2.benchmarks.agreement import upstream_config_for
from sparseclip_d2.benchmarks.project import project_cfg
from sparseclip_d2.methods.registry import UPSTREAM

#: project dataset -> the upstream mmseg-style config file of the three checkouts
MMSEG_FILE = {"sparseclip_voc21_val": "configs/cfg_voc21.py", "sparseclip_voc20_val": "configs/cfg_voc20.py",
              "sparseclip_context60_val": "configs/cfg_context60.py",
              "sparseclip_context59_val": "configs/cfg_context59.py",
              "sparseclip_coco_object_val": "configs/cfg_coco_object.py",
              "sparseclip_coco_stuff_val": "configs/cfg_coco_stuff164k.py",
              "sparseclip_cityscapes_val": "configs/cfg_city_scapes.py"}

#: the configs each entry must compare: every configs/baselines/<prefix>*.yaml of the method
EXPECTED = {
    "sclip": {"sclip_b16.yaml", "sclip_b16_voc21.yaml", "sclip_b16_context60.yaml", "sclip_b16_coco_object.yaml",
              "sclip_b16_coco_stuff.yaml", "sclip_b16_cityscapes.yaml"},
    "clearclip": {"clearclip_b16.yaml", "clearclip_b16_voc21.yaml", "clearclip_b16_context60.yaml",
                  "clearclip_b16_coco_object.yaml", "clearclip_b16_cityscapes.yaml"},
    "naclip": {f"naclip{p}_b16{s}.yaml" for p in ("", "_pamr")
               for s in ("", "_voc21", "_voc20", "_context60", "_coco_object", "_cityscapes")},
}


@pytest.mark.parametrize("method", sorted(EXPECTED))
def test_mmseg_entries_compare_each_config_with_its_datasets_upstream_file(method):
    entry = UPSTREAM.get(method)
    assert set(entry.agreement_configs()) == EXPECTED[method]
    for config in entry.agreement_configs():
        cfg = project_cfg(config, [])
        dataset = cfg.DATASETS.TEST[0]
        assert upstream_config_for(entry, config, dataset) == MMSEG_FILE[dataset], config
        # PAMR on upstream (naclip.py pamr_steps) exactly as the project config runs it; the entry's
        # build passes pamr_steps=0 (eval.py --pamr off), which a row's setting overrides
        steps = int(cfg.MODEL.SPARSECLIP.PAMR.STEPS)
        assert entry.config_settings.get(config, {}).get("pamr_steps", 0) == steps, config
    opts, settings = entry.forcing["prob0"]
    assert list(opts) == ["MODEL.SPARSECLIP.PROB_THRESHOLD", "0.0"] and settings == {"prob_thd": 0.0}


def test_naclip_pamr_configs_are_the_only_ones_with_pamr():
    entry = UPSTREAM.get("naclip")
    assert set(entry.config_settings) == {c for c in EXPECTED["naclip"] if "_pamr_" in c}


def test_cliptrase_rows_use_the_project_configs_dataset_and_protocol():
    entry = UPSTREAM.get("cliptrase")
    key = {"sparseclip_voc21_val": "VOC21", "sparseclip_voc20_val": "VOC20"}
    assert set(entry.agreement_configs()) == {"cliptrase_b16.yaml", "cliptrase_b16_voc20.yaml",
                                              "cliptrase_b16_336.yaml", "cliptrase_b16_336_voc20.yaml"}
    for config in entry.agreement_configs():
        cfg = project_cfg(config, [])
        assert upstream_config_for(entry, config, cfg.DATASETS.TEST[0]) == key[cfg.DATASETS.TEST[0]], config
        s = entry.protocol({"upstream_settings": entry.config_settings.get(config, {})})
        vote = cfg.MODEL.SPARSECLIP.CLUSTER_VOTE
        assert (s["image_size"], s["eps"], s["min"]) == (cfg.INPUT.CENTER_CROP_TEST, vote.EPS, vote.MIN_SAMPLES), config
        # self_clip multiplies by the CLS logits for VOC20 only: the project configs' CLS_LOGIT_PRODUCT
        assert bool(cfg.MODEL.SPARSECLIP.CLS_LOGIT_PRODUCT) == (key[cfg.DATASETS.TEST[0]] == "VOC20"), config


def test_cliptrase_labels_hook_puts_upstreams_background_label_first():
    import numpy as np

    entry = UPSTREAM.get("cliptrase")
    pred = np.array([[20, 0, 19], [3, 20, 7]])
    # VOC21: upstream labels its 20 classes 0..19 and every background word 20; the project's
    # class 0 is the background, class c + 1 upstream's c
    got = entry.labels({"preds": [pred], "dataset": "VOC21", "classes": 20}, {})
    assert got.tolist() == [[0, 1, 20], [4, 0, 8]]
    # VOC20 has no background: the map is upstream's
    assert entry.labels({"preds": [pred[:, 1:]], "dataset": "VOC20", "classes": 20}, {}).tolist() == [[0, 19], [20, 7]]
    with pytest.raises(SystemExit, match="labelled 0 images, expected the folder's one"):
        entry.labels({"preds": [], "dataset": "VOC21", "classes": 20}, {})
    with pytest.raises(SystemExit, match="label 21 above the background label 20 of VOC21"):
        entry.labels({"preds": [pred + 1], "dataset": "VOC21", "classes": 20}, {})


def test_a_folder_row_gives_the_project_side_its_configs_dataset(tmp_path, monkeypatch):
    """measure() of a CLIPtrase row (its workers replaced by ones that record their specs and answer
    equal all-1 maps): the project worker reads the row config's dataset (VOC20 for
    cliptrase_b16_336_voc20.yaml, not the entry's VOC21), the upstream worker the row's dataset_info
    key and the 336 px protocol, and the row is measured at the centre crop."""
    import argparse
    import json

    import numpy as np

    from sparseclip_d2.benchmarks import agreement

    specs = {}

    def fake_worker(python, spec, threads):
        specs[spec["side"]] = spec
        np.savez(spec["result"] + ".npz", labels=np.ones((336, 336), np.int64),
                 margin=np.full((336, 336), 0.5, np.float32))
        with open(spec["result"] + ".json", "w") as f:
            json.dump(dict(activity={}, summary="", flat=[], replay=None), f)  # as the worker writes it

    monkeypatch.setattr(agreement, "_run_worker", fake_worker)
    monkeypatch.setattr(agreement, "random_clip_weights", lambda name, seed, path: path)
    args = argparse.Namespace(force=[], templates="single", seed=0, threads=1, hub_path=None, opts=[],
                              upstream_python="python")
    entry = UPSTREAM.get("cliptrase")
    row = agreement.measure("cliptrase", entry, str(tmp_path / "CLIPtrase"), "cliptrase_b16_336_voc20.yaml",
                            "voc_wide", args, str(tmp_path / "out"))
    assert specs["project"]["dataset"] == "sparseclip_voc20_val"
    assert specs["upstream"]["upstream_config"] == "VOC20"
    assert specs["upstream"]["upstream_settings"] == {"image_size": 336, "eps": 1.1, "min": 7}
    assert row["resized"] == [336, 336] and row["percent"] == 100.0 and row["upstream_config"] == "VOC20"
