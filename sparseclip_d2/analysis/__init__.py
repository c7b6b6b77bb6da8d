"""Analysis helpers behind ``tools/sweep.py``, ``tools/plot.py``,
``tools/visualize_attention.py`` and the app: sweep files and JSON-lines records
(:mod:`.sweep`), tables and the paper join (:mod:`.tables`), figures (:mod:`.plots`,
:mod:`.attention_figures`), the attention row of the patch under a pixel, read from an attention
record, with its statistics (:mod:`.patch_attention`).

Submodules are imported on demand (matplotlib and detectron2 are not needed to read a
JSON-lines file).
"""
