"""The sweep file format: its data classes, config-key aliases and the expansion of one run's
parameters into config overrides.

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
    launcher:                              # optional: cluster settings (sweeps/launchers.py)
      partition: gpu
      time: 120                            # minutes per run (or "H:MM:SS")
      gpus_per_run: 1

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
"""
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = ["ALIASES", "SPECIAL", "BACKBONES", "BLOCK_VARIANTS", "TOP_LEVEL_KEYS", "SweepRun", "Sweep",
           "cli_value", "expand_params", "merge_run_config", "load_base_config", "as_config_type"]

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
#: Top-level keys of a sweep file.
TOP_LEVEL_KEYS = ("name", "base", "fixed", "variants", "grid", "description", "launcher")


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
    """A loaded sweep file; ``launcher`` is its (unvalidated) ``launcher:`` mapping."""

    name: str
    path: str
    base: str
    runs: List[SweepRun] = field(default_factory=list)
    launcher: Dict[str, Any] = field(default_factory=dict)

    @property
    def invalid_runs(self) -> List[SweepRun]:
        """Runs with errors."""
        return [r for r in self.runs if r.errors]


def cli_value(value: Any) -> str:
    """A config value as a detectron2 command-line override string."""
    if isinstance(value, (list, tuple)):
        return repr(tuple(value))
    return str(value)


def _is_full_key(key: str) -> bool:
    return "." in key and key.upper() == key


def _number(key: str, value: Any, kind) -> Any:
    try:
        return kind(value)
    except (TypeError, ValueError):
        what = "a number" if kind is float else "an integer"
        raise ValueError(f"sweep value {key}={value!r} is not {what}") from None


def _expand_special(key: str, value: Any, opts, explicit_normalizer: bool, sliding: bool) -> None:
    """The overrides of one of the :data:`SPECIAL` keys, added to ``opts``."""
    if key == "alpha":
        alpha = _number("alpha", value, float)
        opts[A + "ALPHA"] = alpha
        if not explicit_normalizer:
            opts[A + "NORMALIZER"] = "softmax" if alpha == 1.0 else "entmax"
    elif key == "resolution":
        res = _number("resolution", value, int)
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


def expand_params(params: Dict[str, Any], base_cfg=None) -> List[Tuple[str, Any]]:
    """Resolve one run's ``{alias or FULL.KEY: value}`` into ordered ``(FULL.KEY, value)`` pairs.

    Values are not range-checked here: :func:`~sparseclip_d2.sweeps.validate.validate_config`
    checks the merged config the way the run does (``AttentionSpec``).

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
        if key in SPECIAL:
            _expand_special(key, value, opts, explicit_normalizer, bool(sliding))
        elif key in ALIASES or _is_full_key(key):
            opts[ALIASES.get(key, key)] = tuple(value) if isinstance(value, list) else value
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


def as_config_type(cfg, key: str, value: Any) -> Any:
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
        flat += [k, cli_value(as_config_type(cfg, k, v))]
    try:
        cfg.merge_from_list(flat)
    except (KeyError, AssertionError, ValueError, TypeError) as e:
        raise ValueError(f"sweep overrides {dict(opts)} do not merge into the base config: {e}") from e
    return cfg


def load_base_config(path: str):
    """The merged detectron2 config of a base config file (defaults + sparseclip keys), read
    as ``train_net`` reads ``--config-file`` (:func:`sparseclip_d2.config.merge_config`: an
    integer for a float key, ``ALPHA: 2``, is accepted there, so it is here)."""
    from detectron2.config import get_cfg

    from sparseclip_d2.config import add_sparseclip_config, merge_config

    cfg = get_cfg()
    add_sparseclip_config(cfg)
    merge_config(cfg, path)
    return cfg
