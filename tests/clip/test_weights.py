"""Every weight format a researcher holds loads into the same open_clip model.

Each format is made here, tiny and random, with no download: an OpenAI-layout TorchScript
archive (``torch.jit.save``, what ``clip.load`` leaves in ``~/.cache/clip``), an open_clip
``local-dir:`` folder, and ``transformers`` ``CLIPModel`` / ``SiglipModel`` checkpoints
written by ``save_pretrained``. Each test compares the features of the model
:func:`build_clip` returns with the source library's own forward of the same file
(``open_clip.load_openai_model``, ``open_clip.create_model("local-dir:...")``,
transformers' ``get_image_features`` / ``get_text_features``): max |diff| <= 1e-5.
``pytest -s tests/clip/test_weights.py`` prints each measured max |diff|.
"""
import json
import logging
import os

import numpy as np
import pytest
import torch

import open_clip

from sparseclip_d2.clip import build_clip, get_tokenizer
from sparseclip_d2.clip.builder import check_model_name
from sparseclip_d2.clip.model_configs import register_local_model_config

transformers = pytest.importorskip("transformers")

# torch >= 2.10 deprecates TorchScript; the archives made here are what OpenAI's release is.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.(script|save|load)` is deprecated:FutureWarning")

TOL = 1e-5
# An OpenAI-layout tower: open_clip's build_model_from_openai_state_dict infers heads = width / 64.
OPENAI_TINY = "sparseclip-test-openai-tiny"
register_local_model_config(OPENAI_TINY, {
    "embed_dim": 32,
    "quick_gelu": True,
    "vision_cfg": {"image_size": 64, "layers": 2, "width": 128, "head_width": 64, "patch_size": 16},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 128, "heads": 2, "layers": 2},
})
TEXTS = ["a photo of a cat.", "a dog", "grass"]


def _images(seed=0, side=64):
    return torch.randn(2, 3, side, side, generator=torch.Generator().manual_seed(seed))


def _max_diff(a, b):
    return (a.detach().double() - b.detach().double()).abs().max().item()


def _features(model, images, tokens):
    with torch.no_grad():
        return model.encode_image(images), model.encode_text(tokens)


def _random_model(name, seed):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build_clip(name, "none")


