"""The one refusal of config keys set while their section's switch is off (common/keys.py)."""
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


def test_key_default_tables_are_the_default_config():
    """Each section's ``*_KEY_DEFAULTS`` (layer 2, where detectron2's config cannot be read) is
    exactly its section of ``add_sparseclip_config``'s defaults, every key but the switch, so a
    default changed in one place and not the other fails here instead of refusing a valid config
    or letting a set key pass unnoticed."""
    from detectron2.config import CfgNode, get_cfg

    from sparseclip_d2.clip.object_presence import OBJECT_PRESENCE_KEY_DEFAULTS
    from sparseclip_d2.config import add_sparseclip_config
    from sparseclip_d2.propagation.config import LABEL_PROPAGATION_KEY_DEFAULTS, VFM_KEY_DEFAULTS
    from sparseclip_d2.proxy.config import (CASS_KEY_DEFAULTS, CORRCLIP_KEY_DEFAULTS, FSA_KEY_DEFAULTS,
                                            PROXY_KEY_DEFAULTS)
    from sparseclip_d2.proxy.trident_config import TRIDENT_KEY_DEFAULTS

    cfg = get_cfg()
    add_sparseclip_config(cfg)
    sc = cfg.MODEL.SPARSECLIP
    for table, node, switch in [
        (PROXY_KEY_DEFAULTS, sc.PROXY, "NAME"),
        (FSA_KEY_DEFAULTS, sc.PROXY.FSA, "ENABLED"),
        (CASS_KEY_DEFAULTS, sc.PROXY.CASS, "ENABLED"),
        (CORRCLIP_KEY_DEFAULTS, sc.PROXY.CORRCLIP, "ENABLED"),
        (TRIDENT_KEY_DEFAULTS, sc.PROXY.TRIDENT, "ENABLED"),
        (OBJECT_PRESENCE_KEY_DEFAULTS, sc.OBJECT_PRESENCE, "ENABLED"),
        (LABEL_PROPAGATION_KEY_DEFAULTS, sc.LABEL_PROPAGATION, "KIND"),
        (VFM_KEY_DEFAULTS, sc.LABEL_PROPAGATION.VFM, None),
    ]:
        leaves = {k: v for k, v in node.items() if not isinstance(v, CfgNode) and k != switch}
        assert sorted(table) == sorted(leaves), (switch, sorted(set(table) ^ set(leaves)))
        assert changed_keys(leaves, table, "X") == [] and changed_keys(table, leaves, "X") == []
