"""Build a frozen open_clip CLIP model from (name, pretrained tag | local file | none)."""
import contextlib
import copy
import json
import logging
import os
import socket
import zipfile
from typing import Optional, Tuple, Union
from urllib.parse import urlparse

import torch

import open_clip

from ..common.logs import dropping_log_records
from .model_configs import LOCAL_MODEL_CONFIGS, get_local_model_config
from .weights import (check_transformers_activation, convert_transformers_state_dict, describe_openai_state_dict,
                      directory_as_pretrained, explain_checkpoint_failure, is_torchscript_archive, load_torchscript_state_dict, parse_hf_pretrained,
                      read_transformers_config, transformers_activation)

__all__ = ["build_clip", "check_model_name", "is_random_weights", "get_tokenizer", "PRECISIONS",
           "vision_tower_variant", "VISION_ACTS"]

logger = logging.getLogger(__name__)

PRECISIONS = ("fp32", "fp16", "bf16")
#: Vision-tower activations of :func:`vision_tower_variant` ("" = as built).
VISION_ACTS = ("", "gelu", "quick_gelu")
_RANDOM_VALUES = ("", "none", "random")
# open_clip builds sparseclip_d2's own configs from this built-in name, with every
# architecture field overridden by the local config dict.
_FACTORY_BASE = "ViT-B-16"
# ... and the configs with a timm vision tower from a timm-tower name, so that open_clip's
# precision handling takes its timm path (open_clip factory `_set_model_device_and_precision`).
_FACTORY_BASE_TIMM = "EVA02-B-16"

_NO_NETWORK_HELP = (
    "There is probably no network here: supply a local checkpoint file path via "
    "MODEL.SPARSECLIP.CLIP.PRETRAINED (e.g. the OpenAI ViT-B-16.pt or an open_clip "
    "open_clip_pytorch_model.bin), or `none` for a random-weight smoke run."
)


# open_clip/factory.py create_model: logging.warning("No pretrained weights loaded for model
# ..." on the root logger for every pretrained=None build; build_clip says it once itself.
_OPEN_CLIP_RANDOM_NOTICE = "No pretrained weights loaded for model"
# Seconds to wait for a TCP connection to the weights' host before declaring it unreachable.
_PROBE_TIMEOUT_S = 3.0
_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def _quiet_random_notice():
    return dropping_log_records("", _OPEN_CLIP_RANDOM_NOTICE)


def _weights_source(tag_cfg: dict, cache_dir: Optional[str]) -> Tuple[str, int, list]:
    """``(host, port, cached candidate files)`` of an open_clip pretrained tag, following
    open_clip/pretrained.py ``download_pretrained``: the Hugging Face hub when the tag has an
    ``hf_hub`` entry (``org/model/filename``; a ``.safetensors`` alternative is tried first),
    else its ``url`` (cached as ``<cache_dir or ~/.cache/clip>/<basename>``)."""
    if tag_cfg.get("hf_hub"):
        try:
            import huggingface_hub
            from huggingface_hub import constants as hf_constants
        except ImportError:
            return "", 0, []
        model_id, filename = os.path.split(tag_cfg["hf_hub"])
        filename = filename or "open_clip_pytorch_model.bin"  # open_clip/constants.py HF_WEIGHTS_NAME
        names = [filename]
        if filename == "open_clip_pytorch_model.bin":  # open_clip/pretrained.py _get_safe_alternatives
            names.insert(0, "open_clip_model.safetensors")
        elif filename.endswith(".bin"):
            names.insert(0, filename[:-4] + ".safetensors")
        cached = []
        for n in names:
            hit = huggingface_hub.try_to_load_from_cache(model_id, n, cache_dir=cache_dir)
            if isinstance(hit, str):
                cached.append(hit)
        return _host_port(hf_constants.ENDPOINT) + (cached,)
    url = tag_cfg.get("url", "")
    if not url:
        return "", 0, []
    root = cache_dir or os.path.expanduser(os.path.join("~", ".cache", "clip"))
    path = os.path.join(root, os.path.basename(urlparse(url).path))
    return _host_port(url) + ([path] if os.path.isfile(path) else [],)


