"""Sweep files: expansion into runs, config-key aliases, validation, run keys, running and resuming.

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

Every run is validated when the sweep is loaded as the run itself would check it: the merged
config, ``AttentionSpec.from_config`` (plus ``NUM_LAYERS`` against the model's depth), the
prompt templates, the datasets (registered and found). Invalid runs carry their errors and
the sweep refuses to start; settings that change nothing are warnings.

Each run is one ``tools/train_net.py --eval-only`` process with its own ``OUTPUT_DIR``
(``<out>/runs/<run id>``; its stdout and stderr in ``stdout.txt`` / ``stderr.txt``, apart from
detectron2's ``log.txt``); its ``results.json`` (or, when it fails, its exception from
``error.json`` or its traceback from stderr) becomes one line of ``<out>/results.jsonl``. The
run key hashes what determines the result (:func:`run_key`): the fully merged config, the
dataset root, the data found (image count and file-list checksum per dataset), the package
version and code, the library versions and the weights; a re-started sweep skips runs whose
key already has an ``ok`` line.
"""
import hashlib
import itertools
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import yaml

from ..common.io import atomic_write_text

__all__ = [
    "ALIASES",
    "BACKBONES",
    "BLOCK_VARIANTS",
    "SweepRun",
    "Sweep",
    "SweepValidationError",
    "load_sweep",
    "expand_params",
    "merge_run_config",
    "validate_config",
    "dataset_identity",
    "environment_identity",
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



class SweepValidationError(ValueError):
    """Some runs of a sweep are invalid; ``runs`` holds them (each with ``errors``)."""

    def __init__(self, runs: Sequence["SweepRun"]):
        self.runs = list(runs)
        lines = [f"{len(self.runs)} run(s) of the sweep are invalid:"]
        for r in self.runs:
            lines += [f"  {r.name}: {e}" for e in r.errors]
        super().__init__("\n".join(lines))


@dataclass
class SweepRun:
    """One combination: ``params`` as written in the sweep (alias -> value), ``opts`` the
    resolved ``(FULL.KEY, value)`` overrides, ``name`` readable, ``key`` the resume hash,
    ``errors`` what makes the run invalid (it would fail), ``warnings`` settings that change
    nothing, ``identity`` what the key covers besides the config (data, versions, weights)."""

    name: str
    params: Dict[str, Any]
    opts: List[Tuple[str, Any]]
    key: str = ""
    group: str = ""
    errors: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    identity: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Sweep:
    """A loaded sweep file."""

    name: str
    path: str
    base: str
    runs: List[SweepRun] = field(default_factory=list)

    @property
    def invalid_runs(self) -> List[SweepRun]:
        """Runs with errors."""
        return [r for r in self.runs if r.errors]


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

    Values are not range-checked here: :func:`validate_config` checks the merged config the
    way the run does (``AttentionSpec``).

    Args:
        params: the run's parameters (fixed, variant and grid values merged, in that order).
        base_cfg: the merged base config (a detectron2 ``CfgNode``); used to check that full
            keys exist and whether sliding windows are on (for ``resolution``). May be None.

    Raises:
        ValueError: an unknown key or a value that cannot be converted, naming it and the
            valid choices.
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
            try:
                alpha = float(value)
            except (TypeError, ValueError):
                raise ValueError(f"sweep value alpha={value!r} is not a number") from None
            opts[A + "ALPHA"] = alpha
            if not explicit_normalizer:
                opts[A + "NORMALIZER"] = "softmax" if alpha == 1.0 else "entmax"
        elif key == "resolution":
            try:
                res = int(value)
            except (TypeError, ValueError):
                raise ValueError(f"sweep value resolution={value!r} is not an integer") from None
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
        merge_run_config(base_cfg, pairs)
    return pairs


def _as_config_type(cfg, key: str, value: Any) -> Any:
    """An integer given for a float key (``temperature: -1``) as a float, as the user means it."""
    node = cfg
    for part in key.split("."):
        node = node.get(part) if hasattr(node, "get") else None
        if node is None:
            return value
    if isinstance(node, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def merge_run_config(base_cfg, opts: Sequence[Tuple[str, Any]]):
    """A copy of ``base_cfg`` with the run's overrides merged as ``train_net`` merges its
    command line (``merge_from_list``). Raises ``ValueError`` when they do not merge."""
    cfg = base_cfg.clone()
    cfg.defrost()
    flat = []
    for k, v in opts:
        flat += [k, _cli_value(_as_config_type(cfg, k, v))]
    try:
        cfg.merge_from_list(flat)
    except (KeyError, AssertionError, ValueError, TypeError) as e:
        raise ValueError(f"sweep overrides {dict(opts)} do not merge into the base config: {e}") from e
    return cfg


def load_base_config(path: str):
    """The merged detectron2 config of a base config file (defaults + sparseclip keys)."""
    from detectron2.config import get_cfg

    from sparseclip_d2.config import add_sparseclip_config

    cfg = get_cfg()
    add_sparseclip_config(cfg)
    cfg.merge_from_file(path)
    return cfg


def _model_depth(name: str) -> int:
    """Number of vision blocks of an open_clip (or sparseclip_d2 local) model name."""
    import open_clip

    from sparseclip_d2.clip.model_configs import get_local_model_config

    mc = get_local_model_config(name) or open_clip.get_model_config(name)
    if mc is None:
        raise ValueError(f"MODEL.SPARSECLIP.CLIP.NAME={name!r} is not an open_clip model; valid: "
                         f"{', '.join(open_clip.list_models()[:8])}, ... (open_clip.list_models())")
    layers = mc["vision_cfg"]["layers"]
    return int(layers if isinstance(layers, int) else sum(layers))


def validate_config(cfg) -> Tuple[List[str], List[str]]:
    """Check a run's merged config as the run would: ``(errors, warnings)``.

    Errors: an invalid attention setting (``AttentionSpec.from_config``), ``NUM_LAYERS``
    beyond the model's depth, an unknown model, unknown prompt templates, an empty or
    unregistered ``DATASETS.TEST``. Warnings: settings that change nothing
    (``AttentionSpec.inert_settings``).
    """
    from detectron2.data import DatasetCatalog

    import sparseclip_d2.data  # noqa: F401  (registers the datasets)
    from sparseclip_d2.clip import AttentionSpec, get_templates

    errors: List[str] = []
    warnings: List[str] = []
    spec = None
    try:
        spec = AttentionSpec.from_config(cfg, warn=False)
        warnings += spec.inert_settings()
    except ValueError as e:
        errors.append(str(e))
    try:
        depth = _model_depth(cfg.MODEL.SPARSECLIP.CLIP.NAME)
        if spec is not None:
            try:
                spec.check_depth(depth)
            except ValueError as e:
                errors.append(f"MODEL.SPARSECLIP.ATTENTION.NUM_LAYERS: {e} ({cfg.MODEL.SPARSECLIP.CLIP.NAME})")
    except ValueError as e:
        errors.append(str(e))
    try:
        get_templates(cfg.MODEL.SPARSECLIP.TEXT.TEMPLATES)
    except ValueError as e:
        errors.append(f"MODEL.SPARSECLIP.TEXT.TEMPLATES: {e}")
    if not cfg.DATASETS.TEST:
        errors.append("DATASETS.TEST is empty: name at least one registered dataset")
    registered = set(DatasetCatalog.list())
    for name in cfg.DATASETS.TEST:
        if name not in registered:
            errors.append(f"dataset {name!r} is not registered; registered: {', '.join(sorted(registered))}")
    return errors, warnings


def dataset_identity(name: str) -> Dict[str, Any]:
    """What a dataset resolves to on this machine: ``{"num_images", "files_sha256"}`` (sha256
    of the sorted image and annotation paths of its dataset dicts). Raises what the dataset's
    loader raises when its files are missing."""
    from detectron2.data import DatasetCatalog

    dicts = DatasetCatalog.get(name)
    h = hashlib.sha256()
    files = sorted(f"{d.get('file_name', '')}\t{d.get('sem_seg_file_name', '')}" for d in dicts)
    for f in files:
        h.update(f.encode("utf-8", "surrogateescape") + b"\n")
    return {"num_images": len(dicts), "files_sha256": h.hexdigest()[:16]}


def _file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def _python_code(path: str) -> bytes:
    """A Python file's code without comments, docstrings or formatting (its AST)."""
    import ast

    with open(path, "rb") as f:
        tree = ast.parse(f.read(), filename=path)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            body[0] = ast.Pass()
    return ast.dump(tree, include_attributes=False).encode()


def _code_fingerprint() -> str:
    """sha256 of the package's code that can change a result: every file but ``analysis/``;
    Python files by their AST, so comments, docstrings and formatting do not count."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("analysis", "__pycache__"))
        for fn in sorted(filenames):
            if fn.endswith((".py", ".cpp", ".txt", ".csv")):
                path = os.path.join(dirpath, fn)
                h.update(os.path.relpath(path, root).encode() + b"\0")
                if fn.endswith(".py"):
                    h.update(_python_code(path))
                else:
                    with open(path, "rb") as f:
                        h.update(f.read())
    return h.hexdigest()[:16]


def environment_identity() -> Dict[str, Any]:
    """Versions and code of this process: sparseclip_d2 (version and code fingerprint), torch,
    open_clip, detectron2."""
    from importlib.metadata import PackageNotFoundError, version

    import detectron2
    import open_clip
    import torch

    try:
        own = version("sparseclip_d2")
    except PackageNotFoundError:  # run from a checkout without installing it: the code checksum still counts
        own = "not installed"
    return {"sparseclip_d2": own, "code": _code_fingerprint(), "torch": torch.__version__,
            "open_clip": getattr(open_clip, "__version__", "?"), "detectron2": detectron2.__version__}


def _weights_identity(cfg, memo: Dict[str, str]) -> str:
    pretrained = str(cfg.MODEL.SPARSECLIP.CLIP.PRETRAINED)
    path = os.path.expanduser(pretrained)
    if os.path.isfile(path):
        if path not in memo:
            memo[path] = "file:" + _file_sha256(path)
        return memo[path]
    return "tag:" + pretrained  # an open_clip tag (with open_clip's version) or "none" (seeded random)


def _datasets_root() -> str:
    return os.path.abspath(os.path.expanduser(os.getenv("DETECTRON2_DATASETS", "datasets")))


def run_key(cfg, identity: Dict[str, Any]) -> str:
    """sha256 (16 hex digits) of the fully merged config (``OUTPUT_DIR`` excluded, so comments
    or key order in the config files do not matter) and ``identity`` (dataset root, data
    found, versions, code, weights)."""
    c = cfg.clone()
    c.defrost()
    c.OUTPUT_DIR = ""
    payload = json.dumps({"config": yaml.safe_load(c.dump()), "identity": identity}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "-", text).strip("-")[:80] or "run"


def load_sweep(path: str, *, extra: Optional[Dict[str, Any]] = None, validate: bool = True,
               identify_data: bool = True) -> Sweep:
    """Read a sweep file, expand it into runs and validate each run.

    Args:
        path: the YAML sweep file.
        extra: overrides applied to every run after ``fixed`` (e.g. from ``--set`` on the
            command line); they are part of the run key.
        validate: check every run (:func:`validate_config`); invalid runs get ``errors``.
        identify_data: load every dataset's dicts for the run key (:func:`dataset_identity`);
            a dataset that cannot be loaded is an error of the runs that use it.

    Raises:
        ValueError: a malformed sweep file, or two runs with identical merged configs.
    """
    with open(path) as f:
        spec = yaml.safe_load(f) or {}
    if not isinstance(spec, dict):
        raise ValueError(f"sweep file {path!r} must be a YAML mapping, got {type(spec).__name__}")
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
    base_cfg = load_base_config(base)
    env = environment_identity()
    root = _datasets_root()
    data_memo: Dict[str, Any] = {}
    weights_memo: Dict[str, str] = {}
    runs, seen = [], {}
    keys = list(grid)
    for variant in variants:
        vname = str(variant.get("name", "")) if variant.get("name") is not None else ""
        for values in itertools.product(*(grid[k] for k in keys)):
            gparams = dict(zip(keys, values))
            params = {**fixed, **{k: v for k, v in variant.items() if k != "name"}, **gparams}
            shown = {**{k: v for k, v in variant.items() if k != "name"}, **gparams}
            label = ",".join(f"{k}={_cli_value(v)}" for k, v in shown.items()) or "base"
            rname = f"{vname}:{label}" if vname else label
            run = SweepRun(name=rname, params=params, opts=[], group=vname)
            runs.append(run)
            try:
                run.opts = [(k, _as_config_type(base_cfg, k, v)) for k, v in expand_params(params, None)]
                cfg = merge_run_config(base_cfg, run.opts)
            except ValueError as e:
                run.errors.append(str(e))
                run.key = hashlib.sha256(repr(sorted(params.items(), key=str)).encode()).hexdigest()[:16]
                continue
            if validate:
                errors, warnings = validate_config(cfg)
                run.errors += errors
                run.warnings += warnings
            data: Dict[str, Any] = {}
            if identify_data:
                for ds in cfg.DATASETS.TEST:
                    if ds not in data_memo:
                        try:
                            data_memo[ds] = dataset_identity(ds)
                        except Exception as e:  # the loader's own error says what is missing
                            data_memo[ds] = {"error": f"dataset {ds!r} cannot be loaded: {type(e).__name__}: {e}"}
                    if "error" in data_memo[ds]:
                        if data_memo[ds]["error"] not in run.errors:
                            run.errors.append(data_memo[ds]["error"])
                    data[ds] = data_memo[ds]
            run.identity = {"datasets_root": root, "data": data, "versions": env,
                            "weights": _weights_identity(cfg, weights_memo)}
            run.key = run_key(cfg, run.identity)
            if run.key in seen:
                raise ValueError(f"sweep file {path!r}: runs {seen[run.key]!r} and {rname!r} have identical "
                                 "merged configs")
            seen[run.key] = rname
    if not runs:
        raise ValueError(f"sweep file {path!r} expands to no run")
    return Sweep(name=name, path=os.path.abspath(path), base=base, runs=runs)


# ------------------------------------------------------------------------------ JSON lines
def read_jsonl(path: str) -> List[Dict[str, Any]]:
    """Records of a JSON-lines file; a corrupt line is skipped with a warning. A missing file
    gives []."""
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
                logger.warning("%s:%d is not valid JSON; skipped", path, i)
    return out


_LOCK = threading.Lock()


def append_jsonl(path: str, record: Dict[str, Any]) -> None:
    """Add one record as a line: the file is rewritten through a temporary file and
    ``os.replace`` (a killed sweep leaves the old file or the new one, never half a line);
    thread-safe within the process."""
    line = json.dumps(record, sort_keys=False, allow_nan=True)
    with _LOCK:
        old = ""
        if os.path.isfile(path):
            with open(path) as f:
                old = f.read()
            if old and not old.endswith("\n"):
                old += "\n"
        atomic_write_text(path, old + line + "\n")


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


_TRACEBACK = "Traceback (most recent call last):"


def _run_error(run_dir: str, rc: Optional[int], timeout: Optional[float]) -> Dict[str, Any]:
    """The failed run's error: its ``error.json`` (written by train_net), else the last
    traceback on its stderr, else how it ended (signal, exit code, timeout) and stderr's tail."""
    err_path = os.path.join(run_dir, "error.json")
    stderr_path = os.path.join(run_dir, "stderr.txt")
    stderr = ""
    if os.path.isfile(stderr_path):
        with open(stderr_path, errors="replace") as f:
            stderr = f.read()
    if rc is None:
        how = f"timed out after {timeout:g} s and was killed"
    elif rc < 0:
        try:
            how = f"killed by signal {signal.Signals(-rc).name}"
        except ValueError:
            how = f"killed by signal {-rc}"
    elif rc == 0:
        how = "exited 0 without writing results.json"
    else:
        how = f"exited with code {rc}"
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


def run_one(run: SweepRun, sweep: Sweep, out_dir: str, *, train_net: Optional[str] = None,
            env: Optional[Dict[str, str]] = None, timeout: Optional[float] = None) -> Dict[str, Any]:
    """Run one combination as a ``train_net.py --eval-only`` subprocess and build its record.

    The subprocess's stdout and stderr go to ``stdout.txt`` and ``stderr.txt`` of the run's
    folder (detectron2 writes its own ``log.txt`` there). A failed run's record has
    ``status: failed`` and ``error: {type, message, traceback, exit}``.
    """
    run_dir = _run_dir(out_dir, run)
    os.makedirs(run_dir, exist_ok=True)
    results_path = os.path.join(run_dir, "results.json")
    for stale in (results_path, os.path.join(run_dir, "error.json")):
        if os.path.exists(stale):
            os.remove(stale)  # never read a result of an earlier attempt
    cmd = [sys.executable, train_net or default_train_net(), "--eval-only", "--config-file", sweep.base]
    for k, v in run.opts:
        cmd += [k, _cli_value(v)]
    cmd += ["OUTPUT_DIR", run_dir]
    record: Dict[str, Any] = OrderedDict(
        run_key=run.key, run_name=run.name, group=run.group, sweep=sweep.name, base_config=sweep.base,
        params=run.params, overrides={k: v for k, v in run.opts}, output_dir=run_dir, identity=run.identity,
    )
    if run.warnings:
        record["warnings"] = list(run.warnings)
    atomic_write_text(os.path.join(run_dir, "command.txt"), " ".join(cmd) + "\n")
    start = time.time()
    with open(os.path.join(run_dir, "stdout.txt"), "w") as out, open(os.path.join(run_dir, "stderr.txt"), "w") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        rc = _wait_reporting_progress(proc, run.name, os.path.join(run_dir, "log.txt"), timeout)
    record["seconds"] = round(time.time() - start, 3)
    record["returncode"] = rc
    if rc != 0 or not os.path.isfile(results_path):
        record["status"] = "failed"
        record["error"] = _run_error(run_dir, rc, timeout)
        tb = record["error"].get("traceback") or record["error"].get("stderr_tail") or ""
        logger.error("run %s failed (%s): %s\n%s\n(stdout/stderr in %s)", run.name, record["error"]["exit"],
                     error_summary(record["error"]), tb[-3000:], run_dir)
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


# detectron2/evaluation/evaluator.py inference_on_dataset logs "Inference done i/N. ... ETA=..."
# about every 5 s once past its warm-up images; the sweep relays the newest one.
_INFERENCE_PROGRESS = re.compile(r"Inference done (\d+)/(\d+)\..*?ETA=(\S+)")
PROGRESS_INTERVAL_S = 30.0


def _latest_progress(log_path: str) -> Optional[str]:
    """``"i/N images, ETA h:mm:ss"`` from the newest detectron2 inference progress line of a
    run's ``log.txt`` (read from its last 64 kB), or None."""
    try:
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            tail = f.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    found = _INFERENCE_PROGRESS.findall(tail)
    if not found:
        return None
    done, total, eta = found[-1]
    return f"{done}/{total} images, ETA {eta}"


def _wait_reporting_progress(proc: "subprocess.Popen", name: str, log_path: str,
                             timeout: Optional[float], interval: float = PROGRESS_INTERVAL_S) -> Optional[int]:
    """Wait for a run's subprocess; every ``interval`` s log its newest inference progress
    (when it changed). Kills it after ``timeout`` s and returns None then, else its exit code."""
    start = time.time()
    last = None
    while True:
        wait = interval if timeout is None else max(0.0, min(interval, start + timeout - time.time()))
        try:
            return proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass
        if timeout is not None and time.time() - start >= timeout:
            proc.kill()
            proc.wait()
            return None
        progress = _latest_progress(log_path)
        if progress is not None and progress != last:
            logger.info("run %s: %s (%.0f s so far)", name, progress, time.time() - start)
            last = progress


def _config_summary(config: Dict[str, Any]) -> Dict[str, Any]:
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

    Raises:
        SweepValidationError: some runs are invalid (nothing is run).
    """
    if sweep.invalid_runs:
        raise SweepValidationError(sweep.invalid_runs)
    jsonl = os.path.join(out_dir, "results.jsonl")
    records = read_jsonl(jsonl)
    done = finished_keys(records)
    failed_before = {r.get("run_key") for r in records if r.get("status") != "ok"}
    todo = [r for r in sweep.runs if r.key not in done and (retry_failed or r.key not in failed_before)]
    counts = {"total": len(sweep.runs), "skipped": len(sweep.runs) - len(todo), "ok": 0, "failed": 0}
    logger.info("sweep %s: %d runs, %d already finished, %d to run -> %s",
                sweep.name, len(sweep.runs), counts["skipped"], len(todo), jsonl)
    for run in todo:
        for w in run.warnings:
            logger.warning("run %s: %s", run.name, w)

    started = time.time()
    parallel = max(1, num_gpus)

    def begin(run):
        with _LOCK:
            counts["started"] = counts.get("started", 0) + 1
            i = counts["started"]
        logger.info("[%d/%d] starting %s -> %s", i, len(todo), run.name, _run_dir(out_dir, run))

    def finish(record):
        append_jsonl(jsonl, record)
        with _LOCK:
            counts["ok" if record["status"] == "ok" else "failed"] += 1
            n = counts["ok"] + counts["failed"]
        if on_record is not None:
            on_record(record)
        left = len(todo) - n
        # ETA: the mean wall time per finished run so far, times the runs left, over the runs in parallel
        eta = f", sweep ETA {_hms((time.time() - started) / n * left / parallel)}" if left else ""
        logger.info("[%d/%d] %s: %s (%.1f s%s)", n, len(todo), record["run_name"],
                    record["status"] if record["status"] == "ok" else
                    f"FAILED: {error_summary(record.get('error'))}", record["seconds"], eta)

    if num_gpus <= 1:
        for run in todo:
            begin(run)
            finish(run_one(run, sweep, out_dir, train_net=train_net, timeout=timeout))
        counts.pop("started", None)
        return counts

    from concurrent.futures import ThreadPoolExecutor
    import queue

    gpus: "queue.Queue[int]" = queue.Queue()
    for g in range(num_gpus):
        gpus.put(g)

    def work(run):
        gpu = gpus.get()
        try:
            begin(run)
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu))
            finish(run_one(run, sweep, out_dir, train_net=train_net, env=env, timeout=timeout))
        finally:
            gpus.put(gpu)

    with ThreadPoolExecutor(max_workers=num_gpus) as pool:
        list(pool.map(work, todo))
    counts.pop("started", None)
    return counts


def _hms(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
