"""tools/agreement_resclip.py without an upstream checkout: the message that says how to get one,
and the random weights both sides read (float16-rounded, loaded by the project as a file)."""
import importlib.util
import os
import subprocess
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "agreement_resclip.py")


def _tool_module():
    spec = importlib.util.spec_from_file_location("agreement_resclip", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_missing_checkout_names_the_clone_and_the_commit(tmp_path):
    proc = subprocess.run([sys.executable, TOOL, "--upstream", str(tmp_path / "nope"), "--config",
                           "configs/baselines/resclip_b16_voc21.yaml", "--output", str(tmp_path / "out")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "no such directory" in proc.stderr and "git clone https://github.com/yvhangyang/ResCLIP" in proc.stderr
    assert "checkout 0e085f7" in proc.stderr


def test_random_weights_are_float16_values_the_project_loads(tmp_path):
    from sparseclip_d2.clip import build_clip

    from conftest import TINY_CLIP_NAME

    path = str(tmp_path / "w.pt")
    _tool_module().random_weights(TINY_CLIP_NAME, 3, path)
    state = torch.load(path)
    assert all(torch.equal(v, v.half().float()) for v in state.values() if v.is_floating_point())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        drawn = build_clip(TINY_CLIP_NAME, "none").state_dict()
    assert any(not torch.equal(drawn[k], state[k]) for k in state)  # rounded
    torch.testing.assert_close(state["visual.conv1.weight"], drawn["visual.conv1.weight"], atol=1e-3, rtol=1e-3)
    loaded = build_clip(TINY_CLIP_NAME, path).state_dict()
    assert all(torch.equal(loaded[k], state[k]) for k in state)
