"""The one spec grammar and validation (AttentionSpec), settings that change nothing, the
bounded cache and the atomic writes."""
import dataclasses
import json
import logging
import os

import pytest
import torch

from sparseclip_d2.attention import alpha_entmax, attention_weights, paper_source_name
from sparseclip_d2.clip import (PRESETS, SETTINGS, SPEC_KEYS, AttentionSpec, CalibrationOptions, DenseCLIPEncoder,
                                FeedbackOptions, MixOptions, ParallelOptions, parse_attention_spec)
from sparseclip_d2.clip.spec import GROUPS, SpecDepthError
from sparseclip_d2.common.cache import LRUCache
from sparseclip_d2.common.io import atomic_write_json


@pytest.mark.parametrize("text, match", [
    ("qq+kk:layers=2", "num_layers=2 changes nothing"),           # softmax in the earlier block = plain CLIP
    ("sclip:layers=3", "num_layers=3 changes nothing"),
    ("softmax:alpha=1.5", "alpha=1.5 changes nothing with normalizer 'softmax'"),
    ("sparsemax:alpha=1.3", "alpha=1.3 changes nothing"),
    ("identity:entmax:1.2", "identity source's block outputs its values"),
    ("maskclip:prior=gaussian", "prior='gaussian' changes nothing on the identity source"),
    ("qq:sum_mode=sum_then_normalize", "sum_mode='sum_then_normalize' changes nothing"),
    ("qq:std=3", "prior_std=3 changes nothing without a prior"),
    ("entmax:seed=4", "seed=4 changes nothing"),
])
def test_grammar_refuses_settings_that_change_nothing(text, match):
    with pytest.raises(ValueError, match=match):
        parse_attention_spec(text)


@pytest.mark.parametrize("text", ["qq+kk:entmax:1.2:layers=2", "softmax:t=0.5:layers=2", "identity:entmax:layers=2",
                                  "qq+kk:sum_mode=sum_then_normalize", "naclip:std=3", "random_matched:1.2:seed=4"])
def test_grammar_accepts_settings_that_matter(text):
    assert parse_attention_spec(text).inert_settings() == []


def test_inert_num_layers_is_really_inert_and_effective_ones_are_not(tiny_clip):
    """What inert_settings claims, measured on the encoder: softmax on 2 layers equals 1 layer
    (SCLIP), entmax on 2 layers does not."""
    visual = tiny_clip[0].visual
    x = torch.randn(1, 3, 48, 64, generator=torch.Generator().manual_seed(0))
    sclip = DenseCLIPEncoder(visual, AttentionSpec.preset("sclip"))(x)
    two = DenseCLIPEncoder(visual, AttentionSpec.preset("sclip", num_layers=2))(x)
    assert AttentionSpec.preset("sclip", num_layers=2).inert_settings()
    torch.testing.assert_close(two, sclip, rtol=0, atol=1e-5)
    ent1 = DenseCLIPEncoder(visual, AttentionSpec.preset("sclip", normalizer="entmax"))(x)
    ent2 = DenseCLIPEncoder(visual, AttentionSpec.preset("sclip", normalizer="entmax", num_layers=2))(x)
    assert (ent2 - ent1).abs().max() > 1e-3


def test_config_path_logs_inert_settings(caplog):
    from detectron2.config import get_cfg

    from sparseclip_d2 import add_sparseclip_config

    cfg = add_sparseclip_config(get_cfg())
    cfg.MODEL.SPARSECLIP.ATTENTION.SOURCE = "qq+kk"
    cfg.MODEL.SPARSECLIP.ATTENTION.NUM_LAYERS = 2
    with caplog.at_level(logging.WARNING):
        spec = AttentionSpec.from_config(cfg)
    assert spec.num_layers == 2 and "num_layers=2 changes nothing" in caplog.text
    cfg.MODEL.SPARSECLIP.ATTENTION.SOURCE = "qx"
    with pytest.raises(ValueError, match="MODEL.SPARSECLIP.ATTENTION/BLOCK: unknown attention source 'qx'"):
        AttentionSpec.from_config(cfg)


def test_one_alpha_check_everywhere():
    """The spec, attention_weights and alpha_entmax refuse the same alphas with the same words."""
    q = torch.randn(1, 1, 3, 4)
    for bad in (0.9, 2.5, float("nan"), True):
        with pytest.raises(ValueError, match=r"in \[1, 2\]"):
            AttentionSpec(normalizer="entmax", alpha=bad)
        with pytest.raises(ValueError, match=r"in \[1, 2\]"):
            attention_weights(q, q, q, normalizer="entmax", alpha=bad)
        with pytest.raises(ValueError, match=r"in \[1, 2\]"):
            alpha_entmax(q, bad)


def test_paper_names_and_rows_sum_to():
    assert [paper_source_name(s) for s in ("qk", "qqv", "identity", "qq+kk", "qqv+kkv+vvv")] == \
        ["qkv", "qqv", "v-only", "qq+kk", "qq+kk+vv"]
    spec = AttentionSpec(source="qqv+kkv")
    assert (spec.source, spec.paper_source, spec.rows_sum_to) == ("qq+kk", "qq+kk", 2)
    assert spec.replace(sum_mode="sum_then_normalize").rows_sum_to == 1
    assert AttentionSpec.parse("clearclip:entmax:1.5") == AttentionSpec.preset("clearclip", normalizer="entmax",
                                                                               alpha=1.5)


