"""MESS through its own package (mess-benchmark 0.2, the `mess` extra that scripts/setup.sh
installs): small datasets planted in the folders MESS's preparation scripts write, MESS's real
registration (``import mess.datasets``), the real ``tools/train_net.py`` eval path with a tiny
random tower, MESS's evaluator; its metrics checked by hand from the saved predictions and its
per-domain means against MESS's own ``mess/evaluation/mess_evaluation.py``."""
import csv
import importlib.util
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

if importlib.util.find_spec("mess") is None:  # setup installs it: absent is a failure, never a skip
    pytest.fail("MESS's package is not installed: pip install -e '.[mess]' (scripts/setup.sh installs the `mess` "
                "extra, mess-benchmark==0.2)", pytrace=False)

from sparseclip_d2.data.class_names import CLASS_NAME_SETS  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")

# Where MESS's preparation scripts write each prepared dataset, relative to the datasets root, and
# the file names its registration pairs (mess-benchmark 0.2: mess/prepare_datasets/prepare_*.py write
# them, mess/datasets/register_*.py read them with load_sem_seg(gt_ext=..., image_ext=...)).
# id: (image folder, ground-truth folder, image file, ground-truth file)
LAYOUT = {
    "bdd100k_sem_seg_val": ("bdd100k/images/10k/val", "bdd100k/annotations_detectron2/val", "a.jpg", "a.png"),
    "dark_zurich_sem_seg_val": ("Dark_Zurich/rgb_anon/val/night/GOPR0356", "Dark_Zurich/annotations_detectron2/val",
                                "GOPR0356_frame_000001_rgb_anon.png", "GOPR0356_frame_000001_gt_labelIds.png"),
    "mhp_v1_sem_seg_test": ("LV-MHP-v1/images_detectron2/test", "LV-MHP-v1/annotations_detectron2/test", "1.jpg", "1.png"),
    "foodseg103_sem_seg_test": ("FoodSeg103/Images/img_dir/test", "FoodSeg103/Images/ann_dir/test", "0.jpg", "0.png"),
    "atlantis_sem_seg_test": ("atlantis/images_detectron2/test", "atlantis/annotations_detectron2/test", "a.jpg", "a.png"),
    "dram_sem_seg_test": ("DRAM_processed/images_detectron2/test", "DRAM_processed/annotations_detectron2/test",
                          "a.jpg", "a.png"),
    "isaid_sem_seg_val": ("isaid/images_detectron2/val", "isaid/annotations_detectron2/val", "P0003_0_0.png",
                          "P0003_0_0.png"),
    "isprs_potsdam_sem_seg_test_irrg": ("ISPRS_Potsdam/images_detectron2/test/irrg",
                                        "ISPRS_Potsdam/annotations_detectron2/test", "top_potsdam_2_13_0.png",
                                        "top_potsdam_2_13_0.png"),
    "worldfloods_sem_seg_test_irrg": ("WorldFloods/images_detectron2/test/irrg", "WorldFloods/annotations_detectron2/test",
                                      "EMSR_0.png", "EMSR_0.png"),
    "floodnet_sem_seg_test": ("FloodNet-Supervised_v1.0/images_detectron2/test",
                              "FloodNet-Supervised_v1.0/annotations_detectron2/test", "6651.jpg", "6651.png"),
    "uavid_sem_seg_val": ("uavid_v1.5/images_detectron2/val", "uavid_v1.5/annotations_detectron2/val", "seq1_000000.png",
                          "seq1_000000.png"),
    "kvasir_instrument_sem_seg_test": ("kvasir-instrument/images_detectron2/test",
                                       "kvasir-instrument/annotations_detectron2/test", "ckcu.png", "ckcu.png"),
    "chase_db1_sem_seg_test": ("CHASEDB1/images_detectron2/test", "CHASEDB1/annotations_detectron2/test",
                               "Image_11L.jpg", "Image_11L.png"),
    "cryonuseg_sem_seg_test": ("CryoNuSeg/images_detectron2", "CryoNuSeg/annotations_detectron2",
                               "Human_AdrenalGland_01.png", "Human_AdrenalGland_01.png"),
    "corrosion_cs_sem_seg_test": ("Corrosion Condition State Classification/original/Test/images",
                                  "Corrosion Condition State Classification/original/Test/masks", "c1.jpeg", "c1.png"),
    "deepcrack_sem_seg_test": ("DeepCrack/test_img", "DeepCrack/annotations_detectron2/test", "11125-1.jpg", "11125-1.png"),
    "pst900_sem_seg_test": ("PST900_RGBT_Dataset/test/thermal", "PST900_RGBT_Dataset/test/labels", "32_bag.png",
                            "32_bag.png"),
    "zerowaste_sem_seg_test": ("zerowaste-f/splits_final_deblurred/test/data",
                               "zerowaste-f/splits_final_deblurred/test/sem_seg", "01_frame_000000.PNG",
                               "01_frame_000000.PNG"),
    "suim_sem_seg_test": ("SUIM/TEST/images", "SUIM/annotations_detectron2/test", "d_r_122_.jpg", "d_r_122_.png"),
    "cub_200_sem_seg_test": ("CUB_200_2011/images_detectron2/test", "CUB_200_2011/annotations_detectron2/test",
                             "Black_Footed_Albatross_0009.jpg", "Black_Footed_Albatross_0009.png"),
    "cwfid_sem_seg_test": ("cwfid/images", "cwfid/annotations_detectron2/test", "002_image.png", "002_annotation.png"),
}
for _task in ("lungs", "mediastinum", "bones", "diaphragm"):  # prepare_paxray.py: one image folder, a mask folder per task
    LAYOUT[f"paxray_sem_seg_test_{_task}"] = ("paxray_dataset/images_detectron2/test",
                                              f"paxray_dataset/annotations_detectron2/test/{_task}", "p1.png", "p1.png")

