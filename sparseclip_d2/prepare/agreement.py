"""Agreement of ``prepare_datasets.py ade847 / context459`` with CAT-Seg's own preparation scripts
(``tools/agreement_catseg.py``): both run on the same planted downloads, in two copies of one
folder, and every written label file and image is compared pixel for pixel.

The planted downloads (:func:`plant_downloads`) follow what the scripts read: ADE20K 2021's
``index_ade20k.pkl`` (``folder``, ``filename``), ``<image>.jpg`` and ``<image>_seg.png`` (class id
= ``int(R / 10) * 256 + G``), training and validation images, sides below and above 512 px, ids
outside the 847 classes; Pascal Context's ``VOC2010/trainval/<id>.mat`` (``LabelMap`` 1..459),
``pascalcontext_val.txt`` (one id without a ``.mat``) and ``labels.txt`` (``<index>: <name>``
lines, which CAT-Seg's script opens).

Upstream's scripts run unchanged from the checkout given, as ``python <script>`` with
``DETECTRON2_DATASETS`` set to their copy (they read nothing else); nothing of them is copied here.
"""
import filecmp
import os
import pickle
import shutil
import subprocess
import sys
from typing import Dict, List

import numpy as np
from PIL import Image

__all__ = ["plant_downloads", "compare_outputs", "run_agreement"]

_ADE_SCRIPT = os.path.join("datasets", "prepare_ade20k_full.py")
_PC_SCRIPT = os.path.join("datasets", "prepare_pascal_context_459.py")


def plant_downloads(root: str, seed: int = 0) -> None:
    """Random ADE20K 2021 and Pascal Context downloads under ``root`` (see the module docstring)."""
    import scipy.io

    from .catseg import ADE847_IDS

    rng = np.random.default_rng(seed)
    ids = np.array(list(ADE847_IDS) + [5, 7, 3000])  # three ids outside the 847
    folders, files = [], []
    for i, (split, h, w) in enumerate((("val", 300, 400), ("val", 600, 530), ("val", 515, 1100),
                                       ("train", 520, 600), ("val", 1000, 700))):
        folder = os.path.join("ADE20K_2021_17_01", "images", "ADE", "validation" if split == "val" else "training", "x")
        name = f"ADE_{split}_{i + 1:08d}.jpg"
        os.makedirs(os.path.join(root, folder), exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(os.path.join(root, folder, name))
        blocks = rng.choice(ids, (h // 16 + 1, w // 16 + 1))
        cls = np.repeat(np.repeat(blocks, 16, 0), 16, 1)[:h, :w]
        cls[rng.random((h, w)) < 0.02] = rng.choice(ids)  # isolated pixels
        rgb = np.stack([(cls // 256) * 10 + rng.integers(0, 10, cls.shape), cls % 256,
                        rng.integers(0, 256, cls.shape)], -1).astype(np.uint8)  # R carries noise below 10
        Image.fromarray(rgb).save(os.path.join(root, folder, name.replace(".jpg", "_seg.png")))
        folders.append(folder)
        files.append(name)
    with open(os.path.join(root, "ADE20K_2021_17_01", "index_ade20k.pkl"), "wb") as f:
        pickle.dump({"folder": folders, "filename": files}, f)

    base = os.path.join(root, "VOCdevkit", "VOC2010")
    os.makedirs(os.path.join(base, "trainval"), exist_ok=True)
    pc_ids = [f"2008_{i:06d}" for i in range(2, 7)]
    for image_id in pc_ids[:-1]:
        h, w = rng.integers(100, 500, 2)
        scipy.io.savemat(os.path.join(base, "trainval", image_id + ".mat"),
                         {"LabelMap": rng.integers(1, 460, (h, w)).astype(np.uint16)})
    with open(os.path.join(base, "pascalcontext_val.txt"), "w") as f:
        f.write("\n".join(pc_ids) + "\n")
    with open(os.path.join(base, "labels.txt"), "w") as f:
        f.write("".join(f"{i}: class{i}\n" for i in range(1, 460)))


def _outputs(root: str) -> List[str]:
    found = []
    for sub in (os.path.join("ADE20K_2021_17_01", "images_detectron2"),
                os.path.join("ADE20K_2021_17_01", "annotations_detectron2"),
                os.path.join("VOCdevkit", "VOC2010", "annotations_detectron2")):
        for dirpath, _, names in os.walk(os.path.join(root, sub)):
            found += [os.path.relpath(os.path.join(dirpath, n), root) for n in names]
    return sorted(found)


def compare_outputs(ours: str, upstream: str) -> Dict[str, object]:
    """Every file both preparations wrote: the same set of paths, and for each the same pixels
    (and mode); also whether the files are byte-identical."""
    a, b = _outputs(ours), _outputs(upstream)
    rows, pixels, equal = [], 0, 0
    for rel in sorted(set(a) & set(b)):
        with Image.open(os.path.join(ours, rel)) as x, Image.open(os.path.join(upstream, rel)) as y:
            xa, ya = np.asarray(x), np.asarray(y)
            same_mode = x.mode == y.mode
        n = int(np.prod(ya.shape)) if xa.shape == ya.shape else 0
        agree = int((xa == ya).sum()) if xa.shape == ya.shape else 0
        pixels += int(np.prod(ya.shape))
        equal += agree
        rows.append({"file": rel, "shape": list(ya.shape), "mode": same_mode, "agree": agree, "of": n,
                     "bytes_equal": filecmp.cmp(os.path.join(ours, rel), os.path.join(upstream, rel), shallow=False)})
    return {"only_ours": sorted(set(a) - set(b)), "only_upstream": sorted(set(b) - set(a)), "files": rows,
            "pixels": pixels, "agreeing_pixels": equal,
            "agreement_percent": 100.0 * equal / pixels if pixels else float("nan")}


def run_agreement(upstream: str, workdir: str) -> Dict[str, object]:
    """Plant the downloads in ``workdir/ours`` and ``workdir/upstream``, run our preparation on the
    first and CAT-Seg's scripts (from the checkout ``upstream``) on the second, compare."""
    from .catseg import ade847, context459

    for script in (_ADE_SCRIPT, _PC_SCRIPT):
        if not os.path.isfile(os.path.join(upstream, script)):
            raise FileNotFoundError(f"{os.path.join(upstream, script)} does not exist: --upstream must be a checkout "
                                    "of cvlab-kaist/CAT-Seg (6d3a188)")
    ours, theirs = os.path.join(workdir, "ours"), os.path.join(workdir, "upstream")
    for d in (ours, theirs):
        shutil.rmtree(d, ignore_errors=True)
        plant_downloads(d)
    ade847(ours)
    context459(ours)
    env = dict(os.environ, DETECTRON2_DATASETS=theirs)
    for script in (_ADE_SCRIPT, _PC_SCRIPT):
        res = subprocess.run([sys.executable, os.path.join(upstream, script)], env=env, cwd=upstream,
                             capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"upstream {script} failed:\n{res.stderr[-2000:]}")
    return compare_outputs(ours, theirs)
