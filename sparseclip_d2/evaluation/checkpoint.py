"""Resumable evaluation with per-image checkpoints, and ``--skip-bad``.

:func:`evaluate_resumable` runs detectron2's ``inference_on_dataset`` over one dataset
through two thin wrappers of our own (no library class is changed):

- the evaluator (:class:`ResumableEvaluator`) passes every ``process`` call on and then
  writes one **record per image** atomically into the checkpoint folder
  (``<folder>/<index>.pt``: the input dict without its image tensor, and what the evaluators
  read from the output: ``sem_seg`` reduced to its ``argmax`` label map (as PNG bytes), which is all
  detectron2's ``SemSegEvaluator`` uses, other entries such as ``attention`` / ``fgovd``
  as they are, on the CPU). On ``reset`` it replays the records of the images already
  done through the real evaluator, in dataset order, so the final metrics equal an
  uninterrupted run's exactly;
- the loader (:class:`_TrackingLoader`) tells the evaluator which dataset index each batch
  is, and with ``skip_bad`` records a :class:`~sparseclip_d2.data.image_io.BadInputFile`
  (an unreadable image or ground-truth file) as a skipped image and goes on; without it
  the error stops the run, naming the file.

A rerun resumes after the longest run of recorded images from index 0 when the checkpoint's
key matches: a SHA-256 over the config, the dataset name, its dataset dicts, each referenced
file's size and modification time, ``skip_bad``, the package's own source files and the
torch / detectron2 / open_clip versions. Any other key discards the folder (logged). The
caller removes the folder once results.json is written (:func:`remove_checkpoint`).
Single process only: with several processes the folder is not used (logged).

``SPARSECLIP_FAULT_KILL_AFTER=N`` (fault injection for the tests) ends the process with
SIGKILL right after its N-th record is written; ``SPARSECLIP_FAULT_STOP_AT=I`` stops it
(SIGSTOP) right after the record of dataset index I, so that a test can interrupt a run at a
known image; it does so once per run (a ``fault_stopped_<I>`` file beside the checkpoint
folder): a resumed attempt starts after I, and an attempt that starts over goes on too.
"""
import hashlib
import json
import logging
import os
import shutil
import signal
import tempfile
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from detectron2.evaluation import DatasetEvaluator, inference_on_dataset

from ..data.image_io import BadInputFile

__all__ = ["ResumableEvaluator", "evaluate_resumable", "checkpoint_key", "remove_checkpoint", "KEY_FILE"]

logger = logging.getLogger(__name__)

KEY_FILE = "key.json"
_FAULT_ENV = "SPARSECLIP_FAULT_KILL_AFTER"
_FAULT_STOP_ENV = "SPARSECLIP_FAULT_STOP_AT"
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_code_digest: Optional[str] = None


def _code_fingerprint() -> str:
    """SHA-256 over the package's .py / .cpp files (paths and bytes), computed once."""
    global _code_digest
    if _code_digest is None:
        h = hashlib.sha256()
        for root, dirs, files in os.walk(_PACKAGE_DIR):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for f in sorted(files):
                if f.endswith((".py", ".cpp")):
                    path = os.path.join(root, f)
                    h.update(os.path.relpath(path, _PACKAGE_DIR).encode())
                    with open(path, "rb") as fh:
                        h.update(fh.read())
        _code_digest = h.hexdigest()
    return _code_digest


def _file_stamp(path) -> Optional[List[int]]:
    try:
        st = os.stat(path)
    except (OSError, TypeError, ValueError):
        return None
    return [st.st_size, st.st_mtime_ns]


def checkpoint_key(cfg_dump: str, dataset_name: str, dicts: Sequence[dict], skip_bad: bool) -> str:
    """The hex key a checkpoint must carry to be resumed (see the module docstring)."""
    import detectron2
    import open_clip

    h = hashlib.sha256()
    h.update(json.dumps({"config": cfg_dump, "dataset": dataset_name, "skip_bad": bool(skip_bad),
                         "code": _code_fingerprint(), "torch": torch.__version__,
                         "detectron2": detectron2.__version__,
                         "open_clip": getattr(open_clip, "__version__", "")}, sort_keys=True).encode())
    for d in dicts:
        h.update(json.dumps(d, sort_keys=True, default=str).encode())
        for k in ("file_name", "sem_seg_file_name"):
            if k in d:
                h.update(json.dumps(_file_stamp(d[k])).encode())
    return h.hexdigest()


