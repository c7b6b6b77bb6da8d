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
    labels = [ax.get_ylabel() for ax in fig.axes if len(ax.images) <= 1 and ax.get_ylabel().startswith("attention")]
    assert labels == ["attention weight (head mean), one scale for all panels: 0 to 0.25"]

    fig = attention_figure(image, _results(), (25, 20), shared_scale=False)
    overlays = [ax.images[1] for ax in fig.axes if len(ax.images) == 2]
    assert overlays[0].get_clim() != overlays[1].get_clim()
