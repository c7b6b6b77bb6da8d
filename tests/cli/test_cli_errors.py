"""One error line and exit status 2 for the user mistakes (the sweep-file
ones belong to tools/sweep.py's tests)."""
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from conftest import tiny_cfg
from sparseclip_d2.config import check_sparseclip_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tool(name, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "tools", name), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)


def one_error_line(proc, tool_name):
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith(f"{tool_name}: error: "), proc.stderr[-3000:]
    return errors[0]


def test_num_gpus_beyond_this_machine(tmp_path):
    line = one_error_line(tool("train_net.py", "--eval-only", "--num-gpus", "64", "--config-file",
                               "configs/demo.yaml", "OUTPUT_DIR", str(tmp_path)), "train_net.py")
    assert "--num-gpus 64 needs 64 GPUs" in line and "--num-gpus 1" in line


@pytest.fixture
def small_image(tmp_path):
    path = tmp_path / "img.png"
    Image.fromarray(np.zeros((30, 40, 3), np.uint8)).save(path)
    return str(path)


def test_visualize_attention_query_outside_the_image(small_image, tmp_path):
    line = one_error_line(tool("visualize_attention.py", "--image", small_image, "--query", "40", "5",
                               "--pretrained", "none", "-o", str(tmp_path / "a.png")), "visualize_attention.py")
    assert "outside the 40x30 image" in line and "0 <= X < 40" in line
    assert not (tmp_path / "a.png").exists()


def test_visualize_attention_bad_output_suffix_and_spec(small_image, tmp_path):
    line = one_error_line(tool("visualize_attention.py", "--image", small_image, "--query", "1", "1",
                               "-o", str(tmp_path / "a.jpgg")), "visualize_attention.py")
    assert "'jpgg'" in line and "png" in line
    line = one_error_line(tool("visualize_attention.py", "--image", small_image, "--query", "1", "1",
                               "--specs", "qx:softmax", "-o", str(tmp_path / "a.png")), "visualize_attention.py")
    assert "--specs" in line and "qx" in line


def test_plot_missing_file_one_line(tmp_path):
    line = one_error_line(tool("plot.py", "heatmap", str(tmp_path / "nope.jsonl"), "-o", str(tmp_path / "x")),
                          "plot.py")
    assert "nope.jsonl" in line


def test_fgovd_num_negatives_zero_is_refused_before_the_model():
    with pytest.raises(ValueError, match=r"FGOVD.NUM_NEGATIVES = 0 is invalid; valid: an integer >= 1, or -1"):
        check_sparseclip_config(tiny_cfg(**{"MODEL.SPARSECLIP.FGOVD.NUM_NEGATIVES": "0"}))
    check_sparseclip_config(tiny_cfg(**{"MODEL.SPARSECLIP.FGOVD.NUM_NEGATIVES": "5"}))
