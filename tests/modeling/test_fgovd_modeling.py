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
from sparseclip_d2.data.fgovd_mapper import FGOVDDatasetMapper
from sparseclip_d2.evaluation.fgovd_evaluation import FGOVDEvaluator
from sparseclip_d2.modeling.fgovd import (
    CaptionEncoder,
    SparseCLIPFGOVD,
    clip_crop,
    crop_box_pixels,
    match_proposals,
    pool_region_embeddings,
)
from sparseclip_d2.modeling.fgovd_conventions import FGOVD_CONVENTION_PRESETS
from sparseclip_d2.common.needs import Needs


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


def test_match_proposals_by_iou_and_by_score():
    gt = torch.tensor([[0.0, 0, 10, 10], [20, 20, 30, 30], [0, 0, 10, 10]])
    props = torch.tensor([[0.0, 0, 10, 20], [0, 0, 10, 10], [20, 20, 26, 30]])
    scores = torch.tensor([0.9, 0.1, 0.5])
    # box 0: IoU 0.5 (score 0.9) and 1.0 (score 0.1); box 1: IoU 0.6 with proposal 2
    index, matched = match_proposals(gt, props, 0.5, mode="iou")
    assert index.tolist() == [1, 2, 1] and matched.tolist() == [True, True, True]
    # by score, IoU must exceed 0.5 strictly: proposal 0 (IoU exactly 0.5) is not eligible
    index, matched = match_proposals(gt, props, 0.5, scores, mode="score")
    assert index.tolist() == [1, 2, 1] and matched.tolist() == [True, True, True]
    index, matched = match_proposals(gt, props, 0.4, scores, mode="score")
    assert index.tolist() == [0, 2, 0]  # now the higher-scoring proposal 0 wins
    index, matched = match_proposals(gt, props, 0.61, mode="iou")
    assert matched.tolist() == [True, False, True]
    assert match_proposals(gt, props[:0], 0.5, scores[:0])[1].tolist() == [False] * 3
    with pytest.raises(ValueError, match="unknown proposal matching"):
        match_proposals(gt, props, 0.5, scores, mode="best")


def test_crop_box_pixels_floor_ceil_clipped():
    assert crop_box_pixels([2.5, 1, 6, 5.2], 8, 8) == (2, 1, 6, 6)
    assert crop_box_pixels([-3.2, -0.5, 100.0, 7.01], 8, 8) == (0, 0, 8, 8)
    assert crop_box_pixels([3.0, 3.0, 3.0, 3.0], 8, 8) == (3, 3, 4, 4)  # at least one pixel


@pytest.mark.parametrize("box, size", [([10.3, 5.7, 70.2, 33.1], 32), ([0.0, 0.0, 90.0, 60.0], 24),
                                       ([60.5, 2.0, 89.9, 59.5], 16)])
