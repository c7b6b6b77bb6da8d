"""Dataset preparation behind ``tools/prepare_datasets.py``: official downloads converted, once,
into the files sparseclip_d2 evaluates on, and the check of which datasets are ready
(docs/datasets.md, docs/ground_truth.md). One module per job:

- :mod:`.convert`: the label conversions (VOC20, ADE20K, Context59, COCO-Stuff, COCO-Object,
  Cityscapes) and their id tables;
- :mod:`.catseg`: ADE20K-847 and Pascal Context-459 as CAT-Seg prepares them (uint16 TIFFs);
- :mod:`.context`: Pascal Context's 60-class masks from PASCAL in Detail's json;
- :mod:`.check`: each dataset loaded as a run would, every mask checked;
- :mod:`.cli`: the command line (``main``).

This package sits outside ``sparseclip_d2.data`` on purpose: importing that registers the
datasets under the datasets root, and ``check --root`` must set the root first. Nothing here
imports it, or detectron2, at module level.
"""
