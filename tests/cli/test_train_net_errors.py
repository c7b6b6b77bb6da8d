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
    (["--config-file", "configs/demo.yaml", "MODEL.SPARSECLIP.NOT_A_KEY", "1"], "config:",
     "unknown config key 'MODEL.SPARSECLIP.NOT_A_KEY' (from the command-line overrides); keys under MODEL.SPARSECLIP: "),
    (["--config-file", "demo", "MODEL.SPARSECLIP.ATTENTION.ALPAH", "1.3"], "config:",
     "unknown config key 'MODEL.SPARSECLIP.ATTENTION.ALPAH' (from the command-line overrides); "
     "closest: MODEL.SPARSECLIP.ATTENTION.ALPHA"),
    (["--config-file", "demo", "MODEL.SPARSECLIP.ATTENTION.ALPHA"], "config:",  # OUTPUT_DIR out follows: 3 items
     "the command-line overrides: KEY VALUE pairs expected, got 3 items: 'MODEL.SPARSECLIP.ATTENTION.ALPHA' has no "
     "value (it is followed by the key 'OUTPUT_DIR')"),
    (["--config-file", "configs/no_such.yaml"], "config:", "no_such.yaml"),
    (["--config-file", "configs/demo.yaml", "MODEL.SPARSECLIP.LOGIT_SCALE", "abc"], "config:",
     "MODEL.SPARSECLIP.LOGIT_SCALE = abc (from the command-line overrides) is not a number (float)"),
    (["--config-file", "configs/demo.yaml", "DATASETS.TEST", "('nope_val',)"], "data:",
     "unknown dataset 'nope_val' in DATASETS.TEST; "),
    (["--config-file", "configs/demo.yaml", "DATASETS.TEST", "('sparseclip_voc21_vall',)"], "data:",
     "unknown dataset 'sparseclip_voc21_vall' in DATASETS.TEST; closest: sparseclip_voc21_val, "),
    (["--config-file", "configs/demo.yaml", *TINY, "MODEL.SPARSECLIP.CLIP.PRETRAINED", "/no/such/weights.pt"],
     "model:", "/no/such/weights.pt"),
])
def test_user_mistakes_one_line(tmp_path, args, prefix, text):
    line = _one_error_line(_run(args, tmp_path), prefix)
    assert text in line
    assert not (tmp_path / "out" / "results.json").exists()
    if "unknown dataset" in line:  # ours listed, detectron2's counted
        assert "sparseclip_d2's: sparseclip_ade20k_val" in line and "detectron2 builtins" in line
        assert "coco_2017_train" not in line


def test_unwritable_output_dir_names_the_key(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "train_net.py"), "--eval-only",
                           "--config-file", "demo", "OUTPUT_DIR", "/proc/sparseclip_no_such_dir"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    line = _one_error_line(proc, "output:")
    assert "cannot write the output folder '/proc/sparseclip_no_such_dir' (OUTPUT_DIR)" in line
    assert line.endswith("choose a folder you can write to with OUTPUT_DIR DIR")


def test_ctrl_c_is_one_line_saying_how_to_resume(tmp_path, monkeypatch, capsys):
    """Ctrl-C (a KeyboardInterrupt out of the run) prints one line and exits 130; with a
    per-image checkpoint on disk the line says that a rerun resumes from it."""
    from sparseclip_d2.common.outputs import OutputFolder

    tn = _train_net()
    monkeypatch.setattr(tn, "_OUTPUT_FOLDER", None)

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(tn, "main", interrupted)
    with pytest.raises(SystemExit) as e:
        tn.run(None)
    assert e.value.code == 130
    assert capsys.readouterr().err == ("train_net.py: interrupted: no image was finished yet; run the same command "
                                       "again to start over\n")
    folder = OutputFolder(str(tmp_path / "out"), "test")
    checkpoint = tmp_path / "out" / "inference" / "sparseclip_demo" / "checkpoint"
    checkpoint.mkdir(parents=True)
    (checkpoint / "key.json").write_text("{}")
    monkeypatch.setattr(tn, "_OUTPUT_FOLDER", folder)
    with pytest.raises(SystemExit):
        tn.run(None)
    assert "no image was finished yet" in capsys.readouterr().err  # the key alone is no image
    for i in range(2):  # two images recorded, as evaluation/checkpoint.py names them
        (checkpoint / f"{i:08d}.pt").write_bytes(b"")
    with pytest.raises(SystemExit):
        tn.run(None)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"2 evaluated image(s) are kept in {tmp_path / 'out' / 'inference' / '*' / 'checkpoint'}" in err
    assert "run the same command again to resume from there (--restart starts from image 0)" in err


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