def _record_path(folder: str, index: int) -> str:
    return os.path.join(folder, f"{index:08d}.pt")


def _png_bytes(labels: torch.Tensor) -> bytes:
    """A ``(H, W)`` label map as PNG bytes (8-bit, or 16-bit up to 65535; lossless)."""
    import io

    import numpy as np
    from PIL import Image

    arr = labels.numpy()
    if arr.size and (arr.min() < 0 or arr.max() > 65535):
        raise ValueError(f"label values {arr.min()}..{arr.max()} do not fit a 16-bit PNG")
    buf = io.BytesIO()
    Image.fromarray(arr.astype(np.uint8 if arr.max(initial=0) <= 255 else np.uint16)).save(
        buf, format="PNG", compress_level=1)
    return buf.getvalue()


def _labels_from_png(data: bytes) -> torch.Tensor:
    import io

    import numpy as np
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        return torch.from_numpy(np.asarray(im).astype(np.int64))


def _reduce_output(output) -> Dict:
    """What the evaluators read from one output, on the CPU: ``sem_seg`` (or
    ``sem_seg_labels``) as its argmax label map in PNG bytes, the rest as it is."""
    out = {}
    for k, v in output.items():
        if k == "sem_seg":
            out["sem_seg_labels_png"] = _png_bytes(v.argmax(dim=0).cpu())
        elif k == "sem_seg_labels":
            out["sem_seg_labels_png"] = _png_bytes(v.cpu())
        else:
            out[k] = _to_cpu(v)
    return out


