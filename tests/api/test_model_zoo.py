"""Config names and paths (``sparseclip_d2.model_zoo``), as ``--config-file`` and
``Predictor.from_config`` resolve them."""
import os

import pytest

from sparseclip_d2 import model_zoo

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_packaged_name_with_a_folder_resolves_from_any_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no baselines/ folder here: the name is a packaged config
    want = os.path.join(REPO, "configs", "baselines", "sclip_b16.yaml")
    assert os.path.samefile(model_zoo.resolve_config_file("baselines/sclip_b16"), want)
    assert os.path.samefile(model_zoo.resolve_config_file("baselines/sclip_b16.yaml"), want)
    assert os.path.samefile(model_zoo.resolve_config_file("configs/baselines/sclip_b16.yaml"), want)


def test_an_existing_file_is_itself_and_a_missing_one_names_its_folder(tmp_path):
    own = tmp_path / "mine.yaml"
    own.write_text("_BASE_: x\n")
    assert model_zoo.resolve_config_file(str(own)) == str(own)
    missing = str(tmp_path / "nowhere" / "sclip_b16.yaml")
    with pytest.raises(FileNotFoundError, match=r"config file not found: .*nowhere.*\(no folder .*nowhere'\)"):
        model_zoo.resolve_config_file(missing)
    with pytest.raises(FileNotFoundError, match=r"closest: baselines/sclip_b16"):
        model_zoo.resolve_config_file("baselines/sclip_b61")