# ------------------------------------------------------------------------------ TorchScript
class _Holder(torch.nn.Module):
    """A scriptable module holding a state dict under the exact (dotted) key names."""

    def __init__(self, sd):
        super().__init__()
        for key, value in sd.items():
            *path, leaf = key.split(".")
            mod = self
            for part in path:
                if not hasattr(mod, part):
                    mod.add_module(part, torch.nn.Module())
                mod = getattr(mod, part)
            if value.is_floating_point():
                mod.register_parameter(leaf, torch.nn.Parameter(value.clone(), requires_grad=False))
            else:
                mod.register_buffer(leaf, value.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def _torchscript_file(tmp_path, name=OPENAI_TINY, seed=0, fp16=True):
    source = _random_model(name, seed)
    sd = {k: (v.half() if fp16 and v.is_floating_point() else v) for k, v in source.state_dict().items()}
    sd.update(input_resolution=torch.tensor(64), context_length=torch.tensor(77), vocab_size=torch.tensor(49408))
    path = str(tmp_path / "ViT-tiny.pt")
    torch.jit.save(torch.jit.script(_Holder(sd)), path)
    return path


def test_openai_torchscript_file_loads_like_open_clip_load_openai_model(tmp_path):
    path = _torchscript_file(tmp_path)
    ours = build_clip(OPENAI_TINY, path)
    ref = open_clip.load_openai_model(path, precision="fp32", device="cpu").eval()
    tokens = get_tokenizer(OPENAI_TINY)(TEXTS)
    (oi, ot), (ri, rt) = _features(ours, _images(), tokens), _features(ref, _images(), tokens)
    di, dt = _max_diff(oi, ri), _max_diff(ot, rt)
    print(f"\nTorchScript archive vs open_clip.load_openai_model: image max|diff| {di:.2e}, text {dt:.2e}")
    assert di <= TOL and dt <= TOL
    assert not any(p.requires_grad for p in ours.parameters())


def test_torchscript_file_forces_quick_gelu_as_the_openai_tag(tmp_path, caplog):
    """A name without -quickgelu gets QuickGELU forced, with the openai tag's warning."""
    name = "sparseclip-test-openai-tiny-gelu"
    cfg = {"embed_dim": 32, "vision_cfg": {"image_size": 64, "layers": 2, "width": 128, "head_width": 64,
                                           "patch_size": 16},
           "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 128, "heads": 2, "layers": 2}}
    register_local_model_config(name, cfg)
    path = _torchscript_file(tmp_path)
    with caplog.at_level(logging.WARNING, logger="sparseclip_d2"):
        model = build_clip(name, path)
    assert isinstance(model.visual.transformer.resblocks[0].mlp.gelu, open_clip.transformer.QuickGELU)
    assert any("QuickGELU" in r.getMessage() for r in caplog.records)


def test_torchscript_file_of_another_model_names_both(tmp_path):
    path = _torchscript_file(tmp_path)
    with pytest.raises(ValueError) as e:
        build_clip("sparseclip-tiny-vit", path)
    msg = str(e.value)
    assert "sparseclip-tiny-vit" in msg and "width 128" in msg and "width 64" in msg and path in msg


# ------------------------------------------------------------------------------ local-dir
def _local_dir(tmp_path, name="sparseclip-tiny-vit", seed=1, weights=True):
    from safetensors.torch import save_file

    from sparseclip_d2.clip.model_configs import get_local_model_config

    folder = tmp_path / "oc_dir"
    folder.mkdir()
    with open(folder / "open_clip_config.json", "w") as f:
        json.dump({"model_cfg": get_local_model_config(name), "preprocess_cfg": {}}, f)
    if weights:
        sd = {k: v.contiguous() for k, v in _random_model(name, seed).state_dict().items()}
        save_file(sd, str(folder / "open_clip_model.safetensors"))
    return str(folder)


def test_local_dir_name_loads_like_open_clip(tmp_path):
    folder = _local_dir(tmp_path)
    name = f"local-dir:{folder}"
    check_model_name(name)
    ours = build_clip(name, "openai")  # the name brings its own weights: the tag is not used
    ref = open_clip.create_model(name).eval()
    tokens = get_tokenizer(name)(TEXTS)
    (oi, ot), (ri, rt) = _features(ours, _images(), tokens), _features(ref, _images(), tokens)
    di, dt = _max_diff(oi, ri), _max_diff(ot, rt)
    print(f"\nlocal-dir vs open_clip.create_model: image max|diff| {di:.2e}, text {dt:.2e}")
    assert di <= TOL and dt <= TOL
    assert _max_diff(oi, _features(_random_model("sparseclip-tiny-vit", 1), _images(), tokens)[0]) <= TOL


def test_local_dir_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        check_model_name(f"local-dir:{tmp_path}/missing")
    with pytest.raises(FileNotFoundError, match="open_clip_config.json"):
        check_model_name(f"local-dir:{tmp_path}")
    folder = _local_dir(tmp_path, weights=False)
    with pytest.raises(FileNotFoundError, match="holds no weights file"):
        build_clip(f"local-dir:{folder}", "openai")
    assert build_clip(f"local-dir:{folder}", "none") is not None  # random weights, said loudly


def test_hf_hub_names_are_validated_and_fail_fast_offline(monkeypatch):
    with pytest.raises(ValueError, match="org/repo"):
        check_model_name("hf-hub:just-a-name")
    check_model_name("hf-hub:timm/ViT-B-16-SigLIP")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RuntimeError, match="hf-hub:sparseclip-test/not-cached"):
        build_clip("hf-hub:sparseclip-test/not-cached", "none")


# ------------------------------------------------------------------------------ transformers
def _hf_clip_dir(tmp_path, hidden=64, seed=2):
    cfg = transformers.CLIPConfig(
        text_config=dict(vocab_size=49408, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=77, hidden_act="quick_gelu",
                         bos_token_id=49406, eos_token_id=49407),
        vision_config=dict(hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=2, num_attention_heads=4,
                           image_size=64, patch_size=16, hidden_act="quick_gelu"),
        projection_dim=32)
    torch.manual_seed(seed)
    model = transformers.CLIPModel(cfg).eval()
    with torch.no_grad():  # transformers initialises LayerNorms to (1, 0) and biases to 0: perturb them
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    folder = tmp_path / f"hf_clip_{hidden}"
    model.save_pretrained(str(folder))
    return str(folder), model


def _hf_siglip_dir(tmp_path, seed=3):
    cfg = transformers.SiglipConfig(
        text_config=dict(vocab_size=49408, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=16, hidden_act="gelu", layer_norm_eps=1e-6,
                         projection_size=64),
        vision_config=dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                           image_size=64, patch_size=16, hidden_act="gelu", layer_norm_eps=1e-6))
    torch.manual_seed(seed)
    model = transformers.SiglipModel(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    folder = tmp_path / "hf_siglip"
    model.save_pretrained(str(folder))
    return str(folder), model


def _hf_features(model, images, tokens):
    def pooled(out):
        return out.pooler_output if hasattr(out, "pooler_output") else out

    with torch.no_grad():
        return pooled(model.get_image_features(pixel_values=images)), pooled(model.get_text_features(input_ids=tokens))


def test_transformers_clip_checkpoint_matches_transformers_forward(tmp_path):
    folder, hf = _hf_clip_dir(tmp_path)
    ours = build_clip("sparseclip-tiny-vit", f"hf:{folder}")
    tokens = get_tokenizer("sparseclip-tiny-vit")(TEXTS)
    (oi, ot), (hi, ht) = _features(ours, _images(), tokens), _hf_features(hf, _images(), tokens)
    di, dt = _max_diff(oi, hi), _max_diff(ot, ht)
    print(f"\ntransformers CLIPModel vs converted open_clip: image max|diff| {di:.2e}, text {dt:.2e}")
    assert di <= TOL and dt <= TOL
    assert _max_diff(ours.logit_scale, hf.logit_scale) == 0.0


def test_transformers_siglip_checkpoint_matches_transformers_forward(tmp_path):
    folder, hf = _hf_siglip_dir(tmp_path)
    ours = build_clip("sparseclip-tiny-siglip", f"hf:{folder}")
    tokens = torch.randint(1, 49408, (3, 16), generator=torch.Generator().manual_seed(4))
    (oi, ot), (hi, ht) = _features(ours, _images(), tokens), _hf_features(hf, _images(), tokens)
    di, dt = _max_diff(oi, hi), _max_diff(ot, ht)
    print(f"\ntransformers SiglipModel vs converted open_clip: image max|diff| {di:.2e}, text {dt:.2e}")
    assert di <= TOL and dt <= TOL
    assert _max_diff(ours.logit_bias, hf.logit_bias) == 0.0


def test_transformers_checkpoint_of_another_model_names_both(tmp_path):
    folder, _ = _hf_clip_dir(tmp_path, hidden=128)
    with pytest.raises(ValueError) as e:
        build_clip("sparseclip-tiny-vit", f"hf:{folder}")
    msg = str(e.value)
    assert "sparseclip-tiny-vit" in msg and "vision hidden 128" in msg
    clip_dir, _ = _hf_clip_dir(tmp_path)
    with pytest.raises(ValueError) as e:
        build_clip("sparseclip-tiny-siglip", f"hf:{clip_dir}")
    assert "sparseclip-tiny-siglip" in str(e.value) and "transformers clip checkpoint" in str(e.value)


def test_transformers_unsupported_or_missing(tmp_path):
    folder = tmp_path / "bert"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    with pytest.raises(ValueError, match="model_type 'bert'.*valid: clip, siglip"):
        build_clip("sparseclip-tiny-vit", f"hf:{folder}")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_clip("sparseclip-tiny-vit", f"hf:{tmp_path}/nothing")
    with pytest.raises(ValueError, match="names no directory"):
        build_clip("sparseclip-tiny-vit", "hf:")


def test_quick_gelu_mismatch_is_an_error(tmp_path):
    """A GELU transformers checkpoint into a QuickGELU open_clip model would be silently wrong."""
    cfg = transformers.CLIPConfig(
        text_config=dict(vocab_size=49408, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, hidden_act="gelu"),
        vision_config=dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                           image_size=64, patch_size=16, hidden_act="gelu"), projection_dim=32)
    folder = tmp_path / "gelu"
    transformers.CLIPModel(cfg).save_pretrained(str(folder))
    with pytest.raises(ValueError, match="quick_gelu"):
        build_clip("sparseclip-tiny-vit", f"hf:{folder}")


