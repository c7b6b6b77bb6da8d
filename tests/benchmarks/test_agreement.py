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


def test_record_returns_records_each_call_and_returns_what_the_original_returned():
    from scipy.optimize import linear_sum_assignment

    from sparseclip_d2.benchmarks import upstream as up
    from sparseclip_d2.methods.cass.upstream import CASSUpstream

    module = types.SimpleNamespace(linear_sum_assignment=linear_sum_assignment)
    saved = dict(up.RECORDED)
    up.RECORDED.clear()
    try:
        up.record_returns(module, "linear_sum_assignment", "assignment", CASSUpstream._assignment)
        cost = [[4.0, 1.0, 3.0], [2.0, 0.0, 5.0], [3.0, 2.0, 2.0]]  # unique minimiser (1, 0, 2): 1 + 2 + 2
        rows, cols = module.linear_sum_assignment(cost)
        assert list(rows) == [0, 1, 2] and list(cols) == [1, 0, 2]
        module.linear_sum_assignment([[0.0, 1.0], [1.0, 0.0]])
        assert up.RECORDED == {"assignment": [{"cols": [1, 0, 2], "cost": cost},
                                              {"cols": [0, 1], "cost": [[0.0, 1.0], [1.0, 0.0]]}]}

        class Block:  # a state recorded before each call (the random generator's, for CASS)
            seen = []

            def step(self, x):
                self.seen.append(x)
                return x + 1

        up.record_returns(Block, "step", "state", lambda args, kwargs, out: [out, len(Block.seen)], before=True)
        assert Block().step(5) == 6 and Block().step(7) == 8
        assert up.RECORDED["state"] == [[None, 0], [None, 1]]
    finally:
        up.RECORDED.clear()
        up.RECORDED.update(saved)


def _log(call, own, other, tol=1e-5, cost_diff=0.0):
    return dict(name="assignment", call=call, replayed=abs(other - own) <= tol, own=own, other=other,
                delta=other - own, tol=tol, differs=0 if other == own else 2, cost_diff=cost_diff)


def test_replay_summary_says_what_was_replayed_refused_or_left_over():
    from sparseclip_d2.benchmarks.agreement import format_row, replay_summary

    tie = dict(recorded={"assignment": 2}, unused={},
               log=[_log(1, 11.0, 11.0), _log(2, 11.5, 11.5 + 2e-7, cost_diff=3e-7)])
    assert replay_summary(tie) == ("assignment x2: replayed upstream's in 2 (differs from the project's own in 1), "
                                   "cost tie, abs. difference <= 2.0e-07 (tol 1.0e-05; cost 11.000000-11.500000), "
                                   "cost matrices differ by <= 3.0e-07")
    refused = dict(recorded={"assignment": 3}, unused={"assignment": 1}, log=[_log(1, 11.0, 11.0), _log(2, 4.0, 19.0)])
    assert replay_summary(refused) == (
        "assignment x2: replayed upstream's in 1 (differs from the project's own in 0), cost tie, abs. difference <= 0.0e+00 "
        "(tol 1.0e-05; cost 11.000000-11.000000), cost matrices differ by <= 0.0e+00; **replay REFUSED in 1 "
        "(not a cost tie: call 2 own 4.0000000, upstream's 19.0000000, Δ=1.5e+01 > tol 1.0e-05); the project's "
        "own kept** **upstream made 1 more such calls than the project**")
    assert replay_summary(None) == ""
    rng = dict(recorded={"random state": 2}, unused={}, log=[dict(name="random state", call=c, replayed=True)
                                                              for c in (1, 2)])
    assert replay_summary(rng) == "random state x2: replayed upstream's"
    row = dict(config="c.yaml", force=[], upstream_config="u.py", input="voc_wide", resized=[336, 504], percent=100.0,
               classes_upstream=3, differ=0, activity_summary="windows: windows 1", flat=[], replay=tie)
    assert format_row(row, "o/r 1234567").endswith(
        "| windows: windows 1; assignment x2: replayed upstream's in 2 (differs from the project's own in 1), cost "
        "tie, abs. difference <= 2.0e-07 (tol 1.0e-05; cost 11.000000-11.500000), cost matrices differ by <= 3.0e-07 | o/r 1234567 |")
