"""Reading a sweep file into a :class:`~sparseclip_d2.sweeps.sweep_file.Sweep`: parse and check its
top level, expand variants x grid into runs, validate each run and give it its run key."""
import hashlib
import itertools
import os
import re
from typing import Any, Dict, List, Optional, Tuple

import yaml

from .identity import (HASH_CACHE_FILE, ContentHashes, dataset_identity, datasets_root, environment_identity,
                       run_key, weights_identity)
from .sweep_file import TOP_LEVEL_KEYS, Sweep, SweepRun, as_config_type, cli_value, expand_params, load_base_config, \
    merge_run_config
from .validate import validate_config

__all__ = ["load_sweep", "read_sweep_file", "sweep_name", "expand_runs", "SweepYAMLLoader"]


class SweepYAMLLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that ``1:30:00`` stays the string it looks like: YAML 1.1
    reads it as the base-60 integer 5400, which a sweep file never means (``time: 1:30:00``
    is 90 minutes)."""


_SEXAGESIMAL = re.compile(r"^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$")
SweepYAMLLoader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
for _first in "+-0123456789":
    SweepYAMLLoader.yaml_implicit_resolvers.setdefault(_first, []).insert(0, ("tag:yaml.org,2002:str", _SEXAGESIMAL))


def read_sweep_file(path: str) -> Dict[str, Any]:
    """The sweep file's top-level mapping, checked (keys, ``base`` present, ``grid`` and
    ``variants`` shapes); ``base`` resolved to an existing absolute path."""
    with open(path) as f:
        spec = yaml.load(f, Loader=SweepYAMLLoader) or {}
    if not isinstance(spec, dict):
        raise ValueError(f"sweep file {path!r} must be a YAML mapping, got {type(spec).__name__}")
    unknown = set(spec) - set(TOP_LEVEL_KEYS)
    if unknown:
        raise ValueError(f"sweep file {path!r}: unknown top-level keys {sorted(unknown)}; valid: {sorted(TOP_LEVEL_KEYS)}")
    if "base" not in spec:
        raise ValueError(f"sweep file {path!r} lacks 'base' (the base config file)")
    base = spec["base"]
    if not os.path.isabs(base):
        candidate = os.path.join(os.path.dirname(os.path.abspath(path)), base)
        base = candidate if os.path.isfile(candidate) else os.path.abspath(base)
    spec["base_path"] = os.path.normpath(base)
    if not os.path.isfile(spec["base_path"]):
        raise FileNotFoundError(f"sweep file {path!r}: base config {spec['base']!r} not found (tried {spec['base_path']!r})")
    grid = spec.get("grid") or {}
    if not isinstance(grid, dict):
        raise ValueError(f"sweep file {path!r}: 'grid' must map keys to lists of values")
    for k, v in grid.items():
        if not isinstance(v, list) or not v:
            raise ValueError(f"sweep file {path!r}: grid key {k!r} must be a non-empty list, got {v!r}")
    variants = spec.get("variants") or [{}]
    if not isinstance(variants, list) or not all(isinstance(v, dict) for v in variants):
        raise ValueError(f"sweep file {path!r}: 'variants' must be a list of mappings")
    launcher = spec.get("launcher") or {}
    if not isinstance(launcher, dict):
        raise ValueError(f"sweep file {path!r}: 'launcher' must be a mapping (e.g. {{partition: gpu, time: 60}})")
    spec.update(grid=grid, variants=variants, launcher=launcher)
    return spec


def sweep_name(path: str) -> str:
    """The sweep's name (its ``name:``, else the file's stem), without expanding it."""
    with open(path) as f:
        spec = yaml.safe_load(f) or {}
    name = spec.get("name") if isinstance(spec, dict) else None
    return str(name) if name else os.path.splitext(os.path.basename(path))[0]


def expand_runs(spec: Dict[str, Any], extra: Optional[Dict[str, Any]] = None) -> List[SweepRun]:
    """The runs of a checked sweep mapping: variants x product(grid), parameters ``fixed``,
    then ``extra``, then the variant, then the grid values."""
    fixed = dict(spec.get("fixed") or {})
    fixed.update(extra or {})
    grid = spec["grid"]
    keys = list(grid)
    runs = []
    for variant in spec["variants"]:
        vname = str(variant["name"]) if variant.get("name") is not None else ""
        own = {k: v for k, v in variant.items() if k != "name"}
        for values in itertools.product(*(grid[k] for k in keys)):
            gparams = dict(zip(keys, values))
            shown = {**own, **gparams}
            label = ",".join(f"{k}={cli_value(v)}" for k, v in shown.items()) or "base"
            runs.append(SweepRun(name=f"{vname}:{label}" if vname else label,
                                 params={**fixed, **own, **gparams}, opts=[], group=vname))
    return runs


class _Identifier:
    """Run keys of the runs of one sweep (dataset identities and weights hashed once)."""

    def __init__(self, identify_data: bool, hashes: ContentHashes):
        self.identify_data = identify_data
        self.hashes = hashes
        self.env = environment_identity()
        self.root = datasets_root()
        self.data_memo: Dict[str, Any] = {}
        self.weights_memo: Dict[str, str] = {}

    def data(self, cfg, run: SweepRun) -> Dict[str, Any]:
        data: Dict[str, Any] = {}
        if not self.identify_data:
            return data
        for ds in cfg.DATASETS.TEST:
            if ds not in self.data_memo:
                try:
                    self.data_memo[ds] = dataset_identity(ds, self.hashes)
                except Exception as e:  # the loader's own error says what is missing
                    self.data_memo[ds] = {"error": f"dataset {ds!r} cannot be loaded: {type(e).__name__}: {e}"}
            if "error" in self.data_memo[ds] and self.data_memo[ds]["error"] not in run.errors:
                run.errors.append(self.data_memo[ds]["error"])
            data[ds] = self.data_memo[ds]
        return data

    def identify(self, cfg, run: SweepRun) -> None:
        run.identity = {"datasets_root": self.root, "data": self.data(cfg, run), "versions": self.env,
                        "weights": weights_identity(cfg, self.weights_memo)}
        run.key = run_key(cfg, run.identity)


def _resolve_run(run: SweepRun, base_cfg, validate: bool, ident: _Identifier) -> bool:
    """Fill ``run.opts``, ``errors``, ``warnings``, ``identity`` and ``key``; False when the
    overrides do not even merge (the key is then a hash of the parameters)."""
    try:
        run.opts = [(k, as_config_type(base_cfg, k, v)) for k, v in expand_params(run.params, None)]
        cfg = merge_run_config(base_cfg, run.opts)
    except ValueError as e:
        run.errors.append(str(e))
        run.key = hashlib.sha256(repr(sorted(run.params.items(), key=str)).encode()).hexdigest()[:16]
        return False
    if validate:
        errors, warnings = validate_config(cfg)
        run.errors += errors
        run.warnings += warnings
    ident.identify(cfg, run)
    return True


def load_sweep(path: str, *, extra: Optional[Dict[str, Any]] = None, validate: bool = True,
               identify_data: bool = True, hash_cache: Optional[str] = None) -> Sweep:
    """Read a sweep file, expand it into runs and validate each run.

    Args:
        path: the YAML sweep file.
        extra: overrides applied to every run after ``fixed`` (e.g. from ``--set`` on the
            command line); they are part of the run key.
        validate: check every run (:func:`~sparseclip_d2.sweeps.validate.validate_config`);
            invalid runs get ``errors``.
        identify_data: load every dataset's dicts and hash their files' contents for the run
            key (:func:`~sparseclip_d2.sweeps.identity.dataset_identity`); a dataset that
            cannot be loaded is an error of the runs that use it.
        hash_cache: the content-hash cache file (``<out>/data_hashes.json``); None = hash in
            memory only.

    Raises:
        ValueError: a malformed sweep file, an empty grid, or two runs with identical merged
            configs.
    """
    spec = read_sweep_file(path)
    base = spec["base_path"]
    base_cfg = load_base_config(base)
    hashes = ContentHashes(hash_cache)
    ident = _Identifier(identify_data, hashes)
    runs = expand_runs(spec, extra)
    seen: Dict[str, str] = {}
    for run in runs:
        if not _resolve_run(run, base_cfg, validate, ident):
            continue
        if run.key in seen:
            raise ValueError(f"sweep file {path!r}: runs {seen[run.key]!r} and {run.name!r} have identical "
                             "merged configs")
        seen[run.key] = run.name
    hashes.save()
    if not runs:
        raise ValueError(f"sweep file {path!r} expands to no run")
    name = spec.get("name") or os.path.splitext(os.path.basename(path))[0]
    return Sweep(name=name, path=os.path.abspath(path), base=base, runs=runs, launcher=dict(spec["launcher"]))


def default_hash_cache(out_dir: str) -> str:
    """The content-hash cache of the sweep whose output folder is ``out_dir``."""
    return os.path.join(out_dir, HASH_CACHE_FILE)
