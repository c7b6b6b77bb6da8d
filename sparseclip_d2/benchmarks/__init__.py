"""The methods benchmark behind ``tools/benchmark_methods.py``: seconds per image and peak RSS of
the project's newer methods next to their upstream loops, each side in its own worker process
(docs/model_zoo.md). One module per concern:

- :mod:`.methods`: the per-method table (upstream repository, commit, marker file, project
  config, how the upstream side is driven) and the DINO checkout the VFM methods need;
- :mod:`.checkouts`: upstream checkouts checked and read without importing their code;
- :mod:`.harness`: the timing harness (worker processes, peak RSS, load average, alternating
  timed runs); :mod:`.worker` is the file a worker process runs;
- :mod:`.standins`: what the upstream segmentors import or call and the worker has not (mmseg /
  mmengine names, CUDA calls, DINO's hub entry, LPOSS's GPU libraries);
- :mod:`.upstream`: the upstream side, one driver per method;
- :mod:`.project`: the project side (config overrides, the shared input, ``build_model``);
- :mod:`.cli`: the command line (``main``) and the table.

Submodules are imported on demand; the upstream worker imports the harness, the table, the
checkout readers, the stand-ins and the upstream drivers only, none of which imports detectron2
or the model code.
"""
