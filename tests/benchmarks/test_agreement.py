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


@pytest.mark.parametrize("method", ["proxyclip", "trident", "fsa", "corrclip", "cass"])
def test_each_declared_row_compares_the_project_dataset_with_its_own_upstream_config(method):
    # the explicit mapping of every row agrees with the mapping read from the project config's own
    # test dataset (configs/cfg_<dataset>.py, COCO-Stuff and Cityscapes spelt their way); prob0 forces
    # the probability threshold to 0 on both sides
    from sparseclip_d2.benchmarks.project import project_cfg
    from sparseclip_d2.methods.registry import UPSTREAM, UpstreamEntry

    e = UPSTREAM.get(method)
    spelt = {"cityscapes": "configs/cfg_city_scapes.py", "coco_stuff": "configs/cfg_coco_stuff164k.py"}
    assert len(e.agreement_configs()) >= 6
    for name in e.agreement_configs():
        dataset = project_cfg(name, []).DATASETS.TEST[0]
        short = dataset[len("sparseclip_"):-len("_val")]
        assert e.configs[name] == spelt.get(short, f"configs/cfg_{short}.py"), (name, dataset)
        assert upstream_config_for(e, name, dataset) == e.configs[name]
    overrides, settings = e.forcing["prob0"]
    assert list(overrides) == ["MODEL.SPARSECLIP.PROB_THRESHOLD", "0.0"] and settings == {"prob_thd": 0.0}
    assert UpstreamEntry.input_opts(None, "unused") == []


def test_a_region_mask_row_writes_the_mask_of_its_own_input(tmp_path):
    # CorrCLIP's region mask of a row is the partition of that row's (cropped) photo, where the upstream
    # worker reads it (<row folder>/masks/<stem of photo.png>.npz) and the project side's MASK_DIR points
    import numpy as np

    from sparseclip_d2.methods.registry import UPSTREAM

    rgb = np.zeros((50, 100, 3), np.uint8)
    rgb[:, :, 0] = 200  # left cell (48 px) bright red: luma 0.299 * 200 = 59.8 < 128, spread 200 >= 16
    rgb[:, 48:96] = 255  # middle cell white: luma 255 >= 128 but spread 0 < 16 -> region 0 (unsegmented)
    rgb[:, 96:] = (0, 255, 0)  # right cell green: luma 0.587 * 255 = 149.7 >= 128, spread 255
    opts = UPSTREAM.get("corrclip").input_opts(rgb, str(tmp_path))
    assert opts == ["MODEL.SPARSECLIP.PROXY.CORRCLIP.MASK_DIR", str(tmp_path / "masks")]
    mask = np.load(tmp_path / "masks" / "photo.npz")["instance_mask"]
    # 1 + 2 * cell index + (luma >= 128); cells row-major: row 0 holds cells 0, 1, 2 and row 1 (y >= 48) 3, 4, 5
    expected = np.zeros((50, 100), np.int64)
    expected[:48, :48], expected[:48, 96:] = 1, 1 + 2 * 2 + 1
    expected[48:, :48], expected[48:, 96:] = 1 + 2 * 3, 1 + 2 * 5 + 1
    np.testing.assert_array_equal(mask, expected)


def test_the_project_side_reads_the_published_list_of_its_class_names_set():
    # ProxyCLIP's COCO-Object file names "bed" twice (in the background's synonyms and as class 60,
    # mc-lan/ProxyCLIP @ e7b767f configs/cls_coco_object.txt): the driver feeds the project side the
    # dataset (its evaluation path, the published list kept) when the set's file equals upstream's;
    # a config without a set has no such list
    from sparseclip_d2.benchmarks.agreement import project_class_names
    from sparseclip_d2.benchmarks.project import project_cfg

    cfg = project_cfg("proxyclip_b16_coco_object.yaml", [])
    names = project_class_names(cfg, cfg.DATASETS.TEST[0])
    assert len(names) == 81 and names[60] == "bed" and "bed" in names[0].split(", ")
    plain = project_cfg("proxyclip_b16_coco_object.yaml", ["MODEL.SPARSECLIP.CLASS_NAMES", ""])
    assert project_class_names(plain, plain.DATASETS.TEST[0]) is None
