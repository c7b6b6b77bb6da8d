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


# ----------------------------------------------------------------------------- issue 43: every entry point
DEMO = ["--input", os.path.join(ROOT, "README.md"), "--classes", "cat, dog"]  # the config fails before any image


@pytest.mark.parametrize("extra, text", [
    (["--output", "OUT", "--opts", "MODEL.SPARSECLIP.ATTENTION.ALPAH", "1.3"],
     "demo.py: error: unknown config key 'MODEL.SPARSECLIP.ATTENTION.ALPAH' (from --opts); "
     "closest: MODEL.SPARSECLIP.ATTENTION.ALPHA"),
    (["--output", "OUT", "--opts", "MODEL.SPARSECLIP.ATTENTION.ALPHA"],
     "demo.py: error: --opts: KEY VALUE pairs expected, got 1 item: 'MODEL.SPARSECLIP.ATTENTION.ALPHA' has no value"),
    (["--output", "/proc/sparseclip_no_such_dir", "--opts", "MODEL.SPARSECLIP.CLIP.PRETRAINED", "none"],
     "demo.py: error: cannot write the output folder '/proc/sparseclip_no_such_dir' (--output): No such file or "
     "directory; choose a folder you can write to with --output DIR"),
])
def test_demo_config_and_output_mistakes_one_line(tmp_path, extra, text):
    extra = [str(tmp_path / "out") if e == "OUT" else e for e in extra]
    line = one_error_line(tool("demo.py", *DEMO, *extra), "demo.py")
    assert line == text or line.startswith(text), line


def test_demo_unknown_vocabulary_names_the_closest_ours_first(tmp_path, small_image):
    line = one_error_line(tool("demo.py", "--input", small_image, "--vocabulary", "voc99", "--output",
                               str(tmp_path / "out"), "--opts", "MODEL.SPARSECLIP.CLIP.PRETRAINED", "none"), "demo.py")
    assert line.startswith("demo.py: error: unknown --vocabulary 'voc99'; closest: ")
    closest, rest = line.split("; sparseclip_d2's: ", 1)
    assert "voc21" in closest and "ade20k_sem_seg_val" not in line and "detectron2 datasets" in rest


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_app_opts_mistakes_one_line():
    line = one_error_line(tool("app.py", "--port", str(_free_port()), "--opts", "MODEL.SPARSECLIP.ATTENTION.ALPAH",
                               "1.3"), "sparseclip-app")
    assert "unknown config key 'MODEL.SPARSECLIP.ATTENTION.ALPAH' (from --opts); closest: " \
           "MODEL.SPARSECLIP.ATTENTION.ALPHA" in line


def test_app_port_in_use_names_the_option():
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = one_error_line(tool("app.py", "--port", str(port), "--opts", "MODEL.SPARSECLIP.CLIP.PRETRAINED",
                                   "none"), "sparseclip-app")
    assert line == (f"sparseclip-app: error: --port {port}: 127.0.0.1:{port} is in use (another app, or another "
                    f"program); stop it or choose another port, e.g. --port {port + 1}")


def test_plot_unwritable_output_names_the_option(tmp_path):
    line = one_error_line(tool("plot.py", "gain", str(tmp_path / "r.jsonl"), "-o", "/proc/sparseclip_x/fig"), "plot.py")
    assert line == ("plot.py: error: -o '/proc/sparseclip_x/fig': cannot create the folder '/proc/sparseclip_x' (No "
                    "such file or directory); choose a path in a folder you can write to")


def test_prepare_datasets_unknown_name_and_missing_download(tmp_path):
    line = one_error_line(tool("prepare_datasets.py", "check", "sparseclip_voc21_vall", "--root", str(tmp_path)),
                          "prepare_datasets.py")
    assert line.startswith("prepare_datasets.py: error: unknown dataset 'sparseclip_voc21_vall'; closest: "
                           "sparseclip_voc21_val")
    line = one_error_line(tool("prepare_datasets.py", "voc20", "--root", str(tmp_path)), "prepare_datasets.py")
    assert f"missing split file {tmp_path}/VOCdevkit/VOC2012/ImageSets/Segmentation/val.txt" in line
    assert "is --root (default $DETECTRON2_DATASETS) the folder that holds the extracted downloads?" in line


def test_run_cli_sorts_mistakes_bugs_and_ctrl_c(capsys):
    from sparseclip_d2.common.errors import UserError, run_cli

    def fails(exc):
        raise exc

    with pytest.raises(SystemExit) as e:
        run_cli("prog", fails, ValueError("bad value 'x'\nsecond line"))
    assert e.value.code == 2 and capsys.readouterr().err == "prog: error: bad value 'x' second line\n"
    with pytest.raises(SystemExit) as e:
        run_cli("prog", fails, KeyboardInterrupt(), interrupted=lambda: "run it again to resume")
    assert e.value.code == 130 and capsys.readouterr().err == "prog: interrupted: run it again to resume\n"
    with pytest.raises(TypeError):  # a bug keeps its traceback
        run_cli("prog", fails, TypeError("unsupported operand"))
    with pytest.raises(ValueError):  # strict (train_net): only marked mistakes are one line
        run_cli("prog", fails, ValueError("inside a bug"), strict=True)
    with pytest.raises(SystemExit):
        run_cli("prog", fails, UserError("a mistake"), strict=True)
    assert capsys.readouterr().err == "prog: error: a mistake\n"
