"""What one line of ``results.jsonl`` holds: a finished run's metrics and config summary
(:func:`ok_record`), or a failed run's error (:func:`run_error`), built from the run's
``results.json``, ``error.json`` and ``stderr.txt``."""
import json
import os
import signal
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Tuple

import yaml

from .sweep_file import Sweep, SweepRun, load_base_config, merge_run_config

__all__ = ["base_record", "ok_record", "run_error", "error_summary", "config_summary", "dataset_metrics",
           "planned_config"]

_TRACEBACK = "Traceback (most recent call last):"


def base_record(run: SweepRun, sweep_name: str, base_config: str, run_dir: str) -> Dict[str, Any]:
    """The fields every record of ``run`` has, whatever its outcome."""
    record: Dict[str, Any] = OrderedDict(
        run_key=run.key, run_name=run.name, group=run.group, sweep=sweep_name, base_config=base_config,
        params=run.params, overrides={k: v for k, v in run.opts}, output_dir=run_dir, identity=run.identity,
    )
    if run.warnings:
        record["warnings"] = list(run.warnings)
    return record


def dataset_metrics(results: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """Per dataset, the scalar entries of a ``results.json``."""
    skip = {"config", "random_weights", "max_images", "partial"}
    out = OrderedDict()
    for name, entry in results.items():
        if name in skip or not isinstance(entry, dict):
            continue
        out[name] = {k: v for k, v in entry.items() if not isinstance(v, (dict, list))}
    return out


def ok_record(record: Dict[str, Any], results: Dict[str, Any]) -> Dict[str, Any]:
    """``record`` completed from a successful run's ``results.json`` dict."""
    record["status"] = "ok"
    record["random_weights"] = bool(results.get("random_weights", False))
    record["partial"] = bool(results.get("partial", False))
    if "max_images" in results:
        record["max_images"] = results["max_images"]
    record["config"] = config_summary(results.get("config") or {})
    record["datasets"] = dataset_metrics(results)
    return record


def _how_it_ended(rc: Optional[int], timeout: Optional[float]) -> str:
    if rc is None:
        return f"timed out after {timeout:g} s and was killed"
    if rc < 0:
        try:
            return f"killed by signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    if rc == 0:
        return "exited 0 without writing results.json"
    return f"exited with code {rc}"


def run_error(run_dir: str, rc: Optional[int], timeout: Optional[float]) -> Dict[str, Any]:
    """The failed run's error: its ``error.json`` (written by train_net), else the last
    traceback on its stderr, else how it ended (signal, exit code, timeout) and stderr's tail."""
    err_path = os.path.join(run_dir, "error.json")
    stderr_path = os.path.join(run_dir, "stderr.txt")
    stderr = ""
    if os.path.isfile(stderr_path):
        with open(stderr_path, errors="replace") as f:
            stderr = f.read()
    how = _how_it_ended(rc, timeout)
    if os.path.isfile(err_path):
        try:
            with open(err_path) as f:
                e = json.load(f)
            return {"type": e.get("type"), "message": e.get("message"), "traceback": e.get("traceback"),
                    "exit": how, "stderr": stderr_path}
        except (OSError, json.JSONDecodeError):
            pass
    if _TRACEBACK in stderr:
        tb = stderr[stderr.rindex(_TRACEBACK):].strip()
        last = tb.splitlines()[-1]
        etype, _, msg = last.partition(": ")
        return {"type": etype.strip(), "message": msg.strip(), "traceback": tb, "exit": how, "stderr": stderr_path}
    return {"type": None, "message": how, "traceback": None, "stderr_tail": stderr[-1500:], "exit": how,
            "stderr": stderr_path}


def error_summary(error: Any) -> str:
    """One line of a record's ``error``: ``Type: message``."""
    if isinstance(error, dict):
        etype, msg = error.get("type"), str(error.get("message") or "").strip()
        first = msg.splitlines()[0] if msg else ""
        return f"{etype}: {first}" if etype else first or str(error.get("exit", "failed"))
    return str(error or "failed").strip().splitlines()[-1] if error else "failed"


def config_summary(config: Dict[str, Any]) -> Dict[str, Any]:
    """The config values that describe a run (for tables, plots and the paper join)."""
    sc = (config.get("MODEL") or {}).get("SPARSECLIP") or {}
    att, blk, clip = sc.get("ATTENTION") or {}, sc.get("BLOCK") or {}, sc.get("CLIP") or {}
    test = config.get("TEST") or {}
    return OrderedDict(
        backbone=clip.get("NAME"), pretrained=clip.get("PRETRAINED"),
        source=att.get("SOURCE"), normalizer=att.get("NORMALIZER"), alpha=att.get("ALPHA"),
        temperature=att.get("TEMPERATURE"), num_layers=att.get("NUM_LAYERS"), prior=att.get("PRIOR"),
        prior_std=att.get("PRIOR_STD"), sum_mode=att.get("SUM_MODE"), residual=blk.get("RESIDUAL"),
        ffn=blk.get("FFN"), resolution=(config.get("INPUT") or {}).get("MIN_SIZE_TEST"),
        fgovd_resolution=(sc.get("FGOVD") or {}).get("RESOLUTION"),
        fgovd_protocol=(sc.get("FGOVD") or {}).get("PROTOCOL"),
        sliding=(test.get("SLIDING_WINDOW") or {}).get("ENABLED"),
        templates=(sc.get("TEXT") or {}).get("TEMPLATES"),
        logit_scale=sc.get("LOGIT_SCALE"), prob_threshold=sc.get("PROB_THRESHOLD"),
        area_threshold=sc.get("AREA_THRESHOLD"), max_images=test.get("MAX_IMAGES"),
    )


def planned_config(sweep: Sweep, run: SweepRun) -> Tuple[Dict[str, Any], List[str]]:
    """``(config summary, dataset names)`` that ``run`` will evaluate (as recorded after the
    run), without running it."""
    cfg = merge_run_config(load_base_config(sweep.base), run.opts)
    return config_summary(yaml.safe_load(cfg.dump())), list(cfg.DATASETS.TEST)
