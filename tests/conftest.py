"""Shared pytest fixtures: small open_clip models with random weights (no network).

The text-embedding disk cache is disabled for the whole test session
(``SPARSECLIP_TEXT_CACHE=off``).

Fixtures:
    tiny_clip: session-scoped ``(model, tokenizer, name)`` for ``sparseclip-tiny-vit``
        (see ``sparseclip_d2/clip/model_configs.py``): a random-weight (torch seed 0),
        fp32, CPU, eval-mode, frozen open_clip ``CLIP`` with a 2-block, width-64, 4-head,
        patch-16 ViT at 64 px, a 2-layer width-64 text tower (context 77) and a 32-d joint
        space; ``tokenizer(list[str]) -> (N, 77) long``; ``name == "sparseclip-tiny-vit"``
        (use it for ``MODEL.SPARSECLIP.CLIP.NAME`` with ``PRETRAINED "none"`` in
        end-to-end tests). It is shared: never modify it in place - deep-copy it first.
"""
import os
import sys

import pytest

os.environ.setdefault("SPARSECLIP_TEXT_CACHE", "off")

# The tests live in folders that mirror the package (tests/methods/, tests/clip/ ...); a test may
# import another one's float64 references by module name (``from test_proxyclip import ...``), so
# every folder is on sys.path (module names are unique across folders).
_TESTS = os.path.dirname(os.path.abspath(__file__))
for _name in sorted(os.listdir(_TESTS)):
    _folder = os.path.join(_TESTS, _name)
    if os.path.isdir(_folder) and not _name.startswith((".", "_")) and _folder not in sys.path:
        sys.path.insert(0, _folder)

import sparseclip_d2  # noqa: E402

from tiny_models import register_tiny_models  # noqa: E402  (tests/ is on sys.path: rootdir conftest)

# The package registers nothing on import; the suite registers its tiny timm towers and,
# as every tool does through add_sparseclip_config, the detectron2 parts.
register_tiny_models()
if sparseclip_d2.HAS_DETECTRON2:
    sparseclip_d2.register_detectron2_parts()

TINY_CLIP_NAME = "sparseclip-tiny-vit"


@pytest.fixture(autouse=True)
def _torch_seeded():
    """Every test starts from torch seed 0, so a model built with random weights and no seed of
    its own (``build_model`` on ``PRETRAINED none``) is the same whichever tests ran before it in
    the worker (with -n 2 the order changes as files are added; one such test saw another
    file's RNG state and failed)."""
    import torch

    torch.manual_seed(0)
    yield


def build_tiny_clip(seed: int = 0, precision: str = "fp32"):
    """A fresh random-weight ``sparseclip-tiny-vit`` CLIP (torch RNG seeded with ``seed``)."""
    import torch

    from sparseclip_d2.clip import build_clip

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build_clip(TINY_CLIP_NAME, "none", precision=precision)


def tiny_cfg(**opts):
    """A detectron2 config of ``configs/Base-SparseCLIP.yaml`` with the tiny random-weight CLIP on
    the CPU, no text disk cache, and ``opts`` (config key -> value) merged last."""
    from detectron2.config import get_cfg

    import sparseclip_d2

    cfg = get_cfg()
    sparseclip_d2.add_sparseclip_config(cfg)
    cfg.merge_from_file(os.path.join(os.path.dirname(__file__), "..", "configs", "Base-SparseCLIP.yaml"))
    cfg.merge_from_list(["MODEL.SPARSECLIP.CLIP.NAME", TINY_CLIP_NAME, "MODEL.SPARSECLIP.CLIP.PRETRAINED", "none",
                         "MODEL.DEVICE", "cpu", "MODEL.SPARSECLIP.TEXT.CACHE_DIR", "off"])
    for k, v in opts.items():
        cfg.merge_from_list([k, v])
    return cfg


def baseline_cfg(name_or_path):
    """A detectron2 config of ``configs/baselines/<name>.yaml`` (or of a config file path), read
    as yacs reads it (``merge_from_file``), with nothing overridden."""
    from detectron2.config import get_cfg

    import sparseclip_d2

    path = name_or_path if os.path.isabs(name_or_path) or name_or_path.endswith(".yaml") else os.path.join(
        os.path.dirname(__file__), "..", "configs", "baselines", name_or_path + ".yaml")
    cfg = get_cfg()
    sparseclip_d2.add_sparseclip_config(cfg)
    cfg.merge_from_file(path)
    return cfg


def register_sem_seg(name, dicts, classes):
    """(Re-)register an in-memory segmentation dataset ``name`` (no background class; its
    masks hold the class indices as they are, 255 = ignore) with detectron2's catalogs."""
    from detectron2.data import DatasetCatalog, MetadataCatalog

    if name in DatasetCatalog.list():
        DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)
    DatasetCatalog.register(name, lambda: dicts)
    MetadataCatalog.get(name).set(stuff_classes=classes, ignore_label=255, evaluator_type="sem_seg",
                                  background_index=None)


@pytest.fixture(scope="session")
def tiny_clip():
    """``(model, tokenizer, name)`` of the tiny random-weight CLIP (seed 0); see the module docstring."""
    from sparseclip_d2.clip import get_tokenizer

    return build_tiny_clip(0), get_tokenizer(TINY_CLIP_NAME), TINY_CLIP_NAME


# The end-to-end tests on a real local Slurm cluster (tests/sweeps/test_slurm_cluster.py) carry the
# marker ``slurm``; they run in the default suite (``-m "not slurm"`` leaves them out by hand).
def pytest_configure(config):
    config.addinivalue_line("markers", "slurm: end-to-end tests on a real local Slurm cluster")
