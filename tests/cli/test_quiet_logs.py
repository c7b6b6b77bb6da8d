"""A run prints what the user chose, not the whole config (issue 43): the keys that differ
from the defaults, the weights, the datasets and the method; the environment and the full
config go to ``log.txt`` (debug level) and ``config.yaml``; ``--verbose`` prints them too."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["MODEL.SPARSECLIP.CLIP.NAME", "sparseclip-tiny-vit", "MODEL.SPARSECLIP.CLIP.PRETRAINED", "none",
        "MODEL.SPARSECLIP.TEXT.CACHE_DIR", "off", "INPUT.MIN_SIZE_TEST", "64"]


def _demo_run(out, *extra):
    return subprocess.run([sys.executable, os.path.join(ROOT, "tools", "train_net.py"), "--eval-only", *extra,
                           "--config-file", "configs/demo.yaml", *TINY, "OUTPUT_DIR", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def quiet_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("quiet") / "out"
    return _demo_run(out), out


def test_first_run_is_short_and_says_what_was_chosen(quiet_run):
    proc, out = quiet_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = (proc.stdout + proc.stderr).splitlines()
    assert len(lines) <= 60, len(lines)
    text = "\n".join(lines)
    assert "RANDOM WEIGHTS" in text  # the one warning that matters survives
    assert "config: configs/demo.yaml" in text
    assert "MODEL.SPARSECLIP.CLIP.NAME='sparseclip-tiny-vit'" in text and "INPUT.MIN_SIZE_TEST=64" in text
    assert "weights: CLIP sparseclip-tiny-vit, PRETRAINED none" in text
    assert "datasets: sparseclip_demo" in text
    assert "method: sparseclip-tiny-vit: qq" in text
    assert f"full config: {out / 'config.yaml'}" in text
    for wall in ("Running with full config", "Environment info", "ANCHOR_GENERATOR", "Command line arguments"):
        assert wall not in text


def test_full_config_and_environment_still_go_to_the_files(quiet_run):
    _, out = quiet_run
    log = (out / "log.txt").read_text()
    assert "Running with full config" in log and "ANCHOR_GENERATOR" in log and "Environment info" in log
    assert "ANCHOR_GENERATOR" in (out / "config.yaml").read_text()


def test_verbose_restores_the_full_output(tmp_path):
    proc = _demo_run(tmp_path / "out", "--verbose")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Running with full config" in proc.stdout and "Environment info" in proc.stdout
    assert "ANCHOR_GENERATOR" in proc.stdout and "Command line arguments" in proc.stdout
