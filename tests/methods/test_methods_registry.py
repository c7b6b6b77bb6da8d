"""``sparseclip_d2.methods``: the registries of the one inference pipeline, the plan a config makes
of them, and ``check_parts``, which derives every refusal from what the parts declare.

The label maps themselves are checked elsewhere (every method's own test file against float64
computations; ``tests/modeling/test_entry_points_agree.py`` for the entry points); here: which parts a
config selects, in which order they run, and that each declared incompatibility gives one
message naming both keys.
"""
import pytest
import torch

from conftest import tiny_cfg
from sparseclip_d2.common.needs import Needs
from sparseclip_d2.methods import ENCODERS, LOGIT_HEADS, SIDE_INPUTS, STAGES, UPSTREAM, check_parts, plan_from_config
from sparseclip_d2.methods.registry import Registry


def test_registries_hold_every_part_once():
    assert sorted(n for n, _ in LOGIT_HEADS) == ["cls_product", "cosine", "feature_surgery", "object_presence", "talk2dino", "tta"]
    assert sorted(n for n, _ in ENCODERS) == ["cass", "corrclip", "fsa", "gla_clip", "proxyclip", "talk2dino", "trident"]
    assert [n for n, c in ENCODERS if c.default] == ["proxyclip"]
    assert sorted(n for n, _ in STAGES) == ["cluster_vote", "label_closing", "label_propagation", "pamr",
                                            "region_vote", "text_laplacian", "trident_grid", "window_set"]
    assert [n for n, _ in SIDE_INPUTS] == ["region_mask"]
    assert sorted(n for n, _ in UPSTREAM) == ["cass", "clearclip", "clipsurgery", "cliptrase", "corrclip", "fsa", "gem",
                                              "gla_clip", "itaclip", "lposs", "maskclip", "naclip", "pearl", "proxyclip", "resclip",
                                              "scclip", "sclip", "sfp", "talk2dino", "trident"]
    with pytest.raises(KeyError, match=r"unknown post-processing stage 'pamrr'; valid: .*pamr"):
        STAGES.get("pamrr")
    r = Registry("thing")
    r.register("a")(int)
    with pytest.raises(ValueError, match="'a' is registered twice"):
        r.register("a")(float)
    assert r.name_of(int) == "a" and r.name_of(3) == "a"


@pytest.mark.parametrize("opts, head, stages", [
    ({}, "cosine", ()),
    ({"TEST.TTA.MODE": "itaclip", "MODEL.SPARSECLIP.LABEL_CLOSING": 3}, "tta", ("label_closing",)),
    ({"MODEL.SPARSECLIP.CLS_LOGIT_PRODUCT": True, "MODEL.SPARSECLIP.CLUSTER_VOTE.ENABLED": True,
      "MODEL.SPARSECLIP.PAMR.STEPS": 2}, "cls_product", ("pamr", "cluster_vote")),
    ({"MODEL.SPARSECLIP.FEATURE_SURGERY.ENABLED": True}, "feature_surgery", ()),
    ({"MODEL.SPARSECLIP.OBJECT_PRESENCE.ENABLED": True}, "object_presence", ()),
])
def test_plan_selects_one_head_and_orders_the_stages_by_kind(opts, head, stages):
    plan = plan_from_config(tiny_cfg(**opts))
    assert plan.head == head
    assert tuple(name for name, _ in plan.stages) == stages


@pytest.mark.parametrize("opts, message", [
    ({"TEST.TTA.MODE": "itaclip", "MODEL.SPARSECLIP.FEATURE_SURGERY.ENABLED": True},
     r"^MODEL\.SPARSECLIP\.FEATURE_SURGERY\.ENABLED cannot be combined with TEST\.TTA\.MODE: both compute the "
     r"window logits"),
    ({"TEST.TTA.MODE": "itaclip", "MODEL.SPARSECLIP.FEEDBACK.ENABLED": True,
      "MODEL.SPARSECLIP.ATTENTION.SOURCE": "qq+kk"},
     r"^TEST\.TTA\.MODE cannot be combined with MODEL\.SPARSECLIP\.FEEDBACK\.ENABLED: the encoder needs a first "
     r"segmentation"),
    ({"TEST.TTA.MODE": "itaclip", "TEST.ATTENTION_STATS.ENABLED": True},
     r"^TEST\.TTA\.MODE cannot be combined with TEST\.ATTENTION_STATS\.ENABLED"),
    ({"MODEL.SPARSECLIP.CLUSTER_VOTE.ENABLED": True, "MODEL.SPARSECLIP.FEATURE_SURGERY.ENABLED": True},
     r"^MODEL\.SPARSECLIP\.CLUSTER_VOTE\.ENABLED cannot be combined with MODEL\.SPARSECLIP\.FEATURE_SURGERY\.ENABLED: "
     r"it reads a block's self-correlation"),
    ({"MODEL.SPARSECLIP.CLUSTER_VOTE.ENABLED": True, "TEST.SLIDING_WINDOW.ENABLED": True},
     r"TEST\.SLIDING_WINDOW\.ENABLED = True is invalid with it; valid: False"),
    ({"MODEL.SPARSECLIP.CLUSTER_VOTE.ENABLED": True, "TEST.ATTENTION_STATS.ENABLED": True},
     r"^MODEL\.SPARSECLIP\.CLUSTER_VOTE\.ENABLED cannot be combined with TEST\.ATTENTION_STATS\.ENABLED"),
])
def test_each_declared_conflict_is_one_message_naming_both_keys(opts, message):
    with pytest.raises(ValueError, match=message):
        plan_from_config(tiny_cfg(**opts))