TINY = ["MODEL.SPARSECLIP.CLIP.NAME", "sparseclip-tiny-vit", "MODEL.SPARSECLIP.CLIP.PRETRAINED", "none",
        "MODEL.SPARSECLIP.TEXT.CACHE_DIR", "off", "INPUT.MIN_SIZE_TEST", "64", "DATALOADER.NUM_WORKERS", "0"]


def mess_metadata():
    """MESS's own registration, imported here: id -> (classes, classes_of_interest, background_class)."""
    from detectron2.data import MetadataCatalog

    import mess.datasets  # noqa: F401
    return {d: (list(MetadataCatalog.get(d).stuff_classes), list(MetadataCatalog.get(d).classes_of_interest),
                int(MetadataCatalog.get(d).background_class)) for d in LAYOUT}


def plant(root, meta, h=24, w=40, seed=0):
    """One image and one label map per dataset, in MESS's prepared layout; labels drawn from the
    dataset's classes (each class of a 2-class set present) with an ignore (255) stripe."""
    rng = np.random.default_rng(seed)
    gts = {}
    for d, (image_dir, gt_dir, image, gt) in LAYOUT.items():
        n = len(meta[d][0])
        os.makedirs(os.path.join(root, image_dir), exist_ok=True)
        os.makedirs(os.path.join(root, gt_dir), exist_ok=True)
        path = os.path.join(root, image_dir, image)
        if not os.path.exists(path):  # PAXRay's four tasks share the image
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path, format="JPEG" if
                                                                                   path.lower().endswith(("jpg", "jpeg")) else "PNG")
        labels = rng.integers(0, min(n, 6), (h, w)).astype(np.uint8)
        labels[:, :3] = 255
        Image.fromarray(labels).save(os.path.join(root, gt_dir, gt), format="PNG")
        gts[d] = labels
    return gts


def run_train_net(args, env):
    return subprocess.run([sys.executable, os.path.join(ROOT, "tools", "train_net.py")] + args, cwd=ROOT,
                          env=dict(os.environ, OMP_NUM_THREADS="1", **env), capture_output=True, text=True, timeout=900)


