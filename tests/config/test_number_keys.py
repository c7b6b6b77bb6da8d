"""values that were refused or silently accepted.

integer literals for float keys, unnormalised images into DenseCLIPEncoder, a
MAX_SIZE_TEST below MIN_SIZE_TEST, an ALPHA its NORMALIZER ignores, and one synonym rule
for TextClassifier and the CLI."""
import logging

import pytest
import torch

from conftest import tiny_cfg
from detectron2.config import get_cfg

import sparseclip_d2
from sparseclip_d2 import config as config_module
from sparseclip_d2.config import check_sparseclip_config, coerce_opts, merge_config


def fresh_cfg():
    cfg = get_cfg()
    sparseclip_d2.add_sparseclip_config(cfg)
    return cfg


# ------------------------------------------------------------------ ints for float keys
def test_integer_literals_on_the_command_line_for_float_keys():
    cfg = merge_config(fresh_cfg(), None, ["MODEL.SPARSECLIP.ATTENTION.NORMALIZER", "entmax",
                                           "MODEL.SPARSECLIP.ATTENTION.ALPHA", "2",
                                           "MODEL.SPARSECLIP.LOGIT_SCALE", "40",
                                           "TEST.SLIDING_WINDOW.STRIDE", "100"])
    alpha, scale = cfg.MODEL.SPARSECLIP.ATTENTION.ALPHA, cfg.MODEL.SPARSECLIP.LOGIT_SCALE
    assert alpha == 2.0 and isinstance(alpha, float) and scale == 40.0 and isinstance(scale, float)
    assert cfg.TEST.SLIDING_WINDOW.STRIDE == 100 and isinstance(cfg.TEST.SLIDING_WINDOW.STRIDE, int)
    check_sparseclip_config(cfg)  # ALPHA 2 (sparsemax) is valid
    # the same overrides straight into yacs are refused: the reason for merge_config
    with pytest.raises(ValueError, match="Type mismatch"):
        fresh_cfg().merge_from_list(["MODEL.SPARSECLIP.ATTENTION.ALPHA", "2"])
    # nothing else is rewritten: a float stays, a bool for a float key and text are yacs' to judge
    assert coerce_opts(fresh_cfg(), ["MODEL.SPARSECLIP.ATTENTION.ALPHA", "1.5", "MODEL.DEVICE", "3"]) == [
        "MODEL.SPARSECLIP.ATTENTION.ALPHA", "1.5", "MODEL.DEVICE", "3"]
    with pytest.raises(ValueError, match="Type mismatch"):
        merge_config(fresh_cfg(), None, ["MODEL.SPARSECLIP.ATTENTION.ALPHA", "True"])
    with pytest.raises((KeyError, AssertionError), match="NOT_A_KEY"):  # yacs: "Non-existent key"
        merge_config(fresh_cfg(), None, ["MODEL.SPARSECLIP.NOT_A_KEY", "2"])


