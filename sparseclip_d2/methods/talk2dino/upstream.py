"""Talk2DINO's upstream side (lorebianchi98/Talk2DINO at 4918c2d): its entry in the timing benchmark
(``tools/benchmark_methods.py``) and the helpers that ``tools/agreement_talk2dino.py`` drives it with.

Upstream's ``DINOText`` (``src/open_vocabulary_segmentation/models/dinotext/dinotext.py``) and
``DINOTextSegInference.encode_decode`` (``segmentation/evaluation/dinotext_seg.py``) run unchanged; what
this environment lacks is replaced by the stand-ins of :func:`install_upstream_standins` (ours, named in
docs/upstream_agreement.md): OpenAI's ``clip`` (``clip.load`` -> an open_clip ``ViT-B-16-quickgelu`` from
the shared weights file, fp32, without its
vision tower, which ``DINOText`` never calls; ``clip.tokenize`` -> open_clip's tokenizer, the same BPE and 77 tokens),
``einops.rearrange`` (the three patterns ``build_text_embedding`` uses, as reshapes), the ``mmcv`` /
``mmseg`` / ``termcolor`` names its modules import, and ``torch.hub.load`` of ``dinov2_vitb14_reg``
answered by a local facebookresearch/dinov2 checkout with a weights file. mmseg's slide inference is
:func:`slide_run` (mmseg 0.x ``EncoderDecoder.slide_inference``: crop 448, stride 224, summed logits
over the count, resized to the output size, argmax).

Nothing heavy at module level and no model code of this project (the upstream worker imports this
module alone).
"""
import ast
import os
import sys

from ..registry import UPSTREAM, UpstreamEntry

SEG = "src/open_vocabulary_segmentation"
#: upstream's configs of each project config: (model config, eval config, with a background class)
UPSTREAM_CONFIGS = {
    "talk2dino_voc21.yaml": ("configs/voc_bg/dinotext_voc_bg_vitb_mlp_infonce.yml",
                             "configs/voc_bg/eval_voc_bg_pamr.yml", True),
    "talk2dino_voc20.yaml": ("configs/voc/dinotext_voc_vitb_mlp_infonce.yml", "configs/voc/eval_voc_pamr.yml", False),
}
HUB_ENTRY = "dinov2_vitb14_reg"


def draw_dinov2(dinov2: str, path: str) -> str:
    """Random ``dinov2_vitb14_reg`` weights in the hub layout at ``path`` (once): built by the ``dinov2``
    checkout's hub code after ``torch.manual_seed(0)``, its layer-scale gammas then set to U(0.5, 1)
    (generator seed 1; at their init 1e-5 the blocks would barely change the tokens)."""
    import torch

    if not os.path.exists(path):
        torch.manual_seed(0)
        sd = torch.hub.load(dinov2, HUB_ENTRY, source="local", pretrained=False).state_dict()
        g = torch.Generator().manual_seed(1)
        for k in sd:
            if k.endswith(("ls1.gamma", "ls2.gamma")):
                sd[k] = 0.5 + 0.5 * torch.rand(sd[k].shape, generator=g)
        torch.save(sd, path)
    return path


def write_random_projection(path: str, seed: int = 0, clip_dim: int = 512, dino_dim: int = 768) -> str:
    """A projection in upstream's key layout drawn as ``methods/talk2dino/maths.py`` ``random_projection``
    draws it (nn.Linear's init after ``manual_seed(seed)``: the first layer, then the hidden one), at
    ``path`` (once)."""
    import torch

    if not os.path.exists(path):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            a, b = torch.nn.Linear(clip_dim, dino_dim), torch.nn.Linear(dino_dim, dino_dim)
        torch.save({"linear_layer.weight": a.weight.detach(), "linear_layer.bias": a.bias.detach(),
                    "hidden_layers.0.weight": b.weight.detach(), "hidden_layers.0.bias": b.bias.detach()}, path)
    return path


