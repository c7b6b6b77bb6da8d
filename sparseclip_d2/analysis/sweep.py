"""Sweep files: expansion into runs, config-key aliases, run keys, running and resuming.

A sweep file (YAML)::

    name: alpha_depth                      # output folder name (default: the file's stem)
    base: ../paper/b16_qkv_entmax1.2.yaml  # base config, relative to the sweep file
    fixed:                                 # overrides of every run (optional)
      datasets: [sparseclip_voc21_val]
      attention_stats: true
    variants:                              # optional list of override sets, each a run group
      - {name: softmax, normalizer: softmax}
      - {name: entmax1.2, normalizer: entmax, alpha: 1.2}
    grid:                                  # lists of values; every combination is run
      alpha: [1, 1.025, 1.05]
      num_layers: [1, 2, 3]

Runs = variants x product(grid); a run's overrides are ``fixed``, then its variant, then its
grid values. Keys are full config keys (``MODEL.SPARSECLIP.ATTENTION.ALPHA``) or aliases
(:data:`ALIASES`, plus the special ones below):

- ``alpha``: ``ATTENTION.ALPHA``; alpha 1 also sets ``NORMALIZER softmax`` and alpha > 1
  sets ``NORMALIZER entmax``, unless the run sets ``normalizer`` itself (so
  ``{normalizer: random_matched, alpha: 1.2}`` stays the random control);
- ``resolution``: ``INPUT.MIN_SIZE_TEST`` and ``MODEL.SPARSECLIP.FGOVD.RESOLUTION``, and
  ``TEST.SLIDING_WINDOW.CROP_SIZE`` when sliding windows are on;
- ``backbone``: ``CLIP.NAME``; ``B/16`` -> ``ViT-B-16-quickgelu``, ``L/14`` ->
  ``ViT-L-14-quickgelu`` (the paper's OpenAI models), other names verbatim;
- ``block``: the paper's last-block variants ``full``, ``drop_ffn``, ``drop_residual``,
  ``drop_both`` -> ``BLOCK.RESIDUAL`` / ``BLOCK.FFN``.

Each run is one ``tools/train_net.py --eval-only`` process with its own ``OUTPUT_DIR``
(``<out>/runs/<run id>``); its ``results.json`` becomes one line of ``<out>/results.jsonl``,
appended as soon as the run ends. The run key hashes the base config files' text and the
run's overrides, so a re-started sweep skips runs whose key already has an ``ok`` line.
"""
import hashlib
import itertools
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import yaml

__all__ = [
    "ALIASES",
    "BACKBONES",
    "BLOCK_VARIANTS",
    "SweepRun",
    "Sweep",
    "load_sweep",
    "expand_params",
    "run_key",
    "read_jsonl",
    "append_jsonl",
    "finished_keys",
    "run_sweep",
    "default_train_net",
]

logger = logging.getLogger(__name__)

A = "MODEL.SPARSECLIP.ATTENTION."
#: Short names of config keys accepted in sweep files.
ALIASES = {
    "num_layers": A + "NUM_LAYERS",
    "depth": A + "NUM_LAYERS",
    "source": A + "SOURCE",
    "normalizer": A + "NORMALIZER",
    "temperature": A + "TEMPERATURE",
    "prior": A + "PRIOR",
    "prior_std": A + "PRIOR_STD",
    "sum_mode": A + "SUM_MODE",
    "seed": A + "SEED",
    "residual": "MODEL.SPARSECLIP.BLOCK.RESIDUAL",
    "ffn": "MODEL.SPARSECLIP.BLOCK.FFN",
    "pretrained": "MODEL.SPARSECLIP.CLIP.PRETRAINED",
    "precision": "MODEL.SPARSECLIP.CLIP.PRECISION",
    "templates": "MODEL.SPARSECLIP.TEXT.TEMPLATES",
    "logit_scale": "MODEL.SPARSECLIP.LOGIT_SCALE",
    "prob_threshold": "MODEL.SPARSECLIP.PROB_THRESHOLD",
    "area_threshold": "MODEL.SPARSECLIP.AREA_THRESHOLD",
    "datasets": "DATASETS.TEST",
    "max_images": "TEST.MAX_IMAGES",
    "sliding": "TEST.SLIDING_WINDOW.ENABLED",
    "crop_size": "TEST.SLIDING_WINDOW.CROP_SIZE",
    "stride": "TEST.SLIDING_WINDOW.STRIDE",
    "attention_stats": "TEST.ATTENTION_STATS.ENABLED",
    "device": "MODEL.DEVICE",
}
SPECIAL = ("alpha", "resolution", "backbone", "block")
#: The paper's backbones.
BACKBONES = {"B/16": "ViT-B-16-quickgelu", "L/14": "ViT-L-14-quickgelu"}
#: The paper's last-block variants -> (RESIDUAL, FFN).
BLOCK_VARIANTS = {"full": (True, True), "drop_ffn": (True, False), "drop_residual": (False, True),
                  "drop_both": (False, False)}
