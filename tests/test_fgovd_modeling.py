"""FG-OVD inference: RoIAlign coordinates, planted embeddings end to end, tiny CLIP checks."""
import json
import os
import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from detectron2.config import get_cfg
from detectron2.data import DatasetCatalog, MetadataCatalog, build_detection_test_loader
from detectron2.data.build import get_detection_dataset_dicts
from detectron2.evaluation import inference_on_dataset
from detectron2.modeling import build_model
from detectron2.structures import Boxes, Instances

from sparseclip_d2.clip import TextClassifier, get_tokenizer
from sparseclip_d2.config import add_sparseclip_config
from sparseclip_d2.data.datasets.fgovd import register_fgovd_dataset
from sparseclip_d2.data.fgovd_mapper import FGOVDDatasetMapper, FGOVDOptions
from sparseclip_d2.evaluation.fgovd_evaluation import FGOVDEvaluator
from sparseclip_d2.modeling.fgovd import crop_boxes, fgovd_inference, match_proposals, pool_region_embeddings
from sparseclip_d2.modeling.meta_arch import SparseCLIP


# ---------------------------------------------------------------- RoIAlign coordinates
def test_one_patch_box_pools_that_patch():
    torch.manual_seed(0)
    feats = torch.randn(2, 5, 3, 4)  # (B, D, h, w), p = 16 -> image 48 x 64
    boxes = [torch.tensor([[16.0 * j, 16.0 * i, 16.0 * (j + 1), 16.0 * (i + 1)] for i in range(3) for j in range(4)])] * 2
    out = pool_region_embeddings(feats, boxes, patch_size=16, pooler_resolution=1, aligned=True)
    for b in range(2):
        expected = F.normalize(feats[b].flatten(1).t(), dim=-1)  # (h*w, D), row-major patches
        assert torch.allclose(out[b], expected, atol=1e-6)


def test_aligned_false_samples_patch_corner():
    # aligned=False has no half-pixel offset: a one-patch box is sampled at the corner shared
    # by patches (i, j), (i, j+1), (i+1, j), (i+1, j+1), i.e. their mean.
    torch.manual_seed(1)
    feats = torch.randn(1, 4, 3, 3)
    out = pool_region_embeddings(feats, [torch.tensor([[0.0, 0.0, 16.0, 16.0]])], 16, 1, aligned=False)[0]
    expected = F.normalize(feats[0, :, :2, :2].mean(dim=(1, 2)), dim=0)
    assert torch.allclose(out[0], expected, atol=1e-6)


def test_pooler_resolution_two_on_two_patches():
    # P = 2 on a box covering 2 x 2 patches: each bin is one patch, sampled at its centre.
    torch.manual_seed(2)
    feats = torch.randn(1, 4, 3, 3)
    out = pool_region_embeddings(feats, [torch.tensor([[16.0, 16.0, 48.0, 48.0]])], 16, 2, aligned=True)[0]
    expected = F.normalize(feats[0, :, 1:3, 1:3].mean(dim=(1, 2)), dim=0)
    assert torch.allclose(out[0], expected, atol=1e-6)


def test_match_proposals():
    gt = torch.tensor([[0.0, 0, 10, 10], [20, 20, 30, 30], [0, 0, 10, 10]])
    props = torch.tensor([[0.0, 0, 10, 20], [0, 0, 10, 10], [20, 20, 26, 30]])
    index, matched = match_proposals(gt, props, 0.5)
    # box 0: IoU 0.5 and 1.0 -> proposal 1; box 1: IoU 0.6 with proposal 2 (>= 0.5)
    assert index.tolist()[:2] == [1, 2] and matched.tolist() == [True, True, True]
    index, matched = match_proposals(gt, props, 0.61)
    assert matched.tolist() == [True, False, True]
    assert match_proposals(gt, props[:0], 0.5)[1].tolist() == [False] * 3


