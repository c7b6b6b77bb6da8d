"""The upstream side of each method, in the upstream worker: :func:`build_upstream` returns
``run()`` of one image through the upstream repository's own code (unchanged), driven as the
agreement rows of docs/upstream_agreement.md drive it; one driver per method
(:data:`UPSTREAM_DRIVERS`).

The worker imports torch, numpy, cv2 and the upstream checkout only (never this project's
model code or detectron2, so that an interpreter with other library versions can run it); the
stand-ins it installs are :mod:`.standins`'.
"""
import os
import sys

from .checkouts import dataset_classes, upstream_config
from .method_table import METHODS
from .standins import (cpu_cuda_standins, install_standins, lposs_gpu_standins, lposs_standins, random_dino,
                       tensor_cuda_standin)


def upstream_to_fp32(seg, vfm) -> None:
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


def build_upstream(spec: dict):
    """``run()`` of one image through the upstream side, built from ``spec``."""
    import numpy as np
    import torch  # noqa: F401  (before any upstream import, as every driver needs it)

    method, path = spec["method"], spec["path"]
    image = np.load(spec["image"])
    path = os.path.join(path, METHODS[method].get("subdir", ""))  # where its code and configs sit
    sys.path.insert(0, path)
    os.chdir(path)  # upstream configs and prompt files are relative to the checkout
    driver = UPSTREAM_DRIVERS.get(method)
    if driver is None:
        raise SystemExit(f"unknown method {method!r}")
    return driver(spec, image, path)


# ------------------------------------------------------------------------- one driver per method
# Each takes (spec, the input image, the checkout folder holding the code) and returns run().

def _scclip_sfp(spec, image, path):
    """SC-CLIP and SFP, driven as the agreement rows drive them (docs/upstream_agreement.md, "SC-CLIP
    and SFP"): the segmentor built from configs/base_config.py + cfg_<dataset>.py with clip_path = the
    weights file and device='cpu'; its data preprocessor and predict (slide, postprocess)."""
    import torch

    method, weights = spec["method"], spec["weights"]
    install_standins()
    import prompts.imagenet_template as templates
    if spec["templates"] == "single":
        templates.openai_imagenet_template = templates.openai_imagenet_template[:1]
    model = upstream_config(path, METHODS[method]["upstream_config"])
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
    return segmentor_run(seg, image, spec)


def _itaclip_resclip(spec, image, path):
    """ITACLIP's and ResCLIP's segmentors from configs/cfg_voc21.py (ResCLIP's ``.cuda()`` calls kept
    on the CPU); their data preprocessor and predict."""
    import torch

    method, weights = spec["method"], spec["weights"]
    install_standins()
    if method == "resclip":
        cpu_cuda_standins()
    import prompts.imagenet_template as templates
    if spec["templates"] == "single":
        templates.openai_imagenet_template = templates.openai_imagenet_template[:1]
    model = upstream_config(path, METHODS[method]["upstream_config"])
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
    return segmentor_run(seg, image, spec)


def _gem(spec, image, path):
    """GEM's dense forward of the vision tower (``gem.model.visual``) on the normalised image."""
    import torch

    weights = spec["weights"]
    x = torch.from_numpy(image)
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


def _proxyclip_fsa(spec, image, path):
    """ProxyCLIP's segmentor, and FSA's: FSA_Proxy_segmentor.py is ProxyCLIP's segmentor plus lamda /
    FSA (configs/base_config.py: lamda=3.0, FSA=True), with the same VFM loading and fp16 casts:
    driven the same way. ``torch.hub.load`` of DINO is answered from the ``--dino`` checkout."""
    import torch

    method, weights = spec["method"], spec["weights"]
    install_standins()
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
    model = upstream_config(path, METHODS[method]["upstream_config"])
    model.pop("type", None)
    model.update(name_path=os.path.join(path, METHODS[method]["class_file"]), device="cpu",
                 model_type=os.path.basename(weights))
    os.chdir(os.path.dirname(weights))  # its create_model turns "/" of a name into "-": the bare file name
    seg = getattr(seg_module, segmentor)(**model)
    upstream_to_fp32(seg, seg.vfm)
    return segmentor_run(seg, image, spec)


def _cliptrase(spec, image, path):
    """CLIPtrase's own loop (``self_clip``) over the folder the tool wrote (the photo and an all-0
    ground truth), on the CPU, its metric not computed, its text features memoised."""
    import clip_self_correlation as cs
    import clip_utils
    from configs.dataset_cfg import dataset_info

    method, weights = spec["method"], spec["weights"]
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


def _clipsurgery(spec, image, path):
    """CLIP Surgery's ``encode_image`` (its ``CS-ViT-B/16`` build) on the normalised image."""
    import torch

    weights = spec["weights"]
    x = torch.from_numpy(image)
    install_standins()
    from clip.build_model import build_model
    model = build_model("CS-ViT-B/16", torch.load(weights, map_location="cpu")).float().eval()
    return lambda: model.encode_image(x)


