"""tools/agreement.py's checks that need no upstream code: the checkout check (marker file, git
HEAD against the cited commit, a folder that is not a git checkout), the inputs' resized sizes, the
upstream config of a project config, and the refusals of the command line."""
import os
import subprocess
import types

import pytest

from sparseclip_d2.benchmarks.agreement import INPUTS, check_checkout, photo, upstream_config_for
from sparseclip_d2.benchmarks.project import rescale_size

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _git(path, *args):
    subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True,
                   env=dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                            GIT_COMMITTER_EMAIL="t@t"))


def _repo(tmp_path):
    repo = tmp_path / "Up"
    repo.mkdir()
    (repo / "segmentor.py").write_text("x = 1\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "one")
    first = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    (repo / "segmentor.py").write_text("x = 2\n")
    _git(repo, "commit", "-qam", "two")
    return repo, first


def test_checkout_at_the_cited_commit_passes_and_another_commit_is_refused(tmp_path):
    repo, first = _repo(tmp_path)
    entry = types.SimpleNamespace(repo="owner/Up", commit=first[:7], marker="segmentor.py")
    with pytest.raises(SystemExit, match=f"HEAD is .* but the agreement rows compare with owner/Up at {first[:7]}; "
                                         f"run: git -C {repo} checkout {first[:7]}"):
        check_checkout("up", str(repo), entry)
    _git(repo, "checkout", "-q", first)
    path, head, note = check_checkout("up", str(repo), entry)
    assert (path, head) == (str(repo), first) and note == f"owner/Up at {first[:12]} (checked)"


def test_a_folder_without_git_is_named_unchecked_and_a_wrong_folder_refused(tmp_path):
    entry = types.SimpleNamespace(repo="owner/Up", commit="abc1234", marker="segmentor.py")
    plain = tmp_path / "export"
    plain.mkdir()
    (plain / "segmentor.py").write_text("")
    path, head, note = check_checkout("up", str(plain), entry)
    assert head is None and "is not a git checkout" in note and "owner/Up at abc1234" in note
    (tmp_path / "other").mkdir()
    with pytest.raises(SystemExit, match="not a checkout of owner/Up .it has no segmentor.py.*git clone "
                                         "https://github.com/owner/Up"):
        check_checkout("up", str(tmp_path / "other"), entry)


def test_inputs_resize_to_the_documented_sizes():
    # mmcv's rule at short side 336, long side <= 2048 (the configs' INPUT.MIN_SIZE_TEST / MAX_SIZE_TEST)
    expected = {"voc": (336, 448), "arc2017": (336, 448), "voc_odd": (336, 451), "voc_wide": (336, 504)}
    for name in INPUTS:
        h, w = photo(name).shape[:2]
        new_w, new_h = rescale_size(h, w, 336, 2048)
        assert (new_h, new_w) == expected[name], name
    assert photo("voc@336x504").shape == (336, 504, 3)
    with pytest.raises(SystemExit, match="unknown input; valid: voc, arc2017, voc_odd, voc_wide or PHOTO@HxW"):
        photo("nope")


def test_upstream_config_of_a_project_config():
    from sparseclip_d2.methods.registry import UPSTREAM

    resclip = UPSTREAM.get("resclip")
    assert upstream_config_for(resclip, "resclip_b16.yaml", "sparseclip_ade20k_val") == "configs/cfg_ade20k.py"
    assert upstream_config_for(resclip, "resclip_b16_coco_stuff.yaml", "x") == "configs/cfg_coco_stuff164k.py"
    assert len(resclip.agreement_configs()) == 8
    for name in resclip.agreement_configs():
        assert os.path.isfile(os.path.join(ROOT, "configs", "baselines", name)), name
    assert "feedback0" in resclip.forcing


def test_command_line_refuses_an_unknown_variant_before_any_work(tmp_path):
    from sparseclip_d2.benchmarks.agreement import main

    with pytest.raises(SystemExit, match="--force nothing: not a stage-forcing variant of resclip; "
                                         "valid: feedback0, prob0"):
        main(["--method", "resclip", "--upstream", str(tmp_path), "--force", "nothing"])


def test_config_files_named_from_the_checkouts_parent_resolve_inside_it(tmp_path):
    """ITACLIP's configs name './ITACLIP/configs/cls_voc21.txt' (run from the checkout's parent):
    the row reads the class file and its auxiliary text file inside the checkout."""
    from sparseclip_d2.benchmarks.agreement import upstream_vocabulary
    from sparseclip_d2.methods.registry import UPSTREAM

    ita = UPSTREAM.get("itaclip")
    assert ita.checkout_path("./ITACLIP/configs/cls_voc21.txt") == os.path.join("configs", "cls_voc21.txt")
    assert ita.checkout_path("configs/cls_voc21.txt") == os.path.join("configs", "cls_voc21.txt")
    assert UPSTREAM.get("resclip").checkout_path("./ITACLIP/x.txt") == os.path.join("ITACLIP", "x.txt")
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "base_config.py").write_text("model = dict(type='S', prob_thd=0.0)\n")
    (tmp_path / "configs" / "cfg_context60.py").write_text(
        "_base_ = './base_config.py'\nname = 'context60'\n"
        "model = dict(name_path=f'./ITACLIP/configs/cls_{name}.txt',\n"
        "             auxiliary_text_path=f'./ITACLIP/llama_generated_texts/{name}_definitions.txt')\n")
    (tmp_path / "configs" / "cls_context60.txt").write_text("background\nplane, aeroplane\n")
    assert upstream_vocabulary(ita, str(tmp_path), "configs/cfg_context60.py") == (
        os.path.join("configs", "cls_context60.txt"), ["background", "plane, aeroplane"])
    from sparseclip_d2.benchmarks.checkouts import upstream_config

    model = upstream_config(str(tmp_path), "configs/cfg_context60.py")
    assert model["prob_thd"] == 0.0
    assert ita.row_opts(str(tmp_path), model) == [
        "MODEL.SPARSECLIP.TEXT.DEFINITIONS", os.path.join(str(tmp_path), "llama_generated_texts",
                                                          "context60_definitions.txt")]
    assert upstream_config_for(ita, "itaclip_b16_cityscapes.yaml", "x") == "configs/cfg_cityscapes.py"
    assert upstream_config_for(ita, "itaclip_b16.yaml", "x") == "configs/cfg_coco_stuff164k.py"


