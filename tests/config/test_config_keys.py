"""No key of ``configs/Base-SparseCLIP.yaml`` is silently ignored.

Every key the Base config sets is listed below with a changed value and how it shows:
either the model built by the one factory (``build_clip_parts`` through the META_ARCH's
``from_config``) or the loader reflects it, or it is refused with an error naming it, or it
is one of detectron2's own run keys (consumed by detectron2's machinery, checked to exist
in its defaults). A new key in the Base config fails ``test_every_base_key_is_listed``
until it gets a row. The detectron2 keys the META_ARCHs do not read (``MODEL.WEIGHTS``,
``MODEL.BACKBONE.NAME``, ``MODEL.PIXEL_MEAN/STD``) are refused when set.
"""
import os

import pytest
import yaml

from detectron2.config import get_cfg
from detectron2.modeling import build_model

from sparseclip_d2 import add_sparseclip_config

from conftest import TINY_CLIP_NAME

BASE = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "Base-SparseCLIP.yaml")


def _flat(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _flat(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}"


def _cfg(**opts):
    cfg = get_cfg()
    add_sparseclip_config(cfg)
    cfg.merge_from_file(BASE)
    cfg.merge_from_list(["MODEL.SPARSECLIP.CLIP.NAME", TINY_CLIP_NAME, "MODEL.SPARSECLIP.CLIP.PRETRAINED", "none",
                         "MODEL.DEVICE", "cpu", "MODEL.SPARSECLIP.TEXT.CACHE_DIR", "off"])
    for k, v in opts.items():
        cfg.merge_from_list([k, v])
    return cfg


def _model(**opts):
    return build_model(_cfg(**opts))


def _loader(**opts):
    from detectron2.data import DatasetCatalog

    from sparseclip_d2.data import build_test_loader

    cfg = _cfg(**opts)
    return build_test_loader(cfg, "sparseclip_demo", DatasetCatalog.get("sparseclip_demo"))


# key -> (override value, check(model-or-None) or a "refused" match, or "detectron2")
MODEL_EFFECTS = {
    "MODEL.META_ARCHITECTURE": ("SparseCLIPFGOVD", lambda m: type(m).__name__ == "SparseCLIPFGOVD"),
    "MODEL.DEVICE": ("cpu", lambda m: m.device.type == "cpu"),
    "MODEL.SPARSECLIP.CLIP.NAME": (TINY_CLIP_NAME, lambda m: m.encoder.patch_size == 16),
    "MODEL.SPARSECLIP.CLIP.PRETRAINED": ("none", lambda m: m.random_weights),
    "MODEL.SPARSECLIP.ATTENTION.SOURCE": ("qq", lambda m: m.encoder.spec.source == "qq"),
    "MODEL.SPARSECLIP.ATTENTION.NORMALIZER": ("entmax", lambda m: m.encoder.spec.normalizer == "entmax"),
    "MODEL.SPARSECLIP.ATTENTION.ALPHA": ("1.5", lambda m: m.encoder.spec.alpha == 1.5),
    "MODEL.SPARSECLIP.ATTENTION.NUM_LAYERS": ("2", lambda m: m.encoder.spec.num_layers == 2),
    "MODEL.SPARSECLIP.BLOCK.RESIDUAL": ("False", lambda m: m.encoder.spec.residual is False),
    "MODEL.SPARSECLIP.BLOCK.FFN": ("False", lambda m: m.encoder.spec.ffn is False),
    "MODEL.SPARSECLIP.TEXT.TEMPLATES": ("openai_imagenet", lambda m: m.templates == "openai_imagenet"),
    "MODEL.SPARSECLIP.LOGIT_SCALE": ("40.0", lambda m: m.logit_scale == 40.0),
    "MODEL.SPARSECLIP.PROB_THRESHOLD": ("0.3", lambda m: m.prob_threshold == 0.3),
    "MODEL.SPARSECLIP.AREA_THRESHOLD": ("0.1", lambda m: m.area_threshold == 0.1),
    "INPUT.FORMAT": ("BGR", lambda m: m.input_format == "BGR"),
    "TEST.SLIDING_WINDOW.ENABLED": ("True", lambda m: m.sliding_window is True),
    "TEST.SLIDING_WINDOW.CROP_SIZE": ("336", lambda m: m.crop_size == 336),
    "TEST.SLIDING_WINDOW.STRIDE": ("112", lambda m: m.stride == 112),
    "TEST.SLIDING_WINDOW.BATCH_SIZE": ("3", lambda m: m.window_batch_size == 3),
}
LOADER_EFFECTS = {
    "INPUT.MIN_SIZE_TEST": ("96", lambda batch: min(batch["image"].shape[-2:]) == 96),
    "INPUT.MAX_SIZE_TEST": ("100", lambda batch: max(batch["image"].shape[-2:]) == 100),
    "DATALOADER.NUM_WORKERS": ("0", None),  # checked on the loader itself below
}
# Read by tools/train_net.py and detectron2's default_setup / config machinery.
DETECTRON2_KEYS = {"DATASETS.TRAIN", "DATASETS.TEST", "OUTPUT_DIR", "VERSION", "SEED"}


def test_every_base_key_is_listed():
    with open(BASE) as f:
        keys = set(_flat(yaml.safe_load(f)))
    listed = set(MODEL_EFFECTS) | set(LOADER_EFFECTS) | DETECTRON2_KEYS
    assert keys - listed == set(), "Base-SparseCLIP.yaml sets keys no test row checks"
    defaults = get_cfg()
    for key in DETECTRON2_KEYS:
        node = defaults
        for part in key.split("."):
            node = node[part]  # detectron2's own key: its machinery reads it


@pytest.mark.parametrize("key", sorted(MODEL_EFFECTS))
def test_model_keys_take_effect(key):
    value, check = MODEL_EFFECTS[key]
    extra = {}
    if key == "MODEL.SPARSECLIP.ATTENTION.ALPHA":
        extra["MODEL.SPARSECLIP.ATTENTION.NORMALIZER"] = "entmax"
    if key == "MODEL.SPARSECLIP.ATTENTION.NUM_LAYERS":
        extra["MODEL.SPARSECLIP.ATTENTION.NORMALIZER"] = "entmax"
    model = _model(**{key: value}, **extra)
    assert check(model), f"{key} = {value} did not take effect"


@pytest.mark.parametrize("key", ["INPUT.MIN_SIZE_TEST", "INPUT.MAX_SIZE_TEST"])
def test_loader_keys_take_effect(key):
    value, check = LOADER_EFFECTS[key]
    batch = next(iter(_loader(**{key: value})))[0]
    assert check(batch), f"{key} = {value}: image {tuple(batch['image'].shape)}"


def test_num_workers_takes_effect():
    assert _loader(**{"DATALOADER.NUM_WORKERS": "0"}).num_workers == 0
    assert _loader(**{"DATALOADER.NUM_WORKERS": "1"}).num_workers == 1


@pytest.mark.parametrize("key, value, match", [
    ("MODEL.WEIGHTS", "/some/model_final.pth", "MODEL.WEIGHTS.*MODEL.SPARSECLIP.CLIP.PRETRAINED"),
    ("MODEL.BACKBONE.NAME", "build_resnet_fpn_backbone", "MODEL.BACKBONE.NAME.*SparseCLIPBackbone"),
    ("MODEL.PIXEL_MEAN", "[1.0, 2.0, 3.0]", "MODEL.PIXEL_MEAN/PIXEL_STD.*PIXEL_NORM"),
])
def test_unread_detectron2_keys_are_refused(key, value, match):
    for arch in ("SparseCLIP", "SparseCLIPFGOVD"):
        with pytest.raises(ValueError, match=match):
            _model(**{key: value, "MODEL.META_ARCHITECTURE": arch})


def test_pixel_mean_matching_pixel_norm_is_accepted():
    """Setting MODEL.PIXEL_MEAN/STD to what PIXEL_NORM gives (for another META_ARCH using the
    backbone) is consistent and accepted; FG-OVD normalises with PIXEL_NORM too."""
    ref = _model()
    mean = [round(float(v), 4) for v in ref.pixel_mean.flatten()]
    std = [round(float(v), 4) for v in ref.pixel_std.flatten()]
    model = _model(**{"MODEL.PIXEL_MEAN": str(mean), "MODEL.PIXEL_STD": str(std)})
    assert model.pixel_mean.flatten().tolist() == ref.pixel_mean.flatten().tolist()
    fg = _model(**{"MODEL.META_ARCHITECTURE": "SparseCLIPFGOVD", "MODEL.SPARSECLIP.PIXEL_NORM": "imagenet"})
    assert [round(float(v), 3) for v in fg.pixel_mean.flatten()] == [123.675, 116.28, 103.53]


# Keys outside the Base config (CLIPtrase's post-processing): each takes effect on the
# model or the loader built from it, or is refused naming itself (tests/methods/test_cliptrase.py has
# the refusals and the numeric checks).
CLIPTRASE_EFFECTS = {
    "MODEL.SPARSECLIP.CLUSTER_VOTE.ENABLED": ("True", lambda m: m.stage("cluster_vote") is not None),
    "MODEL.SPARSECLIP.CLUSTER_VOTE.LAYER": ("-1", lambda m: m.stage("cluster_vote").settings.layer == -1),
    "MODEL.SPARSECLIP.CLUSTER_VOTE.EPS": ("1.1", lambda m: m.stage("cluster_vote").settings.eps == 1.1),
    "MODEL.SPARSECLIP.CLUSTER_VOTE.MIN_SAMPLES": ("7", lambda m: m.stage("cluster_vote").settings.min_samples == 7),
    "MODEL.SPARSECLIP.CLUSTER_VOTE.UPSAMPLE": ("2", lambda m: m.stage("cluster_vote").settings.upsample == 2),
    "MODEL.SPARSECLIP.CLUSTER_VOTE.MEDIAN_SIZE": ("3", lambda m: m.stage("cluster_vote").settings.median_size == 3),
    "MODEL.SPARSECLIP.CLS_LOGIT_PRODUCT": ("True", lambda m: m.head_name == "cls_product"),
}


@pytest.mark.parametrize("key", sorted(CLIPTRASE_EFFECTS))
def test_cliptrase_keys_take_effect(key):
    value, check = CLIPTRASE_EFFECTS[key]
    extra = {} if key.endswith("ENABLED") or not key.startswith("MODEL.SPARSECLIP.CLUSTER_VOTE") else {
        "MODEL.SPARSECLIP.CLUSTER_VOTE.ENABLED": "True"}
    model = _model(**{key: value}, **extra)
    assert check(model), f"{key} = {value} did not take effect"


def test_center_crop_key_takes_effect_on_the_loader():
    batch = next(iter(_loader(**{"INPUT.CENTER_CROP_TEST": "48"})))[0]
    assert tuple(batch["image"].shape[-2:]) == (48, 48) and (batch["height"], batch["width"]) == (48, 48)
# MODEL.SPARSECLIP.CALIBRATION.* (not in the Base config; the calibrated last block of SC-CLIP's
# configs/baselines/scclip_b16*.yaml): key -> (value on the 2-block tiny tower, spec field, expected)
CALIBRATION_EFFECTS = {
    "MODEL.SPARSECLIP.CALIBRATION.OUTLIER_DETECTOR": ("lof", "outlier_detector", "lof"),
    "MODEL.SPARSECLIP.CALIBRATION.OUTLIER_NEIGHBORS": ("5", "outlier_neighbors", 5),
    "MODEL.SPARSECLIP.CALIBRATION.OUTLIER_CONTAMINATION": ("0.1", "outlier_contamination", 0.1),
    "MODEL.SPARSECLIP.CALIBRATION.SIMILARITY_LAYER": ("1", "similarity_layer", 1),
    "MODEL.SPARSECLIP.CALIBRATION.SIMILARITY_SCALE": ("2.0", "similarity_scale", 2.0),
    "MODEL.SPARSECLIP.CALIBRATION.SIMILARITY_THRESHOLD": ("0.3", "similarity_threshold", 0.3),
    "MODEL.SPARSECLIP.CALIBRATION.POST_SIMILARITY_LAYER": ("0", "post_similarity_layer", 0),
    "MODEL.SPARSECLIP.CALIBRATION.FUSION_LAYERS": ("[0, 1]", "fusion_layers", (0, 1)),
    "MODEL.SPARSECLIP.CALIBRATION.OUTLIER_COUNT": ("4", "outlier_count", 4),
    "MODEL.SPARSECLIP.CALIBRATION.OUTLIER_CLS_SCALE": ("2.0", "outlier_cls_scale", 2.0),
    "MODEL.SPARSECLIP.CALIBRATION.FUSION_ATTENTION": ("similarity", "fusion_attention", "similarity"),
    "MODEL.SPARSECLIP.CALIBRATION.THRESHOLD_SIMILARITY_TERM": ("True", "threshold_similarity_term", True),
}


def test_calibration_keys_take_effect_and_bad_values_are_refused_before_the_build():
    model = _model(**{k: v for k, (v, _, _) in CALIBRATION_EFFECTS.items()})
    for key, (value, field, want) in CALIBRATION_EFFECTS.items():
        assert getattr(model.encoder.spec.calibration, field) == want, f"{key} = {value} did not take effect"
    from sparseclip_d2.clip.calibrated import is_calibrated

    assert is_calibrated(model.encoder.spec) and not is_calibrated(_model().encoder.spec)
    for key, value, match in [
        ("MODEL.SPARSECLIP.CALIBRATION.OUTLIER_DETECTOR", "zscore", "MODEL.SPARSECLIP.CALIBRATION: unknown "
                                                                    "outlier_detector 'zscore'; valid: none, l2, lof, som"),
        ("MODEL.SPARSECLIP.CALIBRATION.SIMILARITY_LAYER", "-3", "SIMILARITY_LAYER.*must be -1 \\(off\\) or a 0-based"),
        ("MODEL.SPARSECLIP.CALIBRATION.FUSION_LAYERS", "[5]", "\\[5\\] are not block inputs of a tower of depth 2"),
    ]:
        with pytest.raises(ValueError, match=match):
            _model(**{key: value})


# Keys outside the Base config (CASS): MODEL.SPARSECLIP.PROXY.CASS.* and
# MODEL.SPARSECLIP.OBJECT_PRESENCE.*, each set to a non-default value together (on the tiny DINO
# proxy) and read back from the model; tests/methods/test_cass.py has the refusals and the numerics.
_CASS_BASE = {"MODEL.SPARSECLIP.PROXY.NAME": "sparseclip_tiny_dino8", "MODEL.SPARSECLIP.PROXY.FEATURE": "keys",
              "MODEL.SPARSECLIP.ATTENTION.SOURCE": "kk", "MODEL.SPARSECLIP.BLOCK.FFN": "False"}
CASS_EFFECTS = {
    "MODEL.SPARSECLIP.PROXY.CASS.ENABLED": ("True", lambda m: type(m.encoder).__name__ == "CASSEncoder"),
    "MODEL.SPARSECLIP.PROXY.CASS.MATCHING": ("sequential", lambda m: m.encoder.cass.matching == "sequential"),
    "MODEL.SPARSECLIP.PROXY.CASS.K_EIGEN": ("5", lambda m: m.encoder.cass.k_eigen == 5),
    "MODEL.SPARSECLIP.PROXY.CASS.SCALE_FACTOR": ("4.0", lambda m: m.encoder.cass.scale_factor == 4.0),
    "MODEL.SPARSECLIP.PROXY.CASS.RANK": ("3", lambda m: m.encoder.cass.rank == 3),
    "MODEL.SPARSECLIP.PROXY.CASS.SVD": ("exact", lambda m: m.encoder.cass.svd == "exact"),
    "MODEL.SPARSECLIP.PROXY.CASS.SEED": ("2", lambda m: m.encoder.cass.seed == 2),
    "MODEL.SPARSECLIP.PROXY.CASS.SINGULAR_SCALE": ("[1.0, 1.0]", lambda m: (m.encoder.cass.singular_low,
                                                                         m.encoder.cass.singular_high) == (1.0, 1.0)),
    "MODEL.SPARSECLIP.PROXY.CASS.KEY_PRECISION": ("fp16", lambda m: m.encoder.cass.key_precision == "fp16"),
    "MODEL.SPARSECLIP.PROXY.CASS.INPUT": ("exact", lambda m: m.encoder.cass.input == "exact"),
    "MODEL.SPARSECLIP.OBJECT_PRESENCE.ENABLED": ("True", lambda m: m.head_name == "object_presence"),
    "MODEL.SPARSECLIP.OBJECT_PRESENCE.GLOBAL_WEIGHT": ("0.2", lambda m: m.head.settings.global_weight == 0.2),
    "MODEL.SPARSECLIP.OBJECT_PRESENCE.MEAN_WEIGHT": ("0.1", lambda m: m.head.settings.mean_weight == 0.1),
    "MODEL.SPARSECLIP.OBJECT_PRESENCE.TOP_K": ("3", lambda m: m.head.settings.top_k == 3),
    "MODEL.SPARSECLIP.OBJECT_PRESENCE.CLUSTER_THRESHOLD": ("0.3", lambda m: m.head.settings.cluster_threshold == 0.3),
    "MODEL.SPARSECLIP.OBJECT_PRESENCE.GLOBAL": ("window", lambda m: m.head.settings.global_source == "window"
                                                and m.head.native_encoder is None),
}


def test_cass_keys_take_effect():
    model = _model(**_CASS_BASE, **{k: v for k, (v, _) in CASS_EFFECTS.items()})
    for key, (value, check) in CASS_EFFECTS.items():
        assert check(model), f"{key} = {value} did not take effect"
    assert _model().head_name == "cosine"
# MODEL.SPARSECLIP.LABEL_PROPAGATION.* (not in the Base config; LPOSS / LPOSS+ of
# configs/baselines/lposs*_b16*.yaml): key -> (value, check(model)); every key is set together with
# KIND and a tiny VFM (tests/methods/test_lposs.py has the refusals and the numeric checks).
_LP_ON = {"MODEL.SPARSECLIP.LABEL_PROPAGATION.KIND": "lposs", "MODEL.SPARSECLIP.LABEL_PROPAGATION.VFM.NAME":
          "sparseclip_tiny_mae", "MODEL.SPARSECLIP.LABEL_PROPAGATION.VFM.WEIGHTS": "none"}
LABEL_PROPAGATION_EFFECTS = {
    "MODEL.SPARSECLIP.LABEL_PROPAGATION.KIND": ("lposs_plus", lambda m: m.stage("label_propagation").propagation.settings.kind == "lposs_plus"),
    "MODEL.SPARSECLIP.LABEL_PROPAGATION.K": ("7", lambda m: m.stage("label_propagation").propagation.settings.k == 7),
    "MODEL.SPARSECLIP.LABEL_PROPAGATION.SIGMA": ("0.05", lambda m: m.stage("label_propagation").propagation.settings.sigma == 0.05),
    "MODEL.SPARSECLIP.LABEL_PROPAGATION.PIX_DIST_POW": ("2.0", lambda m: m.stage("label_propagation").propagation.settings.pix_dist_pow == 2.0),
    "MODEL.SPARSECLIP.LABEL_PROPAGATION.GAMMA": ("2.0", lambda m: m.stage("label_propagation").propagation.settings.gamma == 2.0),
    "MODEL.SPARSECLIP.LABEL_PROPAGATION.ALPHA": ("0.9", lambda m: m.stage("label_propagation").propagation.settings.alpha == 0.9),
    "MODEL.SPARSECLIP.LABEL_PROPAGATION.TOL": ("1.0e-4", lambda m: m.stage("label_propagation").propagation.settings.tol == 1e-4),
    "MODEL.SPARSECLIP.LABEL_PROPAGATION.MAX_ITER": ("5", lambda m: m.stage("label_propagation").propagation.settings.max_iter == 5),
    "MODEL.SPARSECLIP.LABEL_PROPAGATION.TAU": ("0.2", lambda m: m.stage("label_propagation").propagation.settings.tau == 0.2),
    "MODEL.SPARSECLIP.LABEL_PROPAGATION.RADIUS": ("7", lambda m: m.stage("label_propagation").propagation.settings.radius == 7),
    "MODEL.SPARSECLIP.LABEL_PROPAGATION.REDUCE_SYNONYMS": (
        "before_resize", lambda m: m.stage("label_propagation").propagation.settings.reduce_synonyms == "before_resize"),
    "MODEL.SPARSECLIP.LABEL_PROPAGATION.VFM.NAME": ("sparseclip_tiny_dino8", lambda m: m.stage("label_propagation").propagation.vfm.name == "sparseclip_tiny_dino8"),
    "MODEL.SPARSECLIP.LABEL_PROPAGATION.VFM.WEIGHTS": ("/nonexistent/vfm.pth", "LABEL_PROPAGATION.VFM.WEIGHTS = '/nonexistent/vfm.pth': no such file"),
    "MODEL.SPARSECLIP.LABEL_PROPAGATION.VFM.LAYER": ("0", lambda m: m.stage("label_propagation").propagation.vfm.layer == 0),
    "MODEL.SPARSECLIP.LABEL_PROPAGATION.VFM.FEATURE": ("keys", lambda m: m.stage("label_propagation").propagation.vfm.feature == "keys"),
    "MODEL.SPARSECLIP.LABEL_PROPAGATION.VFM.INPUT_SIZE": ("32", lambda m: m.stage("label_propagation").propagation.vfm.opts.input_size == 32),
    "MODEL.SPARSECLIP.LABEL_PROPAGATION.VFM.POS_EMBED_INTERP": ("size", lambda m: m.stage("label_propagation").propagation.vfm.opts.pos_embed_interp == "size"),
    "MODEL.SPARSECLIP.LABEL_PROPAGATION.VFM.PRECISION": ("bf16", lambda m: str(m.stage("label_propagation").propagation.vfm.dtype) == "torch.bfloat16"),
}


@pytest.mark.parametrize("key", sorted(LABEL_PROPAGATION_EFFECTS))
def test_label_propagation_keys_take_effect(key):
    import re

    value, check = LABEL_PROPAGATION_EFFECTS[key]
    opts = dict(_LP_ON, **{key: value})
    if isinstance(check, str):
        with pytest.raises((ValueError, FileNotFoundError), match=re.escape(check)):
            _model(**opts)
    else:
        assert check(_model(**opts)), f"{key} = {value} did not take effect"
    if not key.endswith(".KIND"):  # without KIND the key would change nothing: refused, naming it
        with pytest.raises(ValueError, match=re.escape(f"{key} = ") + ".* changes nothing while "
                                             "MODEL.SPARSECLIP.LABEL_PROPAGATION.KIND is ''"):
            _model(**{key: value})
# MODEL.SPARSECLIP.PROXY.CORRCLIP.* (not in the Base config; CorrCLIP, configs/baselines/corrclip_b16*.yaml):
# key -> (value, settings field, expected) on the 5-block tiny tower with the tiny DINO B/8
# (tests/methods/test_corrclip.py has the refusals and the float64 checks).
CORRCLIP_EFFECTS = {
    "MODEL.SPARSECLIP.PROXY.CORRCLIP.TAU": ("2.5", "tau", 2.5),
    "MODEL.SPARSECLIP.PROXY.CORRCLIP.SPATIAL_WEIGHT": ("0.7", "spatial_weight", 0.7),
    "MODEL.SPARSECLIP.PROXY.CORRCLIP.SEMANTIC_WEIGHT": ("0.3", "semantic_weight", 0.3),
    "MODEL.SPARSECLIP.PROXY.CORRCLIP.NUM_SPATIAL": ("2", "num_spatial", 2),
    "MODEL.SPARSECLIP.PROXY.CORRCLIP.DBSCAN_EPS": ("0.4", "dbscan_eps", 0.4),
    "MODEL.SPARSECLIP.PROXY.CORRCLIP.DBSCAN_MIN_SAMPLES": ("2", "dbscan_min_samples", 2),
    "MODEL.SPARSECLIP.PROXY.CORRCLIP.RESTRICTION": ("regions_strict", "restriction", "regions_strict"),
    "MODEL.SPARSECLIP.PROXY.CORRCLIP.MODE_VOTE": ("False", "mode_vote", False),
}


def test_corrclip_keys_take_effect(tmp_path):
    from tiny_models import TINY_CLIP5_NAME

    base = {"MODEL.SPARSECLIP.CLIP.NAME": TINY_CLIP5_NAME, "MODEL.SPARSECLIP.PROXY.NAME": "sparseclip_tiny_dino8",
            "MODEL.SPARSECLIP.PROXY.CORRCLIP.ENABLED": "True", "MODEL.SPARSECLIP.PROXY.CORRCLIP.MASK_DIR": str(tmp_path),
            "MODEL.SPARSECLIP.BLOCK.RESIDUAL": "False", "MODEL.SPARSECLIP.BLOCK.FFN": "False"}
    model = _model(**base, **{k: v for k, (v, _, _) in CORRCLIP_EFFECTS.items()})
    assert type(model.encoder).__name__ == "CorrCLIPEncoder" and model.encoder.settings.mask_dir == str(tmp_path)
    for key, (value, field, want) in CORRCLIP_EFFECTS.items():
        assert getattr(model.encoder.settings, field) == want, f"{key} = {value} did not take effect"
    assert model.encoder.num_spatial == 2
    assert type(_model(**dict(base, **{"MODEL.SPARSECLIP.PROXY.CORRCLIP.ENABLED": "False",
                                       "MODEL.SPARSECLIP.PROXY.CORRCLIP.MASK_DIR": ""})).encoder).__name__ == \
        "ProxyCLIPEncoder"


# MODEL.SPARSECLIP.ATTENTION.PROCRUSTES.* and MODEL.SPARSECLIP.TLP.* (not in the Base config; PEARL,
# configs/baselines/pearl_b16*.yaml): key -> (value, what it sets); tests/methods/test_pearl.py has the maths.
_PROCRUSTES_ON = {"MODEL.SPARSECLIP.ATTENTION.SOURCE": "procrustes"}
PROCRUSTES_EFFECTS = {
    "MODEL.SPARSECLIP.ATTENTION.PROCRUSTES.KK_WEIGHT": ("0.3", lambda m: m.encoder.spec.procrustes.kk_weight == 0.3),
    "MODEL.SPARSECLIP.ATTENTION.PROCRUSTES.SOLVER": ("svd", lambda m: m.encoder.spec.procrustes.solver == "svd"),
    "MODEL.SPARSECLIP.ATTENTION.PROCRUSTES.ITERATIONS": ("7", lambda m: m.encoder.spec.procrustes.iterations == 7),
}
_TLP_ON = {"MODEL.SPARSECLIP.TLP.ENABLED": "True"}
TLP_EFFECTS = {
    "MODEL.SPARSECLIP.TLP.ENABLED": ("True", lambda m: m.stage("text_laplacian") is not None),
    "MODEL.SPARSECLIP.TLP.GRID": ("224", lambda m: m.stage("text_laplacian").settings.grid == 224),
    "MODEL.SPARSECLIP.TLP.TEXT_TEMPERATURE": ("0.2", lambda m: m.stage("text_laplacian").settings.text_temperature == 0.2),
    "MODEL.SPARSECLIP.TLP.DIAGONAL_BOOST": ("3.0", lambda m: m.stage("text_laplacian").settings.diagonal_boost == 3.0),
    "MODEL.SPARSECLIP.TLP.EDGE_CONSTANT": ("2.0", lambda m: m.stage("text_laplacian").settings.edge_constant == 2.0),
    "MODEL.SPARSECLIP.TLP.CG_STEPS": ("10", lambda m: m.stage("text_laplacian").settings.cg_steps == 10),
    "MODEL.SPARSECLIP.TLP.TAU": ("0.5", lambda m: m.stage("text_laplacian").settings.tau == 0.5),
}


@pytest.mark.parametrize("key", sorted(PROCRUSTES_EFFECTS))
def test_procrustes_keys_take_effect(key, caplog):
    value, check = PROCRUSTES_EFFECTS[key]
    assert check(_model(**dict(_PROCRUSTES_ON, **{key: value}))), f"{key} = {value} did not take effect"
    # without the procrustes source the key changes nothing: a warning naming the setting
    caplog.clear()
    assert _model(**{key: value}).encoder.spec.source == "qk"
    assert "changes nothing without the procrustes source" in caplog.text


@pytest.mark.parametrize("key", sorted(TLP_EFFECTS))
def test_tlp_keys_take_effect(key):
    import re

    value, check = TLP_EFFECTS[key]
    assert check(_model(**dict(_TLP_ON, **{key: value}))), f"{key} = {value} did not take effect"
    assert _model().stage("text_laplacian") is None
    if not key.endswith(".ENABLED"):  # without ENABLED the key would change nothing: refused, naming it
        with pytest.raises(ValueError, match=re.escape(f"{key} = ") + ".* changes nothing while "
                                             "MODEL.SPARSECLIP.TLP.ENABLED is False"):
            _model(**{key: value})
