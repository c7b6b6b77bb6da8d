"""The one refusal of config keys set while their section's switch is off (common/keys.py)."""
import re

import pytest

from sparseclip_d2.common.keys import changed_keys, refuse_keys_while_off


def test_changed_keys_by_hand():
    defaults = {"A": 1, "B": "x", "C": [0.5, 1.5]}
    assert changed_keys({"A": 1, "B": "x", "C": (0.5, 1.5)}, defaults, "P") == []  # a yacs tuple equals the list
    assert changed_keys({"A": 2, "B": "x", "C": [1.0, 1.0]}, defaults, "P.Q") == ["P.Q.A = 2", "P.Q.C = [1.0, 1.0]"]
    assert changed_keys({"A": 1, "B": "y", "C": 0.5}, defaults, "P") == ["P.B = 'y'", "P.C = 0.5"]


def test_refusal_names_every_key_the_switch_and_the_remedy():
    refuse_keys_while_off([], "P.ENABLED is False", "enable it")  # nothing set: no error
    with pytest.raises(ValueError) as e:
        refuse_keys_while_off(["P.A = 2", "P.C = 0.5"], "P.ENABLED is False", "enable P or leave these keys")
    assert str(e.value) == "P.A = 2, P.C = 0.5 changes nothing while P.ENABLED is False: enable P or leave these keys"


def test_every_section_refuses_its_keys_while_off():
    from conftest import tiny_cfg

    from sparseclip_d2.config import check_sparseclip_config

    for key, value, switch in [
        ("MODEL.SPARSECLIP.PROXY.FSA.TOP_P", "0.5", "FSA.ENABLED is False"),
        ("MODEL.SPARSECLIP.PROXY.CASS.SINGULAR_SCALE", "[1.0, 1.0]", "CASS.ENABLED is False"),
        ("MODEL.SPARSECLIP.PROXY.CORRCLIP.TAU", "2.0", "CORRCLIP.ENABLED is False"),
        ("MODEL.SPARSECLIP.PROXY.TRIDENT.COS_FAC", "2.0", "TRIDENT.ENABLED is False"),
        ("MODEL.SPARSECLIP.OBJECT_PRESENCE.TOP_K", "3", "OBJECT_PRESENCE.ENABLED is False"),
        ("MODEL.SPARSECLIP.LABEL_PROPAGATION.VFM.LAYER", "3", "LABEL_PROPAGATION.KIND is ''"),
    ]:
        opts = {key: value}
        if "PROXY" in key:  # a proxy, so that only the section's own switch is off
            opts["MODEL.SPARSECLIP.PROXY.NAME"] = "sparseclip_tiny_dino8"
        with pytest.raises(ValueError, match=rf"{key.replace('.', '[.]')} = .* changes nothing while .*{switch}"):
            check_sparseclip_config(tiny_cfg(**opts))


def _sections():
    from sparseclip_d2.methods.cass.object_presence import OBJECT_PRESENCE_SECTION
    from sparseclip_d2.methods.cliptrase.cluster_vote import CLUSTER_VOTE_SECTION
    from sparseclip_d2.dense.first_segmentation import FEEDBACK_SECTION
    from sparseclip_d2.methods.lposs.keys import LABEL_PROPAGATION_SECTION, VFM_SECTION
    from sparseclip_d2.methods.cass.keys import CASS_SECTION
    from sparseclip_d2.methods.corrclip.keys import CORRCLIP_SECTION
    from sparseclip_d2.methods.fsa.keys import FSA_SECTION
    from sparseclip_d2.proxy.keys import PROXY_SECTION
    from sparseclip_d2.methods.trident.keys import TRIDENT_SECTION

    return [(PROXY_SECTION, "PROXY"), (FSA_SECTION, "PROXY.FSA"), (CASS_SECTION, "PROXY.CASS"),
            (CORRCLIP_SECTION, "PROXY.CORRCLIP"), (TRIDENT_SECTION, "PROXY.TRIDENT"),
            (OBJECT_PRESENCE_SECTION, "OBJECT_PRESENCE"), (LABEL_PROPAGATION_SECTION, "LABEL_PROPAGATION"),
            (VFM_SECTION, "LABEL_PROPAGATION.VFM"), (FEEDBACK_SECTION, "FEEDBACK"),
            (CLUSTER_VOTE_SECTION, "CLUSTER_VOTE")]


