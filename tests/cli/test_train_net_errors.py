"""tools/train_net.py: user mistakes (config, data, weights) end with one ``error:`` line and
exit status 2; anything else keeps its traceback."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TINY = ["MODEL.SPARSECLIP.CLIP.NAME", "sparseclip-tiny-vit", "MODEL.SPARSECLIP.TEXT.CACHE_DIR", "off",
        "DATALOADER.NUM_WORKERS", "0"]


def _train_net():
    import sparseclip_d2.cli.train_net as module

    return module


def test_user_errors_marks_only_the_listed_types():
    tn = _train_net()

    def raised(stage, types, exc):
        with pytest.raises(type(exc)) as info:  # the exception propagates unchanged
            with tn.user_errors(stage, types):
                raise exc
        return tn.user_mistake(info.value)

    assert raised("config", tn.CONFIG_ERRORS, KeyError("no such key 'X'")) == "config: no such key 'X'"
    assert raised("model", tn.MODEL_ERRORS, RuntimeError("line one\nline two")) == "model: line one line two"
    assert raised("model", tn.MODEL_ERRORS, TypeError("unsupported operand")) is None  # a bug
    assert raised("data", tn.INFERENCE_ERRORS, ValueError("shape mismatch")) is None  # not a data error


def _run(args, tmp_path, env=None):
    return subprocess.run([sys.executable, os.path.join(ROOT, "tools", "train_net.py"), "--eval-only", *args,
                           "OUTPUT_DIR", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True,
                          timeout=1800, env=dict(os.environ, **(env or {})))


def _one_error_line(proc, prefix):
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith(f"train_net.py: error: {prefix}"), errors
    return errors[0]


@pytest.mark.parametrize("args, prefix, text", [
    (["--config-file", "configs/demo.yaml", "MODEL.SPARSECLIP.NOT_A_KEY", "1"], "config:", "NOT_A_KEY"),
    (["--config-file", "configs/no_such.yaml"], "config:", "no_such.yaml"),
    (["--config-file", "configs/demo.yaml", "MODEL.SPARSECLIP.LOGIT_SCALE", "abc"], "config:", "LOGIT_SCALE"),
    (["--config-file", "configs/demo.yaml", "DATASETS.TEST", "('nope_val',)"], "data:", "'nope_val' is not registered"),
    (["--config-file", "configs/demo.yaml", *TINY, "MODEL.SPARSECLIP.CLIP.PRETRAINED", "/no/such/weights.pt"],
     "model:", "/no/such/weights.pt"),
])
def test_user_mistakes_one_line(tmp_path, args, prefix, text):
    line = _one_error_line(_run(args, tmp_path), prefix)
    assert text in line
    assert not (tmp_path / "out" / "results.json").exists()


def test_traceback_on_request(tmp_path):
    proc = _run(["--config-file", "configs/demo.yaml", "MODEL.SPARSECLIP.NOT_A_KEY", "1"], tmp_path,
                env={"SPARSECLIP_TRACEBACK": "1"})
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "NOT_A_KEY" in proc.stderr


def test_error_json_keeps_the_original_exception(tmp_path):
    import json

    proc = _run(["--config-file", "configs/demo.yaml", *TINY, "MODEL.SPARSECLIP.CLIP.PRECISION", "fp8"], tmp_path)
    _one_error_line(proc, "model:")
    err = json.loads((tmp_path / "out" / "error.json").read_text())
    assert err["type"] == "ValueError" and "fp8" in err["message"] and err["traceback"].startswith("Traceback")
