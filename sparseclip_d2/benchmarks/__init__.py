"""The methods benchmark behind ``tools/benchmark_methods.py``: seconds per image and peak RSS of
the project's newer methods next to their upstream loops, each side in its own worker process
(docs/model_zoo.md). This package names no method: each method's entry (its upstream
repository, commit, marker file, project config, its own project-side overrides and upstream
driver) is in its folder, ``methods/<family>/upstream.py``, registered in
``methods.registry.UPSTREAM`` (docs/writing_a_method.md, "An upstream benchmark entry"). One
module per concern:

- :mod:`.entries`: the registered entries, in the tool's process, and the DINO checkout the VFM
  methods need;
- :mod:`.checkouts`: upstream checkouts checked and read without importing their code;
- :mod:`.harness`: the timing harness (worker processes, peak RSS, load average, alternating
  timed runs); :mod:`.worker` is the file a worker process runs;
- :mod:`.standins`: what the upstream segmentors import or call and the worker has not (mmseg /
  mmengine names, CUDA calls, DINO's hub entry);
- :mod:`.upstream`: the upstream side: the entry read in the worker, the helpers its driver is
  handed (``kit``);
- :mod:`.project`: the project side (config overrides, the shared input, ``build_model``);
- :mod:`.cli`: the command line (``main``) and the table.

Submodules are imported on demand; the upstream worker imports the harness, the checkout
readers, the stand-ins, :mod:`.upstream` and the method's entry module only (with
``methods/registry.py``; the methods package's ``__init__`` files are skipped), none of which
imports detectron2 or the model code.
"""
