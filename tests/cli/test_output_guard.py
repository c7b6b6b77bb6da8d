"""Guarded output folders (lock + manifest), --skip-bad and hidden files in the demo
; the lock across processes for train_net is in test_resume.py."""
import json
import logging
import os

import numpy as np
import pytest
from PIL import Image

from sparseclip_d2.common.outputs import MANIFEST_FILE, OutputFolder, OutputFolderBusy, OutputFolderError
from sparseclip_d2.data.image_io import ImageReadError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["MODEL.SPARSECLIP.CLIP.NAME", "sparseclip-tiny-vit", "MODEL.SPARSECLIP.CLIP.PRETRAINED", "none",
        "MODEL.SPARSECLIP.TEXT.CACHE_DIR", "off", "INPUT.MIN_SIZE_TEST", "64", "MODEL.DEVICE", "cpu"]


@pytest.fixture(scope="module")
def demo():
    import sparseclip_d2.cli.demo as module

    return module


def photo(path, seed=0):
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(path)
    return str(path)


def run(demo, inputs, out, classes, *extra):
    return demo.main(["--input", *inputs, "--classes", classes, "--output", str(out), *extra, "--opts", *TINY])


def test_rerun_with_another_vocabulary_leaves_no_stale_outputs(demo, tmp_path):
    a, b = photo(tmp_path / "a.png", 0), photo(tmp_path / "b.png", 1)
    out = tmp_path / "out"
    run(demo, [a, b], out, "cat, dog")
    assert (out / "b_labels.png").exists() and (out / "results.json").exists()
    (out / "my_notes.txt").write_text("mine")  # not the demo's: never touched
    run(demo, [a], out, "sky, grass, road")
    assert not (out / "b_labels.png").exists() and not (out / "b_overlay.png").exists()
    assert (out / "a_labels.png").exists() and (out / "my_notes.txt").read_text() == "mine"
    assert (out / "classes.txt").read_text().splitlines() == ["0\tsky", "1\tgrass", "2\troad"]
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    assert sorted(manifest["files"]) == ["a_labels.png", "a_overlay.png", "classes.txt", "results.json"]
    assert manifest["run"]["vocabulary"] == ["sky", "grass", "road"]


def test_folder_with_outputs_but_no_manifest_is_refused(demo, tmp_path):
    a = photo(tmp_path / "a.png")
    out = tmp_path / "old_run"
    out.mkdir()
    (out / "x_labels.png").write_bytes(b"")  # written by a version without manifests
    with pytest.raises(OutputFolderError, match="x_labels.png"):
        run(demo, [a], out, "cat, dog")
    assert sorted(os.listdir(out)) == [".sparseclip.lock", "x_labels.png"]


def test_busy_output_folder_is_refused_at_once(demo, tmp_path):
    a = photo(tmp_path / "a.png")
    out = tmp_path / "out"
    with OutputFolder(str(out), "a demo still running"):
        with pytest.raises(OutputFolderBusy, match="a demo still running"):
            run(demo, [a], out, "cat, dog")
        with pytest.raises(OutputFolderBusy):  # a second lock object, as a second process would hold
            OutputFolder(str(out), "x").acquire()
    OutputFolder(str(out), "x").acquire().release()  # free again once the holder let go


def test_skip_bad_and_hidden_files(demo, tmp_path, caplog):
    inputs = tmp_path / "photos"
    inputs.mkdir()
    photo(inputs / "good.png")
    (inputs / "bad.png").write_bytes(b"not a png" * 10)
    (inputs / "._good.png").write_bytes(b"\x00\x05\x16\x07 AppleDouble")  # macOS resource fork
    (inputs / ".hidden.png").write_bytes(b"junk")
    with pytest.raises(ImageReadError, match="bad.png"):  # first unreadable file stops, named
        run(demo, [str(inputs)], tmp_path / "strict", "cat, dog")
    with caplog.at_level(logging.WARNING):
        written = run(demo, [str(inputs)], tmp_path / "lenient", "cat, dog", "--skip-bad")
    assert list(written) == [str(inputs / "good.png")]
    results = json.loads((tmp_path / "lenient" / "results.json").read_text())
    assert [s["file"] for s in results["skipped"]] == [str(inputs / "bad.png")]
    assert "bad.png" in results["skipped"][0]["error"]
    assert any("skipped 1 of 2 input(s) (--skip-bad)" in r.getMessage() for r in caplog.records)
    assert (tmp_path / "lenient" / "good_labels.png").exists()


def test_manifest_unit(tmp_path):
    folder = OutputFolder(str(tmp_path / "o"), "tool")
    with pytest.raises(RuntimeError, match="acquire"):
        folder.begin({})
    folder.acquire()
    folder.begin({"n": 1})
    (tmp_path / "o" / "f1").write_text("1")
    (tmp_path / "o" / "f2").write_text("2")
    folder.record([str(tmp_path / "o" / "f1"), str(tmp_path / "o" / "f2")])
    with pytest.raises(ValueError, match="outside"):
        folder.record([str(tmp_path / "elsewhere")])
    removed = folder.begin({"n": 2}, keep=[str(tmp_path / "o" / "f2")])
    assert removed == [str(tmp_path / "o" / "f1")] and (tmp_path / "o" / "f2").exists()
    folder.release()
    (tmp_path / "o" / MANIFEST_FILE).write_text("{broken")
    with pytest.raises(OutputFolderError, match="unreadable"):
        OutputFolder(str(tmp_path / "o"), "tool").acquire().begin({})
