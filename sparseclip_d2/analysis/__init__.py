"""Analysis helpers behind ``tools/sweep.py``, ``tools/plot.py`` and
``tools/visualize_attention.py``: sweep files and JSON-lines records (:mod:`.sweep`),
tables and the paper join (:mod:`.tables`), figures (:mod:`.plots`, :mod:`.visualize`).

Submodules are imported on demand (matplotlib and detectron2 are not needed to read a
JSON-lines file).
"""
