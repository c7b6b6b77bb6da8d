"""The config as a user gives it: merged with one-line errors, and summed up in a few lines.

:func:`merge_user_config` is :func:`sparseclip_d2.config.merge_config` (a config file or a
packaged config name, then ``KEY VALUE`` overrides) whose mistakes are a
:class:`ConfigError` naming the file or the option, the key, the value and the fix: an
unknown key (with the closest keys), an override without its value, a value of the wrong
type (with the key's type and default). yacs alone answers these with an ``AssertionError``
or a ``KeyError`` such as ``Non-existent key: ...``. ``train_net``, the demo, the app and the
``Predictor`` merge through it.

:func:`changed_keys` lists the keys whose value differs from the defaults, and
:func:`run_summary` is the few lines a run logs instead of the whole config (which goes to
``config.yaml`` and to the log at debug level).
"""
import re
from typing import List, Optional, Sequence, Tuple

from .common.errors import UserError, nearest, one_line, unknown_name

__all__ = ["ConfigError", "merge_user_config", "config_keys", "changed_keys", "default_config", "run_summary"]


class ConfigError(UserError):
    """A mistake in a config file or in the overrides (names the key, the value and the fix)."""


def config_keys(cfg, prefix: str = "") -> List[str]:
    """Every leaf key of ``cfg`` as a dotted name (``MODEL.SPARSECLIP.ATTENTION.ALPHA``), in order."""
    from yacs.config import CfgNode

    out = []
    for k, v in cfg.items():
        name = f"{prefix}{k}"
        if isinstance(v, CfgNode):
            out.extend(config_keys(v, name + "."))
        else:
            out.append(name)
    return out


def _lookup(cfg, key: str):
    """``(found, node)``: the value of the dotted ``key``, or the deepest node on its path."""
    from yacs.config import CfgNode

    node = cfg
    for part in key.split("."):
        if isinstance(node, CfgNode) and part in node:
            node = node[part]
        else:
            return False, node
    return True, node


def _unknown_key(cfg, key: str, where: str) -> ConfigError:
    """The error of an unknown ``key``: the closest keys under its deepest existing parent
    (``MODEL.SPARSECLIP.ATTENTION.ALPAH`` -> ``...ALPHA``), else that parent's keys, else
    the closest keys of the whole config."""
    from yacs.config import CfgNode

    parts = key.split(".")
    node, depth = cfg, 0
    while depth < len(parts) and isinstance(node, CfgNode) and parts[depth] in node:
        node, depth = node[parts[depth]], depth + 1
    head = f"unknown config key {key!r}{where}"
    if depth and isinstance(node, CfgNode):
        prefix = ".".join(parts[:depth])
        below = config_keys(node)
        close = nearest(".".join(parts[depth:]), below, n=3, cutoff=0.6, parts=False)
        if close:
            return ConfigError(f"{head}; closest: {', '.join(prefix + '.' + c for c in close)}")
        return ConfigError(f"{head}; keys under {prefix}: {', '.join(sorted(node.keys()))}")
    close = nearest(key, config_keys(cfg), n=3, cutoff=0.8, parts=False)
    if close:
        return ConfigError(f"{head}; closest: {', '.join(close)}")
    return ConfigError(f"{head}; top-level keys: {', '.join(sorted(cfg.keys()))} (all keys: the config.yaml a run "
                       "writes)")


_TYPE_MISMATCH = re.compile(r"Type mismatch \((.*?) vs\. (.*?)\) with values \((.*?) vs\. (.*?)\) for config key: (\S+)",
                            re.S)


def _type_name(text: str) -> str:
    m = re.match(r"<class '(\w+)'>", text.strip())
    names = {"float": "a number (float)", "int": "an integer", "str": "a string", "bool": "True or False",
             "tuple": "a tuple such as (\"a\", \"b\")", "list": "a list such as [1, 2]"}
    return names.get(m.group(1), m.group(1)) if m else text


def _explain_merge(e: Exception, where: str, cfg) -> ConfigError:
    """A yacs / detectron2 merge error as a :class:`ConfigError` (``where``: the file or option)."""
    text = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
    m = _TYPE_MISMATCH.search(str(text))
    if m:
        want, _, default, value, key = m.groups()
        return ConfigError(f"{key} = {value}{where} is not {_type_name(want)}; give {_type_name(want)} like the "
                           f"default {default}")
    m = re.search(r"Non-existent (?:config )?key: (\S+)", str(text))
    if m:
        return _unknown_key(cfg, m.group(1), where)
    return ConfigError(f"{one_line(text)}{where}")


