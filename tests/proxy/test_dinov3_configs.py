"""``configs/baselines/*_dinov3_b16_*.yaml``: the proxy methods with DINOv3 ViT-B/16 as their second
backbone. Each is its DINO config (``_BASE_``) with the proxy's name swapped and nothing else
changed, and passes every check made before a model is built (the DINOv3 architecture is read
on the ``meta`` device: no weights). The configs' predictions on both entry points are covered by
``tests/modeling/test_entry_points_agree.py`` (tiny DINOv3)."""
import glob
import os

import pytest
import yaml

from conftest import baseline_cfg

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "baselines")
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "*_dinov3_b16_*.yaml")))
DINOV3 = "vit_base_patch16_dinov3"


def _flat(node, prefix=""):
    out = {}
    for k, v in node.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def test_every_proxy_method_has_a_voc21_and_a_sliding_window_config():
    got = {os.path.basename(p)[:-5] for p in CONFIGS}
    for method in ("proxyclip", "fsa", "cass", "trident", "lposs"):
        assert f"{method}_dinov3_b16_voc21" in got and f"{method}_dinov3_b16_context60" in got, method
    for method in ("proxyclip", "fsa", "cass", "lposs"):  # Trident windows the image itself (PROXY.TRIDENT)
        assert baseline_cfg(os.path.join(ROOT, f"{method}_dinov3_b16_context60.yaml")).TEST.SLIDING_WINDOW.ENABLED
    assert baseline_cfg(os.path.join(ROOT, "trident_dinov3_b16_context60.yaml")).MODEL.SPARSECLIP.PROXY.TRIDENT.ENABLED


@pytest.mark.parametrize("path", CONFIGS, ids=[os.path.basename(p)[:-5] for p in CONFIGS])
def test_dinov3_config_is_its_dino_config_with_the_proxy_swapped(path):
    from sparseclip_d2.config import check_sparseclip_config

    base_name = yaml.safe_load(open(path))["_BASE_"]
    assert base_name == os.path.basename(path).replace("_dinov3_b16_", "_b16_")
    cfg, base = baseline_cfg(path), baseline_cfg(os.path.join(ROOT, base_name))
    vfm = "MODEL.SPARSECLIP.LABEL_PROPAGATION.VFM" if path.split(os.sep)[-1].startswith("lposs") else \
        "MODEL.SPARSECLIP.PROXY"
    a, b = _flat(cfg), _flat(base)
    assert {k for k in a if a[k] != b[k]} == {f"{vfm}.NAME", "OUTPUT_DIR"}
    assert a[f"{vfm}.NAME"] == DINOV3 and a[f"{vfm}.POS_EMBED_INTERP"] == "scale_factor"  # the default: unused
    assert a["OUTPUT_DIR"] == f"output/baselines/{os.path.basename(path)[:-5]}"
    check_sparseclip_config(cfg)  # every key check (PROXY, the method's section, parts) before a model is built
    text = open(path).read()
    assert "timm 1.0.31 models/eva.py vit_base_patch16_dinov3" in text and "@ " in text.split("_BASE_")[0]
    if os.path.basename(path).startswith("cass"):
        assert "average 42.2 (PGSmall/PEARL @ c26062b" in text