def mess_formula(gt, pred, n, coi):
    """MESS's metrics by hand in float64 from the label maps (its definitions, read in
    mess/evaluation/sem_seg_evaluation.py: a class's accuracy over its ground-truth pixels, IoU over
    classes with a ground-truth or predicted pixel, CoI-mIoU = sum of the IoUs of classes of interest
    present in the ground truth over the number of classes of interest with a union)."""
    valid = gt != 255
    g, p = gt[valid].astype(np.int64), pred[valid].astype(np.int64)
    tp = np.array([np.sum((g == c) & (p == c)) for c in range(n)], dtype=np.float64)
    pos_gt = np.array([np.sum(g == c) for c in range(n)], dtype=np.float64)
    pos_pred = np.array([np.sum(p == c) for c in range(n)], dtype=np.float64)
    present, union_ok = pos_gt > 0, pos_gt + pos_pred > 0
    iou = np.where(union_ok, tp / np.maximum(pos_gt + pos_pred - tp, 1), np.nan)
    acc = np.where(present, tp / np.maximum(pos_gt, 1), np.nan)
    is_coi = np.zeros(n, dtype=bool)
    is_coi[coi] = True
    out = {"mIoU": 100 * np.nanmean(iou[union_ok]), "mACC": 100 * np.mean(acc[present]),
           "CoI-mIoU": 100 * np.sum(iou[is_coi & present]) / np.sum(is_coi & union_ok),
           "CoI-mACC": 100 * np.mean(acc[is_coi & present])}
    if n == 2:
        out["Specificity"], out["Sensitivity"] = 100 * acc[0], 100 * acc[1]
    return out


def decode_predictions(path, shape):
    """detectron2's sem_seg_predictions.json (one RLE per predicted class) -> label map."""
    from pycocotools import mask as mask_util

    pred = np.full(shape, -1, dtype=np.int64)
    for entry in json.load(open(path)):
        rle = dict(entry["segmentation"], counts=entry["segmentation"]["counts"].encode())
        pred[mask_util.decode(rle).astype(bool)] = entry["category_id"]
    assert (pred >= 0).all()
    return pred


def read_csv_table(path):
    with open(path) as f:
        rows = list(csv.reader(f))
    return {r[0]: dict(zip(rows[0][1:], r[1:])) for r in rows[1:]}