def test_clip_crop_equals_clip_preprocess(box, size):
    """Our crop = PIL's crop of the floor/ceil rectangle through CLIP's own transform
    (open_clip.image_transform: Resize(n, bicubic) of the short side, CenterCrop(n),
    ToTensor, Normalize), written here from the library's pieces."""
    import open_clip
    from torchvision import transforms as T

    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (60, 90, 3), dtype=np.uint8))
    ours = clip_crop(image, box, size)
    assert ours.dtype == torch.uint8 and ours.shape == (3, size, size)
    rect = (int(np.floor(box[0])), int(np.floor(box[1])), int(np.ceil(box[2])), int(np.ceil(box[3])))
    crop = image.crop(rect)
    geometric = T.Compose([T.Resize(size, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(size)])(crop)
    assert torch.equal(ours, torch.as_tensor(np.asarray(geometric)).permute(2, 0, 1))
    reference = open_clip.image_transform(size, is_train=False)(crop)  # (3, n, n) normalised
    mean = torch.tensor(open_clip.OPENAI_DATASET_MEAN).view(3, 1, 1)
    std = torch.tensor(open_clip.OPENAI_DATASET_STD).view(3, 1, 1)
    assert torch.allclose((ours.float() / 255 - mean) / std, reference, atol=1e-5)
    # not a stretch of the whole box to a square (the old behaviour): aspect kept
    stretched = torch.as_tensor(np.asarray(crop.resize((size, size), Image.BICUBIC))).permute(2, 0, 1)
    if crop.width != crop.height:
        assert not torch.equal(ours, stretched)


def test_caption_cache_bounded_per_instance():
    calls = []

    def encode(texts):
        calls.append(list(texts))
        return torch.stack([e(len(t) % D) + 0.1 for t in texts])

    enc = CaptionEncoder(encode, max_size=2)
    out = enc(["aa", "b", "aa"], torch.device("cpu"))
    assert out.shape == (3, D) and torch.equal(out[0], out[2]) and calls == [["aa", "b"]]
    assert torch.allclose(out.norm(dim=1), torch.ones(3))
    enc(["b"], torch.device("cpu"))
    assert calls == [["aa", "b"]] and len(enc) == 2
    enc(["ccc"], torch.device("cpu"))  # evicts the least recently used ("aa")
    assert len(enc) == 2
    enc(["aa"], torch.device("cpu"))
    assert calls[-1] == ["aa"]
    assert CaptionEncoder(encode)._cache is not enc._cache
    with pytest.raises(ValueError, match="CAPTION_CACHE_SIZE"):
        CaptionEncoder(encode, max_size=0)


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
    needs = Needs()  # the encoder contract: nothing besides the images

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


def planted_model(**kwargs):
    clip = PlantedText()
    return SparseCLIPFGOVD(
        encoder=PlantedEncoder(),
        caption_encoder=TextClassifier(clip, planted_tokenizer, "none", cache_dir="off").encode,
        pixel_mean=[0.0, 0.0, 0.0], pixel_std=[1.0, 1.0, 1.0], clip_model=clip, resolution=48, **kwargs,
    )


def patch_box(k, dx=0.0):
    i, j = divmod(k, 3)
    return [16.0 * j + dx, 16.0 * i, 16.0, 16.0]  # xywh


def write_benchmark(root, images):
    """images: {image_id: [(ann_id, xywh, [positive, negatives...])]} of 48 x 48 images."""
    os.makedirs(os.path.join(root, "coco", "val2017"), exist_ok=True)
    ids = {t: i for i, t in enumerate(TEXTS)}
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


def _evaluate(model, cfg, name, image_ids=None, conventions="fgovd"):
    dicts = get_detection_dataset_dicts(
        [name], filter_empty=False,
        proposal_files=list(cfg.DATASETS.PROPOSAL_FILES_TEST) if cfg.MODEL.LOAD_PROPOSALS else None,
    )
    if image_ids is not None:
        dicts = [d for d in dicts if d["image_id"] in image_ids]
    loader = build_detection_test_loader(dicts, mapper=FGOVDDatasetMapper(cfg, name))
    n = cfg.MODEL.SPARSECLIP.FGOVD.NUM_NEGATIVES
    evaluator = FGOVDEvaluator(name, None if n < 0 else n, FGOVD_CONVENTION_PRESETS[conventions])
    return inference_on_dataset(model, loader, evaluator)["fgovd"]


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
    assert res["median_rank"] == 3  # FG-OVD's sorted(r)[len(r) // 2 + 1]: 1 1 2 [3]
    assert (res["num_boxes"], res["num_dropped"], res["num_missed"]) == (4, 1, 0)

    res = _evaluate(model, cfg, "_test_fgovd_planted")  # ranks 1 2 3 1 1
    assert res["top1"] == 60.0
    assert res["mean_rank"] == pytest.approx(8 / 5)
    assert res["median_rank"] == 2.0  # sorted 1 1 1 2 3, index 3
    assert (res["num_boxes"], res["num_dropped"]) == (5, 1)

    # region_top1: the tie is a hit, box 15 kept with its one negative (rank 1); ranks
    # 1 1 3 1 1 1; median the mean of the two middle ranks
    res = _evaluate(model, cfg, "_test_fgovd_planted", conventions="region_top1")
    assert res["top1"] == pytest.approx(500 / 6)
    assert res["mean_rank"] == pytest.approx(8 / 6) and res["median_rank"] == 1.0
    assert (res["num_boxes"], res["num_dropped"], res["num_short"]) == (6, 0, 1)

    # N = 3 from the config: boxes 11-15 have < 3 negatives, box 21 keeps all 3 and ties
    res = _evaluate(model, _cfg(RESOLUTION=48, NUM_NEGATIVES=3), "_test_fgovd_planted")
    assert (res["num_boxes"], res["num_dropped"], res["top1"], res["mean_rank"]) == (1, 5, 0.0, 2.0)


def test_planted_proposals(tmp_path):
    images = {
        3: [
            # gt box [2, 0, 18, 16]: proposals [0, 0, 16, 16] (IoU 0.78, score 0.5, region e0:
            # rank 1) and [2, 0, 26, 16] (IoU 0.67, score 0.95, region 0.625 e0 + 0.375 e1:
            # rank 2). Pooled on the gt box itself: 0.875 e0 + 0.125 e1, rank 2.
            (31, patch_box(0, dx=2.0), [A, "mostly 0, some 1.", B]),
            # patch 8: no proposal with IoU >= 0.5 -> miss, worst rank 3 (would be rank 1)
            (32, patch_box(8), [P8, A, B]),
        ],
    }
    json_file, image_root = write_benchmark(str(tmp_path), images)
    _register("_test_fgovd_planted_props", json_file, image_root, 2)
    pfile = str(tmp_path / "props.pkl")
    with open(pfile, "wb") as f:
        pickle.dump({"ids": [3], "boxes": [np.array([[0, 0, 48, 48], [0, 0, 16, 16], [2, 0, 26, 16]], np.float32)],
                     "objectness_logits": [np.array([0.9, 0.5, 0.95], np.float32)]}, f)
    cfg = _cfg(RESOLUTION=48)
    cfg.MODEL.LOAD_PROPOSALS = True
    cfg.DATASETS.PROPOSAL_FILES_TEST = (pfile,)
    res = _evaluate(planted_model(proposal_matching="iou"), cfg, "_test_fgovd_planted_props")
    assert (res["top1"], res["mean_rank"]) == (50.0, 2.0)  # ranks 1 and 3 (miss)
    assert (res["num_boxes"], res["num_missed"], res["num_dropped"]) == (2, 1, 0)
    res = _evaluate(planted_model(proposal_matching="score"), cfg, "_test_fgovd_planted_props")
    assert (res["top1"], res["mean_rank"]) == (0.0, 2.5)  # ranks 2 and 3 (miss)
    assert res["num_missed"] == 1
    # without proposals the shifted gt box itself is pooled: rank 2 and 1
    res = _evaluate(planted_model(), _cfg(RESOLUTION=48), "_test_fgovd_planted_props")
    assert (res["top1"], res["mean_rank"], res["num_missed"]) == (50.0, 1.5, 0)


# ---------------------------------------------------------------- tiny random-weight CLIP
def _tiny_cfg(**fgovd):
    cfg = _cfg(**fgovd)
    cfg.MODEL.META_ARCHITECTURE = "SparseCLIPFGOVD"
    cfg.MODEL.SPARSECLIP.CLIP.NAME = "sparseclip-tiny-vit"
    cfg.MODEL.SPARSECLIP.CLIP.PRETRAINED = "none"
    cfg.MODEL.SPARSECLIP.TEXT.CACHE_DIR = "off"
    cfg.MODEL.SPARSECLIP.ATTENTION.SOURCE = "qq+kk"
    cfg.MODEL.SPARSECLIP.ATTENTION.NORMALIZER = "entmax"
    return cfg


@pytest.fixture(scope="module")
def tiny_dense():
    torch.manual_seed(0)
    return build_model(_tiny_cfg(RESOLUTION=64))


def _tiny_input(boxes, captions, h=48, w=80, seed=0):
    g = torch.Generator().manual_seed(seed)
    image = torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8)
    inst = Instances((h, w))
    inst.gt_boxes = Boxes(torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4))
    inst.ann_ids = torch.arange(len(boxes))
    return {"image": image, "instances": inst, "fgovd_captions": captions, "image_id": 0}


