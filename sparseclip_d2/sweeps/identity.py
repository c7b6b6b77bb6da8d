"""Run identity: what a run's result depends on, hashed into its run key.

The key (:func:`run_key`) covers the fully merged config, the dataset root, the data found
(per dataset: image count, a checksum of the file list and a checksum of the files' contents,
:func:`dataset_identity`), the package version and code, the library versions and the
weights. A resumed sweep skips a run only when a record with the same key says ``ok``, so a
mask regenerated under the same name, a code change or another checkpoint re-runs it.

File contents are hashed once: :class:`ContentHashes` caches ``path -> (size, mtime_ns,
sha256)`` in a JSON file inside the sweep's output folder, and re-reads a file only when its
size or modification time changed.
"""
import hashlib
import json
import logging
import os
from typing import Any, Dict, Optional

import yaml

from ..common.io import atomic_write_json

__all__ = ["ContentHashes", "HASH_CACHE_FILE", "dataset_identity", "environment_identity", "weights_identity",
           "datasets_root", "run_key", "file_sha256", "python_code", "code_fingerprint"]

logger = logging.getLogger(__name__)

#: The content-hash cache inside a sweep's output folder.
HASH_CACHE_FILE = "data_hashes.json"
# Folders of the package whose code cannot change a result (the tools' helpers).
_NOT_RESULT_CODE = ("analysis", "sweeps", "__pycache__")


def file_sha256(path: str) -> str:
    """sha256 of a file's bytes (16 hex digits)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


class ContentHashes:
    """sha256 of files' contents, cached by ``(size, mtime_ns)``.

    Args:
        cache_path: the JSON cache file (``<sweep output>/data_hashes.json``); None = in
            memory only. The cache holds only facts about files (no code), so checkouts with
            different code may share it.
    """

    def __init__(self, cache_path: Optional[str] = None):
        self.cache_path = cache_path
        self._entries: Dict[str, list] = {}
        self._dirty = False
        if cache_path and os.path.isfile(cache_path):
            try:
                with open(cache_path) as f:
                    self._entries = dict(json.load(f))
            except (OSError, ValueError, TypeError):
                logger.warning("%s is not a valid hash cache; every file is hashed again", cache_path)
        self.hashed = 0  # files read (not served from the cache) by this instance

    def sha256(self, path: str) -> str:
        """The content hash of ``path`` (re-read only when its size or mtime changed)."""
        path = os.path.abspath(path)
        st = os.stat(path)
        entry = self._entries.get(path)
        if entry is not None and entry[0] == st.st_size and entry[1] == st.st_mtime_ns:
            return entry[2]
        digest = file_sha256(path)
        self.hashed += 1
        self._entries[path] = [st.st_size, st.st_mtime_ns, digest]
        self._dirty = True
        return digest

    def save(self) -> None:
        """Write the cache (atomically) when it changed."""
        if self.cache_path and self._dirty:
            atomic_write_json(self.cache_path, self._entries, indent=0)
            self._dirty = False


def _dataset_files(d: Dict[str, Any]):
    return [d[k] for k in ("file_name", "sem_seg_file_name") if d.get(k)]


def dataset_identity(name: str, hashes: Optional[ContentHashes] = None) -> Dict[str, Any]:
    """What a dataset resolves to on this machine: ``{"num_images", "files_sha256",
    "contents_sha256"}``: the sha256 of the sorted image and annotation paths of its dataset
    dicts, and of those files' contents (an FG-OVD benchmark's json file included). Raises
    what the dataset's loader raises when its files are missing."""
    from detectron2.data import DatasetCatalog, MetadataCatalog

    hashes = hashes or ContentHashes()
    dicts = DatasetCatalog.get(name)
    names, contents = hashlib.sha256(), hashlib.sha256()
    files = sorted(f"{d.get('file_name', '')}\t{d.get('sem_seg_file_name', '')}" for d in dicts)
    for f in files:
        names.update(f.encode("utf-8", "surrogateescape") + b"\n")
    paths = sorted({p for d in dicts for p in _dataset_files(d)})
    json_file = MetadataCatalog.get(name).get("json_file", None)
    if json_file and os.path.isfile(json_file):
        paths.append(json_file)
    for p in paths:
        contents.update(p.encode("utf-8", "surrogateescape") + b"\0" + hashes.sha256(p).encode() + b"\n")
    return {"num_images": len(dicts), "files_sha256": names.hexdigest()[:16],
            "contents_sha256": contents.hexdigest()[:16]}


def python_code(path: str) -> bytes:
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


def code_fingerprint() -> str:
    """sha256 of the package's code that can change a result: every file but ``analysis/``
    and ``sweeps/``; Python files by their AST, so comments, docstrings and formatting do
    not count."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _NOT_RESULT_CODE)
        for fn in sorted(filenames):
            if fn.endswith((".py", ".cpp", ".txt", ".csv")):
                path = os.path.join(dirpath, fn)
                h.update(os.path.relpath(path, root).encode() + b"\0")
                if fn.endswith(".py"):
                    h.update(python_code(path))
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
    return {"sparseclip_d2": own, "code": code_fingerprint(), "torch": torch.__version__,
            "open_clip": getattr(open_clip, "__version__", "?"), "detectron2": detectron2.__version__}


def weights_identity(cfg, memo: Dict[str, str]) -> str:
    """``file:<sha256>`` of a local checkpoint, else ``tag:<PRETRAINED>``."""
    pretrained = str(cfg.MODEL.SPARSECLIP.CLIP.PRETRAINED)
    path = os.path.expanduser(pretrained)
    if os.path.isfile(path):
        if path not in memo:
            memo[path] = "file:" + file_sha256(path)
        return memo[path]
    return "tag:" + pretrained  # an open_clip tag (with open_clip's version) or "none" (seeded random)


def datasets_root() -> str:
    """``$DETECTRON2_DATASETS`` (default ``datasets``), absolute."""
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
