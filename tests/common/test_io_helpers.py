"""The helpers that exist once: atomic writes (``common/io.py``), the channel-order check
(``data/image_io.py``) and the datasets root (``data/datasets/root.py``)."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from sparseclip_d2.common.io import atomic_path, atomic_write_text

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def test_atomic_path_replaces_only_on_success(tmp_path):
    path = tmp_path / "sub" / "mask.png"
    with atomic_path(str(path)) as tmp:
        assert os.path.dirname(tmp) == str(path.parent) and os.path.basename(tmp).startswith(".mask.png.")
        Image.fromarray(np.full((2, 3), 7, np.uint8)).save(tmp, format="PNG")
        assert not path.exists()  # nothing at the final name before the block ends
    assert np.array(Image.open(path)).tolist() == [[7, 7, 7], [7, 7, 7]]
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_path(str(path)) as tmp:
            Image.fromarray(np.zeros((2, 3), np.uint8)).save(tmp, format="PNG")
            raise RuntimeError("boom")
    assert np.array(Image.open(path)).max() == 7  # the old file survives a failed write
    assert os.listdir(path.parent) == ["mask.png"]  # and no temporary file is left


def test_atomic_write_text_keeps_newlines_as_given(tmp_path):
    path = str(tmp_path / "t.txt")
    atomic_write_text(path, "a\r\nb\n")
    with open(path, "rb") as f:
        assert f.read() == b"a\r\nb\n"


def test_demo_files_are_written_through_atomic_path():
    import inspect

    from sparseclip_d2.data.datasets import demo

    assert "atomic_path" in inspect.getsource(demo._save_atomic)
    assert "mkstemp" not in inspect.getsource(demo) and "os.replace" not in inspect.getsource(demo)


def test_one_channel_order_check():
    from sparseclip_d2.data.image_io import check_input_format, convert_channel_order

    assert check_input_format("BGR") == "BGR"
    with pytest.raises(ValueError, match=r"INPUT.FORMAT = 'BGRA' is invalid; valid: RGB, BGR"):
        check_input_format("BGRA")
    with pytest.raises(ValueError, match=r"FOO = 'rgb' is invalid"):
        check_input_format("rgb", "FOO")
    img = np.arange(2 * 2 * 3, dtype=np.uint8).reshape(2, 2, 3)
    assert convert_channel_order(img, "RGB", "RGB") is img
    out = convert_channel_order(img, "RGB", "BGR")
    assert out.flags["C_CONTIGUOUS"] and out[0, 0].tolist() == [2, 1, 0] and out[1, 1].tolist() == [11, 10, 9]
    with pytest.raises(ValueError, match=r"\(H, W, 3\)"):
        convert_channel_order(img[:, :, 0], "RGB", "BGR")


@pytest.mark.parametrize("module", ["sparseclip_d2.data.mapper", "sparseclip_d2.data.fgovd_mapper"])
def test_mappers_use_the_one_check(module):
    import importlib
    import inspect

    src = inspect.getsource(importlib.import_module(module))
    assert '("RGB", "BGR")' not in src and "[:, :, ::-1]" not in src


def test_datasets_root_is_read_in_one_place(tmp_path):
    code = "from sparseclip_d2.data.datasets.root import datasets_root; print(datasets_root())"
    for env, expected in (({"DETECTRON2_DATASETS": "~/d2data"}, os.path.expanduser("~/d2data")), ({}, "datasets")):
        e = {k: v for k, v in os.environ.items() if k != "DETECTRON2_DATASETS"}
        e.update(env)
        out = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.strip().splitlines()[-1] == expected
    readers = []
    for folder in ("sparseclip_d2/data", "sparseclip_d2/evaluation", "sparseclip_d2/prepare", "tools/prepare_datasets.py"):
        path = os.path.join(ROOT, folder)
        files = [path] if path.endswith(".py") else [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs
                                                      if f.endswith(".py")]
        for f in files:
            if re.search(r"getenv\(\s*[\"']DETECTRON2_DATASETS|environ\.get\(\s*[\"']DETECTRON2_DATASETS",
                         open(f).read()):
                readers.append(os.path.relpath(f, ROOT))
    assert readers == [os.path.join("sparseclip_d2", "data", "datasets", "root.py")]