def test_mess_sweep_runs_all_22_through_train_net_and_mess_evaluator_and_matches_mess_script(tmp_path):
    meta = mess_metadata()
    data = tmp_path / "data"
    gts = plant(str(data), meta)
    # the real sweep file (its 25 dataset ids = MESS's evaluation set) with the tiny random tower; an
    # upstream class-name set (NACLIP's) is set too: MESS's class names stay
    sets = ["backbone=sparseclip-tiny-vit", "pretrained=none", "resolution=64", "MODEL.SPARSECLIP.CLASS_NAMES=naclip",
            "DATALOADER.NUM_WORKERS=0"]
    sweep_out = tmp_path / "sweep"
    res = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "sweep.py"), "configs/sweeps/mess.yaml",
                          "--output", str(sweep_out)] + [a for kv in sets for a in ("--set", kv)], cwd=ROOT,
                         env=dict(os.environ, OMP_NUM_THREADS="1", DETECTRON2_DATASETS=str(data),
                                  SPARSECLIP_TEXT_CACHE="off"),
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-3000:])
    runs = [p for p in (sweep_out / "runs").iterdir() if (p / "results.json").is_file()]
    assert len(runs) == 1
    out = runs[0]
    assert "its class names are fixed by MESS" in (out / "log.txt").read_text()
    results = json.loads((out / "results.json").read_text())
    from mess.evaluation.mess_evaluation import dataset_names

    from sparseclip_d2.analysis.mess_tables import mess_catalog, mess_tables

    assert set(results) - {"config", "random_weights"} == set(LAYOUT) == set(dataset_names) - {"paxray_combined"}
    _, domains = mess_catalog()
    for d, gt in gts.items():
        entry = results[d]
        classes, coi, _ = meta[d]
        assert entry["benchmark"] == "MESS" and entry["mess_domain"] == domains[d] and entry["num_images"] == 1
        assert len(entry["per_class_IoU"]) == len(classes)
        pred = decode_predictions(out / "inference" / d / "sem_seg_predictions.json", gt.shape)
        hand = mess_formula(gt, pred, len(classes), coi)
        assert set(hand) - {"mACC", "mIoU"} == {k for k in ("CoI-mIoU", "CoI-mACC", "Specificity", "Sensitivity")
                                               if k in entry}
        for k, v in hand.items():
            assert entry[k] == pytest.approx(v, abs=1e-9), (d, k)
    # the sweep's MESS tables (from its record) = MESS's mess_evaluation.py on the .pth files of the same run;
    # and with results missing (one PAXRay task, a whole dataset) both leave them out of the means alike
    import shutil

    partial = tmp_path / "partial"
    shutil.copytree(out / "inference", partial)
    gone = ("paxray_sem_seg_test_bones", "dram_sem_seg_test")
    for d in gone:
        shutil.rmtree(partial / d)
    metrics = ["mIoU", "CoI-mIoU"]
    mine = mess_tables({"base": results, "partial": {d: m for d, m in results.items() if d not in gone}},
                       metrics + ["mACC"])
    theirs_dir = tmp_path / "mess_results"
    res = subprocess.run([sys.executable, "-m", "mess.evaluation.mess_evaluation", "--model_outputs",
                          str(out / "inference"), str(partial), "--metrics", *metrics, "mACC", "--results_dir",
                          str(theirs_dir)], cwd=str(tmp_path), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    missing = [line for line in res.stdout.splitlines() if "No evaluation file found" in line]
    assert sorted(missing) == sorted(f"No evaluation file found for {d} in {partial}" for d in gone)
    assert "PAXRay-4" in (sweep_out / "mess.md").read_text() and "RANDOM WEIGHTS" in (sweep_out / "mess.md").read_text()
    for metric in metrics + ["mACC"]:
        # mess_evaluation.py under pandas 3 leaves its means unrounded (object columns): compared to 1e-9
        for kind, theirs_file, n in (("domain", "domain_results", 6), ("dataset", "results", 23)):
            table = read_csv_table(theirs_dir / f"{theirs_file}_{metric}.csv")
            written = read_csv_table(sweep_out / f"mess_{kind}s_{metric}.csv")["base"] if metric in metrics else None
            for model, theirs_model in (("base", "inference"), ("partial", "partial")):
                theirs, ours = table[theirs_model], mine[f"per_{kind}"][metric][model]
                assert set(theirs) == set(ours) and len(ours) == n  # 22 datasets (PAXRay-4 one) + Mean; 5 domains + Mean
                for key, value in ours.items():
                    if model == "partial" and key == "DRAM":
                        assert math.isnan(value) and theirs[key] == "-"
                        continue
                    assert not math.isnan(value)
                    assert float(theirs[key]) == pytest.approx(value, abs=1e-9), (metric, model, key)
                    if written is not None and model == "base":
                        assert written[key] == f"{round(value, 2):.2f}", (metric, key)
    assert mine["per_domain"]["mIoU"]["partial"]["General"] != mine["per_domain"]["mIoU"]["base"]["General"]


def test_missing_prepared_folder_is_one_line_naming_the_manual_download(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    res = run_train_net(["--eval-only", "--config-file", "configs/demo.yaml", *TINY, "DATASETS.TEST",
                         '("isprs_potsdam_sem_seg_test_irrg",)', "OUTPUT_DIR", str(tmp_path / "o")],
                        {"DETECTRON2_DATASETS": str(empty)})
    assert res.returncode == 2
    lines = [line for line in res.stderr.splitlines() if line.startswith("train_net.py: error: data: ")]
    assert len(lines) == 1, res.stderr[-3000:]
    line = lines[0]
    for part in ("isprs_potsdam_sem_seg_test_irrg", str(empty / "ISPRS_Potsdam" / "images_detectron2" / "test" / "irrg"),
                 "ISPRS Potsdam needs a manual download", "Potsdam.zip",
                 "https://www.isprs.org/education/benchmarks/UrbanSemLab/default.aspx",
                 f"DETECTRON2_DATASETS={empty} python -m mess.prepare_datasets.prepare_isprs_potsdam",
                 "mess.prepare_all_datasets"):
        assert part in line, (part, line)
    assert "RANDOM WEIGHTS" not in res.stderr  # before the model was built


def test_mess_metadata_flows_into_the_project_keys():
    """Every MESS dataset: background_index from MESS's background_class (none where MESS says 255),
    benchmark "mess", its class names kept; the sem_seg evaluator is MESS's."""
    from detectron2.data import MetadataCatalog

    from sparseclip_d2.data.datasets.mess_benchmark import mess_dataset_names
    from detectron2.evaluation import SemSegEvaluator

    from sparseclip_d2.evaluation import SparseCLIPSemSegEvaluator
    from sparseclip_d2.evaluation.build import BENCHMARK_EVALUATORS
    from sparseclip_d2.evaluation.mess_benchmark import SparseCLIPMESSEvaluator, build_mess_evaluator, mess_dataset_info
    import mess.evaluation.sem_seg_evaluation as mess_eval

    names = mess_dataset_names()
    assert set(LAYOUT) <= set(names) and len(names) == 39  # mess-benchmark 0.2 registers 39 (with its variants)
    for d in names:
        meta = MetadataCatalog.get(d)
        bg, n = meta.background_class, len(meta.stuff_classes)
        assert meta.benchmark == "mess" and meta.evaluator_type == "sem_seg" and meta.ignore_label == 255
        assert meta.background_index == (bg if bg < n else None), d
    assert MetadataCatalog.get("isprs_potsdam_sem_seg_test_irrg").background_index == 5  # 'others'
    assert MetadataCatalog.get("bdd100k_sem_seg_val").background_index is None
    assert MetadataCatalog.get("atlantis_sem_seg_test").background_index is None
    assert MetadataCatalog.get("dram_sem_seg_test").background_index == 11
    # the sem_seg builder's choice (building an evaluator reads the dataset: the sweep test does that)
    assert BENCHMARK_EVALUATORS["mess"] is build_mess_evaluator
    mro = SparseCLIPMESSEvaluator.__mro__
    assert mro.index(SparseCLIPSemSegEvaluator) < mro.index(mess_eval.MESSSemSegEvaluator) < mro.index(SemSegEvaluator)
    assert mess_dataset_info("chase_db1_sem_seg_test") == {"mess_dataset": "CHASE DB1", "mess_domain": "Medical Sciences"}
    assert mess_dataset_info("chase_db1_sem_seg_test_official" if "chase_db1_sem_seg_test_official" in names
                             else "cwfid_sem_seg_test_official") == {"mess_dataset": None, "mess_domain": None}


@pytest.mark.parametrize("class_set", ("",) + CLASS_NAME_SETS)
def test_every_class_name_setting_keeps_mess_names_and_background(class_set):
    """What a method config can change in the vocabulary path is MODEL.SPARSECLIP.CLASS_NAMES ('' or an
    upstream set): with each, a MESS dataset's vocabulary is MESS's stuff_classes and its background."""
    from types import SimpleNamespace

    from detectron2.data import MetadataCatalog

    import sparseclip_d2.data  # noqa: F401  (registers, MESS's datasets included)
    from sparseclip_d2.modeling.meta_arch import SparseCLIP

    for d, bg in (("isprs_potsdam_sem_seg_test_irrg", 5), ("bdd100k_sem_seg_val", None), ("dram_sem_seg_test", 11)):
        model = SimpleNamespace(class_names=class_set, _checked_vocabularies=set())
        model._upstream_vocabulary = lambda *a: SparseCLIP._upstream_vocabulary(model, *a)
        classes, background = SparseCLIP._vocabulary(model, {"dataset_name": d})
        assert classes == list(MetadataCatalog.get(d).stuff_classes) and background == bg