def _host_port(url: str) -> Tuple[str, int]:
    parsed = urlparse(url)
    return parsed.hostname or "", parsed.port or (80 if parsed.scheme == "http" else 443)


def _fail_fast_when_offline(name: str, tag: str, tag_cfg: dict, cache_dir: Optional[str]) -> None:
    """Raise at once (instead of a minute of download retries and a chained traceback) when
    the weights of ``tag`` are not cached and their host cannot be reached.

    Only a TCP connection is tried (``_PROBE_TIMEOUT_S``); with a proxy configured the
    download is left to try. Raises RuntimeError naming the model, the tag and the host."""
    if any(os.environ.get(v) for v in _PROXY_VARS):
        return
    host, port, cached = _weights_source(tag_cfg, cache_dir)
    if not host or cached:
        return
    try:
        socket.create_connection((host, port), timeout=_PROBE_TIMEOUT_S).close()
    except OSError as e:
        raise RuntimeError(
            f"could not obtain the weights of CLIP {name!r} pretrained={tag!r}: they are not in the local "
            f"download cache and {host} cannot be reached ({e}). " + _NO_NETWORK_HELP) from None


def is_random_weights(pretrained: Optional[str]) -> bool:
    """True when ``pretrained`` asks for random weights (``None``, ``""``, ``"none"``, ``"random"``)."""
    return pretrained is None or str(pretrained).strip().lower() in _RANDOM_VALUES


def _looks_like_path(value: str) -> bool:
    return (os.sep in value or "/" in value or value.startswith("~")
            or value.lower().endswith((".pt", ".pth", ".bin", ".safetensors", ".ckpt", ".npz")))


@contextlib.contextmanager
def _reading_checkpoint(path: str, name: str):
    """Re-raise any failure to read or apply a local checkpoint as a ValueError naming it."""
    try:
        yield
    except Exception as e:  # unpickling, zip, safetensors, key/shape mismatches: all say "bad file"
        raise ValueError(
            f"could not read the CLIP checkpoint file {path!r} for model {name!r} "
            f"({type(e).__name__}: {e}); expected an OpenAI CLIP .pt file or an open_clip state "
            f"dict (.bin / .pt / .safetensors) of this model") from e


def _finish(model: torch.nn.Module) -> torch.nn.Module:
    model.eval()
    model.requires_grad_(False)
    return model


def _weights_to_load(name: str, pretrained: Optional[str], hf_dir: Optional[str], schema: str,
                     force_quick_gelu: bool) -> Tuple[Optional[str], Optional[str], bool]:
    """``(weights file or hf: directory to load into the built model, or None; the pretrained tag
    left for open_clip, or None; force_quick_gelu)`` of :func:`build_clip`'s arguments."""
    weights_file = None
    if hf_dir is None and pretrained is not None and os.path.isdir(pretrained):
        raise ValueError(directory_as_pretrained(pretrained, name))  # not "does not exist": say what it is
    if hf_dir is not None:
        hf_cfg = read_transformers_config(hf_dir)
        weights_file = hf_dir
        if transformers_activation(hf_cfg, "vision") == "quick_gelu":
            force_quick_gelu = _quick_gelu_notice(name, f"hf:{hf_dir}", force_quick_gelu)
    elif pretrained is not None and (schema or get_local_model_config(name) is not None or os.path.isfile(pretrained)):
        if schema and not _looks_like_path(pretrained):
            logger.info("CLIP %s brings its own weights; MODEL.SPARSECLIP.CLIP.PRETRAINED=%r names none and is not "
                        "used", name, pretrained)
            pretrained = None
        elif not os.path.isfile(pretrained):
            raise FileNotFoundError(
                f"CLIP checkpoint file {pretrained!r} for model {name!r} does not exist; pass an existing local "
                "checkpoint file, hf:/path/to/transformers_dir, or `none`")
        else:
            weights_file = pretrained
            if is_torchscript_archive(pretrained):
                force_quick_gelu = _quick_gelu_notice(name, pretrained, force_quick_gelu)
    return weights_file, pretrained, force_quick_gelu


