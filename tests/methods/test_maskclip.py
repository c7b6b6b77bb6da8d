"""MaskCLIP's upstream entry (``methods/maskclip/upstream.py``): the rows it declares, the class set
its configs' text-embedding file names, the vocabulary the project side is given, and its stand-ins.
Expected names are written by hand from chongzhou96/MaskCLIP @ 245d31f (``configs/maskclip/*.py``
file names, ``tools/maskclip_utils/prompt_engineering.py`` ``--class-set`` choices and lists)."""
import glob
import io
import os

import pytest
import torch

from sparseclip_d2.benchmarks.agreement import upstream_config_for, upstream_vocabulary
from sparseclip_d2.benchmarks.project import project_cfg
from sparseclip_d2.methods.maskclip.upstream import (MMCV_OPS_NAMES, PROMPT_SCRIPT, _class_list, cpu_map_location,
                                                     standin_modules)
from sparseclip_d2.methods.registry import UPSTREAM

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_maskclip_config_is_a_row_against_its_datasets_upstream_config():
    entry = UPSTREAM.get("maskclip")
    ours = {os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "configs", "baselines", "maskclip_b16*.yaml"))}
    assert set(entry.agreement_configs()) == ours
    expected = {"sparseclip_voc20_val": "configs/maskclip/maskclip_vit16_512x512_voc12aug_20.py",
                "sparseclip_cityscapes_val": "configs/maskclip/maskclip_vit16_1024x512_cityscapes.py",
                "sparseclip_context59_val": "configs/maskclip/maskclip_vit16_520x520_pascal_context_59.py"}
    for config in ours:
        dataset = project_cfg(config, []).DATASETS.TEST[0]
        assert upstream_config_for(entry, config, dataset) == expected[dataset], config


@pytest.mark.parametrize("name, expected", [("pretrain/voc_ViT16_clip_text.pth", "voc"),
                                            ("pretrain/city_ViT16_clip_text.pth", "city"),
                                            ("pretrain/context_ViT16_clip_text.pth", "context")])
def test_the_class_set_is_read_from_the_text_embeddings_file_name(name, expected):
    assert _class_list("x.py", name) == expected


@pytest.mark.parametrize("name", ["pretrain/voc_context_ViT16_clip_text.pth", "pretrain/voc_RN50_clip_text.pth",
                                  "pretrain/voc_ViT16_npe_clip_text.pth"])
def test_another_text_embeddings_file_is_refused_by_name(name):
    with pytest.raises(SystemExit, match=rf"x\.py: text_embeddings_path '{name}' is not one class set's"):
        _class_list("x.py", name)


def test_the_project_side_gets_the_prompt_scripts_list_of_the_configs_class_set(tmp_path):
    """A tiny checkout: a config over a model base naming the Cityscapes text file; the vocabulary is the
    prompt script's ``cityscapes_classes`` (read without importing the script, which imports clip)."""
    (tmp_path / "configs" / "_base_").mkdir(parents=True)
    (tmp_path / "configs" / "m").mkdir()
    (tmp_path / "configs" / "_base_" / "model.py").write_text(
        "norm_cfg = dict(type='SyncBN')\nmodel = dict(decode_head=dict(norm_cfg=norm_cfg, text_embeddings_path=None))\n")
    (tmp_path / "configs" / "m" / "city.py").write_text(
        "_base_ = ['../_base_/model.py']\nmodel = dict(decode_head=dict(text_embeddings_path='pretrain/city_ViT16_clip_text.pth'))\n")
    os.makedirs(tmp_path / os.path.dirname(PROMPT_SCRIPT))
    (tmp_path / PROMPT_SCRIPT).write_text("import clip\nvoc_classes = ['cat']\ncityscapes_classes = ['road', 'traffic light']\n")
    entry = UPSTREAM.get("maskclip")
    assert entry.class_tuple_of(str(tmp_path), "configs/m/city.py") == (PROMPT_SCRIPT, "cityscapes_classes")
    assert upstream_vocabulary(entry, str(tmp_path), "configs/m/city.py") == ("", ["road", "traffic light"])
    with pytest.raises(SystemExit, match=r"model\.py: sets no model\.decode_head\.text_embeddings_path"):
        entry.class_tuple_of(str(tmp_path), "configs/_base_/model.py")  # None there: not a row's config


def test_the_standins_raise_naming_themselves_if_called():
    mods = standin_modules()
    assert set(mods) == {"mmcv.ops", "mmseg.datasets.pipelines.corruptions"}
    assert set(MMCV_OPS_NAMES) == {"sigmoid_focal_loss", "point_sample", "CrissCrossAttention", "PSAMask"}
    for name in MMCV_OPS_NAMES:
        with pytest.raises(RuntimeError, match=rf"^{name} is a stand-in of the MaskCLIP upstream entry"):
            getattr(mods["mmcv.ops"], name)(1, k=2)
    with pytest.raises(RuntimeError, match=r"^corrupt is a stand-in"):
        mods["mmseg.datasets.pipelines.corruptions"].corrupt(None)


@pytest.mark.parametrize("given, passed", [("cuda", "cpu"), ("cuda:0", "cpu"), (torch.device("cuda", 1), "cpu"),
                                           ("cpu", "cpu"), (None, None)])
def test_a_cuda_map_location_loads_on_the_cpu(given, passed):
    seen = []
    cpu_map_location(lambda f, *a, map_location=None, **k: seen.append((f, a, map_location, k)))("f.pth", map_location=given,
                                                                                               weights_only=True)
    assert seen == [("f.pth", (), passed, {"weights_only": True})]


def test_a_file_object_is_read_from_its_start():
    """openai-clip's fallback ``torch.load(opened_file)`` after ``torch.jit.load`` read the file to its end."""
    buf = io.BytesIO()
    torch.save({"w": torch.arange(3.0)}, buf)
    buf.seek(0, io.SEEK_END)
    got = cpu_map_location(torch.load)(buf, map_location="cuda")
    assert torch.equal(got["w"], torch.tensor([0.0, 1.0, 2.0]))


def test_labels_are_the_first_of_simple_tests_list():
    import numpy as np

    a = np.arange(6).reshape(2, 3)
    assert UPSTREAM.get("maskclip").labels([a], {}) is a
