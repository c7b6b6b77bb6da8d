"""The upstream side, in the upstream worker: :func:`build_upstream` returns ``run()`` of one
image through the upstream repository's own code (unchanged), driven as the agreement rows of
docs/upstream_agreement.md drive it by the method's entry (``UpstreamEntry.build``, in the
method's folder: ``methods/<family>/upstream.py``), which :func:`import_entry` reads, and the
generic helpers the entry is handed (:func:`upstream_kit`).

The worker imports torch, numpy, cv2, the entry's module and the upstream checkout only (never
this project's model code or detectron2, so that an interpreter with other library versions can
run it); the stand-ins it installs are :mod:`.standins`' and the entry's own.
"""
import importlib
import importlib.machinery
import os
import sys
import types

from .checkouts import dataset_classes, upstream_config
from .standins import cpu_cuda_standins, fp16_exact_state_file, install_standins, random_dino, tensor_cuda_standin


def fp32_create_model(module) -> None:
    """``module.create_model`` (open_clip's, as a ProxyCLIP-style segmentor module imports it) with
    ``precision`` forced to ``'fp32'``, installed before the segmentor is built. Such a segmentor
    encodes its class names in its constructor (mc-lan/ProxyCLIP @ e7b767f ``proxyclip_segmentor.py``
    ``ProxyCLIPSegmentation.__init__``: ``create_model(..., precision='fp16')``, then
    ``self.clip.encode_text`` per query): an fp16 tower there gives text features that differ from
    float32 ones by up to 2.7e-4 per component (1.5e-3 in norm; random ViT-B/16 weights, VOC21's 46
    queries), which :func:`upstream_to_fp32`'s later cast cannot undo. The weights are rounded to
    float16 already (the drivers' random weights), so the float32 tower computes with the same
    numbers."""
    create = getattr(module, "create_model", None)
    if not callable(create):
        raise SystemExit(f"{getattr(module, '__name__', repr(module))} has no create_model to build "
                         "its CLIP in float32 with: not the segmentor module of the cited upstream commit")

    def create_model(*args, **kwargs):
        kwargs["precision"] = "fp32"
        return create(*args, **kwargs)
    module.create_model = create_model


def upstream_to_fp32(seg, vfm) -> None:
    """float32 on the CPU for a ProxyCLIP-style upstream segmentor (ProxyCLIP, FSA, CorrCLIP), which
    casts CLIP, its VFM ``vfm`` and their inputs to fp16: both models, the text features and every
    later ``Tensor.half`` in float32; then eval mode. Text features computed in the constructor by an
    fp16 tower stay fp16 values (only their dtype changes): build such a segmentor after
    :func:`fp32_create_model`."""
    import torch

    seg.clip.float()
    vfm.float()
    seg.query_features = seg.query_features.float()
    seg.dtype = torch.float32
    torch.Tensor.half = lambda self: self.float()
    seg.eval()


def fp32_module_half() -> None:
    """``nn.Module.half`` as ``float``, so that a constructor's fp16 cast of a model rounds nothing
    (Trident's ``self.sam = sam_model_registry[...](...).half()``). A ``.float()`` afterwards restores
    the weights, which are float16 numbers already, but not the non-persistent buffers that no state
    file holds: SAM's ``pixel_mean`` / ``pixel_std`` (segment_anything ``modeling/sam.py``, 123.675 ->
    123.6875 in fp16), which normalise its input."""
    import torch

    torch.nn.Module.half = lambda self: self.float()


#: choices upstream's code made in this worker, ``{name: [one per call]}`` (:func:`record_returns`);
#: the agreement driver writes them beside the label map and replays them on the project side
#: (``sparseclip_d2.common.replay``)
RECORDED = {}


def record_returns(module, attr: str, name: str, keep, before: bool = False) -> None:
    """Record what ``module.attr`` chooses on each call, upstream's files unchanged: the name in
    ``module`` is wrapped so that each call runs the original and appends ``keep(args, kwargs,
    result)`` (JSON-ready) to ``RECORDED[name]``; the result is returned as it was (e.g. scipy's
    ``linear_sum_assignment`` in the upstream module that imported it). ``before``: ``keep(args,
    kwargs, None)`` is taken before the call instead (a state the call starts from: the random
    generator's)."""
    original = getattr(module, attr)
    calls = RECORDED.setdefault(name, [])

    def recorded(*args, **kwargs):
        if before:
            calls.append(keep(args, kwargs, None))
        out = original(*args, **kwargs)
        if not before:
            calls.append(keep(args, kwargs, out))
        return out

    setattr(module, attr, recorded)


def cut_templates(templates, spec):
    """The prompt templates an upstream side uses: with ``spec['template']`` (the agreement driver:
    the project's one template, ``a photo of a {}.``) that one, in the form of upstream's list
    (callables or format strings); with ``--templates single`` the list's first; else all of them."""
    if spec.get("template"):
        one = spec["template"]
        return [(lambda c: one.format(c)) if callable(templates[0]) else one]
    return list(templates[:1]) if spec["templates"] == "single" else list(templates)