def build_clip(
    name: str,
    pretrained: Optional[str],
    *,
    precision: str = "fp32",
    device: Union[str, torch.device] = "cpu",
    force_quick_gelu: bool = False,
    cache_dir: Optional[str] = None,
) -> torch.nn.Module:
    """Create a frozen open_clip CLIP model (eval mode, ``requires_grad`` False).

    Args:
        name: open_clip model name (``ViT-B-16-quickgelu``, ``ViT-L-14-quickgelu``, ...),
            ``local-dir:/path`` (a folder with open_clip's ``open_clip_config.json`` and
            weights), ``hf-hub:org/repo`` (the same on the Hugging Face hub; cached or
            online), or a config registered with ``register_local_model_config``
            (``sparseclip-tiny-vit``).
        pretrained: an open_clip tag (``openai``); a local checkpoint file: an OpenAI
            TorchScript ``.pt`` (``~/.cache/clip/ViT-B-16.pt``) or an open_clip state dict
            (``.bin`` / ``.pt`` / ``.safetensors``); ``hf:/path`` for a ``transformers``
            ``CLIPModel`` / ``SiglipModel`` directory, converted to the open_clip model
            ``name`` (:mod:`sparseclip_d2.clip.weights`); or ``none``/``""`` for random
            weights (a WARNING says the results are meaningless). With a ``local-dir:`` /
            ``hf-hub:`` name any other value means the weights that come with the name.
        precision: ``fp32``, ``fp16`` or ``bf16`` (weights dtype).
        device: where the model lives.
        force_quick_gelu: use QuickGELU even when ``name`` lacks ``-quickgelu``. It is
            forced automatically (with a warning) for weights trained with QuickGELU (the
            OpenAI tag and TorchScript files, transformers checkpoints whose ``hidden_act``
            is ``quick_gelu``).
        cache_dir: open_clip download cache (``None``/``""`` = open_clip's default).
    Returns:
        an ``open_clip.CLIP`` model.
    Raises:
        ValueError: unknown model name, tag or precision, a checkpoint of another
        architecture (naming both); FileNotFoundError: a checkpoint path that does not
        exist; RuntimeError: weights whose download failed (offline).
    """
    name = str(name).strip()
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; valid: {', '.join(PRECISIONS)}")
    cache_dir = cache_dir or None
    common = dict(precision=precision, device=device, cache_dir=cache_dir)
    random = is_random_weights(pretrained)
    pretrained = None if random else str(pretrained).strip()
    hf_dir = parse_hf_pretrained(pretrained)
    if pretrained is not None and hf_dir is None:
        pretrained = os.path.expanduser(pretrained)
    check_model_name(name)
    if random:
        logger.warning(
            "RANDOM WEIGHTS: CLIP %s is built with random weights (pretrained=none): a smoke run, "
            "every number it produces is meaningless.", name)
    schema, identifier = parse_model_name(name)

    weights_file, pretrained, force_quick_gelu = _weights_to_load(name, pretrained, hf_dir, schema, force_quick_gelu)
    local_cfg = get_local_model_config(name)
    if schema == "hf-hub" and (random or weights_file):
        local_cfg = _hub_model_config(identifier, cache_dir)
    elif schema == "local-dir":
        local_cfg = _local_dir_model_config(identifier)
        if not random and weights_file is None:
            weights_file = _local_dir_checkpoint(identifier)
    if local_cfg is not None:
        if force_quick_gelu:
            local_cfg["quick_gelu"] = True
        custom_text = bool(local_cfg.pop("custom_text", False))
        base = _FACTORY_BASE_TIMM if "timm_model_name" in local_cfg["vision_cfg"] else _FACTORY_BASE
        with _quiet_random_notice():
            model = open_clip.create_model(base, pretrained=None, force_custom_text=custom_text,
                                           **common, **local_cfg)
        if weights_file is not None:
            _load_weights(model, name, weights_file)
        return _finish(model)

    if schema == "hf-hub":
        _fail_fast_when_offline(name, "", {"hf_hub": f"{identifier}/open_clip_config.json"}, cache_dir)
        try:
            model = open_clip.create_model(name, **common)
        except (RuntimeError, OSError, ConnectionError, ValueError) as e:
            raise RuntimeError(f"could not obtain CLIP {name!r} from the Hugging Face hub ({e}). "
                               "Offline, download the repository once and use local-dir:/path/to/it") from e
        return _finish(model)

    if random or weights_file is not None:
        with _quiet_random_notice():
            model = open_clip.create_model(name, pretrained=None, force_quick_gelu=force_quick_gelu, **common)
        if weights_file is not None:
            _load_weights(model, name, weights_file)
        return _finish(model)

    tag_cfg = open_clip.get_pretrained_cfg(name, pretrained) or {}
    if tag_cfg:
        if tag_cfg.get("quick_gelu", False):
            force_quick_gelu = _quick_gelu_notice(name, pretrained, force_quick_gelu)
        _fail_fast_when_offline(name, pretrained, tag_cfg, cache_dir)
        try:
            model = open_clip.create_model(name, pretrained=pretrained, force_quick_gelu=force_quick_gelu, **common)
        except (RuntimeError, OSError, ConnectionError) as e:
            raise RuntimeError(
                f"could not obtain the weights of CLIP {name!r} pretrained={pretrained!r} ({e}). "
                + _NO_NETWORK_HELP) from e
        return _finish(model)

    if _looks_like_path(pretrained):
        raise FileNotFoundError(
            f"CLIP checkpoint file {pretrained!r} does not exist. Supply weights as an existing local "
            f"file via MODEL.SPARSECLIP.CLIP.PRETRAINED, an open_clip tag of {name} "
            f"({', '.join(open_clip.list_pretrained_tags_by_model(name)) or 'none known'}), "
            f"hf:/path/to/transformers_dir, or `none`")
    raise ValueError(
        f"unknown pretrained value {pretrained!r} for {name}; valid: an open_clip tag "
        f"({', '.join(open_clip.list_pretrained_tags_by_model(name)) or 'none known'}), "
        f"a local checkpoint file path, hf:/path/to/transformers_dir, or none")