def test_crop_boxes_identity_and_subcrop():
    img = torch.arange(2 * 8 * 8, dtype=torch.float32).view(2, 8, 8)
    assert torch.allclose(crop_boxes(img, torch.tensor([[0.0, 0, 8, 8]]), (8, 8))[0], img)
    # [2.5, 1, 6, 5.2] -> integer rectangle x 2..6, y 1..6
    assert torch.allclose(crop_boxes(img, torch.tensor([[2.5, 1, 6, 5.2]]), (5, 4))[0], img[:, 1:6, 2:6])


# ---------------------------------------------------------------- planted embeddings
D = 9  # one-hot embedding of each of the 3 x 3 patches of a 48 x 48 image


def e(k, w=1.0):
    v = torch.zeros(D)
    v[k] = w
    return v


CAPTION_VECS = {
    "a mug, red, number 0.": e(0),
    "a mug, red, number 0 again.": e(0),
    "a mug, blue, number 1.": e(1),
    "a mug, green, number 2.": e(2),
    "a mug, black, number 4.": e(4),
    "a mug, white, number 8.": e(8),
    "a mug, white, number 8 again.": e(8),
    "half 0, half 1.": F.normalize(e(0) + e(1), dim=0),
    "mostly 0, some 1.": F.normalize(e(0, 0.875) + e(1, 0.125), dim=0),
}
TEXTS = list(CAPTION_VECS)


class PlantedEncoder(nn.Module):
    """(B, 3, 48, 48) -> (B, 9, 3, 3), patch (i, j) = one-hot e_{3i+j}."""

    patch_size = 16
    embed_dim = D

    def __init__(self):
        super().__init__()
        self.register_buffer("grid", torch.eye(D).view(D, 3, 3))

    def forward(self, images):
        assert images.shape[1:] == (3, 48, 48), images.shape
        return self.grid.expand(images.shape[0], -1, -1, -1).clone()