# ------------------------------------------------------------------------------ messages
def test_transformers_directory_without_hf_prefix_says_to_write_hf(tmp_path):
    folder, _ = _hf_clip_dir(tmp_path)
    with pytest.raises(ValueError) as e:
        build_clip("sparseclip-tiny-vit", folder)
    assert str(e.value) == (f"MODEL.SPARSECLIP.CLIP.PRETRAINED {folder!r} is a transformers clip checkpoint "
                            f"directory, not a file: write MODEL.SPARSECLIP.CLIP.PRETRAINED hf:{folder}")
    other = tmp_path / "weights_here"
    other.mkdir()
    (other / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match=r"is a directory, not a checkpoint file \(it holds model.safetensors\); give "
                                         r"the checkpoint file, hf:DIR"):
        build_clip("sparseclip-tiny-vit", str(other))


def test_state_dict_of_another_architecture_names_both_and_the_fix(tmp_path):
    path = str(tmp_path / "openai_tiny_state_dict.pt")
    torch.save(_random_model(OPENAI_TINY, 0).state_dict(), path)
    with pytest.raises(ValueError) as e:
        build_clip("sparseclip-tiny-vit", path)
    msg = str(e.value)
    assert "\n" not in msg and "size mismatch" not in msg  # no raw load_state_dict dump
    assert msg.startswith(f"MODEL.SPARSECLIP.CLIP.PRETRAINED {path!r} holds a ViT with width 128, 2 layers, patch 16, "
                          "64 px; text width 128, 2 layers")
    assert "does not fit MODEL.SPARSECLIP.CLIP.NAME 'sparseclip-tiny-vit' (ViT with width 64" in msg
    assert msg.endswith("set MODEL.SPARSECLIP.CLIP.NAME to the file's model")


