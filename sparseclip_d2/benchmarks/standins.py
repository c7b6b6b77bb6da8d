"""Stand-ins, in the upstream worker only, for what the upstream segmentors import or call and
the worker has not (named in the tool's description and docs/upstream_agreement.md because they
are not upstream's): mmseg / mmengine's test-time names and ``pkg_resources``
(:func:`install_standins`), CUDA calls kept on the CPU (:func:`cpu_cuda_standins`,
:func:`tensor_cuda_standin`), ``torch.hub``'s DINO answered from a local checkout with random
weights (:func:`random_dino`). A method's own stand-ins (LPOSS's GPU libraries and mmcv / mmseg
imports) are in its entry (``methods/<family>/upstream.py``).

Each patches the worker process's modules; the upstream worker imports torch, numpy, cv2 and
the upstream checkout only (never this project's model code or detectron2, so that an
interpreter with other library versions can run it).
"""
import os
import sys

def install_standins(device: str = "cpu"):
    """mmseg / mmengine names the segmentors import, and ``pkg_resources`` where it is missing; the
    data preprocessor's output on ``device`` (mmseg's moves it to the model's device)."""
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
            return ((x - self.mean) / self.std)[None].to(device)

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



# itaclip_segmentor.py / resclip_segmentor.py SegDataPreProcessor(mean, std, rgb_to_bgr=True)
MMSEG_MEAN = [122.771, 116.746, 104.094]
MMSEG_STD = [68.501, 66.632, 70.323]


def cpu_cuda_standins():
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


def tensor_cuda_standin():
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


def fp16_exact_state_file(path: str) -> bool:
    """Round every floating tensor of the state dict in ``path`` to float16, stored in float32 (as the
    drivers' CLIP weights), rewriting the file when a value changes; True when it was rewritten.

    ProxyCLIP-style segmentors cast their VFM to fp16 in the constructor (mc-lan/ProxyCLIP @ e7b767f
    ``proxyclip_segmentor.py``: ``self.vfm = self.vfm.half()``), which the later cast back to float32
    cannot undo: with weights that are not float16 numbers the two sides would run different DINOs
    (issue 41: features 2.9e-3 apart, of 4.7)."""
    import torch

    state = torch.load(path, map_location="cpu")
    rounded = {k: (v.half().float() if v.is_floating_point() else v) for k, v in state.items()}
    if all(torch.equal(rounded[k], v) for k, v in state.items()):
        return False
    torch.save(rounded, path)
    return True


def random_dino(spec: dict, entry: str) -> str:
    """The random DINO state dict of ``spec['vfm_weights']`` (drawn once by DINO's own hub code,
    ``torch.manual_seed(0)``, every floating tensor rounded to float16: :func:`fp16_exact_state_file`),
    and ``torch.hub.load('facebookresearch/dino:main', entry)`` answered from the ``--dino`` checkout
    with it (``source='local'``, ``pretrained=False``, strict load). A file drawn before the rounding
    is rounded in place (a note says so); the project side, which runs after this worker, loads it."""
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
        fp16_exact_state_file(vfm_file)
    elif fp16_exact_state_file(vfm_file):
        print(f"note: {vfm_file}: its floating tensors were not float16 numbers; rounded to float16 in place "
              "(both sides load this file)", file=sys.stderr)

    def local_hub_load(repo, e, *a, **k):
        vfm = hub_load(dino, e, source="local", pretrained=False)
        vfm.load_state_dict(torch.load(vfm_file, map_location="cpu"), strict=True)
        return vfm
    torch.hub.load = local_hub_load
    return vfm_file
