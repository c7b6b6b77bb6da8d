"""MaskCLIP's entry in the upstream benchmark and the agreement driver (``tools/benchmark_methods.py``,
``tools/agreement.py``): chongzhou96/MaskCLIP at 245d31f, MMSegmentation 0.x code, run in an
interpreter with the pure-Python mmcv 1.4.8 (``--upstream-python`` / ``--maskclip-python``, made by
``scripts/upstream_envs/maskclip.sh``), as its README runs it: the CLIP weights converted by its
``tools/maskclip_utils/convert_clip_weights.py``, the text embeddings made by its
``tools/maskclip_utils/prompt_engineering.py``, the config read by ``mmcv.Config.fromfile``,
``build_segmentor`` + ``load_checkpoint`` and the config's test pipeline as ``tools/test.py`` and
``mmseg.apis.inference_segmentor`` do (docs/agreement/maskclip.md).

Stand-ins (:func:`maskclip_standins`), each raising if called: the compiled ``mmcv.ops`` names
mmseg imports and this path never calls, and ``mmseg.datasets.pipelines.corruptions`` (skimage /
wand, the ``Corrupt`` transform only); ``torch.load(map_location='cuda')`` (the head's loads of
its text embeddings and projection) on the CPU, and a file object read from its start (openai-clip's
``clip.load`` falls back to ``torch.load`` of the file ``torch.jit.load`` has read); ``clip.load('ViT-B/16')``
answered with the weights file both sides read.
"""
import os
import sys

from ..registry import UPSTREAM, UpstreamEntry

#: mmcv.ops names imported by the checkout's mmseg (245d31f: models/losses/focal_loss.py,
#: models/decode_heads/point_head.py, cc_head.py, psa_head.py); none is called by MaskClipHead's path
MMCV_OPS_NAMES = ("sigmoid_focal_loss", "point_sample", "CrissCrossAttention", "PSAMask")
#: the prompt-engineering script's templates with --no-prompt-eng
#: (tools/maskclip_utils/prompt_engineering.py @ 245d31f: prompt_templates = ['a photo of a {}.'])
NO_PROMPT_ENG_TEMPLATE = "a photo of a {}."


def _class_list(upstream_config: str, text_file: str) -> str:
    """The ``--class-set`` of prompt_engineering.py that wrote ``text_file`` (``pretrain/<set>_ViT16_clip_text.pth``,
    the config's ``text_embeddings_path``): ``<set>``; SystemExit for another name."""
    name = os.path.basename(text_file)
    suffix = "_ViT16_clip_text.pth"
    if not name.endswith(suffix) or "_" in name[:-len(suffix)]:
        raise SystemExit(f"{upstream_config}: text_embeddings_path {text_file!r} is not one class set's "
                         f"pretrain/<set>{suffix} (prompt_engineering.py's name for it)")
    return name[:-len(suffix)]


def text_embeddings_file(root: str, upstream_config: str) -> str:
    """The ``model.decode_head.text_embeddings_path`` a MaskCLIP config file sets itself (each ViT-B/16
    config under ``configs/maskclip/`` does), read by running the file's ``dict(...)`` statements."""
    path = os.path.join(root, upstream_config)
    ns = {"dict": dict}
    exec(compile(open(path).read(), path, "exec"), ns)
    got = ns.get("model", {}).get("decode_head", {}).get("text_embeddings_path")
    if not isinstance(got, str):
        raise SystemExit(f"{path}: sets no model.decode_head.text_embeddings_path (the rows need a config that "
                         "names its class set's text embeddings)")
    return got


#: prompt_engineering.py --class-set name -> its module-level class list (its name_mapping)
CLASS_SETS = {"voc": "voc_classes", "city": "cityscapes_classes", "context": "pascal_context_classes",
              "stuff": "coco_stuff_classes", "ade": "ade20k_classes"}
PROMPT_SCRIPT = "tools/maskclip_utils/prompt_engineering.py"
CONVERT_SCRIPT = "tools/maskclip_utils/convert_clip_weights.py"