# open_clip/factory.py HF_HUB_PREFIX / LOCAL_DIR_PREFIX: the schemas open_clip's create_model accepts.
MODEL_NAME_SCHEMAS = ("hf-hub:", "local-dir:")


def parse_model_name(name: str) -> Tuple[Optional[str], str]:
    """``("local-dir", path)``, ``("hf-hub", "org/repo")`` or ``(None, name)``."""
    for prefix in MODEL_NAME_SCHEMAS:
        if name.startswith(prefix):
            return prefix[:-1], name[len(prefix):].strip()
    return None, name


def check_model_name(name: str) -> None:
    """Validate a CLIP model name without building anything (and without the network).

    Valid: an open_clip name, a registered local config, ``local-dir:/existing/dir`` holding
    ``open_clip_config.json``, or ``hf-hub:org/repo``.

    Raises:
        ValueError / FileNotFoundError naming the value and the valid choices.
    """
    name = str(name).strip()
    schema, identifier = parse_model_name(name) if name else (None, "")
    if schema == "local-dir":
        if not identifier:
            raise ValueError(f"CLIP model name {name!r}: local-dir: names no directory (local-dir:/path/to/dir)")
        _local_dir_model_config(identifier)
        return
    if schema == "hf-hub":
        parts = identifier.split("/")
        if len(parts) != 2 or not all(parts):
            raise ValueError(f"CLIP model name {name!r}: hf-hub: takes a repository id org/repo "
                             "(e.g. hf-hub:timm/ViT-B-16-SigLIP)")
        return
    if get_local_model_config(name) is None and name not in open_clip.list_models():
        raise ValueError(
            f"unknown CLIP model name {name!r}; valid: an open_clip name (see open_clip.list_models(), "
            f"e.g. ViT-B-16-quickgelu, ViT-L-14-quickgelu), local-dir:/path/to/open_clip_dir, hf-hub:org/repo, "
            f"or one of sparseclip_d2's local configs ({', '.join(sorted(LOCAL_MODEL_CONFIGS))})")


