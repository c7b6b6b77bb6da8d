"""Figure options: the attention figure's shared colour scale."""
import numpy as np

from sparseclip_d2.analysis.attention_figures import attention_figure


def _results():
    rng = np.random.RandomState(0)
    flat = np.full((4, 5), 0.005)
    peaked = rng.rand(4, 5) * 0.01
    peaked[1, 2] = 0.25
    return [dict(map=m, grid=(4, 5), label=name, support=20.0, perplexity=3.0)
            for m, name in ((flat, "qk softmax"), (peaked, "qq entmax 1.2"))]


def test_attention_panels_share_one_colour_scale_by_default():
    image = np.zeros((40, 50, 3), dtype=np.uint8)
    fig = attention_figure(image, _results(), (25, 20))
    overlays = [ax.images[1] for ax in fig.axes if len(ax.images) == 2]
    assert len(overlays) == 2
    assert all(im.get_clim() == (0.0, 0.25) for im in overlays)
    bars = [ax for ax in fig.axes if len(ax.images) <= 1 and ax.get_ylabel().startswith("attention")]
    assert [ax.get_ylabel() for ax in bars] == ["attention (head mean)"]
    assert fig.get_supxlabel() == "one colour scale for all panels: 0 to 0.25"
    # the label is whole: no longer than its bar, and inside the figure (issue 43: "0 to 0.0" was cut)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    label, bar = bars[0].yaxis.label.get_window_extent(renderer), bars[0].get_window_extent(renderer)
    assert label.height <= bar.height and label.y0 >= bar.y0 - 1 and label.y1 <= bar.y1 + 1
    assert fig.bbox.contains(label.x0, label.y0) and fig.bbox.contains(label.x1, label.y1)

    fig = attention_figure(image, _results(), (25, 20), shared_scale=False)
    overlays = [ax.images[1] for ax in fig.axes if len(ax.images) == 2]
    assert overlays[0].get_clim() != overlays[1].get_clim()
