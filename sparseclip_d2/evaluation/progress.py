"""``OUTPUT_DIR/progress.json``: a run's progress, machine-readable, written from inside the
evaluation.

Layout (every write replaces the file atomically)::

    {"state": "running" | "evaluated" | "stopped" | "ok" | "failed" | "interrupted",
     "images_done": 120, "images_total": 1449,   # over all datasets of the run
     "dataset": "sparseclip_voc21_val", "datasets_done": 0, "datasets_total": 1,
     "elapsed_s": 61.2,                           # since the first image was processed
     "eta_s": 678.4,                              # null before the first image
     "updated": 1764583261.2, "pid": 4242}        # time.time() of this write; train_net's pid

``train_net`` writes ``running`` while images are processed (:class:`RunProgress`, through a
``DatasetEvaluator`` that counts the inputs of ``process``, at most every
:data:`WRITE_INTERVAL_S` s) and ``evaluated`` when every dataset is done; the sweep's runner
adds the exit state (``ok`` / ``failed`` with ``returncode``) when the process has ended
(:func:`finish_progress`). With several processes (``--num-gpus``) the main process writes,
counting its own shard times the world size (capped at the dataset's size).
A train_net that exits before its last dataset is done (an exception, Ctrl-C) writes
``stopped`` on its way out (``atexit``), so the file never says ``running`` after the process
has gone; the runner's exit state (``ok`` / ``failed`` / ``interrupted``) replaces it.
"""
import atexit
import os
import time
from typing import Any, Dict, Mapping, Optional

from detectron2.evaluation import DatasetEvaluator

from ..common.io import atomic_write_json
from ..common.progress_file import PROGRESS_FILE, finish_progress, read_progress

__all__ = ["PROGRESS_FILE", "WRITE_INTERVAL_S", "RunProgress", "read_progress", "finish_progress"]

WRITE_INTERVAL_S = 2.0


class RunProgress:
    """Progress of one evaluation run over its datasets.

    Args:
        output_dir: the run's ``OUTPUT_DIR`` (no file is written when empty).
        sizes: ``{dataset name: number of images}``, in evaluation order.
        world_size, is_main: the process group (``comm.get_world_size()``,
            ``comm.is_main_process()``).
    """

    def __init__(self, output_dir: str, sizes: Mapping[str, int], *, world_size: int = 1, is_main: bool = True):
        self.path = os.path.join(output_dir, PROGRESS_FILE) if output_dir else None
        self.sizes = dict(sizes)
        self.world_size = max(1, int(world_size))
        self.is_main = is_main
        self.done_before = 0  # images of the datasets already evaluated
        self.local = 0  # inputs this process has processed in the current dataset
        self.dataset: Optional[str] = None
        self.datasets_done = 0
        self.started: Optional[float] = None
        self._last_write = 0.0
        self.state: Optional[str] = None
        self.write("running")
        if self.path is not None and self.is_main:
            atexit.register(self._at_exit)

    def _at_exit(self) -> None:
        if self.state == "running":  # the process ends before its last dataset is done
            self.write("stopped")

    @property
    def images_total(self) -> int:
        return sum(self.sizes.values())

    def images_done(self) -> int:
        current = self.sizes.get(self.dataset, 0)
        return self.done_before + min(current, self.local * self.world_size)

    def write(self, state: str) -> None:
        """Write the file now (main process only)."""
        if self.path is None or not self.is_main:
            return
        now = time.time()
        done, total = self.images_done(), self.images_total
        elapsed = 0.0 if self.started is None else now - self.started
        eta = elapsed / done * (total - done) if done else None
        atomic_write_json(self.path, {
            "state": state, "images_done": done, "images_total": total, "dataset": self.dataset,
            "datasets_done": self.datasets_done, "datasets_total": len(self.sizes),
            "elapsed_s": round(elapsed, 3), "eta_s": None if eta is None else round(eta, 3),
            "updated": now, "pid": os.getpid()})
        self._last_write = now
        self.state = state

    def count(self, n: int) -> None:
        """``n`` more inputs processed by this process; writes when the interval has passed."""
        if self.started is None:
            self.started = time.time()
        self.local += n
        if time.time() - self._last_write >= WRITE_INTERVAL_S:
            self.write("running")

    def evaluator(self, dataset: str) -> "ProgressEvaluator":
        """The ``DatasetEvaluator`` to add (``DatasetEvaluators``) for ``dataset``."""
        return ProgressEvaluator(self, dataset)

    def dataset_finished(self) -> None:
        self.done_before += self.sizes.get(self.dataset, 0)
        self.local = 0
        self.datasets_done += 1
        self.write("evaluated" if self.datasets_done == len(self.sizes) else "running")


class ProgressEvaluator(DatasetEvaluator):
    """Counts the images ``inference_on_dataset`` processes and reports them to its
    :class:`RunProgress`; it adds no metric (``evaluate`` returns ``{}``)."""

    def __init__(self, progress: RunProgress, dataset: str):
        self.progress = progress
        self.dataset = dataset

    def reset(self):
        self.progress.dataset = self.dataset
        self.progress.local = 0
        self.progress.write("running")

    def process(self, inputs, outputs):
        self.progress.count(len(inputs))

    def evaluate(self):
        self.progress.dataset_finished()
        return {}
