"""Weight formats beyond open_clip's own: OpenAI TorchScript archives and Hugging Face
``transformers`` CLIP / SigLIP checkpoints, loaded into an open_clip model.

- An OpenAI CLIP ``.pt`` file (what ``clip.load`` leaves in ``~/.cache/clip``) is a
  TorchScript archive. Its state dict uses open_clip's ``CLIP`` key names (open_clip kept
  OpenAI's layout, ``open_clip/model.py`` ``build_model_from_openai_state_dict``) plus three
  integer entries (``input_resolution``, ``context_length``, ``vocab_size``) that are not
  weights. :func:`load_torchscript_state_dict` reads it without running any of its code.
- A ``transformers`` checkpoint directory (``config.json`` + ``model.safetensors`` or
  ``pytorch_model.bin``, as ``save_pretrained`` writes it) of ``CLIPModel`` or
  ``SiglipModel`` is converted key by key (:func:`convert_transformers_state_dict`) into
  the state dict of a given open_clip model; every tensor's shape is checked, so a
  checkpoint of another architecture is an error naming both models.
"""
import json
import logging
import os
import pickle
import struct
import warnings
import zipfile
from typing import Callable, Dict, List, Optional

import torch

__all__ = [
    "HF_PRETRAINED_PREFIX",
    "is_torchscript_archive",
    "load_torchscript_state_dict",
    "describe_openai_state_dict",
    "parse_hf_pretrained",
    "read_transformers_config",
    "load_transformers_state_dict",
    "convert_transformers_state_dict",
    "SUPPORTED_TRANSFORMERS_TYPES",
    "transformers_activation",
    "check_transformers_activation",
    "checkpoint_format",
    "guess_open_clip_names",
    "directory_as_pretrained",
    "explain_checkpoint_failure",
]

logger = logging.getLogger(__name__)

#: ``MODEL.SPARSECLIP.CLIP.PRETRAINED hf:/path/to/dir`` selects a transformers checkpoint.
HF_PRETRAINED_PREFIX = "hf:"
#: transformers ``config.json`` ``model_type`` values the converter supports.
SUPPORTED_TRANSFORMERS_TYPES = ("clip", "siglip")
# Entries of an OpenAI TorchScript state dict that are hyper-parameters, not weights
# (open_clip/model.py build_model_from_openai_state_dict pops the same three).
_OPENAI_META_KEYS = ("input_resolution", "context_length", "vocab_size")
# transformers' weight file names, in save_pretrained's order of preference
# (transformers/utils/__init__.py SAFE_WEIGHTS_NAME, WEIGHTS_NAME).
_HF_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


# ------------------------------------------------------------------------------ TorchScript
def is_torchscript_archive(path: str) -> bool:
    """True when ``path`` is a TorchScript archive (a zip holding ``*/code/`` sources or a
    ``*/constants.pkl``), as ``torch.jit.save`` and OpenAI's CLIP release write them. A
    plain ``torch.save`` zip holds neither."""
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as z:
        return any("/code/" in n or n.endswith("/constants.pkl") for n in z.namelist())


