"""Text side: class names (with comma-separated synonyms) x prompt templates -> embeddings."""
import hashlib
import json
import logging
import os
import time
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn
from tqdm import tqdm

from ..common.cache import LRUCache
from ..common.io import atomic_path
from ..common.synonyms import split_class_name
from .templates import get_templates

__all__ = ["TextClassifier", "max_over_synonyms", "split_synonyms", "weights_fingerprint", "text_cache_dir"]

logger = logging.getLogger(__name__)

# 2: the key also holds the tokenizer, the device type and dtype, the encoding code, and a
# fingerprint that samples every text-side parameter.
_CACHE_FORMAT = 2
_ENV = "SPARSECLIP_TEXT_CACHE"


def split_synonyms(class_names: Sequence[str]) -> Tuple[List[str], List[int]]:
    """Flatten class names with synonyms separated by ``;`` or ``,`` (one rule:
    :mod:`sparseclip_d2.common.synonyms`).

    Args:
        class_names: C strings such as ``"person, people"`` or ``"person; people"``.
    Returns:
        ``(synonyms, class_index)``: S synonym strings and, for each, its class index.
    """
    if isinstance(class_names, str):
        raise ValueError(f"class_names must be a list of class names, got the string {class_names!r}")
    synonyms, index = [], []
    for c, name in enumerate(class_names):
        if not isinstance(name, str):
            raise ValueError(f"class name {c} must be a string, got {name!r}")
        parts = [p for p in split_class_name(name) if p]
        if not parts:
            raise ValueError(f"class {c} ({name!r}) has no name")
        synonyms.extend(parts)
        index.extend([c] * len(parts))
    return synonyms, index


def max_over_synonyms(logits: torch.Tensor, class_index: torch.Tensor, num_classes: int, dim: int = 1) -> torch.Tensor:
    """Reduce synonym logits to class logits by max.

    Args:
        logits: tensor whose ``dim`` has size S (synonyms), e.g. ``(B, S, H, W)``.
        class_index: ``(S,)`` long, the class of each synonym.
        num_classes: C.
        dim: the synonym dimension.
    Returns:
        ``logits`` with ``dim`` of size C: the max over each class's synonyms.
    """
    class_index = torch.as_tensor(class_index, dtype=torch.long, device=logits.device)
    S = logits.shape[dim]
    if class_index.shape != (S,):
        raise ValueError(f"class_index has shape {tuple(class_index.shape)}, expected ({S},) to match logits dim {dim}")
    if S and (int(class_index.min()) < 0 or int(class_index.max()) >= num_classes):
        raise ValueError(f"class_index values must lie in [0, {num_classes}), got "
                         f"[{int(class_index.min())}, {int(class_index.max())}]")
    x = logits.movedim(dim, -1)
    out = torch.full(x.shape[:-1] + (num_classes,), float("-inf"), dtype=x.dtype, device=x.device)
    out = out.scatter_reduce(-1, class_index.expand(x.shape[:-1] + (S,)), x, reduce="amax", include_self=True)
    return out.movedim(-1, dim)


