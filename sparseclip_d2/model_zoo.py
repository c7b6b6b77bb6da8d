"""Find the packaged configs by name, the way detectron2's ``model_zoo.get_config_file`` does.

An installed wheel carries the repository's ``configs/`` tree as ``sparseclip_d2/configs``
(copied at build time by ``setup.py``); a source checkout (editable install) reads the
``configs/`` folder beside the package. Names are paths below that folder without
``.yaml``: ``entmax_qq_l14``, ``baselines/sclip_b16``, ``paper/l14_qqv_entmax1.2``.
``_BASE_`` references inside the files are relative, so they resolve in either place.
Standard library only.
"""
import difflib
import os
from typing import List

__all__ = ["config_dir", "list_configs", "get_config_file", "resolve_config_file"]

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def config_dir() -> str:
    """The folder holding the configs: the packaged copy when installed, else the
    checkout's ``configs/``. Raises FileNotFoundError when neither exists."""
    for candidate in (os.path.join(_PACKAGE_DIR, "configs"), os.path.join(os.path.dirname(_PACKAGE_DIR), "configs")):
        if os.path.isfile(os.path.join(candidate, "Base-SparseCLIP.yaml")):
            return candidate
    raise FileNotFoundError(
        f"no sparseclip_d2 configs found (looked for {os.path.join(_PACKAGE_DIR, 'configs')} and the checkout's "
        "configs/); reinstall the package (pip install .) or pass a config file path")


def list_configs() -> List[str]:
    """Every config name (``baselines/sclip_b16``, ...), sorted; sweep files excluded."""
    root = config_dir()
    names = []
    for folder, _, files in os.walk(root):
        for f in files:
            if f.endswith(".yaml"):
                rel = os.path.relpath(os.path.join(folder, f), root)[:-len(".yaml")]
                if not rel.startswith("sweeps" + os.sep):
                    names.append(rel.replace(os.sep, "/"))
    return sorted(names)


def get_config_file(name: str) -> str:
    """The path of the packaged config ``name`` (``entmax_qq_l14``, ``baselines/sclip_b16``,
    with or without ``.yaml``, with or without a leading ``configs/``).

    Raises:
        FileNotFoundError: naming the closest config names and how to list them all.
    """
    key = str(name).strip().replace("\\", "/")
    if key.startswith("configs/"):
        key = key[len("configs/"):]
    if key.endswith(".yaml"):
        key = key[:-len(".yaml")]
    path = os.path.join(config_dir(), *key.split("/")) + ".yaml"
    if key and os.path.isfile(path):
        return path
    names = list_configs()
    close = difflib.get_close_matches(key, names, n=5, cutoff=0.4)
    raise FileNotFoundError(
        f"no sparseclip_d2 config named {name!r}; "
        + (f"closest: {', '.join(close)}; " if close else "")
        + f"{len(names)} configs in {config_dir()} (python -c 'import sparseclip_d2.model_zoo as z; "
        "print(*z.list_configs(), sep=chr(10))')")


def resolve_config_file(value: str) -> str:
    """``value`` itself when it is an existing file, else :func:`get_config_file` of it."""
    path = os.path.expanduser(str(value))
    if os.path.isfile(path):
        return path
    try:
        return get_config_file(value)  # a packaged name, also one with a folder (baselines/sclip_b16)
    except FileNotFoundError as e:
        folder = os.path.dirname(path)
        if folder and not os.path.isdir(folder):
            raise FileNotFoundError(f"config file not found: {value!r} (no folder {folder!r}), and {e}") from None
        raise FileNotFoundError(f"config file not found: {value!r}, and {e}") from None
