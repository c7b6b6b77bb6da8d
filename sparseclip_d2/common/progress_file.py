"""``OUTPUT_DIR/progress.json`` as a file: its name, reading it, and setting a run's exit state.

Standard library only, so that the sweep's job processes (a submitit job on a Slurm node, which
only starts train_net and waits for it) can read and finish the file without importing
detectron2 and torch. The writer inside the evaluation and the layout of the file are in
:mod:`sparseclip_d2.evaluation.progress`, which re-exports these names.
"""
import json
import os
import time
from typing import Any, Dict, Optional

from .io import atomic_write_json

__all__ = ["PROGRESS_FILE", "read_progress", "finish_progress"]

PROGRESS_FILE = "progress.json"


def read_progress(output_dir: str) -> Optional[Dict[str, Any]]:
    """The run's progress dict, or None when it has none (yet) or it cannot be read."""
    try:
        with open(os.path.join(output_dir, PROGRESS_FILE)) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def finish_progress(output_dir: str, state: str, **fields: Any) -> None:
    """Set the exit ``state`` (and e.g. ``returncode``) of a run's progress file, keeping its
    counts (an empty one when the run never got to its images)."""
    data = read_progress(output_dir) or {"images_done": 0, "images_total": None}
    data.update(fields, state=state, updated=time.time())
    atomic_write_json(os.path.join(output_dir, PROGRESS_FILE), data)