def install_upstream_standins(dinov2: str, dino_file: str, clip_file: str) -> None:
    """The stand-ins of the module docstring, in this process."""
    import logging
    import types

    import open_clip
    import torch
    from torch import nn

    def rearrange(x, pattern, **sizes):
        left, right = (p.strip() for p in pattern.split("->"))
        if "(" in right:  # 'n t -> (n t)', 'n t l -> (n t) l': the leading two axes merged
            return x.reshape(-1, *x.shape[2:])
        return x.reshape(sizes["n"], sizes["t"], *x.shape[1:])  # '(n t) c -> n t c'
    einops = types.ModuleType("einops")
    einops.rearrange = rearrange
    einops.repeat = None  # masker.py imports it; no inference path calls it

    def load(name, device="cpu", jit=False):
        model = open_clip.create_model("ViT-B-16-quickgelu", pretrained=None)
        model.load_state_dict(torch.load(clip_file, map_location="cpu"), strict=True)
        model.visual = None  # DINOText calls encode_text only; the vision tower would hold 350 MB for nothing
        return model.eval(), None
    clip = types.ModuleType("clip")
    clip.load = load
    clip.tokenize = open_clip.get_tokenizer("ViT-B-16-quickgelu")

    class Registry:
        def __init__(self, *a, **k):
            pass

        def register_module(self, *a, **k):
            return lambda cls: cls

    class EncoderDecoder(nn.Module):
        pass
    mods = {n: types.ModuleType(n) for n in ("mmcv", "mmcv.utils", "mmcv.runner", "mmcv.engine", "mmcv.image",
                                              "mmseg", "mmseg.models", "mmseg.apis", "mmseg.apis.test", "termcolor")}
    mods["mmcv"].Config = dict
    mods["mmcv.utils"].Registry = Registry
    mods["mmcv.utils"].get_logger = lambda name="mmcv", *a, **k: logging.getLogger(name)
    mods["mmcv.runner"].CheckpointLoader = object
    mods["mmcv.runner"].get_dist_info = lambda: (0, 1)
    mods["mmcv.engine"].collect_results_cpu = mods["mmcv.engine"].collect_results_gpu = None
    mods["mmcv.image"].tensor2imgs = mods["mmseg.apis.test"].np2tmp = None
    mods["mmseg.models"].EncoderDecoder = EncoderDecoder
    mods["termcolor"].colored = lambda text, *a, **k: text
    mods.update(einops=einops, clip=clip)
    sys.modules.update(mods)
    hub_load = torch.hub.load

    def local_hub_load(repo, entry, *a, **k):
        model = hub_load(dinov2, entry, source="local", pretrained=False)
        model.load_state_dict(torch.load(dino_file, map_location="cpu"), strict=True)
        return model
    torch.hub.load = local_hub_load


def read_yaml_chain(checkout: str, path: str) -> dict:
    """One of upstream's yml configs (under ``src/open_vocabulary_segmentation``) with its ``_base_``
    chain merged, one level of dicts deep (the ``model`` and ``evaluate`` sections)."""
    import yaml

    d = yaml.safe_load(open(os.path.join(checkout, SEG, path)))
    base = d.pop("_base_", None)
    if not base:
        return d
    parent = read_yaml_chain(checkout, os.path.join(os.path.dirname(path), base))
    for k, v in d.items():
        parent[k] = {**parent.get(k, {}), **v} if isinstance(v, dict) else v
    return parent


def voc20_classes(checkout: str):
    """``PascalVOCDataset20.CLASSES`` of upstream's ``segmentation/datasets/pascal_voc.py``, read with
    ``ast`` (the module imports mmseg's datasets)."""
    path = os.path.join(checkout, SEG, "segmentation/datasets/pascal_voc.py")
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.ClassDef) and node.name == "PascalVOCDataset20":
            for st in node.body:
                if isinstance(st, ast.Assign) and getattr(st.targets[0], "id", "") == "CLASSES":
                    return list(ast.literal_eval(st.value))
    raise SystemExit(f"{path}: no PascalVOCDataset20.CLASSES")


