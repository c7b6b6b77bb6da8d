"""The upstream side of ProxyCLIP-style rows (issue 41): its CLIP is built in float32 (a segmentor whose
constructor encodes the class names with ``create_model(..., precision='fp16')`` would otherwise hand
fp16-computed text features to a float32 comparison), and the VFM weights both sides load are float16
numbers (its constructor casts the VFM to fp16)."""
import sys
import types

import torch

from sparseclip_d2.benchmarks.standins import fp16_exact_state_file
from sparseclip_d2.benchmarks.upstream import fp32_create_model
from sparseclip_d2.methods.proxyclip.upstream import ProxyCLIPUpstream, build_proxy_segmentor


def test_fp32_create_model_forces_float32_and_passes_everything_else():
    seen = []
    module = types.SimpleNamespace(create_model=lambda *a, **k: seen.append((a, k)) or "model")
    fp32_create_model(module)
    assert module.create_model("ViT-B-16", pretrained="w.pt", precision="fp16", device="cpu") == "model"
    assert module.create_model("ViT-B-16") == "model"
    assert seen == [(("ViT-B-16",), {"pretrained": "w.pt", "precision": "fp32", "device": "cpu"}),
                    (("ViT-B-16",), {"precision": "fp32"})]


# A stand-in upstream segmentor module: like mc-lan/ProxyCLIP @ e7b767f proxyclip_segmentor.py, it
# imports create_model by name and encodes text in its constructor with the tower it asked for.
_FAKE_SEGMENTOR = '''
import torch
openai_imagenet_template = [lambda c: f"a bad photo of a {c}."]

def create_model(name, pretrained=None, precision="fp32"):
    tower = torch.nn.Linear(4, 3, bias=False)
    torch.nn.init.constant_(tower.weight, 1 / 3)  # 1/3 is not a float16 number: the precision shows
    return tower.half() if precision == "fp16" else tower

class Seg:
    def __init__(self, clip_type, model_type, name_path, device, prob_thd=0.5):
        self.clip = create_model(model_type, pretrained=clip_type, precision="fp16")
        self.query_features = self.clip(torch.full((1, 4), 0.1, dtype=self.clip.weight.dtype))
        self.vfm = torch.nn.Identity()
        self.args = dict(clip_type=clip_type, model_type=model_type, name_path=name_path, device=device,
                         prob_thd=prob_thd)
'''


def test_the_proxyclip_entry_builds_its_segmentor_with_a_float32_clip(tmp_path, monkeypatch):
    (tmp_path / "fake_proxy_segmentor.py").write_text(_FAKE_SEGMENTOR)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(torch.hub, "load", torch.hub.load)  # the build replaces it: restored after the test
    monkeypatch.chdir(tmp_path)
    sys.modules.pop("fake_proxy_segmentor", None)
    weights = tmp_path / "clip_seed0.pt"
    vfm_file = tmp_path / "dino_seed0.pth"
    casts, drawn = [], []
    kit = types.SimpleNamespace(
        install_standins=lambda: None,
        random_dino=lambda spec, hub_entry: drawn.append((spec["vfm_weights"], hub_entry)),
        cut_templates=lambda templates, spec: templates,
        upstream_config=lambda path, name: {"type": "Seg", "clip_type": "openai", "prob_thd": 0.2},
        fp32_create_model=fp32_create_model,
        upstream_to_fp32=lambda seg, vfm: casts.append(vfm),
        segmentor_run=lambda seg, image, spec: seg)
    spec = dict(weights=str(weights), dino=str(tmp_path), vfm_weights=str(vfm_file),
                upstream_config="configs/cfg_voc21.py", class_file="configs/cls_voc21.txt",
                upstream_settings={"prob_thd": 0.0})
    seg = build_proxy_segmentor(spec, None, str(tmp_path), kit, ProxyCLIPUpstream, "fake_proxy_segmentor:Seg")
    # the tower was built in float32: its text features are float32 sums of 0.1 / 3 (float16: 0.1333)
    assert seg.clip.weight.dtype == torch.float32
    want = torch.full((1, 3), 4 * torch.tensor(0.1, dtype=torch.float64).item() / 3, dtype=torch.float64)
    assert seg.query_features.dtype == torch.float32
    assert torch.allclose(seg.query_features.double(), want, rtol=0, atol=1e-7)
    assert seg.args == dict(clip_type="openai", model_type="clip_seed0.pt", name_path=str(tmp_path / "configs/cls_voc21.txt"),
                            device="cpu", prob_thd=0.0)
    assert casts == [seg.vfm] and drawn == [(str(vfm_file), "dino_vitb8")]


def test_a_segmentor_module_without_create_model_is_refused_by_name():
    module = types.ModuleType("not_a_segmentor")
    try:
        fp32_create_model(module)
    except SystemExit as e:
        assert "not_a_segmentor has no create_model" in str(e)
    else:
        raise AssertionError("a module without create_model was accepted")


def test_vfm_state_file_is_rounded_to_float16_numbers_once(tmp_path):
    path = str(tmp_path / "vfm.pth")
    third = torch.full((2, 3), 1 / 3)  # float32 0.33333334; the float16 number nearest 1/3 is 0.333251953125 (1365 / 4096)
    torch.save({"w": third, "b": torch.tensor([0.5, -2.0]), "steps": torch.tensor([7])}, path)
    assert fp16_exact_state_file(path) is True
    state = torch.load(path)
    assert state["w"].dtype == torch.float32 and bool((state["w"] == 1365 / 4096).all())
    assert state["b"].tolist() == [0.5, -2.0] and state["steps"].tolist() == [7]  # exact already / not floating
    assert fp16_exact_state_file(path) is False  # nothing left to round: the file is not rewritten


def test_module_half_rounds_no_non_persistent_buffer(monkeypatch):
    # SAM normalises its input with non-persistent buffers (segment_anything modeling/sam.py pixel_mean
    # 123.675, 116.28, 103.53; pixel_std 58.395, 57.12, 57.375) that no state file holds; Trident's
    # constructor casts SAM to fp16, and a later .float() leaves them rounded
    from sparseclip_d2.benchmarks.upstream import fp32_module_half

    class Norm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("pixel_mean", torch.tensor([123.675, 116.28, 103.53]), False)
            self.lin = torch.nn.Linear(2, 2)

    # without the helper: fp16 spacing is 1/16 in [64, 128]: 123.675 -> 123.6875, 116.28 -> 116.25, 103.53 -> 103.5
    rounded = Norm().half().float()
    assert rounded.pixel_mean.tolist() == [123.6875, 116.25, 103.5]
    monkeypatch.setattr(torch.nn.Module, "half", torch.nn.Module.half)  # undone after the test
    fp32_module_half()
    m = Norm().half()
    assert m.pixel_mean.dtype == torch.float32 and m.lin.weight.dtype == torch.float32
    assert m.pixel_mean.tolist() == torch.tensor([123.675, 116.28, 103.53]).tolist()