def _odd_overrides(cfg, opts: List[str], opts_name: str) -> str:
    """The message of an odd number of overrides, naming the key that lacks its value: the
    first key followed by another key (``ALPHA OUTPUT_DIR out``), else the last item."""
    is_key = [_lookup(cfg, o)[0] for o in opts]
    lone = next((opts[i] for i in range(0, len(opts) - 1, 2) if is_key[i] and is_key[i + 1]), None)
    if lone is None:
        lone = opts[-1]
        why = "is last" if is_key[-1] else "is last; a value with spaces must be quoted"
    else:
        why = f"is followed by the key {opts[opts.index(lone) + 1]!r}"
    return (f"{opts_name}: KEY VALUE pairs expected, got {len(opts)} item{'s' if len(opts) > 1 else ''}: "
            f"{lone!r} has no value (it {why})")


def merge_user_config(cfg, config_file: Optional[str] = None, opts: Sequence = (), *,
                      opts_name: str = "--opts"):
    """:func:`~sparseclip_d2.config.merge_config` with one-line errors.

    Args:
        cfg: the config to merge into (defaults + ``add_sparseclip_config``).
        config_file: a config file or a packaged config name (``None``: none).
        opts: ``[KEY, VALUE, ...]`` overrides, merged after the file.
        opts_name: how the overrides were given, in messages (``--opts``, ``the command line``).
    Raises:
        ConfigError: an unknown key (with the closest keys), an override without its value,
            a value of the wrong type, a malformed file; FileNotFoundError: no such file or
            config name (:func:`sparseclip_d2.model_zoo.resolve_config_file`, which names
            the closest config names).
    """
    from .config import merge_config
    from .model_zoo import resolve_config_file

    if config_file:
        path = resolve_config_file(config_file)
        try:
            merge_config(cfg, path)
        except (KeyError, AssertionError, ValueError) as e:
            raise _explain_merge(e, f" (in {path})", cfg) from None
        except Exception as e:  # a YAML syntax error and the like: name the file
            if type(e).__module__.startswith("yaml"):
                raise ConfigError(f"{path} is not valid YAML: {one_line(e)}") from None
            raise
    opts = [str(o) if not isinstance(o, str) else o for o in opts]
    if len(opts) % 2:
        raise ConfigError(_odd_overrides(cfg, opts, opts_name))
    where = f" (from {opts_name})"
    for key in opts[0::2]:
        if not _lookup(cfg, key)[0]:
            raise _unknown_key(cfg, key, where)
    try:
        merge_config(cfg, None, opts)
    except (KeyError, AssertionError, ValueError) as e:
        raise _explain_merge(e, where, cfg) from None
    return cfg


def default_config():
    """The defaults every config starts from: detectron2's ``get_cfg()`` + ``add_sparseclip_config``."""
    from detectron2.config import get_cfg

    from .config import add_sparseclip_config

    cfg = get_cfg()
    add_sparseclip_config(cfg)
    return cfg


def changed_keys(cfg, defaults=None) -> List[Tuple[str, object]]:
    """``[(key, value)]`` of the leaves of ``cfg`` whose value differs from ``defaults``
    (:func:`default_config` when ``None``), in config order."""
    defaults = default_config() if defaults is None else defaults
    out = []
    for key in config_keys(cfg):
        found, default = _lookup(defaults, key)
        value = _lookup(cfg, key)[1]
        if not found or default != value:
            out.append((key, value))
    return out


def run_summary(cfg, config_file: Optional[str] = None) -> List[str]:
    """What the user chose, for the log: the config, the keys that differ from the defaults
    (the files' and the overrides' together), the weights and the datasets. The method
    (``SparseCLIP.describe``) is logged once the model is built."""
    clip = cfg.MODEL.SPARSECLIP.CLIP
    changed = [f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in changed_keys(cfg)]
    lines = []
    if config_file:
        lines.append(f"config: {config_file}")
    lines.append(f"keys that differ from the defaults ({len(changed)}): {', '.join(changed) or 'none'}")
    lines.append(f"weights: CLIP {clip.NAME}, PRETRAINED {clip.PRETRAINED or 'none'}; device {cfg.MODEL.DEVICE}")
    datasets = list(cfg.DATASETS.TEST)
    lines.append(f"datasets: {', '.join(datasets) or 'none'}"
                 + (f" (first {cfg.TEST.MAX_IMAGES} images each)" if cfg.TEST.MAX_IMAGES > 0 else ""))
    return lines
