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
                           *extra], capture_output=True, text=True, env=ENV, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _png_ok(out + ".png")
    assert os.path.getsize(out + ".pdf") > 1000


def test_plot_errors_name_the_problem(sweep_jsonl):
    from sparseclip_d2.analysis import plots
    from sparseclip_d2.analysis.sweep import read_jsonl
    from sparseclip_d2.analysis.tables import flatten_records

    rows = flatten_records(read_jsonl(sweep_jsonl))
    with pytest.raises(ValueError, match="differ in resolution besides alpha and num_layers"):
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
                          capture_output=True, text=True, env=ENV, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _png_ok(out)
    assert "qq+kk entmax 1.5: support" in proc.stdout


def test_query_attention_stats_match_definition(tiny_clip):
    """Softmax rows are full (support = L); a query outside the image is rejected."""
    import numpy as np

    from sparseclip_d2.analysis.attention_figures import query_attention
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


# ------------------------------------------------------------------ one series per setting, partial marks
def _row(run, value, *, normalizer="softmax", alpha=None, num_layers=1, resolution=448, partial=False, **stats):
    from sparseclip_d2.analysis.tables import describe

    config = {"backbone": "ViT-B-16-quickgelu", "source": "qk", "normalizer": normalizer, "alpha": alpha or 1.2,
              "temperature": 1.0, "num_layers": num_layers, "prior": "none", "sum_mode": "normalize_then_sum",
              "residual": True, "ffn": True, "resolution": resolution, "templates": "single", "sliding": False}
    row = dict(run=run, dataset="voc21", status="ok", metric="mIoU", value=value, mIoU=value, partial=partial,
               random_weights=False, **stats)
    row.update(describe(config, "voc21"))
    return row


def _texts(fig):
    out = []
    for ax in fig.axes:
        leg = ax.get_legend()
        out += [t.get_text() for t in (leg.get_texts() if leg else [])]
        out += [t.get_text() for t in ax.texts] + [ax.get_title()]
    return out + [fig._suptitle.get_text() if fig._suptitle else ""]


def test_gain_one_series_per_depth_and_fits_that_cannot_exist():
    from sparseclip_d2.analysis import plots

    rows = [_row("s1", 10.0, non_class_mass=0.3), _row("e1", 12.0, normalizer="entmax", alpha=1.2),
            _row("s2", 11.0, num_layers=2, non_class_mass=0.3),
            _row("e2", 11.0, normalizer="entmax", alpha=1.2, num_layers=2, partial=True)]
    texts = _texts(plots.gain_scatter(rows))
    assert "num_layers=1" in texts and "num_layers=2 (partial)" in texts
    # equal x: no line, and the figure says why (never "slope 0, r = nan")
    assert any("no least-squares line: every setting has the same non-class mass" in t for t in texts)
    assert not any("nan" in t for t in texts)
    texts = _texts(plots.gain_scatter(rows[:2]))
    assert any("no least-squares line: 1 setting with both runs (need 2)" in t for t in texts)
    rows[2]["non_class_mass"] = 0.5
    rows[3]["mIoU"] = 13.0  # gains 2 and 2: a line exists, r does not
    assert any("r undefined (all gains equal)" in t for t in _texts(plots.gain_scatter(rows)))


def test_same_class_bars_never_pool_depths():
    from sparseclip_d2.analysis import plots

    rows = [_row("s1", 1, same_class_mass=0.2), _row("e1", 1, normalizer="entmax", alpha=1.2, same_class_mass=0.3),
            _row("s2", 1, num_layers=2, same_class_mass=0.25, partial=True)]
    fig = plots.same_class_bars(rows)
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert ticks == ["source=qkv\nnum_layers=1", "source=qkv\nnum_layers=2"]
    assert "partial run" in _texts(fig)
    with pytest.raises(ValueError, match="'s1' and 's1b' have the same setting"):
        plots.same_class_bars(rows + [_row("s1b", 1, same_class_mass=0.1)])


def test_resolution_curves_skip_one_point_series():
    from sparseclip_d2.analysis import plots

    rows = [_row("a", 1.0, resolution=224), _row("b", 2.0, resolution=448),
            _row("c", 3.0, normalizer="entmax", alpha=1.2, resolution=224, partial=True),
            _row("d", 4.0, normalizer="entmax", alpha=1.2, resolution=448),
            _row("e", 5.0, num_layers=2, normalizer="entmax", alpha=1.2, resolution=448)]
    fig = plots.resolution_curves(rows)
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    # the depth-2 run has one point: no curve, no legend entry
    assert legend == ["normalizer=softmax", "normalizer=entmax, alpha=1.2", "partial run (hollow)"]
    assert any("1 setting(s) with a single resolution not drawn" in t for t in _texts(fig))
    with pytest.raises(ValueError, match="no setting has more than one resolution"):
        plots.resolution_curves(rows[-1:])


def test_heatmap_marks_partial_cells_and_refuses_mixed_settings():
    from sparseclip_d2.analysis import plots

    rows = [_row("a", 1.0), _row("b", 2.0, normalizer="entmax", alpha=1.2),
            _row("c", 3.0, num_layers=2, normalizer="entmax", alpha=1.2, partial=True),
            _row("d", 4.0, num_layers=2)]
    texts = _texts(plots.alpha_depth_heatmap(rows))
    assert "3.00*" in texts and "* partial run (first TEST.MAX_IMAGES images)" in texts
    with pytest.raises(ValueError, match="differ in resolution besides alpha and num_layers"):
        plots.alpha_depth_heatmap(rows + [_row("e", 5.0, resolution=224, num_layers=3)])