RESERVED = ("name",)


@dataclass
class SweepRun:
    """One combination: ``params`` as written in the sweep (alias -> value), ``opts`` the
    resolved ``(FULL.KEY, value)`` overrides, ``name`` readable, ``key`` the resume hash."""

    name: str
    params: Dict[str, Any]
    opts: List[Tuple[str, Any]]
    key: str = ""
    group: str = ""


@dataclass
class Sweep:
    """A loaded sweep file."""

    name: str
    path: str
    base: str
    runs: List[SweepRun] = field(default_factory=list)


def default_train_net() -> str:
    """``tools/train_net.py`` of this checkout."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "tools", "train_net.py")


def _cli_value(value: Any) -> str:
    """A config value as a detectron2 command-line override string."""
    if isinstance(value, (list, tuple)):
        return repr(tuple(value))
    return str(value)


def _is_full_key(key: str) -> bool:
    return "." in key and key.upper() == key


def expand_params(params: Dict[str, Any], base_cfg=None) -> List[Tuple[str, Any]]:
    """Resolve one run's ``{alias or FULL.KEY: value}`` into ordered ``(FULL.KEY, value)`` pairs.

    Args:
        params: the run's parameters (fixed, variant and grid values merged, in that order).
        base_cfg: the merged base config (a detectron2 ``CfgNode``); used to check that full
            keys exist and whether sliding windows are on (for ``resolution``). May be None.

    Raises:
        ValueError: an unknown key or a bad value, naming it and the valid choices.
    """
    opts: "OrderedDict[str, Any]" = OrderedDict()
    explicit_normalizer = "normalizer" in params or (A + "NORMALIZER") in params
    sliding = params.get("sliding", params.get("TEST.SLIDING_WINDOW.ENABLED"))
    if sliding is None and base_cfg is not None:
        sliding = bool(base_cfg.TEST.SLIDING_WINDOW.ENABLED)
    for key, value in params.items():
        if key in RESERVED:
            continue
        if key == "alpha":
            alpha = float(value)
            if not 1.0 <= alpha <= 2.0:
                raise ValueError(f"sweep value alpha={value!r} is outside [1, 2] (1 = softmax)")
            opts[A + "ALPHA"] = alpha
            if not explicit_normalizer:
                opts[A + "NORMALIZER"] = "softmax" if alpha == 1.0 else "entmax"
        elif key == "resolution":
            res = int(value)
            opts["INPUT.MIN_SIZE_TEST"] = res
            opts["MODEL.SPARSECLIP.FGOVD.RESOLUTION"] = res
            if sliding:
                opts["TEST.SLIDING_WINDOW.CROP_SIZE"] = res
        elif key == "backbone":
            opts["MODEL.SPARSECLIP.CLIP.NAME"] = BACKBONES.get(str(value), str(value))
        elif key == "block":
            if value not in BLOCK_VARIANTS:
                raise ValueError(f"unknown block variant {value!r}; valid: {', '.join(BLOCK_VARIANTS)}")
            opts["MODEL.SPARSECLIP.BLOCK.RESIDUAL"], opts["MODEL.SPARSECLIP.BLOCK.FFN"] = BLOCK_VARIANTS[value]
        elif key in ALIASES:
            opts[ALIASES[key]] = tuple(value) if isinstance(value, list) else value
        elif _is_full_key(key):
            opts[key] = tuple(value) if isinstance(value, list) else value
        else:
            raise ValueError(
                f"unknown sweep key {key!r}; valid: full config keys (MODEL.SPARSECLIP.ATTENTION.ALPHA) or "
                f"aliases {', '.join(sorted(list(ALIASES) + list(SPECIAL)))}")
    if "OUTPUT_DIR" in opts:
        raise ValueError("sweep key OUTPUT_DIR is set by the sweep itself (one folder per run); remove it")
    pairs = list(opts.items())
    if base_cfg is not None:
        cfg = base_cfg.clone()
        cfg.defrost()
        flat = []
        for k, v in pairs:
            flat += [k, _cli_value(v)]
        try:
            cfg.merge_from_list(flat)
        except (KeyError, AssertionError, ValueError) as e:
            raise ValueError(f"sweep overrides {dict(pairs)} do not merge into the base config: {e}") from e
    return pairs


def _config_chain_text(path: str, seen: Optional[set] = None) -> str:
    """Text of a config file and of its ``_BASE_`` chain (for the run key)."""
    seen = set() if seen is None else seen
    path = os.path.abspath(path)
    if path in seen:
        return ""
    seen.add(path)
    with open(path) as f:
        text = f.read()
    base = (yaml.safe_load(text) or {}).get("_BASE_")
    if base:
        base_path = base if os.path.isabs(base) else os.path.join(os.path.dirname(path), base)
        if os.path.isfile(base_path):
            text = _config_chain_text(base_path, seen) + "\n---\n" + text
    return text


def run_key(base_config: str, opts: Sequence[Tuple[str, Any]]) -> str:
    """sha256 (16 hex digits) of the base config chain's text and the sorted overrides."""
    payload = json.dumps({"base": _config_chain_text(base_config),
                          "opts": sorted((k, _cli_value(v)) for k, v in opts)}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "-", text).strip("-")[:80] or "run"