class PlantedText(nn.Module):
    """``encode_text`` of token ids -> planted caption vectors."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.stack([CAPTION_VECS[t] for t in TEXTS]), requires_grad=False)

    def encode_text(self, tokens):
        return self.table[tokens[:, 0]]


def planted_tokenizer(texts):
    return torch.tensor([[TEXTS.index(t)] for t in texts])  # unknown (e.g. split) text -> ValueError


def planted_model():
    clip = PlantedText()
    return SparseCLIP(
        encoder=PlantedEncoder(), text_classifier=TextClassifier(clip, planted_tokenizer, "none", cache_dir="off"),
        templates="none", pixel_mean=[0.0, 0.0, 0.0], pixel_std=[1.0, 1.0, 1.0], clip_model=clip,
    )


def patch_box(k, dx=0.0):
    i, j = divmod(k, 3)
    return [16.0 * j + dx, 16.0 * i, 16.0, 16.0]  # xywh


def write_benchmark(root, images):
    """images: {image_id: [(ann_id, xywh, [positive, negatives...])]} of 48 x 48 images."""
    os.makedirs(os.path.join(root, "coco", "val2017"), exist_ok=True)
    ids = {t: i + 1 for i, t in enumerate(TEXTS)}
    imgs, anns = [], []
    for iid, boxes in images.items():
        fn = f"val2017/{iid:012d}.png"
        Image.fromarray(np.full((48, 48, 3), 100, np.uint8)).save(os.path.join(root, "coco", fn))
        imgs.append({"id": iid, "width": 48, "height": 48, "file_name": fn})
        for aid, box, caps in boxes:
            anns.append({"id": aid, "image_id": iid, "bbox": box, "category_id": ids[caps[0]],
                         "neg_category_ids": [ids[c] for c in caps[1:]]})
    path = os.path.join(root, "bench.json")
    with open(path, "w") as f:
        json.dump({"images": imgs, "annotations": anns,
                   "categories": [{"id": i, "name": t} for t, i in ids.items()]}, f)
    return path, os.path.join(root, "coco")


def _register(name, json_file, image_root, n):
    if name in DatasetCatalog.list():
        DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)
    register_fgovd_dataset(name, json_file, image_root, n, split="hard")


def _cfg(**fgovd):
    cfg = get_cfg()
    add_sparseclip_config(cfg)
    cfg.INPUT.FORMAT = "RGB"
    cfg.MODEL.DEVICE = "cpu"
    for k, v in fgovd.items():
        setattr(cfg.MODEL.SPARSECLIP.FGOVD, k, v)
    return cfg


def _evaluate(model, cfg, name, image_ids=None):
    dicts = get_detection_dataset_dicts(
        [name], filter_empty=False,
        proposal_files=list(cfg.DATASETS.PROPOSAL_FILES_TEST) if cfg.MODEL.LOAD_PROPOSALS else None,
    )
    if image_ids is not None:
        dicts = [d for d in dicts if d["image_id"] in image_ids]
    loader = build_detection_test_loader(dicts, mapper=FGOVDDatasetMapper(cfg, name))
    return inference_on_dataset(model, loader, FGOVDEvaluator(name))["fgovd"]


A = "a mug, red, number 0."
A2 = "a mug, red, number 0 again."
B = "a mug, blue, number 1."
C = "a mug, green, number 2."
P4 = "a mug, black, number 4."
P8 = "a mug, white, number 8."
P8b = "a mug, white, number 8 again."


def test_planted_ranks_metrics_ties_drop_rule(tmp_path):
    images = {
        1: [
            (11, patch_box(0), [A, B, C]),                  # 1, 0, 0 -> rank 1
            (12, patch_box(0), [A, A2, B]),                 # tie with a negative -> rank 2
            (13, patch_box(1), [A, "half 0, half 1.", B]),  # 0, .71, 1 -> rank 3
            (14, patch_box(4), [P4, A, P8]),                # rank 1
            (15, patch_box(8), [P8, A]),                    # 1 negative < N = 2 -> dropped
        ],
        2: [
            (21, patch_box(8), [P8, A, B, P8b]),            # 3 negatives: first 2 kept -> rank 1
        ],                                                  # (with the 3rd it would tie: rank 2)
    }
    json_file, image_root = write_benchmark(str(tmp_path), images)
    _register("_test_fgovd_planted", json_file, image_root, 2)
    model = planted_model()
    cfg = _cfg(RESOLUTION=48)

    res = _evaluate(model, cfg, "_test_fgovd_planted", image_ids={1})  # ranks 1 2 3 1
    assert res["top1"] == 50.0
    assert res["mean_rank"] == 7 / 4
    assert res["median_rank"] == 1.5  # even count: mean of the two middle ranks (1, 2)
    assert (res["num_boxes"], res["num_dropped"], res["num_missed"]) == (4, 1, 0)

    res = _evaluate(model, cfg, "_test_fgovd_planted")  # ranks 1 2 3 1 1
    assert res["top1"] == 60.0
    assert res["mean_rank"] == pytest.approx(8 / 5)
    assert res["median_rank"] == 1.0  # odd count: the middle rank
    assert (res["num_boxes"], res["num_dropped"]) == (5, 1)

    # N = 3 from the config: boxes 11-15 have < 3 negatives, box 21 keeps all 3 and ties
    res = _evaluate(model, _cfg(RESOLUTION=48, NUM_NEGATIVES=3), "_test_fgovd_planted")
    assert (res["num_boxes"], res["num_dropped"], res["top1"], res["mean_rank"]) == (1, 5, 0.0, 2.0)


def test_planted_proposals(tmp_path):
    images = {
        3: [
            # gt box shifted 2 px off patch 0; proposal [0, 0, 16, 16] (IoU 0.78) stands for it.
            # Pooled on the gt box the region would be 0.875 e0 + 0.125 e1 and rank 2.
            (31, patch_box(0, dx=2.0), [A, "mostly 0, some 1.", B]),
            # patch 8: no proposal with IoU >= 0.5 -> miss, worst rank 3 (would be rank 1)
            (32, patch_box(8), [P8, A, B]),
        ],
    }
    json_file, image_root = write_benchmark(str(tmp_path), images)
    _register("_test_fgovd_planted_props", json_file, image_root, 2)
    pfile = str(tmp_path / "props.pkl")
    with open(pfile, "wb") as f:
        pickle.dump({"ids": [3], "boxes": [np.array([[0, 0, 48, 48], [0, 0, 16, 16]], np.float32)],
                     "objectness_logits": [np.array([0.9, 0.5], np.float32)]}, f)
    cfg = _cfg(RESOLUTION=48)
    cfg.MODEL.LOAD_PROPOSALS = True
    cfg.DATASETS.PROPOSAL_FILES_TEST = (pfile,)
    res = _evaluate(planted_model(), cfg, "_test_fgovd_planted_props")
    assert (res["top1"], res["mean_rank"], res["median_rank"]) == (50.0, 2.0, 2.0)
    assert (res["num_boxes"], res["num_missed"], res["num_dropped"]) == (2, 1, 0)
    # without proposals the shifted gt box itself is pooled: rank 2 and 1
    res = _evaluate(planted_model(), _cfg(RESOLUTION=48), "_test_fgovd_planted_props")
    assert (res["top1"], res["mean_rank"], res["num_missed"]) == (50.0, 1.5, 0)


# ---------------------------------------------------------------- tiny random-weight CLIP
@pytest.fixture(scope="module")
def tiny_model():
    cfg = _cfg()
    cfg.MODEL.META_ARCHITECTURE = "SparseCLIP"
    cfg.MODEL.SPARSECLIP.CLIP.NAME = "sparseclip-tiny-vit"
    cfg.MODEL.SPARSECLIP.CLIP.PRETRAINED = "none"
    cfg.MODEL.SPARSECLIP.ATTENTION.SOURCE = "qq+kk"
    cfg.MODEL.SPARSECLIP.ATTENTION.NORMALIZER = "entmax"
    torch.manual_seed(0)
    return build_model(cfg)


def _tiny_input(boxes, captions, options, size=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    image = torch.randint(0, 256, (3, size, size), generator=g, dtype=torch.uint8)
    inst = Instances((size, size))
    inst.gt_boxes = Boxes(torch.tensor(boxes, dtype=torch.float32))
    inst.ann_ids = torch.arange(len(boxes))
    return {"image": image, "instances": inst, "fgovd_captions": captions, "fgovd_options": options,
            "dataset_name": "sparseclip_fgovd_hard", "image_id": 0}


CAPS = [["A red mug, with a thin handle.", "A blue mug, with a thin handle.", "A red mug, with no handle."]] * 2


def test_tiny_dense_scores_match_patch_embeddings(tiny_model):
    model = tiny_model
    inp = _tiny_input([[16.0, 0, 32, 16], [32.0, 48, 48, 64]], CAPS, FGOVDOptions(resolution=64))
    out = model([inp])[0]["fgovd"]
    feats = model.encoder(model.normalize_images([inp]).tensor)  # (1, 32, 4, 4)
    regions = F.normalize(torch.stack([feats[0, :, 0, 1], feats[0, :, 3, 2]]), dim=-1)
    text = TextClassifier(model.clip_model, get_tokenizer("sparseclip-tiny-vit"), "none", cache_dir="off")
    caps = text.encode(CAPS[0])  # captions encoded whole (commas kept)
    assert torch.allclose(out["scores"], regions @ caps.t(), atol=1e-5)
    assert out["matched"].tolist() == [True, True] and out["ann_ids"].tolist() == [0, 1]


def test_tiny_crop_protocol_full_image_box(tiny_model):
    model = tiny_model
    inp = _tiny_input([[0.0, 0, 64, 64]], CAPS[:1], FGOVDOptions(protocol="crop"))
    out = model([inp])[0]["fgovd"]
    img = F.normalize(model.clip_model.encode_image(model.normalize_image(inp["image"])[None]), dim=-1)
    text = TextClassifier(model.clip_model, get_tokenizer("sparseclip-tiny-vit"), "none", cache_dir="off")
    assert torch.allclose(out["scores"], img @ text.encode(CAPS[0]).t(), atol=1e-5)


def test_tiny_no_boxes(tiny_model):
    inp = _tiny_input([], [], FGOVDOptions(resolution=64))
    inp["instances"].gt_boxes = Boxes(torch.zeros(0, 4))
    out = tiny_model([inp])[0]["fgovd"]
    assert out["scores"].shape[0] == 0 and out["matched"].numel() == 0