@UPSTREAM.register("maskclip")
class MaskCLIPUpstream(UpstreamEntry):
    """The config's EncoderDecoder (VisionTransformer with return_qkv, MaskClipHead) from
    ``build_segmentor``, ``load_checkpoint`` of the converted backbone, the test pipeline on the
    resized photo (``ori_shape`` = the photo's size), ``model(return_loss=False, rescale=True)``."""

    repo, commit, marker = "chongzhou96/MaskCLIP", "245d31f", "tools/maskclip_utils/prompt_engineering.py"
    config = "maskclip_b16.yaml"
    upstream_config = "configs/maskclip/maskclip_vit16_512x512_voc12aug_20.py"
    class_tuple = (PROMPT_SCRIPT, "voc_classes")  # the timing benchmark's vocabulary (its VOC20 config's)
    configs = {"maskclip_b16.yaml": "configs/maskclip/maskclip_vit16_512x512_voc12aug_20.py",
               "maskclip_b16_cityscapes.yaml": "configs/maskclip/maskclip_vit16_1024x512_cityscapes.py",
               "maskclip_b16_context59.yaml": "configs/maskclip/maskclip_vit16_520x520_pascal_context_59.py"}

    @classmethod
    def class_tuple_of(cls, root, upstream_config):
        """The prompt script's class list of the config's text embeddings (a module-level list there)."""
        return PROMPT_SCRIPT, CLASS_SETS[_class_list(upstream_config, text_embeddings_file(root, upstream_config))]

    @classmethod
    def labels(cls, output, spec):
        return output[0]  # simple_test: a list of (H, W) label arrays

    @classmethod
    def build(cls, spec, image, path, kit):
        import numpy as np
        import torch

        kit.cpu_cuda_standins()
        maskclip_standins()
        work = os.path.join(os.path.dirname(spec["vfm_weights"]), "maskclip_pretrain")
        os.makedirs(os.path.join(work, "pretrain"), exist_ok=True)
        from mmcv import Config
        cfg = Config.fromfile(os.path.join(path, cls.upstream_config_of(spec)))
        head = cfg.model.decode_head
        class_set = _class_list(cls.upstream_config_of(spec), head.text_embeddings_path)
        prompt_args = ["--model", "ViT16", "--class-set", class_set]
        if spec.get("template") or spec.get("templates") == "single":
            if spec.get("template", NO_PROMPT_ENG_TEMPLATE) not in ("", NO_PROMPT_ENG_TEMPLATE):
                raise SystemExit(f"maskclip: template {spec['template']!r}; its prompt script's one template is "
                                 f"{NO_PROMPT_ENG_TEMPLATE!r} (--no-prompt-eng)")
            prompt_args.append("--no-prompt-eng")
        text = _run_scripts(path, work, spec["weights"], prompt_args)
        head.text_embeddings_path = text
        head.visual_projs_path = os.path.join(work, "pretrain", "ViT16_clip_weights.pth")
        cfg.model.pretrained, cfg.model.train_cfg = None, None  # tools/test.py
        from mmcv.runner import load_checkpoint
        from mmseg.models import build_segmentor
        model = build_segmentor(cfg.model, test_cfg=cfg.get("test_cfg"))
        load_checkpoint(model, os.path.join(work, "pretrain", "ViT16_clip_backbone.pth"), map_location="cpu")
        model.eval()
        data = _pipeline_data(cfg, np.ascontiguousarray(image[:, :, ::-1]), tuple(spec["out_size"]))

        def run():
            with torch.no_grad():
                return model(return_loss=False, rescale=True, **data)
        return run


def _run_scripts(path: str, work: str, weights: str, prompt_args) -> str:
    """MaskCLIP's two scripts run as ``python <script> ...`` from ``work`` (they write ``pretrain/``
    there), their ``clip.load('ViT-B/16')`` reading ``weights``: the converted projection and
    backbone (``--model ViT16``, ``--model ViT16 --backbone``) and the text embeddings; returns the
    embeddings' file."""
    import runpy

    import clip

    load = clip.load

    def load_weights(name, *a, **k):
        if name != "ViT-B/16":
            raise SystemExit(f"maskclip: clip.load({name!r}); the rows use ViT-B/16 only")
        return load(weights, *a, **k)
    clip.load = load_weights
    here, argv = os.getcwd(), sys.argv
    os.chdir(work)
    try:
        for script, args in ((CONVERT_SCRIPT, ["--model", "ViT16"]), (CONVERT_SCRIPT, ["--model", "ViT16", "--backbone"]),
                             (PROMPT_SCRIPT, list(prompt_args))):
            sys.argv = [script] + args
            runpy.run_path(os.path.join(path, script), run_name="__main__")
    finally:
        os.chdir(here)
        sys.argv = argv
        clip.load = load
    set_name = prompt_args[prompt_args.index("--class-set") + 1]
    npe = "_npe" if "--no-prompt-eng" in prompt_args else ""
    return os.path.join(work, "pretrain", f"{set_name}_ViT16{npe}_clip_text.pth")