def load_base_config(path: str):
    """The merged detectron2 config of a base config file (defaults + sparseclip keys)."""
    from detectron2.config import get_cfg

    from sparseclip_d2.config import add_sparseclip_config

    cfg = get_cfg()
    add_sparseclip_config(cfg)
    cfg.merge_from_file(path)
    return cfg


def load_sweep(path: str, *, extra: Optional[Dict[str, Any]] = None, validate: bool = True) -> Sweep:
    """Read a sweep file and expand it into runs.

    Args:
        path: the YAML sweep file.
        extra: overrides applied to every run after ``fixed`` (e.g. from ``--set`` on the
            command line); they are part of the run key.
        validate: merge every run's overrides into the base config (catches bad keys/values
            before anything runs).
    """
    with open(path) as f:
        spec = yaml.safe_load(f) or {}
    allowed = {"name", "base", "fixed", "variants", "grid", "description"}
    unknown = set(spec) - allowed
    if unknown:
        raise ValueError(f"sweep file {path!r}: unknown top-level keys {sorted(unknown)}; valid: {sorted(allowed)}")
    if "base" not in spec:
        raise ValueError(f"sweep file {path!r} lacks 'base' (the base config file)")
    base = spec["base"]
    if not os.path.isabs(base):
        candidate = os.path.join(os.path.dirname(os.path.abspath(path)), base)
        base = candidate if os.path.isfile(candidate) else os.path.abspath(base)
    base = os.path.normpath(base)
    if not os.path.isfile(base):
        raise FileNotFoundError(f"sweep file {path!r}: base config {spec['base']!r} not found (tried {base!r})")
    name = spec.get("name") or os.path.splitext(os.path.basename(path))[0]
    fixed = dict(spec.get("fixed") or {})
    fixed.update(extra or {})
    grid = spec.get("grid") or {}
    if not isinstance(grid, dict):
        raise ValueError(f"sweep file {path!r}: 'grid' must map keys to lists of values")
    for k, v in grid.items():
        if not isinstance(v, list) or not v:
            raise ValueError(f"sweep file {path!r}: grid key {k!r} must be a non-empty list, got {v!r}")
    variants = spec.get("variants") or [{}]
    if not isinstance(variants, list) or not all(isinstance(v, dict) for v in variants):
        raise ValueError(f"sweep file {path!r}: 'variants' must be a list of mappings")
    base_cfg = load_base_config(base) if validate else None
    runs, seen = [], {}
    keys = list(grid)
    for vi, variant in enumerate(variants):
        vname = str(variant.get("name", "")) if variant.get("name") is not None else ""
        for values in itertools.product(*(grid[k] for k in keys)):
            gparams = dict(zip(keys, values))
            params = {**fixed, **{k: v for k, v in variant.items() if k != "name"}, **gparams}
            opts = expand_params(params, base_cfg)
            shown = {**{k: v for k, v in variant.items() if k != "name"}, **gparams}
            label = ",".join(f"{k}={_cli_value(v)}" for k, v in shown.items()) or "base"
            rname = f"{vname}:{label}" if vname else label
            key = run_key(base, opts)
            if key in seen:
                raise ValueError(f"sweep file {path!r}: runs {seen[key]!r} and {rname!r} have identical overrides")
            seen[key] = rname
            runs.append(SweepRun(name=rname, params=params, opts=opts, key=key, group=vname))
    if not runs:
        raise ValueError(f"sweep file {path!r} expands to no run")
    return Sweep(name=name, path=os.path.abspath(path), base=base, runs=runs)