def test_a_dataset_config_names_the_rows_classes_and_short_side(tmp_path):
    """LPOSS's rows: the dataset config's dataset_type picks the CLASSES (synonyms joined by ', '),
    its MultiScaleFlipAug img_scale the short side; a list _base_ and no model dict read as {}."""
    from sparseclip_d2.benchmarks.agreement import upstream_vocabulary
    from sparseclip_d2.benchmarks.checkouts import upstream_config, upstream_short_side
    from sparseclip_d2.methods.registry import UPSTREAM

    lposs = UPSTREAM.get("lposs")
    d = tmp_path / "segmentation" / "configs" / "_base_" / "datasets"
    d.mkdir(parents=True)
    (d.parent / "custom_import.py").write_text("custom_imports = dict(imports=['a'])\n")
    (d / "pascal_context.py").write_text(
        "_base_ = ['../custom_import.py']\ndataset_type = 'PascalContextDataset'\n"
        "test_pipeline = [dict(type='LoadImageFromFile'), dict(type='MultiScaleFlipAug', img_scale=(2048, 448),"
        " transforms=[dict(type='Resize', keep_ratio=True)])]\n"
        "test_cfg = dict(mode='slide', stride=(112, 112), crop_size=(224, 224))\n")
    (tmp_path / "segmentation" / "datasets").mkdir()
    (tmp_path / "segmentation" / "datasets" / "pascal_context.py").write_text(
        "class PascalContextDataset59:\n    CLASSES = ('x',)\n"
        "class PascalContextDataset:\n    CLASSES = ('background', 'sky;clouds', 'cat')\n")
    rel = "segmentation/configs/_base_/datasets/pascal_context.py"
    assert lposs.class_tuple_of(str(tmp_path), rel) == ("segmentation/datasets/pascal_context.py",
                                                        "PascalContextDataset")
    assert upstream_vocabulary(lposs, str(tmp_path), rel) == ("", ["background", "sky, clouds", "cat"])
    assert upstream_short_side(str(tmp_path), rel) == 448
    assert upstream_config(str(tmp_path), rel) == {}
    assert lposs.dataset_config(str(tmp_path), rel)["test_cfg"]["stride"] == (112, 112)
    assert upstream_config_for(lposs, "lposs_plus_b16_context60.yaml", "x") == rel
    assert lposs.config_settings["lposs_plus_b16_context60.yaml"] == {"model_config": "configs/lposs_plus.yaml"}
    (d / "odd.py").write_text("dataset_type = 'Nope'\n")
    with pytest.raises(SystemExit, match="dataset_type 'Nope' has no class file"):
        lposs.class_tuple_of(str(tmp_path), "segmentation/configs/_base_/datasets/odd.py")
    for name in lposs.agreement_configs():
        assert os.path.isfile(os.path.join(ROOT, "configs", "baselines", name)), name