def test_open_clip_names_of_a_state_dict():
    from sparseclip_d2.clip.weights import guess_open_clip_names

    # only the shapes matter: the tensors of a ViT-B/32 (768 wide, 12 blocks, patch 32, 224 px, 512 joint)
    sd = {"visual.conv1.weight": torch.empty(768, 3, 32, 32), "visual.positional_embedding": torch.empty(50, 768),
          "text_projection": torch.empty(512, 512)}
    sd.update({f"visual.transformer.resblocks.{i}.attn.in_proj_weight": torch.empty(0) for i in range(12)})
    assert guess_open_clip_names(sd)[:2] == ["ViT-B-32", "ViT-B-32-quickgelu"]
    sd["visual.conv1.weight"] = torch.empty(768, 3, 16, 16)
    sd["visual.positional_embedding"] = torch.empty(197, 768)
    assert guess_open_clip_names(sd)[0] == "ViT-B-16"


def test_file_that_is_no_checkpoint_says_so(tmp_path):
    path = tmp_path / "notes.pt"
    path.write_text("hello, this is not a checkpoint\n")
    with pytest.raises(ValueError) as e:
        build_clip("sparseclip-tiny-vit", str(path))
    msg = str(e.value)
    assert msg.startswith(f"MODEL.SPARSECLIP.CLIP.PRETRAINED {str(path)!r} is not a checkpoint: it is neither a zip")
    assert "it starts with b'hello, this '" in msg and "weights_only" not in msg