def _cass(spec, image, path):
    """CASS_segmentor(clip_path, name_path, device, dataset=<cfg file>, pamr_steps=0, **model dict of
    configs/cfg_voc21.py over base_config.py); its predict (whole image for voc21, slide_crop=0)."""
    import types

    import torch

    weights, meta = spec["weights"], METHODS[spec["method"]]
    install_standins()
    sys.modules.setdefault("requests", types.ModuleType("requests"))  # dino/dino_attention.py: imported, unused
    dino_file = random_dino(spec, "dino_vitb8")
    # DinoSelfAttention without a weights file loads the release through load_state_dict_from_url
    torch.hub.load_state_dict_from_url = lambda url, *a, **k: torch.load(dino_file, map_location="cpu")
    tensor_cuda_standin()
    import cass_segmentor as seg_module
    if spec["templates"] == "single":
        seg_module.openai_imagenet_template = seg_module.openai_imagenet_template[:1]
    model = upstream_config(path, meta["upstream_config"])
    for k in ("type", "clip_path", "name_path"):
        model.pop(k, None)
    seg = seg_module.CASS_segmentor(clip_path=weights, name_path=os.path.join(path, meta["class_file"]),
                                    device="cpu", dataset="./" + meta["upstream_config"], pamr_steps=0, **model)
    seg.eval()
    return segmentor_run(seg, image, spec)


def _corrclip(spec, image, path):
    """CorrCLIPSegmentation(clip_type=<weights file>, model_type, dino_type, name_path, device, prob_thd,
    instance_mask_path=<the masks this tool wrote>, mask_generator=None); its predict."""
    weights, meta = spec["weights"], METHODS[spec["method"]]
    install_standins()
    random_dino(spec, "dino_vitb8")
    import corrclip_segmentor as seg_module
    if spec["templates"] == "single":
        seg_module.openai_imagenet_template = seg_module.openai_imagenet_template[:1]
    model = upstream_config(path, meta["upstream_config"])
    model.pop("type", None)
    model.update(clip_type=weights, name_path=os.path.join(path, meta["class_file"]), device="cpu",
                 instance_mask_path=spec["mask_dir"], mask_generator=None)
    seg = seg_module.CorrCLIPSegmentation(**model)
    upstream_to_fp32(seg, seg.dino)
    return path_segmentor_run(seg, image, spec)


def _trident(spec, image, path):
    """Trident(clip_type='openai', model_type=<weights file, its name ending in the patch size 16:
    upstream reads the stride as int(model_type[-2:])>, vfm_model='dino', name_path, sam_ckpt=<random
    SAM>, **model dict of configs/cfg_voc21.py over base_config.py); its predict (get_trident_seg,
    postprocess)."""
    import torch

    weights, meta = spec["weights"], METHODS[spec["method"]]
    install_standins()
    import types
    skimage = types.ModuleType("skimage")  # seg_utils/utils.py imports it for sam_refinement only (off)
    skimage.measure = types.ModuleType("skimage.measure")
    sys.modules.update({"skimage": skimage, "skimage.measure": skimage.measure})
    random_dino(spec, "dino_vitb16")
    sam_file = os.path.join(os.path.dirname(spec["vfm_weights"]), "sam_vit_b_seed0.pth")
    if not os.path.exists(sam_file):
        from segment_anything import sam_model_registry  # Trident's vendored copy
        torch.manual_seed(0)
        torch.save(sam_model_registry["vit_b"](checkpoint=None).state_dict(), sam_file)
    import trident as seg_module
    if spec["templates"] == "single":
        seg_module.openai_imagenet_template = seg_module.openai_imagenet_template[:1]
    model = upstream_config(path, meta["upstream_config"])
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
    return path_segmentor_run(seg, image, spec)


def _lposs(spec, image, path):
    """LPOSS built from configs/lposs.yaml (clip_backbone = configs/maskclip.yaml with
    decode_head.pretrained = the weights file), LPOSS_Infrencer(model, cfg, num_classes, test_cfg) and
    its slide_inference on the resized photo / 255 (ImageToTensorV2), as
    segmentation/evaluation/builder.py."""
    import importlib.util

    import numpy as np
    import torch

    weights, meta = spec["weights"], METHODS[spec["method"]]
    lposs_standins(path)
    knn = lposs_gpu_standins()
    random_dino(spec, "dino_vitb16")
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
    if spec["templates"] == "single":
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


#: method -> its upstream driver ``(spec, image, checkout folder) -> run()``
UPSTREAM_DRIVERS = {
    "itaclip": _itaclip_resclip,
    "resclip": _itaclip_resclip,
    "gem": _gem,
    "clipsurgery": _clipsurgery,
    "proxyclip": _proxyclip_fsa,
    "scclip": _scclip_sfp,
    "sfp": _scclip_sfp,
    "fsa": _proxyclip_fsa,
    "cliptrase": _cliptrase,
    "cass": _cass,
    "corrclip": _corrclip,
    "lposs": _lposs,
    "trident": _trident,
}
