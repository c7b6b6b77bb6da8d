"""The installation is complete: detectron2's modules import, the config merges."""
import importlib
import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "module",
    [
        "detectron2.data",
        "detectron2.data.transforms",
        "detectron2.evaluation",
        "detectron2.engine",
        "detectron2.utils.visualizer",
        "detectron2.modeling",
        "detectron2.checkpoint",
        "open_clip",
        "entmax",
        "imgviz",
    ],
)
def test_dependency_imports(module):
    importlib.import_module(module)


def test_detectron2_pure_python_stand_in():
    from detectron2 import _C

    with pytest.raises(NotImplementedError, match="C\\+\\+ extension"):
        _C.nms_rotated(None, None, 0.5)


def test_model_zoo_configs_packaged():
    from detectron2 import model_zoo

    path = model_zoo.get_config_file("COCO-InstanceSegmentation/mask_rcnn_R_50_FPN_1x.yaml")
    assert path.endswith(".yaml")


def test_add_sparseclip_config_merges(tmp_path):
    from detectron2.config import get_cfg

    from sparseclip_d2 import add_sparseclip_config

    cfg = get_cfg()
    add_sparseclip_config(cfg)
    assert cfg.MODEL.SPARSECLIP.ATTENTION.ALPHA == 1.2
    y = tmp_path / "c.yaml"
    y.write_text(
        "MODEL:\n  SPARSECLIP:\n    ATTENTION:\n      SOURCE: qq\n      NORMALIZER: entmax\n"
        "TEST:\n  SLIDING_WINDOW:\n    ENABLED: True\n"
    )
    cfg.merge_from_file(str(y))
    assert cfg.MODEL.SPARSECLIP.ATTENTION.SOURCE == "qq"
    assert cfg.TEST.SLIDING_WINDOW.ENABLED is True
    typo = tmp_path / "typo.yaml"
    typo.write_text("MODEL:\n  SPARSECLIP:\n    ATTENTION:\n      ALPHAA: 1.5\n")
    with pytest.raises(KeyError, match="ALPHAA"):
        cfg.merge_from_file(str(typo))


def test_import_has_no_network_or_gpu_side_effects():
    # A fresh interpreter with CUDA hidden and sockets disabled imports the package.
    code = (
        "import socket\n"
        "def _no(*a, **k):\n    raise RuntimeError('network touched on import')\n"
        "socket.socket.connect = _no\n"
        "socket.create_connection = _no\n"
        "import sparseclip_d2\nsparseclip_d2.register_detectron2_parts()\n"
        "import torch\n"
        "assert not torch.cuda.is_initialized()\n"
    )
    env = dict(__import__("os").environ, CUDA_VISIBLE_DEVICES="")
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