def test_sections_are_built_from_the_settings_dataclasses():
    """Each part's section of ``add_sparseclip_config`` is its settings dataclass: every field
    with a key gives that key with the field's default (of the same type; a list key from a tuple
    or from indexed fields), in field order, except the defaults the Section states; the keys
    with no field are the Section's own; nothing else is in the section but sub-sections."""
    import dataclasses

    from detectron2.config import CfgNode, get_cfg

    from sparseclip_d2.common.keys import key_defaults, section_defaults, section_help
    from sparseclip_d2.config import add_sparseclip_config

    cfg = get_cfg()
    add_sparseclip_config(cfg)
    for section, path in _sections():
        node = cfg.MODEL.SPARSECLIP
        for part in path.split("."):
            node = node[part]
        leaves = {k: v for k, v in node.items() if not isinstance(v, CfgNode)}
        table = section_defaults(section)
        assert list(leaves) == list(table), (path, list(leaves), list(table))
        field_keys = set()
        for f in dataclasses.fields(section.settings):
            if "key" not in f.metadata:
                continue
            key, index = f.metadata["key"], f.metadata.get("index")
            want = section.defaults.get(f.name, f.default)
            got = leaves[key] if index is None else leaves[key][index]
            if isinstance(want, tuple):
                want = list(want)
            assert got == want and type(got) is type(want), (path, key, got, want)
            assert section_help(section)[key], (path, key, "no comment")
            field_keys.add(key)
        own = {k.name for k in section.before + section.after}
        assert not own & field_keys and own | field_keys == set(leaves), (path, own, field_keys)
        assert section.switch is None or section.switch in leaves, path
        assert set(key_defaults(section)) == set(leaves) - {section.switch}, path


def test_a_changed_dataclass_default_changes_the_section_and_the_refusal():
    """Changing nothing but a field's default moves the config default and the refusal with it:
    the old default then counts as set while the switch is off."""
    import dataclasses

    from detectron2.config import CfgNode as CN

    from sparseclip_d2.common.keys import Key, Section, build_section, changed_section_keys, key_field

    @dataclasses.dataclass(frozen=True)
    class Part:
        top_p: float = key_field(0.45, "TOP_P", "nucleus")
        scale: tuple = key_field((0.5, 1.5), "SCALE", "a list key")

    @dataclasses.dataclass(frozen=True)
    class Part2:
        top_p: float = key_field(0.5, "TOP_P", "nucleus")
        scale: tuple = key_field((0.5, 1.5), "SCALE", "a list key")

    sec = Section(Part, switch="ENABLED", before=(Key("ENABLED", False),))
    node = build_section(CN, sec)
    assert dict(node) == {"ENABLED": False, "TOP_P": 0.45, "SCALE": [0.5, 1.5]}
    assert changed_section_keys(node, sec, "P") == []
    sec2 = Section(Part2, switch="ENABLED", before=(Key("ENABLED", False),))
    assert build_section(CN, sec2).TOP_P == 0.5
    assert changed_section_keys(node, sec2, "P") == ["P.TOP_P = 0.45"]
    with pytest.raises(ValueError, match="has no field nope"):
        Section(Part, defaults={"nope": 1})


def test_switch_is_on_checks_the_switch_and_refuses_keys_while_off():
    """The one switch reading that every ``ENABLED`` section shares (common/keys.py switch_is_on),
    against hand-written expectations."""
    import dataclasses

    from sparseclip_d2.common.keys import Key, Section, key_field, switch_is_on

    @dataclasses.dataclass(frozen=True)
    class S:
        a: int = key_field(1, "A")
        c: float = key_field(0.5, "C")

    section = Section(S, switch="ENABLED", before=(Key("ENABLED", False),))
    assert switch_is_on({"ENABLED": True, "A": 7, "C": 0.5}, section, "P.Q") is True
    assert switch_is_on({"ENABLED": False, "A": 1, "C": 0.5}, section, "P.Q") is False
    with pytest.raises(ValueError) as e:
        switch_is_on({"ENABLED": False, "A": 2, "C": 0.5}, section, "P.Q")
    assert str(e.value) == ("P.Q.A = 2 changes nothing while P.Q.ENABLED is False: set P.Q.ENABLED True or leave "
                            "these keys at their defaults")
    for bad in (1, "True", None):
        with pytest.raises(ValueError, match=rf"^P\.Q\.ENABLED = {re.escape(repr(bad))} is invalid; valid: True, False$"):
            switch_is_on({"ENABLED": bad, "A": 1, "C": 0.5}, section, "P.Q")
    with pytest.raises(ValueError, match="has no switch"):
        switch_is_on({"A": 1, "C": 0.5}, Section(S), "P.Q")


def test_every_encoder_family_switch_reads_its_key():
    """Each non-default encoder family is switched on by its own key alone (the default
    ``EncoderFamily.switched_on`` reads ``key``)."""
    from conftest import tiny_cfg

    from sparseclip_d2.methods.registry import ENCODERS

    families = [(name, cls) for name, cls in ENCODERS if not cls.default]
    assert len(families) >= 6
    for name, cls in families:
        assert not cls.switched_on(tiny_cfg()), name
        cfg = tiny_cfg(**{cls.key: "True"})
        assert cls.switched_on(cfg), name
        assert [n for n, c in families if c.switched_on(cfg)] == [name]