def test_check_parts_reads_only_the_declarations():
    tta, cosine = LOGIT_HEADS.get("tta"), LOGIT_HEADS.get("cosine")
    pamr, lp, vote = STAGES.get("pamr"), STAGES.get("label_propagation"), STAGES.get("cluster_vote")
    ok = dict(sliding_window=False, patch_remainder="pad_crop", attention_stats=False)
    check_parts((Needs(), "enc"), tta, [pamr], **ok)
    check_parts((Needs(first_segmentation=True), "enc"), cosine, [pamr, vote], **ok)
    with pytest.raises(ValueError, match=r"^TEST\.TTA\.MODE cannot be combined with X\.KEY: the encoder needs the "
                                         r"class texts"):
        check_parts((Needs(text=True), "X.KEY"), tta, [], **ok)
    with pytest.raises(ValueError, match=r"^TEST\.TTA\.MODE cannot be combined with X\.KEY: the encoder needs "
                                         r"per-window region masks"):
        check_parts((Needs(region_mask=True), "X.KEY"), tta, [], **ok)
    with pytest.raises(ValueError, match=r"^TEST\.TTA\.MODE cannot be combined with X\.KEY: the encoder needs "
                                         r"the whole windows of truncated crops"):
        check_parts((Needs(whole_windows=True), "X.KEY"), tta, [], **ok)
    with pytest.raises(ValueError, match=r"LABEL_PROPAGATION\.KIND cannot be combined with MODEL\.SPARSECLIP\.PAMR"
                                         r"\.STEPS \(the propagated scores replace PAMR's refinement\)"):
        check_parts((Needs(), "enc"), cosine, [lp, pamr], **ok)
    with pytest.raises(ValueError, match=r"CLUSTER_VOTE\.ENABLED cannot be combined with X\.KEY: it taps a block "
                                         r"of CLIP's own encoding pass"):
        check_parts((Needs(region_mask=True), "X.KEY"), cosine, [vote], **ok)
    with pytest.raises(ValueError, match=r"PATCH_REMAINDER = 'truncate' is invalid with it"):
        check_parts((Needs(), "enc"), cosine, [vote], **dict(ok, patch_remainder="truncate"))


def test_needs_combine_and_refuse_two_tapped_blocks():
    a = Needs(text=True, correlation_layer=-2)
    assert (a | Needs(whole_image=True)) == Needs(text=True, whole_image=True, correlation_layer=-2)
    assert (Needs(whole_windows=True) | a) == Needs(text=True, whole_windows=True, correlation_layer=-2)
    assert Needs(region_mask=True).side_inputs() == ("region_mask",) and Needs().side_inputs() == ()
    with pytest.raises(ValueError, match=r"different blocks \(-2 and 3\)"):
        a | Needs(correlation_layer=3)


def test_the_model_runs_its_stages_in_kind_order_and_exposes_them():
    from detectron2.modeling import build_model

    model = build_model(tiny_cfg(**{"MODEL.SPARSECLIP.LABEL_CLOSING": 3, "MODEL.SPARSECLIP.PAMR.STEPS": 2,
                                    "MODEL.SPARSECLIP.PAMR.DILATIONS": [1]}))
    assert [st.kind for st in model.stages] == ["logits", "labels"]
    assert model.head_name == "cosine" and model.stage("pamr").steps == 2 and model.stage("cluster_vote") is None
    assert model.describe().endswith("PAMR 2 steps, dilations [1], label closing 3")
    g = torch.Generator().manual_seed(0)
    x = {"image": torch.randint(0, 256, (3, 32, 48), dtype=torch.uint8, generator=g), "vocabulary": ["a", "b", "c"]}
    out = model.predict(x)
    assert out.labels is not None and out.labels.shape == (32, 48)  # a labels stage ran: a label map
    assert "sem_seg_labels" in model([x])[0]
    plain = build_model(tiny_cfg())
    result = plain.predict(x)
    assert result.labels is None and torch.equal(result.label_map(), result.score_maps.labels())
    assert "sem_seg" in plain([x])[0]


def test_family_folders_are_found_not_listed():
    """Every sub-package of ``sparseclip_d2/methods`` is a family folder, imported in alphabetical
    order; a folder on disk that the discovery misses would register nothing."""
    import pathlib

    import sparseclip_d2.methods as methods

    root = pathlib.Path(methods.__file__).parent
    on_disk = sorted(p.name for p in root.iterdir() if (p / "__init__.py").is_file())
    assert methods.family_folders() == on_disk
    assert {"pearl", "gla_clip", "talk2dino", "sclip"} <= set(on_disk)
    import sys

    assert all(f"sparseclip_d2.methods.{name}" in sys.modules for name in on_disk)
    # two stages of one kind run in their folders' order (cliptrase/, corrclip/, itaclip/); no
    # shipped config switches on two of one kind (every config's plan was compared before and
    # after the folders were found instead of listed)
    labels = [n for n, c in methods.STAGES if c.kind == "labels"]
    assert labels == ["cluster_vote", "region_vote", "label_closing"]