def _to_cpu(v):
    if isinstance(v, torch.Tensor):
        return v.detach().cpu()
    if isinstance(v, dict):
        return {k: _to_cpu(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(_to_cpu(x) for x in v)
    return v


def _atomic_save(obj, path: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".rec.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


class ResumableEvaluator(DatasetEvaluator):
    """Wraps a ``DatasetEvaluator``: records each processed image, replays recorded images
    on ``reset`` (see the module docstring). ``folder=None`` records nothing."""

    def __init__(self, inner: DatasetEvaluator, dicts: Sequence[dict], folder: Optional[str], done: int = 0):
        self.inner = inner
        self.dicts = list(dicts)
        self.folder = folder
        self.done = int(done)  # records 0 .. done-1 are replayed on reset
        self.skipped: List[Dict[str, str]] = []
        self._batch: List[int] = []
        self._written = 0

    def reset(self):
        self.inner.reset()
        self.skipped = []
        for index in range(self.done):
            rec = torch.load(_record_path(self.folder, index), map_location="cpu", weights_only=False)
            if rec["skipped"] is not None:
                self.skipped.append(rec["skipped"])
            else:
                self.inner.process([rec["input"]], [_output_for_evaluator(rec["output"])])

    def _save(self, index: int, rec: Dict) -> None:
        if self.folder is None:
            return
        _atomic_save(rec, _record_path(self.folder, index))
        self._written += 1
        limit = os.environ.get(_FAULT_ENV)
        if limit and self._written >= int(limit):
            os.kill(os.getpid(), signal.SIGKILL)
        if os.environ.get(_FAULT_STOP_ENV) == str(index):
            # once per run: a later attempt goes on (even one that starts over), so that a test
            # whose resume fails gets a wrong result at once instead of waiting on a stopped run
            marker = os.path.join(os.path.dirname(self.folder), f"fault_stopped_{index}")
            if not os.path.exists(marker):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGSTOP)  # frozen until SIGCONT (a scheduler's kill sends it first)

    def record_skipped(self, index: int, message: str) -> None:
        entry = {"file": str(self.dicts[index].get("file_name")), "error": " ".join(str(message).split())}
        self.skipped.append(entry)
        logger.warning("skipped image %d (%s): %s", index, entry["file"], entry["error"])
        self._save(index, {"skipped": entry, "input": None, "output": None})

    def process(self, inputs, outputs):
        self.inner.process(inputs, outputs)
        indices = self._batch if len(self._batch) == len(inputs) else [None] * len(inputs)
        for index, inp, out in zip(indices, inputs, outputs):
            if index is None:
                raise RuntimeError("ResumableEvaluator: batch without dataset indices (use evaluate_resumable)")
            slim = {k: _to_cpu(v) for k, v in inp.items() if k != "image"}
            self._save(index, {"skipped": None, "input": slim, "output": _reduce_output(out)})

    def evaluate(self):
        return self.inner.evaluate()


def _output_for_evaluator(out: Dict) -> Dict:
    """A recorded output as the evaluators take it: the label map as ``sem_seg_labels``,
    which ``SparseCLIPSemSegEvaluator`` reads as it reads ``sem_seg``'s argmax."""
    out = dict(out)
    if "sem_seg_labels_png" in out:
        out["sem_seg_labels"] = _labels_from_png(out.pop("sem_seg_labels_png"))
    return out


class _TrackingLoader:
    """Iterates ``loader`` (over ``dicts[offset:]``, batches in order), telling
    ``evaluator`` each batch's dataset indices; with ``skip_bad`` a ``BadInputFile`` is
    recorded as skipped and iteration goes on (torch's DataLoader iterators continue
    after an item raised, with or without workers)."""

    def __init__(self, loader, evaluator: ResumableEvaluator, offset: int, skip_bad: bool):
        self.loader, self.evaluator, self.offset, self.skip_bad = loader, evaluator, offset, skip_bad

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        it = iter(self.loader)
        index = self.offset
        while True:
            try:
                batch = next(it)
            except StopIteration:
                return
            except BadInputFile as e:
                if not self.skip_bad:
                    raise
                self.evaluator.record_skipped(index, str(e).strip().splitlines()[-1])
                index += 1
                continue
            self.evaluator._batch = list(range(index, index + len(batch)))
            index += len(batch)
            yield batch


def _resume_point(folder: str, key: str, total: int) -> int:
    """Number of leading images recorded under ``key`` in ``folder`` (0 after discarding a
    checkpoint of another key); creates the folder and its key file."""
    key_path = os.path.join(folder, KEY_FILE)
    if os.path.isdir(folder):
        try:
            with open(key_path, encoding="utf-8") as f:
                old = json.load(f).get("key")
        except (OSError, ValueError):
            old = None
        if old != key:
            logger.info("discarding the checkpoint in %s: it was made with another config, data or code", folder)
            shutil.rmtree(folder)
    os.makedirs(folder, exist_ok=True)
    if not os.path.exists(key_path):
        from ..common.io import atomic_write_json

        atomic_write_json(key_path, {"key": key})
    done = 0
    while done < total and os.path.isfile(_record_path(folder, done)):
        done += 1
    return done


def evaluate_resumable(model, cfg, dataset_name: str, dicts: Sequence[dict], evaluator: DatasetEvaluator,
                       build_loader, *, folder: Optional[str], skip_bad: bool = False) -> Tuple[Dict, Dict]:
    """``inference_on_dataset`` of ``model`` on ``dicts`` with per-image checkpoints in
    ``folder`` (None: none) and ``--skip-bad``.

    Args:
        build_loader: ``build_loader(dicts) -> loader`` (batches in dataset order).

    Returns:
        ``(results, info)``: the evaluator's results and ``{"skipped": [{"file", "error"}],
        "resumed_images": k, "evaluated_now": n}``.
    """
    dicts = list(dicts)
    done = 0
    if folder is not None:
        done = _resume_point(folder, checkpoint_key(cfg.dump(), dataset_name, dicts, skip_bad), len(dicts))
        if done:
            logger.info("resuming %s from its checkpoint: %d of %d images already evaluated (%s)",
                        dataset_name, done, len(dicts), folder)
    wrapped = ResumableEvaluator(evaluator, dicts, folder, done)
    remaining = dicts[done:]
    if remaining:
        loader = _TrackingLoader(build_loader(remaining), wrapped, done, skip_bad)
        results = inference_on_dataset(model, loader, wrapped)
    else:
        wrapped.reset()
        results = wrapped.evaluate()
    if wrapped.skipped:
        logger.warning("%s: skipped %d of %d images (--skip-bad): %s", dataset_name, len(wrapped.skipped),
                       len(dicts), ", ".join(s["file"] for s in wrapped.skipped))
    return results, {"skipped": list(wrapped.skipped), "resumed_images": done,
                     "evaluated_now": len(remaining)}


def remove_checkpoint(folder: Optional[str]) -> None:
    """Remove a finished evaluation's checkpoint folder (its results are in results.json)."""
    if folder and os.path.isdir(folder):
        shutil.rmtree(folder)