CAPS = [["A red mug, with a thin handle.", "A blue mug, with a thin handle.", "A red mug, with no handle."]] * 2


def test_tiny_dense_scores_match_patch_embeddings(tiny_dense):
    """80 x 48 image -> PIL bicubic 64 x 64 -> 4 x 4 patches; boxes scaled by (0.8, 4/3)."""
    model = tiny_dense
    assert isinstance(model, SparseCLIPFGOVD) and model.resize_interpolation == "bicubic"
    inp = _tiny_input([[20.0, 0, 40, 12], [40.0, 36, 60, 48]], CAPS)
    out = model([inp])[0]["fgovd"]
    hwc = inp["image"].permute(1, 2, 0).numpy()
    resized = np.asarray(Image.fromarray(hwc).resize((64, 64), Image.BICUBIC))
    x = (torch.as_tensor(resized.copy()).permute(2, 0, 1).float() - model.pixel_mean) / model.pixel_std
    feats = model.encoder(x[None])  # (1, 32, 4, 4)
    regions = F.normalize(torch.stack([feats[0, :, 0, 1], feats[0, :, 3, 2]]), dim=-1)
    text = TextClassifier(model.clip_model, get_tokenizer("sparseclip-tiny-vit"), "none", cache_dir="off")
    caps = F.normalize(text.encode(CAPS[0]), dim=-1)  # captions encoded whole (commas kept)
    assert torch.allclose(out["scores"], regions @ caps.t(), atol=1e-5)
    assert out["matched"].tolist() == [True, True] and out["ann_ids"].tolist() == [0, 1]
    assert out["num_captions"].tolist() == [3, 3]