def weights_fingerprint(model: nn.Module, max_elements: int = 65536) -> str:
    """A short hash of a model's text-side weights (names, shapes, dtypes, sampled values).

    Hashes every non-visual parameter (two checkpoints that differ only in a middle layer of
    the text tower must not share a text-embedding cache); large tensors are sampled with a
    stride so at most ``max_elements`` values each are read. Returns 16 hex digits.
    """
    params = [(n, p) for n, p in model.named_parameters() if not n.startswith("visual.")]
    if not params:
        params = list(model.named_parameters())
    chosen = params
    h = hashlib.sha256()
    for n, p in chosen:
        t = p.detach().reshape(-1)
        step = max(1, t.numel() // max_elements)
        sample = t[::step].float().cpu().contiguous()
        h.update(f"{n}:{tuple(p.shape)}:{p.dtype}".encode())
        h.update(sample.numpy().tobytes())
    return h.hexdigest()[:16]


def _tokenizer_identity(tokenizer) -> str:
    """What of a tokenizer changes the tokens: its class, its context length, and (Hugging Face
    tokenizers) the checkpoint it was loaded from."""
    kind = type(tokenizer)
    parts = [f"{kind.__module__}.{kind.__qualname__}", str(getattr(tokenizer, "context_length", None))]
    inner = getattr(tokenizer, "tokenizer", None)
    if inner is not None:
        parts.append(str(getattr(inner, "name_or_path", type(inner).__qualname__)))
    return "|".join(parts)


_ENCODE_CODE = None


def _encode_code_version() -> str:
    """Hash of the source of :meth:`TextClassifier.encode` (how prompts become embeddings)."""
    global _ENCODE_CODE
    if _ENCODE_CODE is None:
        import inspect

        _ENCODE_CODE = hashlib.sha256(inspect.getsource(TextClassifier.encode).encode()).hexdigest()[:16]
    return _ENCODE_CODE


def text_cache_dir(cache_dir: Optional[str] = None) -> Optional[str]:
    """Resolve the on-disk cache directory: ``None`` when disabled.

    ``cache_dir="off"`` or the environment variable ``SPARSECLIP_TEXT_CACHE=off`` disables
    it; ``None``/``""`` means ``$SPARSECLIP_TEXT_CACHE`` if it names a directory, else
    ``~/.cache/sparseclip_d2/text``.
    """
    env = os.environ.get(_ENV, "").strip()
    if env.lower() == "off" or (cache_dir is not None and str(cache_dir).strip().lower() == "off"):
        return None
    if cache_dir:
        return os.path.expanduser(str(cache_dir))
    if env:
        return os.path.expanduser(env)
    return os.path.expanduser(os.path.join("~", ".cache", "sparseclip_d2", "text"))


class TextClassifier:
    """Class-name embeddings for open-vocabulary classification.

    ``classifier(class_names) -> (embeddings (S, D) float32 L2-normalised, class_index (S,) long)``:
    each class name may hold synonyms separated by ";" or "," (one rule,
    :mod:`sparseclip_d2.common.synonyms`); each synonym is put into every
    template, the prompts are encoded with ``model.encode_text``, L2-normalised, averaged
    over templates and re-normalised. Results are cached in memory per (vocabulary,
    templates, device) and on disk under ``cache_dir`` keyed by model name, a weight
    fingerprint, the synonyms and the templates.

    Args:
        model: an open_clip CLIP model (``encode_text``).
        tokenizer: ``tokenizer(list[str]) -> (N, context) long`` (open_clip tokenizer).
        templates: a template set name, a template file path, or a list of templates.
        model_name: model name used in the cache key.
        cache_dir: disk cache directory, ``"off"`` to disable (see :func:`text_cache_dir`).
        batch_size: prompts per ``encode_text`` call.
        memory_size: vocabularies kept in memory (a bounded LRU; 0 = none, for callers that
            cache the results themselves, as the META_ARCHs do).
    """

    def __init__(self, model: nn.Module, tokenizer, templates: Union[str, Sequence[str]] = "single", *,
                 model_name: str = "", cache_dir: Optional[str] = None, batch_size: int = 256,
                 memory_size: int = 16):
        self.model = model
        self.tokenizer = tokenizer
        if isinstance(templates, str):
            self.templates = get_templates(templates)
        else:
            self.templates = list(templates)
            for t in self.templates:
                if "{}" not in t:
                    raise ValueError(f"prompt template {t!r} has no '{{}}' placeholder for the class name")
        if not self.templates:
            raise ValueError("at least one prompt template is needed")
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = int(batch_size)
        self.model_name = str(model_name)
        self.cache_dir = text_cache_dir(cache_dir)
        if int(memory_size) < 0:
            raise ValueError(f"memory_size must be >= 0, got {memory_size}")
        self._memory: Optional[LRUCache] = LRUCache(int(memory_size)) if int(memory_size) > 0 else None
        self._fingerprint: Optional[str] = None

    @property
    def device(self) -> torch.device:
        """Device of the model's parameters."""
        return next(self.model.parameters()).device

    def _disk_path(self, synonyms: List[str]) -> Optional[str]:
        if self.cache_dir is None:
            return None
        if self._fingerprint is None:
            self._fingerprint = weights_fingerprint(self.model)
        param = next(self.model.parameters())
        payload = json.dumps({"format": _CACHE_FORMAT, "model": self.model_name, "weights": self._fingerprint,
                              "synonyms": synonyms, "templates": self.templates,
                              "tokenizer": _tokenizer_identity(self.tokenizer),
                              "device": param.device.type, "dtype": str(param.dtype),
                              "code": _encode_code_version()})
        key = hashlib.sha256(payload.encode("utf-8")).hexdigest()[:24]
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in self.model_name) or "model"
        return os.path.join(self.cache_dir, f"{safe}-{key}.pt")

    def _warn_truncation(self, prompts: List[str]) -> None:
        ctx = getattr(self.tokenizer, "context_length", None)
        encode = getattr(self.tokenizer, "encode", None)
        if ctx is None or encode is None:
            return
        long_ = [p for p in prompts if len(encode(p)) + 2 > ctx]  # + start/end tokens
        if long_:
            logger.warning("%d prompt(s) exceed the text context of %d tokens and are truncated, e.g. %r",
                           len(long_), ctx, long_[0][:120])

    @torch.no_grad()
    def encode(self, synonyms: List[str]) -> torch.Tensor:
        """Template-averaged, L2-normalised embeddings of synonym strings: S -> ``(S, D)`` float32.

        A string given twice is encoded once, so its rows are bitwise equal (an upstream
        vocabulary naming ``bed`` twice then ties exactly, as it does upstream)."""
        unique = list(dict.fromkeys(synonyms))
        if len(unique) < len(synonyms):
            row = {s: i for i, s in enumerate(unique)}
            return self.encode(unique)[torch.tensor([row[s] for s in synonyms])]
        prompts = [t.replace("{}", s) for s in synonyms for t in self.templates]
        self._warn_truncation(prompts)
        device = self.device
        chunks = []
        n_batches = (len(prompts) + self.batch_size - 1) // self.batch_size
        bar = tqdm(range(n_batches), desc="encoding class prompts", leave=False, disable=None)
        if n_batches > 1:  # minutes for large vocabularies on a CPU: say so, also in log files
            logger.info("encoding %d class prompts (%d names x %d templates) in %d batches",
                        len(prompts), len(synonyms), len(self.templates), n_batches)
        start = last = time.perf_counter()
        for i in bar:
            batch = prompts[i * self.batch_size:(i + 1) * self.batch_size]
            tokens = self.tokenizer(batch).to(device)
            emb = self.model.encode_text(tokens).float()
            chunks.append(emb / emb.norm(dim=-1, keepdim=True))
            now = time.perf_counter()
            if bar.disable and n_batches > 1 and (now - last > 10 or i + 1 == n_batches):
                last = now  # no bar (not a terminal): a log line every 10 s with the ETA
                done = (i + 1) * self.batch_size
                logger.info("encoded %d/%d prompts in %.0f s (ETA %.0f s)", min(done, len(prompts)), len(prompts),
                            now - start, (now - start) / (i + 1) * (n_batches - i - 1))
        emb = torch.cat(chunks).reshape(len(synonyms), len(self.templates), -1).mean(dim=1)
        return emb / emb.norm(dim=-1, keepdim=True)

    def __call__(self, class_names: Sequence[str]) -> Tuple[torch.Tensor, torch.Tensor]:
        """Embeddings of a vocabulary.

        Args:
            class_names: C class names, each with optional synonyms separated by ";" or ",".

        Returns:
            ``(embeddings (S, D) float32 L2-normalised, class_index (S,) long)`` on the model's device.
        """
        synonyms, index = split_synonyms(class_names)
        device = self.device
        class_index = torch.tensor(index, dtype=torch.long, device=device)
        if self._memory is None:
            return self._embeddings(synonyms, device), class_index
        mkey = (tuple(synonyms), tuple(self.templates), str(device))
        return self._memory.get_or_create(mkey, lambda: self._embeddings(synonyms, device)), class_index

    def _embeddings(self, synonyms: List[str], device: torch.device) -> torch.Tensor:
        """``(S, D)`` embeddings of ``synonyms``, from the disk cache or encoded (and stored)."""
        path = self._disk_path(synonyms)
        emb = None
        if path is not None and os.path.isfile(path):
            try:
                data = torch.load(path, map_location="cpu", weights_only=True)
                if data.get("synonyms") == synonyms and data.get("templates") == self.templates:
                    emb = data["embeddings"].to(device=device, dtype=torch.float32)
                    logger.info("loaded %d class embeddings from %s", len(synonyms), path)
            except Exception as e:  # a corrupt cache file is recomputed, not fatal
                logger.warning("ignoring unreadable text-embedding cache %s (%s)", path, e)
        if emb is None:
            emb = self.encode(synonyms)
            if path is not None:
                try:
                    with atomic_path(path) as tmp:
                        torch.save({"embeddings": emb.cpu(), "synonyms": synonyms, "templates": self.templates}, tmp)
                except OSError as e:
                    logger.warning("could not write the text-embedding cache %s (%s)", path, e)
        return emb