def _quick_gelu_notice(name: str, source: str, force_quick_gelu: bool) -> bool:
    """QuickGELU is forced for weights trained with it; says so when the name lacks it."""
    local = get_local_model_config(name)
    has_it = "quickgelu" in name.lower() or bool(local and local.get("quick_gelu"))
    if not has_it and not force_quick_gelu:
        logger.warning(
            "pretrained=%r was trained with QuickGELU but %r lacks '-quickgelu': forcing QuickGELU "
            "(use the name %s-quickgelu to silence this)", source, name, name)
    return True


def _local_dir_model_config(path: str) -> dict:
    """The ``model_cfg`` of ``local-dir:path`` (open_clip's ``open_clip_config.json`` layout)."""
    path = os.path.expanduser(path)
    cfg_path = os.path.join(path, "open_clip_config.json")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"CLIP model local-dir:{path}: the directory does not exist")
    if not os.path.isfile(cfg_path):
        raise FileNotFoundError(f"CLIP model local-dir:{path}: no open_clip_config.json in it (open_clip's "
                                "layout: open_clip_config.json with a model_cfg entry, plus the weights file)")
    try:
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)["model_cfg"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{cfg_path}: not an open_clip config with a model_cfg entry ({type(e).__name__}: {e})") from None
    return copy.deepcopy(cfg)


# Weight files open_clip looks for in a local-dir, in its order of preference
# (open_clip/factory.py _find_checkpoint_in_dir).
_LOCAL_DIR_WEIGHTS = ("open_clip_model.safetensors", "open_clip_pytorch_model.safetensors",
                      "open_clip_pytorch_model.bin", "open_clip_pytorch_model.pth", "model.safetensors",
                      "pytorch_model.bin", "pytorch_model.pth", "model.pth")


def _local_dir_checkpoint(path: str) -> str:
    path = os.path.expanduser(path)
    for n in _LOCAL_DIR_WEIGHTS:
        if os.path.isfile(os.path.join(path, n)):
            return os.path.join(path, n)
    raise FileNotFoundError(f"CLIP model local-dir:{path} holds no weights file ({', '.join(_LOCAL_DIR_WEIGHTS)}); "
                            "add one, or set MODEL.SPARSECLIP.CLIP.PRETRAINED none for random weights")


def _hub_model_config(identifier: str, cache_dir: Optional[str]) -> dict:
    _fail_fast_when_offline(f"hf-hub:{identifier}", "", {"hf_hub": f"{identifier}/open_clip_config.json"}, cache_dir)
    try:
        cfg = open_clip.get_model_config(f"hf-hub:{identifier}")
    except Exception as e:  # hub errors of every kind: say which repository
        raise RuntimeError(f"could not read open_clip_config.json of hf-hub:{identifier} ({type(e).__name__}: {e}). "
                           "Offline, download the repository once and use local-dir:/path/to/it") from e
    return copy.deepcopy(cfg)


def _load_weights(model: torch.nn.Module, name: str, source: str) -> None:
    """Load a local checkpoint (OpenAI TorchScript, open_clip state dict) or a
    transformers directory into ``model`` (built as ``name``), strictly."""
    if os.path.isdir(source):
        hf_cfg = read_transformers_config(source)
        sd = convert_transformers_state_dict(source, model, name, hf_cfg)
        check_transformers_activation(hf_cfg, model, name)
        model.load_state_dict(sd, strict=True)
        logger.info("loaded CLIP %s from the transformers %s checkpoint %s", name, hf_cfg["model_type"], source)
        return
    if is_torchscript_archive(source):
        with _reading_checkpoint(source, name):
            sd = load_torchscript_state_dict(source)
        target = model.state_dict()
        bad = sorted(set(sd) ^ set(target)) or [k for k in sd if tuple(sd[k].shape) != tuple(target[k].shape)]
        if bad:
            raise ValueError(
                f"the OpenAI CLIP TorchScript file {source!r} holds a {describe_openai_state_dict(sd)}, which does "
                f"not fit the open_clip model {name!r} ({describe_openai_state_dict(target)}; first difference: "
                f"{bad[0]}). Choose the model name of the file (ViT-B-16.pt -> ViT-B-16-quickgelu, ViT-L-14.pt -> "
                "ViT-L-14-quickgelu)")
        model.load_state_dict(sd, strict=True)
        logger.info("loaded CLIP %s from the OpenAI TorchScript file %s", name, source)
        return
    logger.info("loading CLIP %s weights from the local file %s", name, source)
    if _load_in_place(model, source):
        return
    try:
        open_clip.load_checkpoint(model, source)
    except Exception as e:  # unpickling, zip, safetensors, key/shape mismatches: one line naming both sides
        raise ValueError(explain_checkpoint_failure(source, name, model, e)) from e


def _file_state_dict(source: str, mmap: bool) -> Optional[dict]:
    """The state dict of a torch zip checkpoint (unwrapped from ``{"state_dict": ...}`` and from a
    ``module.`` prefix, as open_clip's ``factory.load_state_dict`` does); None for any other file
    (safetensors, numpy, TorchScript, a legacy pickle) or a file torch cannot read so."""
    if source.endswith((".safetensors", ".npz", ".npy")) or not zipfile.is_zipfile(source) \
            or is_torchscript_archive(source):
        return None
    try:
        sd = torch.load(source, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception:  # noqa: BLE001 -- open_clip's loader reads it, or says why not
        return None
    if isinstance(sd, dict) and isinstance(sd.get("state_dict"), dict):
        sd = sd["state_dict"]
    if not isinstance(sd, dict) or not sd or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        return None
    if next(iter(sd)).startswith("module."):
        sd = {k[len("module."):]: v for k, v in sd.items()}
    return sd


def _load_in_place(model: torch.nn.Module, source: str) -> bool:
    """Load a torch zip state dict whose keys and shapes are the model's own with one copy of the
    weights in memory, not two; False (nothing done) when the file needs open_clip's conversions.

    ``open_clip.load_checkpoint`` reads the whole file while the model still holds its random
    initial tensors, then copies: the peak holds both (ViT-B/16: 1.90 GiB peak RSS for 1.33 GiB
    once loaded). Here the file's keys, shapes and dtypes are read first (memory-mapped, no tensor
    data read); when they fit, the model's parameters and persistent buffers are moved to the meta
    device (freed), the file is read and its tensors are assigned (cast per tensor to the model's
    dtype where they differ, as the copy would), and the non-persistent buffers (the text causal
    mask) are kept as built. The values are those the copy gives, bit for bit."""
    peek = _file_state_dict(source, mmap=True)
    if peek is None:
        return False
    target = model.state_dict()
    if set(peek) != set(target) or any(
            tuple(peek[k].shape) != tuple(v.shape) or peek[k].is_floating_point() != v.is_floating_point()
            or (not v.is_floating_point() and peek[k].dtype != v.dtype) for k, v in target.items()):
        return False
    dtypes = {k: v.dtype for k, v in target.items()}
    kept = [(full, b) for full, b in model.named_buffers() if full not in target]  # not saved: kept as built
    del peek, target
    model.to("meta")
    sd = _file_state_dict(source, mmap=False)
    if sd is None:
        raise ValueError(f"the CLIP checkpoint file {source!r} changed while it was being read")
    for k in list(sd):
        if sd[k].dtype != dtypes[k]:
            sd[k] = sd[k].to(dtypes[k])
    model.load_state_dict(sd, strict=True, assign=True)
    for full, b in kept:
        owner, _, attr = full.rpartition(".")
        setattr(model.get_submodule(owner), attr, b)
    return True


def vision_tower_variant(model: torch.nn.Module, name: str, *, act: str = "", ln_eps: float = 0.0) -> torch.nn.Module:
    """``model.visual``, or a copy of it built with another MLP activation / LayerNorm eps.

    MaskCLIP runs the OpenAI ViT-B/16 weights in an MMSeg ViT built with GELU and
    LayerNorm eps 1e-6 (chongzhou96/MaskCLIP ``configs/_base_/models/maskclip_vit16.py``),
    while its text embeddings come from the original QuickGELU model. This builds such a
    vision tower: a new open_clip model of the same architecture (``name``'s config) with
    ``act`` / ``ln_eps`` changed, whose vision tower is loaded with ``model.visual``'s
    weights. ``model`` itself is not modified.

    Args:
        model: an open_clip CLIP model built by :func:`build_clip`.
        name: its model name (open_clip or sparseclip_d2 test config).
        act: "" (keep), "gelu" or "quick_gelu".
        ln_eps: LayerNorm eps of the tower; 0 keeps the model's.
    Returns:
        a frozen ``VisionTransformer`` (``model.visual`` itself when nothing changes) on the
        device and in the dtype of ``model.visual``.
    """
    if act not in VISION_ACTS:
        raise ValueError(f"unknown vision activation {act!r}; valid: '' (as built), gelu, quick_gelu")
    try:
        ln_eps = float(ln_eps)
    except (TypeError, ValueError):
        raise ValueError(f"vision LayerNorm eps must be a number >= 0, got {ln_eps!r}") from None
    if not ln_eps >= 0:
        raise ValueError(f"vision LayerNorm eps must be >= 0 (0 = as built), got {ln_eps!r}")
    visual = model.visual
    blocks = getattr(getattr(visual, "transformer", None), "resblocks", None)
    if not blocks:
        raise ValueError(f"vision_tower_variant supports open_clip VisionTransformer towers, got {type(visual).__name__}")
    current_quick = isinstance(blocks[0].mlp.gelu, open_clip.transformer.QuickGELU)
    current_eps = float(visual.ln_pre.eps)
    quick = current_quick if not act else act == "quick_gelu"
    eps = current_eps if ln_eps == 0 else ln_eps
    if quick == current_quick and eps == current_eps:
        return visual
    name = str(name).strip()
    cfg = get_local_model_config(name) or open_clip.get_model_config(name)
    if cfg is None:
        raise ValueError(f"no open_clip config for model {name!r}: cannot build a vision tower variant")
    cfg = copy.deepcopy(cfg)
    vision_cfg = dict(cfg["vision_cfg"])
    vision_cfg["norm_kwargs"] = dict(vision_cfg.get("norm_kwargs") or {}, eps=eps)
    cfg.update(vision_cfg=vision_cfg, quick_gelu=quick)
    param = next(visual.parameters())
    precision = {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(param.dtype, "fp32")
    with _quiet_random_notice():  # the weights are copied in below
        variant = open_clip.create_model(_FACTORY_BASE, pretrained=None, precision=precision, device=param.device, **cfg)
    variant.visual.load_state_dict(visual.state_dict())
    logger.info("vision tower of %s rebuilt with %s and LayerNorm eps %g (the text tower is unchanged)",
                name, "QuickGELU" if quick else "GELU", eps)
    return _finish(variant.visual)


class _FoldedCLIPTokenizer:
    """open_clip's bundled CLIP BPE tokenizer with ids folded into a smaller vocabulary
    (``id % vocab_size``). Only for random-weight smoke runs of models whose own tokenizer
    cannot be loaded here: the text embeddings mean nothing either way."""

    def __init__(self, context_length: int, vocab_size: int):
        self._inner = open_clip.SimpleTokenizer(context_length=context_length)
        self.context_length = int(context_length)
        self.vocab_size = int(vocab_size)

    def __call__(self, texts, context_length: Optional[int] = None) -> torch.Tensor:
        return self._inner(texts, context_length=context_length) % self.vocab_size


def _text_cfg(name: str) -> dict:
    local_cfg = get_local_model_config(name)
    if local_cfg is not None:
        return local_cfg.get("text_cfg", {})
    cfg = open_clip.get_model_config(name) or {}
    return cfg.get("text_cfg", {})


def get_tokenizer(name: str, tokenizer: Optional[str] = None, *, random_weights: bool = False):
    """The tokenizer of model ``name``: ``tokenizer(list[str]) -> (N, context) long``.

    Args:
        name: open_clip model name or a sparseclip_d2 test config.
        tokenizer: ``None``/``""`` for the model's own tokenizer (``open_clip.get_tokenizer``:
            CLIP BPE for OpenAI/LAION/EVA models, a Hugging Face tokenizer such as
            ``timm/ViT-B-16-SigLIP`` for SigLIP / SigLIP 2, which needs the ``transformers``
            package and the tokenizer files); or a local directory holding that Hugging Face
            tokenizer's files (``tokenizer.json``, ``tokenizer_config.json``, ...), loaded
            with the model's context length and cleaning options.
        random_weights: the model has random weights. Then, when its own tokenizer cannot be
            loaded here, open_clip's bundled CLIP BPE with ids folded into the model's
            vocabulary is used with a WARNING (the text embeddings are meaningless anyway).
    Raises:
        RuntimeError: the model's tokenizer cannot be loaded (names the package or the
        Hugging Face files missing and how to supply them); FileNotFoundError: a
        ``tokenizer`` directory that does not exist.
    """
    name = str(name).strip()
    text_cfg = _text_cfg(name)
    local_cfg = get_local_model_config(name)
    ctx = int(text_cfg.get("context_length", 77))
    if tokenizer:
        path = os.path.expanduser(str(tokenizer).strip())
        if not os.path.isdir(path):
            raise FileNotFoundError(
                f"MODEL.SPARSECLIP.TEXT.TOKENIZER {tokenizer!r} is not a directory; give a directory with the "
                f"Hugging Face tokenizer files of {name} ({text_cfg.get('hf_tokenizer_name') or 'CLIP BPE'}), or "
                "leave it empty for the model's own tokenizer")
        from open_clip.tokenizer import HFTokenizer

        return HFTokenizer(path, context_length=ctx, tokenizer_mode=text_cfg.get("tokenizer_mode"),
                           **text_cfg.get("tokenizer_kwargs", {}))
    if local_cfg is not None:
        return open_clip.SimpleTokenizer(context_length=ctx)
    hf_name = text_cfg.get("hf_tokenizer_name", "")
    try:
        return open_clip.get_tokenizer(name)
    except (ImportError, OSError, ValueError, RuntimeError) as e:
        missing = ("the Python package 'transformers' (pip install 'sparseclip_d2[hf]')"
                   if isinstance(e, ImportError) else
                   f"the Hugging Face tokenizer files of {hf_name or name} (no network here?)")
        if random_weights:
            logger.warning(
                "the tokenizer of %s (%s) cannot be loaded here: %s is missing (%s). The model has RANDOM "
                "weights, so open_clip's bundled CLIP BPE tokenizer with ids folded into its %d-token "
                "vocabulary is used instead; text embeddings are meaningless either way.",
                name, hf_name or "open_clip default", missing, e, int(text_cfg.get("vocab_size", 49408)))
            return _FoldedCLIPTokenizer(ctx, int(text_cfg.get("vocab_size", 49408)))
        raise RuntimeError(
            f"cannot load the tokenizer of CLIP {name!r} (Hugging Face tokenizer {hf_name!r}): {missing} ({e}). "
            f"Install transformers and either allow the download once (it is cached by huggingface_hub) or "
            f"copy the files of https://huggingface.co/{hf_name} into a directory and set "
            f"MODEL.SPARSECLIP.TEXT.TOKENIZER to it") from e