def test_groups_are_frozen_hashable_and_validate_their_own_fields():
    """The core plus option groups: each group is a frozen, hashable value
    that validates its fields with the messages the flat fields had."""
    spec = AttentionSpec.preset("resclip")
    assert spec.mix == MixOptions(layers=(5, 6, 7, 8), source="qk", weight=0.3, scale=2.0)
    assert spec.feedback == FeedbackOptions(enabled=True, weight=0.7, scale=2.2, precision="float16")
    assert {spec: 1}[AttentionSpec.preset("resclip")] == 1 and len({spec, PRESETS["resclip"]}) == 1
    assert hash(spec.mix) == hash(MixOptions(layers=[8, 7, 6, 5], source="QK", weight=0.3, scale=2))
    with pytest.raises(Exception):
        spec.mix.weight = 0.1  # frozen
    for group, message in [(lambda: MixOptions(weight=1.5), r"mix_weight must be in \[0, 1\]"),
                           (lambda: ParallelOptions(qkv_norm="l2"), "parallel path only; set parallel_layers > 0"),
                           (lambda: FeedbackOptions(scale=0), "feedback_scale must be a finite number > 0"),
                           (lambda: CalibrationOptions(similarity_layer=-2), "SIMILARITY_LAYER"),
                           (lambda: AttentionSpec(mix={"layers": (1,)}), "must be a MixOptions")]:
        with pytest.raises((ValueError, TypeError), match=message):
            group()
    # a group is truthy when it changes the block
    plain = AttentionSpec()
    assert not (plain.mix or plain.parallel or plain.feedback or plain.calibration)
    assert spec.mix and spec.feedback and PRESETS["gem"].parallel and PRESETS["sfp"].calibration


def test_flat_settings_name_every_group_field_once_and_round_trip():
    fields = {(g, f) for g, f, _ in SETTINGS.values()}
    want = {(None, f) for f in ("source", "normalizer", "alpha", "temperature", "num_layers", "residual", "ffn",
                                 "prior", "prior_std", "sum_mode", "seed", "cls_weight",
                                 "unmodified_blocks")}
    for name, cls in GROUPS.items():
        want |= {(name, f.name) for f in dataclasses.fields(cls)}
    assert fields == want and len(SETTINGS) == len(want)
    assert set(SPEC_KEYS.values()) == set(SETTINGS)
    for name, spec in PRESETS.items():
        assert AttentionSpec.from_settings(**spec.settings()) == spec, name
    base = AttentionSpec.preset("itaclip")
    assert base.replace(mix_layers=(1, 2), mix_weight=0.2) == base.replace(mix=MixOptions(
        layers=(1, 2), source="qq+kk", weight=0.2)) == parse_attention_spec("itaclip:mix_layers=1,2:mix_weight=0.2")
    # flat names apply on top of a group given in the same call; feedback=True is the flag
    assert base.replace(mix=MixOptions(layers=(3,)), mix_weight=0.1).mix == MixOptions(layers=(3,), weight=0.1)
    assert AttentionSpec().replace(feedback=True).feedback == FeedbackOptions(enabled=True)
    with pytest.raises(TypeError, match="unknown AttentionSpec setting 'mix_layer'"):
        base.replace(mix_layer=(1,))
    with pytest.raises(SpecDepthError) as e:
        base.check_depth(8)
    assert e.value.field == "mix_layers"


def test_no_second_spec_parser():
    """The grammar lives in clip/spec.py only."""
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "sparseclip_d2")
    assert not os.path.exists(os.path.join(root, "utils", "specs.py"))
    import sparseclip_d2.analysis.attention_figures as vis

    assert not hasattr(vis, "parse_spec")


def test_lru_cache_bound_and_order():
    calls = []
    c = LRUCache(2)

    def make(v):
        return lambda: calls.append(v) or v

    assert c.get_or_create("a", make(1)) == 1 and c.get_or_create("b", make(2)) == 2
    assert c.get_or_create("a", make(99)) == 1          # hit: not rebuilt, "a" becomes most recent
    assert c.get_or_create("c", make(3)) == 3           # evicts "b", the least recently used
    assert "b" not in c and "a" in c and len(c) == 2 and calls == [1, 2, 3]
    with pytest.raises(ValueError, match="maxsize must be an integer >= 1"):
        LRUCache(0)


def test_atomic_write_keeps_the_old_file_on_failure(tmp_path):
    path = str(tmp_path / "r.json")
    atomic_write_json(path, {"a": 1})
    with pytest.raises(TypeError):
        atomic_write_json(path, {"a": object()})        # fails while serialising
    with pytest.raises(ValueError):
        atomic_write_json(path, {"a": float("nan")})     # NaN refused by default
    assert json.load(open(path)) == {"a": 1} and os.listdir(tmp_path) == ["r.json"]