def load_torchscript_state_dict(path: str) -> Dict[str, torch.Tensor]:
    """The weights of a TorchScript CLIP archive, on the CPU, in its stored dtype, without
    the hyper-parameter entries. ``torch.jit.load`` reads the archive; nothing in it runs."""
    with warnings.catch_warnings():  # torch >= 2.10 deprecates TorchScript; OpenAI's files are TorchScript
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.load` is deprecated", category=FutureWarning)
        module = torch.jit.load(path, map_location="cpu")
    return {k: v for k, v in module.state_dict().items() if k not in _OPENAI_META_KEYS}


def _openai_layers(sd: Dict[str, torch.Tensor], prefix: str) -> int:
    index = prefix.rstrip(".").count(".") + 1  # the block number follows the prefix
    return len({k.split(".")[index] for k in sd if k.startswith(prefix) and k.endswith(".attn.in_proj_weight")})


def describe_openai_state_dict(sd: Dict[str, torch.Tensor]) -> str:
    """A one-line description of the CLIP architecture an OpenAI-layout state dict holds,
    e.g. ``ViT with width 768, 12 layers, patch 16, 224 px; text width 512, 12 layers``."""
    try:
        conv = sd["visual.conv1.weight"]
        grid = int(round((sd["visual.positional_embedding"].shape[0] - 1) ** 0.5))
        vis = (f"ViT with width {conv.shape[0]}, {_openai_layers(sd, 'visual.transformer.resblocks.')} layers, "
               f"patch {conv.shape[-1]}, {grid * conv.shape[-1]} px")
    except KeyError:
        vis = "no OpenAI ViT vision tower (visual.conv1 missing: a ResNet or another layout)"
    text = ""
    if "ln_final.weight" in sd:
        text = f"; text width {sd['ln_final.weight'].shape[0]}, {_openai_layers(sd, 'transformer.resblocks.')} layers"
    if "text_projection" in sd:
        text += f"; joint space {sd['text_projection'].shape[-1]}"
    return vis + text


# ------------------------------------------------------------------------------ transformers
def parse_hf_pretrained(value: Optional[str]) -> Optional[str]:
    """The directory of a ``hf:/path`` PRETRAINED value (``~`` expanded), else ``None``."""
    if value is None:
        return None
    value = str(value).strip()
    if not value.startswith(HF_PRETRAINED_PREFIX):
        return None
    path = value[len(HF_PRETRAINED_PREFIX):].strip()
    if not path:
        raise ValueError("MODEL.SPARSECLIP.CLIP.PRETRAINED 'hf:' names no directory; use hf:/path/to/checkpoint_dir "
                         "(a transformers CLIPModel / SiglipModel directory with config.json)")
    return os.path.expanduser(path)


def read_transformers_config(path: str) -> dict:
    """``config.json`` of a transformers checkpoint directory, checked to be a supported
    model type. Raises FileNotFoundError / ValueError naming the directory."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"transformers checkpoint directory {path!r} (MODEL.SPARSECLIP.CLIP.PRETRAINED hf:...) "
                                "does not exist")
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise FileNotFoundError(f"{path!r} holds no config.json: not a transformers checkpoint directory "
                                "(save_pretrained writes config.json and model.safetensors)")
    with open(cfg_path, encoding="utf-8") as f:
        cfg = json.load(f)
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_TRANSFORMERS_TYPES:
        raise ValueError(f"{cfg_path}: model_type {model_type!r} (architectures {cfg.get('architectures')}) is not "
                         f"supported; valid: {', '.join(SUPPORTED_TRANSFORMERS_TYPES)} (CLIPModel, SiglipModel)")
    return cfg


def load_transformers_state_dict(path: str) -> Dict[str, torch.Tensor]:
    """The tensors of a transformers checkpoint directory (safetensors preferred; a
    ``pytorch_model.bin`` is read with ``weights_only=True``; sharded checkpoints through
    their ``*.index.json``)."""
    for name in _HF_WEIGHT_FILES:
        index = os.path.join(path, name + ".index.json")
        files = []
        if os.path.isfile(os.path.join(path, name)):
            files = [os.path.join(path, name)]
        elif os.path.isfile(index):
            with open(index, encoding="utf-8") as f:
                files = sorted({os.path.join(path, v) for v in json.load(f)["weight_map"].values()})
        if not files:
            continue
        sd: Dict[str, torch.Tensor] = {}
        for file in files:
            if file.endswith(".safetensors"):
                from safetensors.torch import load_file

                sd.update(load_file(file, device="cpu"))
            else:
                sd.update(torch.load(file, map_location="cpu", weights_only=True))
        return sd
    raise FileNotFoundError(f"{path!r} holds no transformers weights ({', '.join(_HF_WEIGHT_FILES)} or their "
                            "sharded *.index.json)")


def _hf_model_line(cfg: dict) -> str:
    v, t = cfg.get("vision_config", {}), cfg.get("text_config", {})
    return (f"transformers {cfg.get('model_type')} checkpoint (vision hidden {v.get('hidden_size')}, "
            f"{v.get('num_hidden_layers')} layers, patch {v.get('patch_size')}, {v.get('image_size')} px; "
            f"text hidden {t.get('hidden_size')}, {t.get('num_hidden_layers')} layers)")


def _qkv(sd: Dict[str, torch.Tensor], prefix: str, kind: str) -> torch.Tensor:
    return torch.cat([sd[f"{prefix}.{p}_proj.{kind}"] for p in ("q", "k", "v")], 0)


def _encoder_layers(sd: Dict[str, torch.Tensor], prefix: str) -> int:
    return len({k[len(prefix):].split(".")[0] for k in sd if k.startswith(prefix)})


# The tensors of one transformers encoder layer (its names) and where they go in an open_clip
# ResidualAttentionBlock (open_clip/transformer.py) and a timm ViT Block
# (timm/models/vision_transformer.py); "{}" is weight or bias, "qkv" the fused q/k/v projection.
_LAYER_TENSORS = ("qkv", "self_attn.out_proj", "layer_norm1", "layer_norm2", "mlp.fc1", "mlp.fc2")
_OPEN_CLIP_BLOCK = ("attn.in_proj_{}", "attn.out_proj.{}", "ln_1.{}", "ln_2.{}", "mlp.c_fc.{}", "mlp.c_proj.{}")
_TIMM_BLOCK = ("attn.qkv.{}", "attn.proj.{}", "norm1.{}", "norm2.{}", "mlp.fc1.{}", "mlp.fc2.{}")


def _block(sd, src: str, dst: str, names, out: Dict[str, torch.Tensor]) -> None:
    """One transformers encoder layer ``src`` -> the block ``dst`` whose tensor names are ``names``."""
    for kind in ("weight", "bias"):
        for hf, name in zip(_LAYER_TENSORS, names):
            value = _qkv(sd, f"{src}.self_attn", kind) if hf == "qkv" else sd[f"{src}.{hf}.{kind}"]
            out[f"{dst}.{name.format(kind)}"] = value


def _pair(out, dst: str, sd, src: str) -> None:
    out[f"{dst}.weight"], out[f"{dst}.bias"] = sd[f"{src}.weight"], sd[f"{src}.bias"]


def _convert_clip(sd: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """transformers ``CLIPModel`` -> open_clip ``CLIP`` (key names of open_clip/model.py)."""
    out: Dict[str, torch.Tensor] = {}
    v, t = "vision_model", "text_model"
    out["visual.class_embedding"] = sd[f"{v}.embeddings.class_embedding"]
    out["visual.conv1.weight"] = sd[f"{v}.embeddings.patch_embedding.weight"]
    out["visual.positional_embedding"] = sd[f"{v}.embeddings.position_embedding.weight"]
    _pair(out, "visual.ln_pre", sd, f"{v}.pre_layrnorm")  # sic: transformers' CLIP spelling
    for i in range(_encoder_layers(sd, f"{v}.encoder.layers.")):
        _block(sd, f"{v}.encoder.layers.{i}", f"visual.transformer.resblocks.{i}", _OPEN_CLIP_BLOCK, out)
    _pair(out, "visual.ln_post", sd, f"{v}.post_layernorm")
    out["visual.proj"] = sd["visual_projection.weight"].t().contiguous()
    out["token_embedding.weight"] = sd[f"{t}.embeddings.token_embedding.weight"]
    out["positional_embedding"] = sd[f"{t}.embeddings.position_embedding.weight"]
    for i in range(_encoder_layers(sd, f"{t}.encoder.layers.")):
        _block(sd, f"{t}.encoder.layers.{i}", f"transformer.resblocks.{i}", _OPEN_CLIP_BLOCK, out)
    _pair(out, "ln_final", sd, f"{t}.final_layer_norm")
    out["text_projection"] = sd["text_projection.weight"].t().contiguous()
    out["logit_scale"] = sd["logit_scale"].reshape(())
    return out


def _convert_siglip(sd: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """transformers ``SiglipModel`` -> open_clip ``CustomTextCLIP`` with a timm SigLIP trunk
    (``visual.trunk.*``, timm/models/vision_transformer.py; MAP head
    timm/layers/attention_pool.py ``AttentionPoolLatent``: ``q`` and a fused ``kv``)."""
    out: Dict[str, torch.Tensor] = {}
    v, t, tr = "vision_model", "text_model", "visual.trunk"
    _pair(out, f"{tr}.patch_embed.proj", sd, f"{v}.embeddings.patch_embedding")
    out[f"{tr}.pos_embed"] = sd[f"{v}.embeddings.position_embedding.weight"].unsqueeze(0)
    for i in range(_encoder_layers(sd, f"{v}.encoder.layers.")):
        _block(sd, f"{v}.encoder.layers.{i}", f"{tr}.blocks.{i}", _TIMM_BLOCK, out)
    _pair(out, f"{tr}.norm", sd, f"{v}.post_layernorm")
    head = f"{v}.head"
    if f"{head}.probe" in sd:
        out[f"{tr}.attn_pool.latent"] = sd[f"{head}.probe"]
        w, b = sd[f"{head}.attention.in_proj_weight"], sd[f"{head}.attention.in_proj_bias"]
        dim = w.shape[1]
        out[f"{tr}.attn_pool.q.weight"], out[f"{tr}.attn_pool.q.bias"] = w[:dim], b[:dim]
        out[f"{tr}.attn_pool.kv.weight"], out[f"{tr}.attn_pool.kv.bias"] = w[dim:], b[dim:]
        _pair(out, f"{tr}.attn_pool.proj", sd, f"{head}.attention.out_proj")
        _pair(out, f"{tr}.attn_pool.norm", sd, f"{head}.layernorm")
        _pair(out, f"{tr}.attn_pool.mlp.fc1", sd, f"{head}.mlp.fc1")
        _pair(out, f"{tr}.attn_pool.mlp.fc2", sd, f"{head}.mlp.fc2")
    out["text.token_embedding.weight"] = sd[f"{t}.embeddings.token_embedding.weight"]
    out["text.positional_embedding"] = sd[f"{t}.embeddings.position_embedding.weight"]
    for i in range(_encoder_layers(sd, f"{t}.encoder.layers.")):
        _block(sd, f"{t}.encoder.layers.{i}", f"text.transformer.resblocks.{i}", _OPEN_CLIP_BLOCK, out)
    _pair(out, "text.ln_final", sd, f"{t}.final_layer_norm")
    _pair(out, "text.text_projection", sd, f"{t}.head")
    out["logit_scale"] = sd["logit_scale"].reshape(())
    out["logit_bias"] = sd["logit_bias"].reshape(())
    return out


_CONVERTERS: Dict[str, Callable[[Dict[str, torch.Tensor]], Dict[str, torch.Tensor]]] = {
    "clip": _convert_clip,
    "siglip": _convert_siglip,
}


def _act_of(module: torch.nn.Module) -> str:
    """``quick_gelu``, ``gelu`` or ``gelu_tanh``: the first MLP activation found in ``module``."""
    for m in module.modules():
        if type(m).__name__ == "QuickGELU":
            return "quick_gelu"
        if isinstance(m, torch.nn.GELU):
            return "gelu_tanh" if m.approximate == "tanh" else "gelu"
    return "unknown"


# transformers ACT2FN names (transformers/activations.py) -> the activation they compute.
_HF_ACTS = {"quick_gelu": "quick_gelu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh"}


def transformers_activation(cfg: dict, tower: str) -> str:
    """The activation (``quick_gelu`` / ``gelu`` / ``gelu_tanh``) of a checkpoint's
    ``vision`` or ``text`` tower, from its config.json ``hidden_act``."""
    act = cfg.get(f"{tower}_config", {}).get("hidden_act", "quick_gelu" if cfg.get("model_type") == "clip"
                                              else "gelu_pytorch_tanh")
    return _HF_ACTS.get(act, act)


def convert_transformers_state_dict(path: str, model: torch.nn.Module, model_name: str,
                                    cfg: Optional[dict] = None) -> Dict[str, torch.Tensor]:
    """The open_clip state dict of ``model`` (named ``model_name``) filled from the
    transformers checkpoint directory ``path`` (``cfg``: its config.json when already read).

    Raises:
        ValueError: the checkpoint is of another architecture than ``model`` (a missing
            tensor or a shape mismatch; the message names both models), or an unsupported
            ``model_type``.
    """
    cfg = read_transformers_config(path) if cfg is None else cfg
    model_type = cfg["model_type"]
    sd = load_transformers_state_dict(path)
    target = model.state_dict()
    what = f"{_hf_model_line(cfg)} at {path!r}"
    try:
        converted = _CONVERTERS[model_type](sd)
    except KeyError as e:
        raise ValueError(f"{what} lacks the tensor {e.args[0]!r} of a transformers {model_type} model") from None
    wrong: List[str] = []
    for k, tensor in converted.items():
        if k not in target:
            wrong.append(f"{k} (not in {model_name})")
        elif tuple(target[k].shape) != tuple(tensor.shape):
            wrong.append(f"{k} {tuple(tensor.shape)} vs {tuple(target[k].shape)}")
    missing = [k for k in target if k not in converted and not k.endswith("attn_mask")]
    if wrong or missing:
        detail = "; ".join(wrong[:3] + [f"{k} missing" for k in missing[:3]])
        raise ValueError(f"{what} does not fit the open_clip model {model_name!r}: {detail}"
                         f"{' ...' if len(wrong) + len(missing) > 3 else ''}. Choose the MODEL.SPARSECLIP.CLIP.NAME of "
                         f"the checkpoint's architecture (e.g. ViT-B-16-quickgelu for openai/clip-vit-base-patch16, "
                         f"ViT-B-16-SigLIP for google/siglip-base-patch16-224)")
    return converted


def check_transformers_activation(cfg: dict, model: torch.nn.Module, model_name: str) -> None:
    """Compare the activation of ``model``'s vision tower with the one the checkpoint was
    defined with. QuickGELU against GELU would give other features: a ValueError naming
    the name to use. GELU against its tanh approximation (SigLIP: open_clip's own port of
    these weights runs exact GELU too) differs slightly: a warning."""
    want = transformers_activation(cfg, "vision")
    have = _act_of(getattr(model, "visual", model))
    if want == have:
        return
    msg = f"the transformers checkpoint's vision tower uses {want} but open_clip's {model_name} runs {have}"
    if "quick_gelu" in (want, have):
        raise ValueError(f"{msg}; use the open_clip name with{'' if want == 'quick_gelu' else 'out'} '-quickgelu'")
    logger.warning("%s: features differ slightly from transformers' own forward (open_clip's own port of these "
                   "weights runs %s too)", msg, have)


# ------------------------------------------------------------------------------ messages
#: The key a weights message names.
PRETRAINED_KEY = "MODEL.SPARSECLIP.CLIP.PRETRAINED"


def checkpoint_format(path: str) -> str:
    """What the first bytes of ``path`` say it is: ``"zip"`` (``torch.save`` since torch 1.6,
    TorchScript), ``"pickle"`` (legacy ``torch.save``), ``"safetensors"`` (an 8-byte header
    length then JSON), ``"numpy"`` (``.npz`` / ``.npy``, big_vision), or ``"unknown"``."""
    with open(path, "rb") as f:
        head = f.read(16)
    if head.startswith(b"PK\x03\x04"):
        return "numpy" if path.lower().endswith(".npz") else "zip"
    if head.startswith(b"\x93NUMPY"):
        return "numpy"
    if head[:1] == b"\x80" and len(head) > 1 and 2 <= head[1] <= 5:
        return "pickle"
    if len(head) >= 9:
        (size,) = struct.unpack("<Q", head[:8])
        if 0 < size < 100_000_000 and head[8:9] == b"{":
            return "safetensors"
    return "unknown"


def _open_clip_vision(name: str) -> Optional[tuple]:
    import open_clip

    cfg = open_clip.get_model_config(name) or {}
    v = cfg.get("vision_cfg", {})
    if "timm_model_name" in v or not v.get("width"):
        return None
    return (v.get("width"), v.get("layers"), v.get("patch_size"), v.get("image_size"))


def guess_open_clip_names(sd: Dict[str, torch.Tensor], limit: int = 3) -> List[str]:
    """open_clip model names whose vision tower has the width, depth, patch and size of the
    OpenAI-layout state dict ``sd`` (shortest names first; empty when none or not a ViT)."""
    import open_clip

    try:
        conv = sd["visual.conv1.weight"]
        grid = int(round((sd["visual.positional_embedding"].shape[0] - 1) ** 0.5))
    except KeyError:
        return []
    want = (int(conv.shape[0]), _openai_layers(sd, "visual.transformer.resblocks."), int(conv.shape[-1]),
            grid * int(conv.shape[-1]))
    embed = int(sd["text_projection"].shape[-1]) if "text_projection" in sd else None
    names = [n for n in open_clip.list_models() if _open_clip_vision(n) == want
             and (embed is None or (open_clip.get_model_config(n) or {}).get("embed_dim") == embed)]
    # plain CLIP ViTs (ViT-B-32) before CoCa and the multilingual variants of the same tower
    return sorted(names, key=lambda n: (not n.startswith("ViT-"), len(n), n))[:limit]


def directory_as_pretrained(path: str, name: str) -> str:
    """The message for a directory given as ``PRETRAINED`` (a file or ``hf:DIR`` is expected):
    what the directory holds and the value to write instead."""
    if os.path.isfile(os.path.join(path, "config.json")):
        try:
            with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
                model_type = json.load(f).get("model_type")
        except (OSError, ValueError):
            model_type = None
        if model_type in SUPPORTED_TRANSFORMERS_TYPES:
            return (f"{PRETRAINED_KEY} {path!r} is a transformers {model_type} checkpoint directory, not a file: "
                    f"write {PRETRAINED_KEY} hf:{path}")
    if os.path.isfile(os.path.join(path, "open_clip_config.json")):
        return (f"{PRETRAINED_KEY} {path!r} is an open_clip model directory (open_clip_config.json): name it as the "
                f"model instead, MODEL.SPARSECLIP.CLIP.NAME local-dir:{path} (its weights come with it)")
    files = sorted(f for f in os.listdir(path) if f.lower().endswith((".pt", ".pth", ".bin", ".safetensors")))
    inside = f" (it holds {', '.join(files[:3])}{' ...' if len(files) > 3 else ''})" if files else ""
    return (f"{PRETRAINED_KEY} {path!r} is a directory, not a checkpoint file{inside}; give the checkpoint file, "
            f"hf:DIR for a transformers directory, or none for random weights")


def _state_dict_of(path: str) -> Optional[Dict[str, torch.Tensor]]:
    """The tensors of a checkpoint file as open_clip would read them (``state_dict`` entry,
    ``module.`` prefix dropped), read safely; ``None`` when that is not possible."""
    try:
        if checkpoint_format(path) == "safetensors":
            from safetensors.torch import load_file

            sd = load_file(path, device="cpu")
        else:
            sd = torch.load(path, map_location="cpu", weights_only=True, mmap=checkpoint_format(path) == "zip")
    except Exception:  # noqa: BLE001 - only used to explain another failure
        return None
    if isinstance(sd, dict) and isinstance(sd.get("state_dict"), dict):
        sd = sd["state_dict"]
    if not isinstance(sd, dict):
        return None
    return {(k[len("module."):] if k.startswith("module.") else k): v for k, v in sd.items()
            if isinstance(v, torch.Tensor)}


def explain_checkpoint_failure(path: str, name: str, model: torch.nn.Module, error: BaseException) -> str:
    """One line saying why the checkpoint file ``path`` could not be loaded into ``model``
    (built as ``name``), naming both sides and the fix: a file that is no checkpoint at all,
    one that holds Python objects a safe load refuses, one of another architecture (which
    model it holds, and the open_clip names of that model), else the loader's own error."""
    kind = checkpoint_format(path)
    if kind == "unknown":
        with open(path, "rb") as f:
            head = f.read(12)
        return (f"{PRETRAINED_KEY} {path!r} is not a checkpoint: it is neither a zip (torch.save, TorchScript), a "
                f"pickle (an old torch.save) nor a .safetensors file (it starts with {head!r}); give an OpenAI CLIP "
                f".pt file or an open_clip state dict of {name!r}")
    if isinstance(error, pickle.UnpicklingError) or "weights_only" in str(error):
        return (f"{PRETRAINED_KEY} {path!r} holds Python objects besides tensors (a training checkpoint or a "
                f"pickled model), which the safe loader refuses; save only the weights of {name!r} from it "
                "(torch.save(model.state_dict(), FILE) in the code that made it) and give that file")
    sd = _state_dict_of(path)
    if sd:
        target = model.state_dict()
        # a position table of another size alone is resized by open_clip: name a real difference first
        bad = sorted((k for k in target if k in sd and tuple(sd[k].shape) != tuple(target[k].shape)),
                     key=lambda k: "positional_embedding" in k)
        missing = [k for k in target if k not in sd and not k.endswith("attn_mask")]
        if (sd.keys() & target.keys()) and (bad or missing):
            first = bad[0] if bad else missing[0]
            where = (f" {tuple(sd[first].shape)} in the file vs {tuple(target[first].shape)}" if bad else
                     " missing from the file")
            guess = guess_open_clip_names(sd)
            return (f"{PRETRAINED_KEY} {path!r} holds a {describe_openai_state_dict(sd)}, which does not fit "
                    f"MODEL.SPARSECLIP.CLIP.NAME {name!r} ({describe_openai_state_dict(target)}; first difference: "
                    f"{first}{where}); set MODEL.SPARSECLIP.CLIP.NAME to the file's model"
                    + (f" ({' or '.join(guess)})" if guess else ""))
    return (f"could not read the CLIP checkpoint file {path!r} for model {name!r} ({type(error).__name__}: "
            f"{' '.join(str(error).split())[:300]}); expected an OpenAI CLIP .pt file or an open_clip state dict "
            "(.bin / .pt / .safetensors) of this model")