def test_tiny_dense_bilinear_differs():
    torch.manual_seed(0)
    bicubic = build_model(_tiny_cfg(RESOLUTION=64))
    torch.manual_seed(0)
    bilinear = build_model(_tiny_cfg(RESOLUTION=64, RESIZE_INTERPOLATION="bilinear"))
    inp = _tiny_input([[20.0, 0, 40, 12]], CAPS[:1])
    a, b = bicubic([inp])[0]["fgovd"]["scores"], bilinear([inp])[0]["fgovd"]["scores"]
    assert bilinear.resize_interpolation == "bilinear" and not torch.allclose(a, b)


def test_tiny_crop_protocol_is_clip_preprocess():
    """Crop protocol: the score is the unmodified CLIP's encode_image of CLIP's own
    preprocessing of the crop (open_clip.image_transform), against the captions."""
    import open_clip

    torch.manual_seed(0)
    model = build_model(_tiny_cfg(PROTOCOL="crop"))
    boxes = [[5.5, 3.2, 61.0, 40.9], [0.0, 0.0, 80.0, 48.0]]
    inp = _tiny_input(boxes, [CAPS[0], CAPS[0][:2]])
    out = model([inp])[0]["fgovd"]
    image = Image.fromarray(inp["image"].permute(1, 2, 0).numpy())
    n_px = model.clip_model.visual.image_size[0]
    tf = open_clip.image_transform(n_px, is_train=False, mean=model.encoder.image_mean, std=model.encoder.image_std)
    crops = torch.stack([tf(image.crop((5, 3, 61, 41))), tf(image.crop((0, 0, 80, 48)))])
    img = F.normalize(model.clip_model.encode_image(crops), dim=-1)
    text = TextClassifier(model.clip_model, get_tokenizer("sparseclip-tiny-vit"), "none", cache_dir="off")
    caps = F.normalize(text.encode(CAPS[0]), dim=-1)
    expected = img @ caps.t()
    assert torch.allclose(out["scores"][0], expected[0], atol=1e-5)
    assert torch.allclose(out["scores"][1, :2], expected[1, :2], atol=1e-5)
    assert torch.isnan(out["scores"][1, 2]) and out["num_captions"].tolist() == [3, 2]


def test_tiny_no_boxes(tiny_dense):
    inp = _tiny_input([], [])
    out = tiny_dense([inp])[0]["fgovd"]
    assert out["scores"].shape[0] == 0 and out["matched"].numel() == 0


def test_segmentation_meta_arch_has_no_fgovd_dispatch():
    """FG-OVD inputs are not routed by SparseCLIP (it needs a vocabulary or dataset_name)."""
    from sparseclip_d2.modeling import meta_arch

    src = open(meta_arch.__file__).read()
    assert not hasattr(meta_arch, "_is_fgovd") and "evaluator_type" not in src and "fgovd_inference" not in src


# ---------------------------------------------------------------- shared CLIP parts (build_clip_parts)
def test_fgovd_honours_text_tokenizer_key():
    """MODEL.SPARSECLIP.TEXT.TOKENIZER reaches the caption encoder (it was ignored before)."""
    cfg = _tiny_cfg()
    cfg.MODEL.SPARSECLIP.TEXT.TOKENIZER = "/no/such/tokenizer/dir"
    with pytest.raises(FileNotFoundError, match="MODEL.SPARSECLIP.TEXT.TOKENIZER '/no/such/tokenizer/dir'"):
        build_model(cfg)


def test_fgovd_validates_clip_keys_before_building():
    cfg = _tiny_cfg()
    cfg.MODEL.SPARSECLIP.CLIP.PRECISION = "fp8"
    with pytest.raises(ValueError, match=r"MODEL.SPARSECLIP.CLIP.PRECISION = 'fp8' is invalid; valid: fp32, fp16, bf16"):
        build_model(cfg)


def test_fgovd_runs_on_a_siglip_tower_with_random_weights():
    """The random-weights tokenizer fallback (no Hugging Face files here) applies to FG-OVD too."""
    cfg = _tiny_cfg(RESOLUTION=64)
    cfg.MODEL.SPARSECLIP.CLIP.NAME = "sparseclip-tiny-siglip"
    torch.manual_seed(0)
    model = build_model(cfg)
    out = model([_tiny_input([[4.0, 4.0, 40.0, 30.0]], [["a red car", "a blue car"]])])[0]["fgovd"]
    assert out["scores"].shape == (1, 2) and torch.isfinite(out["scores"]).all()