def _pipeline_data(cfg, bgr, ori_shape):
    """The config's test pipeline after its LoadImageFromFile, on the BGR array with the fields that
    step sets (mmseg 0.x ``datasets/pipelines/loading.py``), ``ori_shape`` the photo's size (so that
    ``rescale=True`` resizes to it), collated and unwrapped as ``mmseg.apis.inference_segmentor``
    does on the CPU."""
    import numpy as np
    from mmcv.parallel import collate
    from mmseg.datasets.pipelines import Compose

    steps = list(cfg.data.test.pipeline)
    if steps[0]["type"] != "LoadImageFromFile":
        raise SystemExit(f"maskclip: the test pipeline starts with {steps[0]['type']}, not LoadImageFromFile")
    c = bgr.shape[2]
    results = dict(filename="photo.png", ori_filename="photo.png", img=bgr, img_shape=bgr.shape,
                   ori_shape=tuple(ori_shape) + (c,), pad_shape=bgr.shape, scale_factor=1.0,
                   img_norm_cfg=dict(mean=np.zeros(c, dtype=np.float32), std=np.ones(c, dtype=np.float32),
                                     to_rgb=False))
    data = collate([Compose(steps[1:])(results)], samples_per_gpu=1)
    data["img_metas"] = [m.data[0] for m in data["img_metas"]]
    return data


def maskclip_standins():
    """In the upstream worker: ``mmcv.ops`` (compiled in mmcv-full, absent from the pure-Python
    mmcv) and ``mmseg.datasets.pipelines.corruptions`` (:func:`standin_modules`), and ``torch.load``
    with a CUDA ``map_location`` loading on the CPU (:func:`cpu_map_location`) where CUDA is absent."""
    import torch

    sys.modules.update(standin_modules())
    torch.load = cpu_map_location(torch.load)


def standin_modules():
    """``{module name: module}``: ``mmcv.ops`` holding :data:`MMCV_OPS_NAMES` and
    ``mmseg.datasets.pipelines.corruptions`` holding ``corrupt``, each a function raising if called."""
    import types

    def absent(name, why):
        def call(*a, **k):
            raise RuntimeError(f"{name} is a stand-in of the MaskCLIP upstream entry ({why}); "
                               "this path should never call it")
        call.__name__ = name
        return call
    ops = types.ModuleType("mmcv.ops")
    for name in MMCV_OPS_NAMES:
        setattr(ops, name, absent(name, "a compiled mmcv.ops name; mmcv 1.4.8 is installed without ops"))
    corruptions = types.ModuleType("mmseg.datasets.pipelines.corruptions")
    corruptions.corrupt = absent("corrupt", "the Corrupt transform's skimage / wand code is not installed")
    return {"mmcv.ops": ops, "mmseg.datasets.pipelines.corruptions": corruptions}


def cpu_map_location(load):
    """``load`` (``torch.load``) with a ``map_location`` naming a CUDA device replaced by ``'cpu'``
    (maskclip_head.py's ``torch.load(..., map_location='cuda')``), and a file object read from its
    start: openai-clip 1.0.1's ``clip.load`` falls back to ``torch.load(opened_file)`` after a failed
    ``torch.jit.load(opened_file)`` (a state dict, not a TorchScript archive), which leaves the file at
    its end in torch 2.13 / 2.14. Any other call unchanged."""
    def cpu_load(f, *a, map_location=None, **k):
        if map_location is not None and str(map_location).startswith("cuda"):
            map_location = "cpu"
        if hasattr(f, "seek"):
            f.seek(0)
        return load(f, *a, map_location=map_location, **k)
    return cpu_load
