"""An interactive Gradio app on :class:`~sparseclip_d2.predictor.Predictor` (``sparseclip-app``).

Type a vocabulary, pick methods (the launch config's attention, the baseline presets, every
segmentation config the package holds, or a spec built from source / normaliser / alpha /
layers controls), run, and compare the overlays side by side; click the photo to see the
clicked patch's attention row under every method on one colour scale, with its support
size, perplexity and same-class mass. ``docs/app.md`` describes the page, the endpoints and
the launch options; ``python tools/app.py --help`` lists the options.

The parts:

- :mod:`.engine`: :class:`~.engine.AppEngine`, the work without Gradio (the methods offered,
  the photo and vocabulary of a run, the predictors and runs in bounded LRUs, the downloads,
  the attention look-up by run id);
- :mod:`.render`: the pictures (shown photo, overlays and their grid, probability panels),
  numpy and PIL, no Gradio;
- :mod:`.ui`: the ``gr.Blocks`` page on an engine (:func:`~.ui.build_app`);
- :mod:`.cli`: the options and the launch (:func:`main`, :func:`cli_main`).

The attention row of a clicked patch and its statistics are generic attention analysis:
:mod:`sparseclip_d2.analysis.patch_attention`.
"""
from .cli import cli_main, main

__all__ = ["main", "cli_main"]
