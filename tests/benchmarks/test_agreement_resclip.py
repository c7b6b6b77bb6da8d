"""tools/agreement_resclip.py's former command line, now run by tools/agreement.py; and the random
weights both sides read (float16-rounded, loaded by the project as a file)."""
import importlib.util
import os

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "agreement_resclip.py")


def _tool_module():
    spec = importlib.util.spec_from_file_location("agreement_resclip", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_former_command_line_becomes_the_generic_one():
    argv = _tool_module().translate(["--upstream", "/up", "--config", "configs/baselines/resclip_b16_voc21.yaml",
                                     "--size", "336", "504", "--feedback-threshold", "0", "--output", "/o"])
    assert argv == ["--method", "resclip", "--upstream", "/up", "--configs", "resclip_b16_voc21.yaml", "--inputs",
                    "voc@336x504", "--seed", "0", "--threads", "2", "--workdir", "/o", "--force", "feedback0"]
    with pytest.raises(SystemExit):
        _tool_module().translate(["--upstream", "/up", "--config", "c.yaml", "--prob-threshold", "0.2",
                                  "--output", "/o"])


def test_a_missing_checkout_names_the_clone_and_the_commit(tmp_path):
    from sparseclip_d2.benchmarks.agreement import main

    with pytest.raises(SystemExit, match="no such directory; fetch it with: git clone "
                                         "https://github.com/yvhangyang/ResCLIP && git -C ResCLIP checkout 0e085f7"):
        main(["--method", "resclip", "--upstream", str(tmp_path / "nope")])


def test_random_weights_are_float16_values_the_project_loads(tmp_path):
    from sparseclip_d2.benchmarks.agreement import random_clip_weights
    from sparseclip_d2.clip import build_clip

    from conftest import TINY_CLIP_NAME

    path = str(tmp_path / "w.pt")
    random_clip_weights(TINY_CLIP_NAME, 3, path)
    state = torch.load(path)
    assert all(torch.equal(v, v.half().float()) for v in state.values() if v.is_floating_point())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        drawn = build_clip(TINY_CLIP_NAME, "none").state_dict()
    assert any(not torch.equal(drawn[k], state[k]) for k in state)  # rounded
    torch.testing.assert_close(state["visual.conv1.weight"], drawn["visual.conv1.weight"], atol=1e-3, rtol=1e-3)
    loaded = build_clip(TINY_CLIP_NAME, path).state_dict()
    assert all(torch.equal(loaded[k], state[k]) for k in state)