# ------------------------------------------------------------------------------ JSON lines
def read_jsonl(path: str) -> List[Dict[str, Any]]:
    """Records of a JSON-lines file; a truncated or corrupt line (a killed writer) is skipped
    with a warning. A missing file gives []."""
    if not os.path.isfile(path):
        return []
    out = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                logger.warning("%s:%d is not valid JSON (an interrupted write?); skipped", path, i)
    return out


_LOCK = threading.Lock()


def append_jsonl(path: str, record: Dict[str, Any]) -> None:
    """Append one record as a line (flushed and fsynced; thread-safe)."""
    line = json.dumps(record, sort_keys=False, allow_nan=True)
    with _LOCK:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())


def finished_keys(records: Sequence[Dict[str, Any]]) -> set:
    """Run keys that have a successful (``status == "ok"``) record."""
    return {r.get("run_key") for r in records if r.get("status") == "ok"}


# ------------------------------------------------------------------------------ running
def _run_dir(out_dir: str, run: SweepRun) -> str:
    return os.path.join(out_dir, "runs", f"{_slug(run.name)}-{run.key[:8]}")


def _dataset_metrics(results: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    skip = {"config", "random_weights", "max_images", "partial"}
    out = OrderedDict()
    for name, entry in results.items():
        if name in skip or not isinstance(entry, dict):
            continue
        out[name] = {k: v for k, v in entry.items() if not isinstance(v, (dict, list))}
    return out


def run_one(run: SweepRun, sweep: Sweep, out_dir: str, *, train_net: Optional[str] = None,
            env: Optional[Dict[str, str]] = None, timeout: Optional[float] = None) -> Dict[str, Any]:
    """Run one combination as a ``train_net.py --eval-only`` subprocess and build its record."""
    run_dir = _run_dir(out_dir, run)
    os.makedirs(run_dir, exist_ok=True)
    results_path = os.path.join(run_dir, "results.json")
    if os.path.exists(results_path):
        os.remove(results_path)  # never read a stale result of an interrupted earlier attempt
    cmd = [sys.executable, train_net or default_train_net(), "--eval-only", "--config-file", sweep.base]
    for k, v in run.opts:
        cmd += [k, _cli_value(v)]
    cmd += ["OUTPUT_DIR", run_dir]
    record: Dict[str, Any] = OrderedDict(
        run_key=run.key, run_name=run.name, group=run.group, sweep=sweep.name, base_config=sweep.base,
        params=run.params, overrides={k: v for k, v in run.opts}, output_dir=run_dir,
    )
    start = time.time()
    log_path = os.path.join(run_dir, "log.txt")
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        try:
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = -9
    record["seconds"] = round(time.time() - start, 3)
    record["returncode"] = rc
    if rc != 0 or not os.path.isfile(results_path):
        with open(log_path) as f:
            tail = f.read()[-2000:]
        record["status"] = "failed"
        record["error"] = tail
        logger.error("run %s failed (exit %s); log: %s\n%s", run.name, rc, log_path, tail[-800:])
        return record
    with open(results_path) as f:
        results = json.load(f)
    record["status"] = "ok"
    record["random_weights"] = bool(results.get("random_weights", False))
    record["partial"] = bool(results.get("partial", False))
    if "max_images" in results:
        record["max_images"] = results["max_images"]
    record["config"] = _config_summary(results.get("config") or {})
    record["datasets"] = _dataset_metrics(results)
    return record


def _config_summary(config: Dict[str, Any]) -> Dict[str, Any]:
    """The config values that describe a run (for tables, plots and the paper join)."""
    sc = (config.get("MODEL") or {}).get("SPARSECLIP") or {}
    att, blk, clip = sc.get("ATTENTION") or {}, sc.get("BLOCK") or {}, sc.get("CLIP") or {}
    test = config.get("TEST") or {}
    return OrderedDict(
        backbone=clip.get("NAME"), pretrained=clip.get("PRETRAINED"),
        source=att.get("SOURCE"), normalizer=att.get("NORMALIZER"), alpha=att.get("ALPHA"),
        temperature=att.get("TEMPERATURE"), num_layers=att.get("NUM_LAYERS"), prior=att.get("PRIOR"),
        sum_mode=att.get("SUM_MODE"), residual=blk.get("RESIDUAL"), ffn=blk.get("FFN"),
        resolution=(config.get("INPUT") or {}).get("MIN_SIZE_TEST"),
        fgovd_resolution=(sc.get("FGOVD") or {}).get("RESOLUTION"),
        sliding=(test.get("SLIDING_WINDOW") or {}).get("ENABLED"),
        templates=(sc.get("TEXT") or {}).get("TEMPLATES"),
        prob_threshold=sc.get("PROB_THRESHOLD"),
    )


def planned_config(sweep: Sweep, run: SweepRun) -> Tuple[Dict[str, Any], List[str]]:
    """``(config summary, dataset names)`` that ``run`` will evaluate (as recorded after the
    run), without running it."""
    cfg = load_base_config(sweep.base)
    flat = []
    for k, v in run.opts:
        flat += [k, _cli_value(v)]
    cfg.merge_from_list(flat)
    return _config_summary(yaml.safe_load(cfg.dump())), list(cfg.DATASETS.TEST)


def run_sweep(sweep: Sweep, out_dir: str, *, num_gpus: int = 0, train_net: Optional[str] = None,
              retry_failed: bool = True, timeout: Optional[float] = None, on_record=None) -> Dict[str, int]:
    """Run every unfinished combination, appending each record to ``<out_dir>/results.jsonl``.

    Args:
        num_gpus: 0/1 = one run at a time; N > 1 = N runs at a time, run i on GPU
            ``i mod N`` (``CUDA_VISIBLE_DEVICES``).
        retry_failed: re-run combinations whose only records are failures.
        on_record: called with each new record (e.g. to rewrite the tables).

    Returns:
        ``{"total", "skipped", "ok", "failed"}`` counts of this invocation.
    """
    jsonl = os.path.join(out_dir, "results.jsonl")
    records = read_jsonl(jsonl)
    done = finished_keys(records)
    failed_before = {r.get("run_key") for r in records if r.get("status") != "ok"}
    todo = [r for r in sweep.runs if r.key not in done and (retry_failed or r.key not in failed_before)]
    counts = {"total": len(sweep.runs), "skipped": len(sweep.runs) - len(todo), "ok": 0, "failed": 0}
    logger.info("sweep %s: %d runs, %d already finished, %d to run -> %s",
                sweep.name, len(sweep.runs), counts["skipped"], len(todo), jsonl)

    def finish(record):
        append_jsonl(jsonl, record)
        with _LOCK:
            counts["ok" if record["status"] == "ok" else "failed"] += 1
        if on_record is not None:
            on_record(record)
        logger.info("[%d/%d] %s: %s (%.1f s)", counts["ok"] + counts["failed"], len(todo), record["run_name"],
                    record["status"], record["seconds"])

    if num_gpus <= 1:
        for run in todo:
            finish(run_one(run, sweep, out_dir, train_net=train_net, timeout=timeout))
        return counts

    from concurrent.futures import ThreadPoolExecutor
    import queue

    gpus: "queue.Queue[int]" = queue.Queue()
    for g in range(num_gpus):
        gpus.put(g)

    def work(run):
        gpu = gpus.get()
        try:
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu))
            finish(run_one(run, sweep, out_dir, train_net=train_net, env=env, timeout=timeout))
        finally:
            gpus.put(gpu)

    with ThreadPoolExecutor(max_workers=num_gpus) as pool:
        list(pool.map(work, todo))
    return counts