def test_integer_literals_in_a_config_file_for_float_keys(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("MODEL:\n  SPARSECLIP:\n    LOGIT_SCALE: 40\n")
    child = tmp_path / "child.yaml"
    child.write_text(f"_BASE_: {base.name}\nMODEL:\n  SPARSECLIP:\n    ATTENTION:\n      NORMALIZER: entmax\n"
                     "      ALPHA: 2\nINPUT:\n  MIN_SIZE_TEST: 224\n")
    cfg = merge_config(fresh_cfg(), str(child))
    assert cfg.MODEL.SPARSECLIP.ATTENTION.ALPHA == 2.0 and isinstance(cfg.MODEL.SPARSECLIP.ATTENTION.ALPHA, float)
    assert cfg.MODEL.SPARSECLIP.LOGIT_SCALE == 40.0 and cfg.INPUT.MIN_SIZE_TEST == 224
    assert cfg.MODEL.SPARSECLIP.ATTENTION.NORMALIZER == "entmax"
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        merge_config(fresh_cfg(), str(tmp_path / "nope.yaml"))
    typo = tmp_path / "typo.yaml"
    typo.write_text("MODEL:\n  SPARSECLIP:\n    ALPHA_TYPO: 2\n    LOGIT_SCALE: 40\n")
    with pytest.raises(KeyError, match="ALPHA_TYPO"):
        merge_config(fresh_cfg(), str(typo))


# ------------------------------------------------------------------ unnormalised images
def test_dense_encoder_refuses_unnormalised_images(tiny_clip):
    from sparseclip_d2.clip import AttentionSpec, DenseCLIPEncoder

    model, _, _ = tiny_clip
    enc = DenseCLIPEncoder(model.visual, AttentionSpec())
    raw = torch.randint(0, 256, (1, 3, 64, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="uint8"):
        enc(raw)
    with pytest.raises(ValueError, match="raw pixels"):
        enc(raw.float())
    mean = torch.tensor(enc.image_mean).view(1, 3, 1, 1)
    std = torch.tensor(enc.image_std).view(1, 3, 1, 1)
    feats = enc((raw.float() / 255 - mean) / std)
    assert feats.shape[-2:] == (4, 4) and torch.isfinite(feats).all()


# ------------------------------------------------------------------ valid but misleading values
@pytest.fixture
def config_warnings(caplog, monkeypatch):
    monkeypatch.setattr(config_module, "_WARNED", set())

    def warnings(cfg):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=config_module.__name__):
            check_sparseclip_config(cfg)
        return [r.getMessage() for r in caplog.records if r.name == config_module.__name__]

    return warnings


def test_max_size_below_min_size_warns(config_warnings):
    lines = config_warnings(tiny_cfg(**{"INPUT.MAX_SIZE_TEST": "8"}))
    assert len(lines) == 1 and "INPUT.MAX_SIZE_TEST = 8" in lines[0] and "MIN_SIZE_TEST = 448" in lines[0]
    assert config_warnings(tiny_cfg(**{"INPUT.MAX_SIZE_TEST": "448"})) == []
    assert config_warnings(tiny_cfg(**{"INPUT.MAX_SIZE_TEST": "8", "INPUT.MIN_SIZE_TEST": "0"})) == []  # no resize


def test_alpha_ignored_by_its_normalizer_warns(config_warnings):
    lines = config_warnings(tiny_cfg(**{"MODEL.SPARSECLIP.ATTENTION.ALPHA": "1.5"}))  # softmax by default
    assert len(lines) == 1 and "ALPHA = 1.5 is ignored by NORMALIZER softmax" in lines[0]
    lines = config_warnings(tiny_cfg(**{"MODEL.SPARSECLIP.ATTENTION.NORMALIZER": "sparsemax",
                                        "MODEL.SPARSECLIP.ATTENTION.ALPHA": "1.5"}))
    assert len(lines) == 1 and "sparsemax is alpha 2" in lines[0]
    for normalizer in ("entmax", "random_matched"):
        assert config_warnings(tiny_cfg(**{"MODEL.SPARSECLIP.ATTENTION.NORMALIZER": normalizer,
                                           "MODEL.SPARSECLIP.ATTENTION.ALPHA": "1.5"})) == []
    assert config_warnings(tiny_cfg()) == []  # the default ALPHA with softmax: nothing to say


# ------------------------------------------------------------------ one synonym rule
def test_one_synonym_rule_for_text_classifier_and_cli(tiny_clip):
    from sparseclip_d2.clip import TextClassifier
    from sparseclip_d2.clip.text import split_synonyms
    from sparseclip_d2.data import display_name
    from sparseclip_d2.data.image_io import parse_vocabulary
    from sparseclip_d2.modeling.meta_arch import check_vocabulary

    assert split_synonyms(["grass; lawn", "sky"]) == (["grass", "lawn", "sky"], [0, 0, 1])
    assert split_synonyms(["grass; lawn"]) == split_synonyms(["grass, lawn"])
    assert display_name("tv monitor; monitor") == "tv monitor"
    cli = parse_vocabulary("cat, grass; lawn")  # the CLI: commas between classes
    model, tokenizer, name = tiny_clip
    clf = TextClassifier(model, tokenizer, "single", model_name=name, cache_dir="off")
    e_cli, i_cli = clf(cli)
    e_semi, i_semi = clf(["cat", "grass; lawn"])  # what a user writes after reading the CLI help
    assert torch.equal(i_cli, torch.tensor([0, 1, 1])) and torch.equal(i_cli, i_semi)
    torch.testing.assert_close(e_cli, e_semi, atol=0, rtol=0)
    with pytest.raises(ValueError, match="lawn"):  # a duplicate across ';' synonyms is found too
        check_vocabulary(["grass; lawn", "lawn"], "vocabulary")