def _load_file(path: str):
    """A module of upstream's loaded from its file alone (its package ``__init__`` not run)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("talk2dino_upstream_" + os.path.basename(path)[:-3], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build_upstream_segmentor(checkout: str, config: str, proj_file: str, template: str = "", bg_thresh=None):
    """``(DINOTextSegInference, class names, with_bg)`` of the project config ``config`` (its upstream
    model and eval configs): ``DINOText(**model, pre_trained=False)`` built with the checkout as the
    working directory (it reads ``configs/<proj_class>.yaml``), its projection loaded from
    ``proj_file`` by upstream's ``ProjectionLayer.load_state_dict``, the text embeddings of upstream's
    ``build_dataset_class_tokens`` / ``build_text_embedding`` with the eval config's template set (or
    ``template``), then the segmentor with the eval config's ``pamr`` and ``bg_thresh`` (or ``bg_thresh``
    when given: a stage-forcing variant of tools/agreement_talk2dino.py)."""
    import torch

    model_cfg, eval_cfg, with_bg = UPSTREAM_CONFIGS[config]
    m = dict(read_yaml_chain(checkout, model_cfg)["model"])
    ev = read_yaml_chain(checkout, eval_cfg)["evaluate"]
    m.pop("type")
    for p in (checkout, os.path.join(checkout, SEG)):
        if p not in sys.path:
            sys.path.insert(0, p)
    cwd = os.getcwd()
    os.chdir(checkout)
    try:
        from models.dinotext.dinotext import DINOText
        seg_mod = _load_file(os.path.join(checkout, SEG, "segmentation/evaluation/dinotext_seg.py"))
        model = DINOText(**m, pre_trained=False).eval()
    finally:
        os.chdir(cwd)
    model.proj.load_state_dict(torch.load(proj_file, map_location="cpu"))
    names = voc20_classes(checkout)
    with torch.no_grad():
        text = model.build_text_embedding(model.build_dataset_class_tokens(template or ev["template"], names))
    seg = seg_mod.DINOTextSegInference(model, text, names, with_bg, pamr=bool(ev["pamr"]),
                                       bg_thresh=float(ev["bg_thresh"] if bg_thresh is None else bg_thresh))
    return seg.eval(), names, with_bg


def slide_run(seg, bgr, out_size=None, crop: int = 448, stride: int = 224):
    """mmseg 0.x ``slide_inference`` of an ``(H, W, 3)`` BGR float image through upstream's
    ``encode_decode``, resized bilinearly to ``out_size`` when given: ``(labels, logits)`` numpy."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    img = torch.from_numpy(np.ascontiguousarray(bgr, dtype=np.float32)).permute(2, 0, 1)[None]
    _, _, H, W = img.shape
    hg = max(H - crop + stride - 1, 0) // stride + 1
    wg = max(W - crop + stride - 1, 0) // stride + 1
    preds, count = None, torch.zeros(1, 1, H, W)
    with torch.no_grad():
        for i in range(hg):
            for j in range(wg):
                y1, x1 = i * stride, j * stride
                y2, x2 = min(y1 + crop, H), min(x1 + crop, W)
                y1, x1 = max(y2 - crop, 0), max(x2 - crop, 0)
                out = seg.encode_decode(img[:, :, y1:y2, x1:x2], None)
                if preds is None:
                    preds = torch.zeros(1, out.shape[1], H, W)
                preds[:, :, y1:y2, x1:x2] += out
                count[:, :, y1:y2, x1:x2] += 1
        logits = preds / count
        if out_size is not None and tuple(out_size) != (H, W):
            logits = F.interpolate(logits, size=tuple(out_size), mode="bilinear", align_corners=False)
    return logits[0].argmax(0).numpy(), logits[0].numpy()


@UPSTREAM.register("talk2dino")
class Talk2DINOUpstream(UpstreamEntry):
    """DINOTextSegInference of configs/voc/ (VOC20, PAMR; :func:`build_upstream_segmentor`) under
    mmseg's slide loop (:func:`slide_run`)."""

    repo, commit, marker = "lorebianchi98/Talk2DINO", "4918c2d", f"{SEG}/models/dinotext/dinotext.py"
    config = "talk2dino_voc20.yaml"
    upstream_config = f"{SEG}/configs/voc/dinotext_voc_vitb_mlp_infonce.yml"
    class_tuple = (f"{SEG}/segmentation/datasets/pascal_voc.py", "PascalVOCDataset20")
    # dinotext.py loads DINOv2 with torch.hub.load('facebookresearch/dinov2', 'dinov2_vitb14_reg')
    needs_dino, hub, vfm = "the torch.hub DINOv2 code its upstream loads", "dinov2", HUB_ENTRY

    @classmethod
    def project_opts(cls, path, workdir, drawn):
        proj = write_random_projection(os.path.join(workdir, "talk2dino_projection_seed0.pth"))
        return ["MODEL.SPARSECLIP.PROXY.WEIGHTS", cls.vfm_file(workdir) if drawn else "none",
                "MODEL.SPARSECLIP.PROXY.TALK2DINO.PROJECTION", proj]

    @classmethod
    def build(cls, spec, image, path, kit):
        workdir = os.path.dirname(spec["vfm_weights"])
        dino_file = draw_dinov2(spec["dino"], spec["vfm_weights"])
        proj = write_random_projection(os.path.join(workdir, "talk2dino_projection_seed0.pth"))
        install_upstream_standins(spec["dino"], dino_file, spec["weights"])
        seg, _, _ = build_upstream_segmentor(path, cls.config, proj,
                                             template="simple" if spec["templates"] == "single" else "")
        bgr = image[:, :, ::-1].astype("float32")  # LoadImageFromFile's BGR, FloatImage

        def run():
            return slide_run(seg, bgr, spec["out_size"])
        return run
