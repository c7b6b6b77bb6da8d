"""scripts/setup.sh refuses a venv whose editable install belongs to another checkout
. Built on tiny fake venvs (``python -m venv --without-pip`` + a ``.pth``
line), never the real one."""
import os
import subprocess
import sys
import sysconfig

import pytest

ROOT = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
CHECK = os.path.join(ROOT, "scripts", "check_venv_binding.py")


def fake_venv(tmp_path, bound_to=None):
    """A venv without pip whose site-packages holds a .pth putting ``bound_to`` on sys.path
    (so ``sparseclip_d2`` resolves to ``bound_to/sparseclip_d2``, as an editable install does)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   capture_output=True, timeout=300)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    if bound_to is not None:
        with open(os.path.join(site, "fake_editable.pth"), "w") as f:
            f.write(str(bound_to) + "\n")
    return venv, py


def other_checkout(tmp_path):
    other = tmp_path / "first_clone"
    (other / "sparseclip_d2").mkdir(parents=True)
    (other / "sparseclip_d2" / "__init__.py").write_text("")
    return other


def check(py, env_extra=None):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(py), CHECK, ROOT], capture_output=True, text=True, timeout=120,
                          env=dict(env, **(env_extra or {})), cwd="/")


def test_venv_bound_to_another_checkout_is_named(tmp_path):
    other = other_checkout(tmp_path)
    venv, py = fake_venv(tmp_path, bound_to=other)
    res = check(py)
    assert res.returncode == 3, res.stderr
    msg = res.stderr
    assert str(other / "sparseclip_d2") in msg and os.path.join(ROOT, "sparseclip_d2") in msg
    assert "SPARSECLIP_REBIND=1" in msg and f"PYTHONPATH={ROOT}" in msg and str(venv) in msg


def test_venv_of_this_checkout_or_empty_passes(tmp_path):
    _, py = fake_venv(tmp_path / "mine", bound_to=ROOT)
    res = check(py)
    assert res.returncode == 0 and "this checkout's" in res.stdout, res.stderr
    _, py = fake_venv(tmp_path / "empty")
    res = check(py)
    assert res.returncode == 0 and "not installed" in res.stdout, res.stderr


def test_setup_refuses_before_installing_anything(tmp_path):
    other = other_checkout(tmp_path)
    venv, _ = fake_venv(tmp_path, bound_to=other)
    res = subprocess.run(["bash", os.path.join(ROOT, "scripts", "setup.sh")], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, SPARSECLIP_VENV=str(venv), PYTHONPATH=ROOT))
    assert res.returncode == 1
    errors = [line for line in res.stderr.splitlines() if line.startswith("[setup] ERROR:")]
    assert len(errors) == 1 and str(other / "sparseclip_d2") in errors[0], res.stderr
    assert "installing" not in res.stdout and "up to date" not in res.stdout
    assert not (venv / ".sparseclip_setup_stamp").exists()
