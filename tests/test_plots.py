"""tools/plot.py (four figures from the tiny sweep's JSON lines) and tools/visualize_attention.py."""
import os
import subprocess
import sys

import pytest

from test_sweep import REPO, tiny_sweep_dir

ENV = dict(os.environ, SPARSECLIP_TEXT_CACHE="off", PYTHONPATH=REPO, MPLBACKEND="Agg")


def _png_ok(path):
    assert os.path.isfile(path) and os.path.getsize(path) > 5000, path
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def sweep_jsonl(tmp_path_factory):
    return os.path.join(tiny_sweep_dir(tmp_path_factory), "results.jsonl")


@pytest.mark.parametrize("command,extra", [
    ("heatmap", ["--x", "resolution"]),
    ("gain", []),
    ("same-class", []),
    ("resolution", []),
])
def test_plot_commands(sweep_jsonl, tmp_path, command, extra):
    out = str(tmp_path / command)
    proc = subprocess.run([sys.executable, os.path.join(REPO, "tools", "plot.py"), command, sweep_jsonl, "-o", out,
                           *extra], capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _png_ok(out + ".png")
    assert os.path.getsize(out + ".pdf") > 1000


def test_plot_errors_name_the_problem(sweep_jsonl):
    from sparseclip_d2.analysis import plots
    from sparseclip_d2.analysis.sweep import read_jsonl
    from sparseclip_d2.analysis.tables import flatten_records

    rows = flatten_records(read_jsonl(sweep_jsonl))
    with pytest.raises(ValueError, match="another parameter varies"):
        plots.alpha_depth_heatmap(rows, x="num_layers")  # resolution varies too
    with pytest.raises(ValueError, match="dataset 'voc21' is not in the sweep"):
        plots.same_class_bars(rows, dataset="voc21")
    with pytest.raises(ValueError, match="no setting has both"):
        plots.gain_scatter(rows, alpha=1.5)


def test_visualize_attention_writes_png(tmp_path):
    out = str(tmp_path / "att.png")
    proc = subprocess.run([sys.executable, os.path.join(REPO, "tools", "visualize_attention.py"), "--query", "250", "180",
                           "--backbone", "sparseclip-tiny-vit", "--pretrained", "none", "--resolution", "64",
                           "--specs", "qk:softmax", "qq:entmax:1.2", "qq+kk:entmax:1.5", "-o", out],
                          capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _png_ok(out)
    assert "qq+kk entmax 1.5: support" in proc.stdout


def test_query_attention_stats_match_definition(tiny_clip):
    """Softmax rows are full (support = L); a query outside the image is rejected."""
    import numpy as np

    from sparseclip_d2.analysis.visualize import query_attention
    from sparseclip_d2.clip import parse_attention_spec as parse_spec

    model = tiny_clip[0]
    image = (np.random.RandomState(0).rand(48, 64, 3) * 255).astype("uint8")
    res = query_attention(model.visual, image, (10, 10), [parse_spec("qk:softmax"), parse_spec("qq:sparsemax")],
                          resolution=32)
    assert res[0]["grid"] == (2, 3) and res[0]["support"] == pytest.approx(7.0)
    assert res[0]["map"].shape == (2, 3) and abs(res[0]["map"].sum() + res[0]["cls_mass"] - 1) < 1e-6
    assert 1.0 <= res[1]["support"] <= 7 and res[1]["perplexity"] <= res[1]["support"] + 1e-9
    with pytest.raises(ValueError, match="outside"):
        query_attention(model.visual, image, (70, 10), [parse_spec("qk")], resolution=32)
    with pytest.raises(ValueError, match="unknown token 'x'"):
        parse_spec("qq:entmax:1.2:x")