def segmentor_run(seg, image, spec):
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


def path_segmentor_run(seg, image, spec):
    """``run()`` as :func:`segmentor_run`, with the data sample's ``img_path`` (``metainfo`` too):
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


def template_segmentor(spec, image, path: str, entry, segmentor: str, **args):
    """``run()`` of a segmentor built as the agreement rows build those whose prompt templates are
    the checkout's ``prompts/imagenet_template.py``: ``segmentor`` (``"module:Class"``) of the
    ``model`` dict of ``entry.upstream_config`` (``type`` dropped) with ``name_path`` = the
    entry's class file, ``device`` = ``spec['device']`` (``'cpu'`` by default) and ``args`` (the entry's own: the weights file under
    the name its constructor takes, ...); the module's templates cut to the first with
    ``--templates single``; eval mode; its data preprocessor and predict (:func:`segmentor_run`)."""
    import torch

    device = spec.get("device", "cpu")
    install_standins(device)
    import prompts.imagenet_template as templates
    templates.openai_imagenet_template = cut_templates(templates.openai_imagenet_template, spec)
    model = upstream_config(path, entry.upstream_config_of(spec))
    model.pop("type", None)
    model.update(name_path=os.path.join(path, entry.class_file_of(spec)), device=torch.device(device))
    model.update(args)
    model.update(entry.settings_of(spec))
    module, cls = segmentor.split(":")
    seg_module = importlib.import_module(module)
    seg_module.openai_imagenet_template = templates.openai_imagenet_template
    seg = getattr(seg_module, cls)(**model)
    seg.eval()
    return segmentor_run(seg, image, spec)


def upstream_kit() -> types.SimpleNamespace:
    """The generic helpers an entry's ``build`` is handed (the methods package may not import this
    one): the stand-ins (:mod:`.standins`), the checkout readers (:mod:`.checkouts`) and the runs
    and casts above."""
    return types.SimpleNamespace(
        install_standins=install_standins, cpu_cuda_standins=cpu_cuda_standins,
        tensor_cuda_standin=tensor_cuda_standin, random_dino=random_dino, upstream_config=upstream_config,
        dataset_classes=dataset_classes, segmentor_run=segmentor_run, path_segmentor_run=path_segmentor_run,
        upstream_to_fp32=upstream_to_fp32, fp32_create_model=fp32_create_model, fp32_module_half=fp32_module_half,
        fp16_exact_state_file=fp16_exact_state_file, record_returns=record_returns,
        template_segmentor=template_segmentor,
        cut_templates=cut_templates)


def _bare_package(name: str, folder: str) -> None:
    """``name`` as a package whose submodules are found in ``folder``, its ``__init__`` not run."""
    module = types.ModuleType(name)
    module.__path__ = [folder]
    module.__package__ = name
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    module.__spec__.submodule_search_locations = [folder]
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    setattr(sys.modules[parent], child, module)


def import_entry(spec: dict):
    """The entry of ``spec['method']``, in the upstream worker: its module (``spec['entry']``, under
    ``sparseclip_d2.methods``) imported with the ``__init__`` of ``sparseclip_d2.methods`` and of
    its method folders not run (they register the model's parts, importing the model code and
    open_clip), so that the module, ``methods/registry.py`` and ``common/needs.py`` (torch and the
    standard library) are all of this project's code the worker imports besides this package."""
    import sparseclip_d2

    package = "sparseclip_d2.methods"
    if package not in sys.modules:
        root = os.path.join(os.path.dirname(os.path.abspath(sparseclip_d2.__file__)), "methods")
        _bare_package(package, root)
        for item in sorted(os.scandir(root), key=lambda d: d.name):
            if item.is_dir() and os.path.isfile(os.path.join(item.path, "__init__.py")):
                _bare_package(f"{package}.{item.name}", item.path)
    if not spec["entry"].startswith(package + "."):
        raise SystemExit(f"the entry module {spec['entry']!r} is not under {package}")
    importlib.import_module(spec["entry"])
    from sparseclip_d2.methods.registry import UPSTREAM

    return UPSTREAM.get(spec["method"])


def build_upstream(spec: dict):
    """``run()`` of one image through the upstream side, built from ``spec`` by the method's entry."""
    import numpy as np
    import torch  # noqa: F401  (before any upstream import, as every driver needs it)

    entry = import_entry(spec)
    if spec.get("device", "cpu") != "cpu" and not entry.cuda:
        raise SystemExit(f"{spec['method']}: its upstream entry drives the CPU only (UpstreamEntry.cuda is False)")
    image = np.load(spec["image"])
    path = os.path.join(spec["path"], entry.subdir)  # where its code and configs sit
    sys.path.insert(0, path)
    os.chdir(path)  # upstream configs and prompt files are relative to the checkout
    return entry.build(spec, image, path, upstream_kit())
