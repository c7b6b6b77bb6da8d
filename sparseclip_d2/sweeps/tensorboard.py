"""A finished run's metrics as TensorBoard scalars, through detectron2's own event writers
(``EventStorage`` + ``TensorboardXWriter``) into the run's ``OUTPUT_DIR``.

Each scalar is ``<dataset>/<metric>`` at step 0 (an evaluation has no iterations); the runs
of a sweep are the sibling folders of ``<out>/runs``, so TensorBoard shows them side by side::

    tensorboard --logdir output/sweeps/<sweep name>/runs
"""
import math
from typing import Any, Dict

__all__ = ["write_scalars"]


def write_scalars(run_dir: str, record: Dict[str, Any]) -> int:
    """Write the numeric metrics of an ``ok`` record's ``datasets`` into ``run_dir`` as one
    TensorBoard event file; returns the number of scalars (booleans and non-finite values are
    left out)."""
    from detectron2.utils.events import EventStorage, TensorboardXWriter

    n = 0
    with EventStorage(0) as storage:
        for dataset, metrics in (record.get("datasets") or {}).items():
            for key, value in metrics.items():
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    continue
                storage.put_scalar(f"{dataset}/{key}", float(value), smoothing_hint=False)
                n += 1
        writer = TensorboardXWriter(run_dir)
        try:
            writer.write()
        finally:
            writer.close()
    return n