def test_training_checkpoint_with_python_objects_names_the_fix(tmp_path):
    path = str(tmp_path / "training.pt")
    torch.save({"model": torch.nn.Linear(2, 2), "epoch": 3}, path)
    with pytest.raises(ValueError) as e:
        build_clip("sparseclip-tiny-vit", path)
    msg = str(e.value)
    assert "holds Python objects besides tensors" in msg and "torch.save(model.state_dict(), FILE)" in msg
    assert "weights_only=False" not in msg and "file an issue" not in msg.lower()


# ------------------------------------------------------------------------------ open_clip state dict files
def _spy_load_checkpoint(monkeypatch):
    calls = []
    real = open_clip.load_checkpoint

    def spy(model, path, *a, **k):
        calls.append(path)
        return real(model, path, *a, **k)

    monkeypatch.setattr(open_clip, "load_checkpoint", spy)
    return calls


@pytest.mark.parametrize("layout", ["plain", "wrapped_module_prefix", "fp16"])
def test_state_dict_file_loads_in_place_with_the_values_open_clip_copies(tmp_path, monkeypatch, layout):
    """A file whose keys and shapes are the model's own is assigned (one copy in memory, no
    open_clip.load_checkpoint); every tensor equals what open_clip's copy into a model gives."""
    sd = _random_model("sparseclip-tiny-vit", 3).state_dict()
    if layout == "fp16":
        sd = {k: v.half() if v.is_floating_point() else v for k, v in sd.items()}
    saved = {"state_dict": {"module." + k: v for k, v in sd.items()}} if layout == "wrapped_module_prefix" else sd
    path = str(tmp_path / f"{layout}.pt")
    torch.save(saved, path)
    calls = _spy_load_checkpoint(monkeypatch)
    ours = build_clip("sparseclip-tiny-vit", path)
    assert calls == []
    reference = _random_model("sparseclip-tiny-vit", 5)
    open_clip.load_checkpoint(reference, path)  # open_clip's own reading and copy
    mine, theirs = ours.state_dict(), reference.state_dict()
    assert mine.keys() == theirs.keys()
    for k in theirs:
        assert mine[k].dtype == theirs[k].dtype == torch.float32 and torch.equal(mine[k], theirs[k]), k
    # buffers a state dict does not hold (the text tower's causal mask) are kept as built
    saved_names = set(theirs)
    built = dict(_random_model("sparseclip-tiny-vit", 7).named_buffers())
    extra = {n: b for n, b in ours.named_buffers() if n not in saved_names}
    assert extra and extra.keys() == {n for n in built if n not in saved_names}
    for n, b in extra.items():
        assert b.device.type == "cpu" and torch.equal(b, built[n]), n
    assert all(p.device.type == "cpu" and not p.requires_grad for p in ours.parameters())
    a, b = _features(ours, _images(), get_tokenizer("sparseclip-tiny-vit")(TEXTS)), \
        _features(reference.eval(), _images(), get_tokenizer("sparseclip-tiny-vit")(TEXTS))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_state_dict_file_that_needs_open_clip_conversion_goes_through_open_clip(tmp_path, monkeypatch):
    sd = dict(_random_model("sparseclip-tiny-vit", 3).state_dict())
    assert sd["logit_scale"].ndim == 0
    sd["logit_scale"] = sd["logit_scale"].reshape(1)  # an older layout open_clip reshapes on load
    path = str(tmp_path / "old_layout.pt")
    torch.save(sd, path)
    calls = _spy_load_checkpoint(monkeypatch)
    ours = build_clip("sparseclip-tiny-vit", path)
    assert calls == [path]
    assert ours.logit_scale.shape == () and torch.equal(ours.logit_scale, sd["logit_scale"][0])
    assert torch.equal(ours.visual.conv1.weight, sd["visual.conv1.weight"])
