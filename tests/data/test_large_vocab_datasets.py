"""ADE20K-847 and Pascal Context-459 planted in the on-disk layouts CAT-Seg's preparation reads
(cvlab-kaist/CAT-Seg @ 6d3a188 datasets/prepare_ade20k_full.py, prepare_pascal_context_459.py),
prepared by ``tools/prepare_datasets.py ade847 / context459``, registered under
$DETECTRON2_DATASETS and evaluated."""
import os
import pickle

import numpy as np
import pytest
from PIL import Image

from sparseclip_d2.data import load_class_names
from sparseclip_d2.prepare.catseg import ADE847_IDS, ade847_target_size
from sparseclip_d2.prepare.cli import main as prepare_main  # tools/prepare_datasets.py
from sparseclip_d2.prepare.convert import PrepareError


def _seg_png(path, ade_ids):
    """ADE20K's _seg.png of an object-class map: R = int(id / 256) * 10, G = id % 256 (B unused)."""
    ids = np.asarray(ade_ids)
    rgb = np.zeros(ids.shape + (3,), dtype=np.uint8)
    rgb[..., 0] = (ids // 256) * 10
    rgb[..., 1] = ids % 256
    rgb[..., 2] = 7
    Image.fromarray(rgb).save(path)


def plant_ade(root, big=(520, 530)):
    """ADE20K_2021_17_01 as downloaded: index_ade20k.pkl, images and _seg.png masks of a training
    image (never converted) and two validation images, one larger than 512 on both sides."""
    rng = np.random.default_rng(0)
    base = os.path.join(root, "ADE20K_2021_17_01")
    folders, files = [], []
    # wall 2978 -> 0, building 312 -> 1, adding machine 3148 -> 846 (trainIds of
    # prepare_ade20k_full.py); 5 is no listed id -> 65535
    small = np.array([[2978, 2978, 312, 5], [3148, 3148, 312, 5], [2978, 312, 312, 3148]])
    small = np.repeat(np.repeat(small, 4, 0), 5, 1)  # 12 x 20
    h, w = big
    large = np.full((h, w), 2978)
    large[: h // 2, : w // 3] = 312
    large[h // 2:, w // 2:] = 3148
    large[:, w - 40:] = 5
    for name, split, ids in (("ADE_train_00000001.jpg", "training", small), ("ADE_val_00000001.jpg", "validation", small),
                             ("ADE_val_00000002.jpg", "validation", large)):
        folder = os.path.join("ADE20K_2021_17_01", "images", "ADE", split, "home", "bedroom")
        os.makedirs(os.path.join(root, folder), exist_ok=True)
        Image.fromarray(rng.integers(0, 255, ids.shape + (3,), dtype=np.uint8)).save(os.path.join(root, folder, name))
        _seg_png(os.path.join(root, folder, name.replace(".jpg", "_seg.png")), ids)
        folders.append(folder)
        files.append(name)
    with open(os.path.join(base, "index_ade20k.pkl"), "wb") as f:
        pickle.dump({"folder": folders, "filename": files, "objectnames": ["-"] * 3200}, f)
    return small, large


def plant_context(root, ids=("2008_000002", "2008_000003", "2008_000004")):
    """VOC2010 with Pascal Context's trainval/<id>.mat (LabelMap 1..459) and CAT-Seg's
    pascalcontext_val.txt; the last id has no .mat file (CAT-Seg skips it)."""
    import scipy.io

    rng = np.random.default_rng(1)
    base = os.path.join(root, "VOCdevkit", "VOC2010")
    os.makedirs(os.path.join(base, "trainval"), exist_ok=True)
    os.makedirs(os.path.join(base, "JPEGImages"), exist_ok=True)
    maps = {}
    for i, image_id in enumerate(ids):
        label_map = rng.integers(1, 460, (9, 13)).astype(np.uint16)
        label_map[0, 0], label_map[0, 1] = 1, 459  # the first and the last class
        Image.fromarray(rng.integers(0, 255, (9, 13, 3), dtype=np.uint8)).save(
            os.path.join(base, "JPEGImages", image_id + ".jpg"))
        if i < len(ids) - 1:
            scipy.io.savemat(os.path.join(base, "trainval", image_id + ".mat"), {"LabelMap": label_map})
            maps[image_id] = label_map
    with open(os.path.join(base, "pascalcontext_val.txt"), "w") as f:
        f.write("\n".join(ids) + "\n")
    return maps


def test_class_names_are_catsegs():
    ade = load_class_names("ade847")
    pc = load_class_names("context459")
    assert len(ade) == 847 and len(pc) == 459 and len(ADE847_IDS) == len(set(ADE847_IDS)) == 847
    # CAT-Seg @ 6d3a188 datasets/ade847.json / pc459.json: first, a middle and the last entries
    assert ade[0] == "wall" and ade[1] == "building, edifice" and ade[846] == "adding machine, totalizer, totaliser"
    assert ade[300] == "altar, communion table, lord's table"
    assert pc[0] == "accordion" and pc[2] == "airconditioner" and pc[458] == "wool"
    proxy = load_class_names("context459", class_set="proxyclip")  # ProxyCLIP's cls_context459.txt
    assert len(proxy) == 459 and proxy[2] == "air conditioner" and proxy[458] == "wool"


def test_the_ignore_value_written_is_the_one_registered():
    from sparseclip_d2.data.datasets import segmentation
    from sparseclip_d2.prepare import catseg

    assert catseg.ADE847_IGNORE == segmentation.ADE847_IGNORE == 65535
    assert catseg.CONTEXT459_IGNORE == segmentation.CONTEXT459_IGNORE == 65535


def test_ade847_target_size_is_catsegs():
    assert ade847_target_size(512, 700) is None            # the short side is not above 512
    assert ade847_target_size(300, 2000) is None
    assert ade847_target_size(520, 530) == (512, 522)      # round(530 / 520 * 512) = round(521.8)
    assert ade847_target_size(1536, 2048) == (512, 683)    # round(682.67)
    assert ade847_target_size(2048, 1536) == (683, 512)


def _registered_under(root):
    """The two datasets registered by the real registration functions under ``root`` (in place of
    the import-time registration, restored after), loaded, checked and evaluated."""
    import torch
    from detectron2.data import DatasetCatalog, MetadataCatalog

    from sparseclip_d2.data.datasets.root import datasets_root
    from sparseclip_d2.data.datasets.segmentation import register_ade847, register_context459
    from sparseclip_d2.data.ground_truth import find_bad_ground_truth, load_sem_seg_gt
    from sparseclip_d2.evaluation.build import SparseCLIPSemSegEvaluator

    names = ("sparseclip_ade847_val", "sparseclip_context459_val")

    def register(where):
        for n in names:
            DatasetCatalog.remove(n)
            MetadataCatalog.remove(n)
        register_ade847(where)
        register_context459(where)

    register(root)
    try:
        out = {}
        for n in names:
            d = DatasetCatalog.get(n)
            m = MetadataCatalog.get(n)
            problems, _ = find_bad_ground_truth(n, d, num_classes=len(m.stuff_classes), ignore_label=m.ignore_label)
            ev = SparseCLIPSemSegEvaluator(n, distributed=False)
            ev.reset()
            for r in d:
                gt = load_sem_seg_gt(r["sem_seg_file_name"], num_classes=len(m.stuff_classes),
                                     ignore_label=m.ignore_label)
                pred = np.where(gt == m.ignore_label, 0, gt)
                pred[0, :] = 1
                ev.process([{"file_name": r["file_name"]}], [{"sem_seg_labels": torch.from_numpy(pred)}])
            res = ev.evaluate()["sem_seg"]
            out[n] = dict(n=len(d), ids=[r["image_id"] for r in d], classes=len(m.stuff_classes),
                          ignore=m.ignore_label, file=m.class_names_file, problems=problems, mIoU=res["mIoU"],
                          pACC=res["pACC"], zero=res["zero_IoU_share"], biou=res["boundary_IoU"],
                          root=d[0]["file_name"])
        return out
    finally:
        register(datasets_root())


def test_prepare_register_and_evaluate(tmp_path, capsys):
    import cv2

    root = str(tmp_path)
    small, large = plant_ade(root)
    maps = plant_context(root)
    for task in ("ade847", "context459"):
        assert prepare_main([task, "--root", root]) in (0, None)
    assert "1 of 3 ids" in capsys.readouterr().out  # the id without a .mat, skipped as CAT-Seg does

    base = tmp_path / "ADE20K_2021_17_01"
    out = base / "annotations_detectron2" / "validation"
    assert sorted(os.listdir(out)) == ["ADE_val_00000001.tif", "ADE_val_00000002.tif"]  # no training image
    with Image.open(out / "ADE_val_00000001.tif") as im:
        assert im.format == "TIFF" and im.mode == "I;16"
        got = np.asarray(im)
    table = {2978: 0, 312: 1, 3148: 846, 5: 65535}  # by hand from prepare_ade20k_full.py
    assert np.array_equal(got, np.vectorize(table.get)(small))
    with Image.open(out / "ADE_val_00000002.tif") as im:
        got = np.asarray(im)
    assert got.shape == (512, 522)  # short side 512
    nearest = cv2.resize(large.astype(np.int32), (522, 512), interpolation=cv2.INTER_NEAREST)
    assert np.array_equal(got, np.vectorize(table.get)(nearest))
    with Image.open(base / "images_detectron2" / "validation" / "ADE_val_00000002.jpg") as im:
        assert im.size == (522, 512)
    for image_id, label_map in maps.items():
        with Image.open(tmp_path / "VOCdevkit" / "VOC2010" / "annotations_detectron2" / "pc459_val" / f"{image_id}.tif") as im:
            assert im.mode == "I;16" and np.array_equal(np.asarray(im), label_map.astype(np.int64) - 1)

    # a second run rewrites nothing
    assert prepare_main(["ade847", "--root", root]) in (0, None)
    printed = capsys.readouterr().out
    assert "wrote 0" in printed and "2 already up to date" in printed

    out = _registered_under(root)
    ade, pc = out["sparseclip_ade847_val"], out["sparseclip_context459_val"]
    assert (ade["n"], ade["classes"], ade["ignore"], ade["file"], ade["problems"]) == (2, 847, 65535, "ade847", [])
    assert (pc["n"], pc["classes"], pc["ignore"], pc["file"], pc["problems"]) == (2, 459, 65535, "context459", [])
    assert pc["ids"] == ["2008_000002", "2008_000003"] and ade["root"].startswith(root)
    # hand: the prediction is the ground truth except row 0 (labelled 1); ignored pixels count nowhere
    gts = [np.vectorize(table.get)(small), np.vectorize(table.get)(nearest)]
    valid = sum(int((g != 65535).sum()) for g in gts)
    wrong = sum(int(((g[0] != 65535) & (g[0] != 1)).sum()) for g in gts)
    assert ade["pACC"] == pytest.approx(100 * (valid - wrong) / valid)
    pcs = [m - 1 for m in maps.values()]
    pc_valid = sum(g.size for g in pcs)
    pc_wrong = sum(int((g[0] != 1).sum()) for g in pcs)
    assert pc["pACC"] == pytest.approx(100 * (pc_valid - pc_wrong) / pc_valid)
    # ADE: classes 0, 1, 846 present, each keeps pixels off row 0 -> no zero IoU
    assert ade["zero"] == 0.0 and 0 < ade["biou"] <= 100


def test_missing_downloads_name_the_file_and_where_to_get_it(tmp_path):
    from sparseclip_d2.prepare.catseg import ade847, context459, context459_labels

    with pytest.raises(PrepareError, match="index_ade20k.pkl.*ADE20K_2021_17_01.zip"):
        ade847(str(tmp_path))
    with pytest.raises(PrepareError, match="pascalcontext_val.txt.*CAT-Seg"):
        context459(str(tmp_path))
    with pytest.raises(PrepareError, match="m.mat: LabelMap holds values 0..3; expected 1..459"):
        context459_labels(np.array([[0, 3]]), "m.mat")


def test_the_model_takes_ade847s_published_names_and_refuses_repeats_elsewhere(caplog):
    """ADE20K-847's names repeat 41 synonyms across classes (CAT-Seg's list as published): the META_ARCH
    takes the dataset's vocabulary, logging the repeats once; the same repeats in a vocabulary given
    as input stay an error."""
    import logging

    from detectron2.modeling import build_model

    from conftest import tiny_cfg

    model = build_model(tiny_cfg())
    with caplog.at_level(logging.WARNING):
        classes, bg = model._vocabulary({"dataset_name": "sparseclip_ade847_val"})
        first = len(caplog.records)
        model._vocabulary({"dataset_name": "sparseclip_ade847_val"})
    assert len(classes) == 847 and bg is None
    repeats = [r for r in caplog.records if "duplicate name 'screen'" in r.getMessage()]
    # 'screen' in four classes (51, 57, 147, 153): three repeats, logged by the first image only
    assert len(repeats) == 3 and first == len(caplog.records) >= 41
    with pytest.raises(ValueError, match="duplicate name 'screen'"):
        model._vocabulary({"vocabulary": ["blind, screen", "screen door, screen"]})
