"""``SparseCLIPFGOVD``: FG-OVD region recognition with a frozen (sparse-attention) CLIP.

For each ground-truth box of an image (or, with proposals, the proposal standing for it),
one region embedding is compared with the embeddings of the box's captions (positive
first, then its negatives). Two protocols (``MODEL.SPARSECLIP.FGOVD.PROTOCOL``):

- ``dense``: the whole image is resized to ``R x R`` (PIL, ``RESIZE_INTERPOLATION``), goes
  through the modified dense encoder (``(B, D, R/p, R/p)`` patch embeddings) and each box is
  RoIAligned on that grid (``spatial_scale = 1/p``, adaptive sampling, ``P x P`` bins
  averaged), as 360CVGroup/FG-CLIP fgclip/model/clip_strc/fgclip.py
  (``roi_align(feature_map, boxes, (1, 1), 1.0, -1, True)`` on boxes in grid units) does.
- ``crop``: each box is cropped from the original image and preprocessed exactly as CLIP's
  own transform, then encoded by the *unmodified* ``clip_model.encode_image``
  (lorebianchi98/FG-CLIP fgovd_evaluation/inference_on_benchmark.py).

Captions are encoded whole (commas included; never split into synonyms), optionally through
templates, and kept in a bounded per-model cache. The evaluator
(:class:`sparseclip_d2.evaluation.fgovd_evaluation.FGOVDEvaluator`) applies the N-negatives
rule, the tie rule and the median.
"""
import logging
import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
import torchvision.transforms.functional as TF
from PIL import Image
from torch import nn
from torchvision.ops import roi_align
from torchvision.transforms import InterpolationMode

from detectron2.config import configurable
from detectron2.modeling import META_ARCH_REGISTRY
from detectron2.structures import Boxes, pairwise_iou

from ..data.image_io import check_input_format
from ..common.cache import LRUCache
from ..clip import AttentionSpec
from .backbone import build_clip_parts
from ..dense.first_segmentation import refuse_feedback_spec
from .fgovd_conventions import CONVENTION_CHOICES, conventions_from_config

__all__ = [
    "SparseCLIPFGOVD",
    "FGOVD_PROTOCOLS",
    "pool_region_embeddings",
    "match_proposals",
    "crop_box_pixels",
    "clip_crop",
    "resize_image",
    "CaptionEncoder",
]

logger = logging.getLogger(__name__)

FGOVD_PROTOCOLS = ("dense", "crop")

# RoIAlign sampling ratio: 0 = adaptive (ceil(bin size) samples per bin and axis), as in
# detectron2's ROIAlignV2 pooler and 360CVGroup/FG-CLIP fgclip.py (sampling_ratio=-1, also
# adaptive in torchvision).
_SAMPLING_RATIO = 0

_PIL_INTERPOLATION = {"bicubic": Image.BICUBIC, "bilinear": Image.BILINEAR}


def pool_region_embeddings(
    features: torch.Tensor,
    boxes: Sequence[torch.Tensor],
    patch_size: int,
    pooler_resolution: int = 1,
    aligned: bool = True,
) -> List[torch.Tensor]:
    """RoIAlign boxes on a patch-embedding grid; one L2-normalised embedding per box.

    Args:
        features: ``(B, D, h, w)`` patch embeddings; patch ``(i, j)`` covers the image pixels
            ``[j p, (j+1) p) x [i p, (i+1) p)``.
        boxes: B tensors ``(K_b, 4)``, XYXY in image pixels.
        patch_size: p (``spatial_scale = 1 / p``).
        pooler_resolution: P; the ``P x P`` RoIAlign bins are averaged.
        aligned: RoIAlign ``aligned`` flag (True: half-pixel offset, pixel centres).

    Returns:
        B tensors ``(K_b, D)`` float32, unit norm.
    """
    if len(boxes) != features.shape[0]:
        raise ValueError(f"{len(boxes)} box lists for a batch of {features.shape[0]} feature maps")
    feats = features.float()
    rois = [b.to(device=feats.device, dtype=feats.dtype).reshape(-1, 4) for b in boxes]
    counts = [len(b) for b in rois]
    if sum(counts) == 0:
        return [feats.new_zeros((0, feats.shape[1])) for _ in rois]
    pooled = roi_align(
        feats, rois, output_size=int(pooler_resolution), spatial_scale=1.0 / patch_size,
        sampling_ratio=_SAMPLING_RATIO, aligned=bool(aligned),
    )  # (sum K, D, P, P)
    emb = F.normalize(pooled.mean(dim=(2, 3)), dim=-1)
    return list(emb.split(counts))


def match_proposals(
    gt_boxes: torch.Tensor,
    proposal_boxes: torch.Tensor,
    iou_threshold: float,
    proposal_scores: Optional[torch.Tensor] = None,
    mode: str = "score",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The proposal standing for each ground-truth box.

    Args:
        gt_boxes: ``(K, 4)`` XYXY.
        proposal_boxes: ``(M, 4)`` XYXY (M may be 0).
        iou_threshold: t.
        proposal_scores: ``(M,)`` proposal scores (objectness); needed by ``mode="score"``.
        mode: "score": among the proposals with IoU > t, the highest-scoring one (FG-OVD
            evaluation/ranks.py: the highest-confidence prediction that NMS at IoU t
            suppresses with the ground-truth box; torchvision's NMS suppresses IoU > t).
            "iou": the proposal of highest IoU, matched if IoU >= t (first one on ties).

    Returns:
        ``(index (K,) long, matched (K,) bool)``; ``index`` is 0 when unmatched.
    """
    if mode not in CONVENTION_CHOICES["proposal_matching"]:
        raise ValueError(
            f"unknown proposal matching {mode!r}; valid: {', '.join(CONVENTION_CHOICES['proposal_matching'])}"
        )
    k = gt_boxes.shape[0]
    if k == 0 or proposal_boxes.shape[0] == 0:
        return torch.zeros(k, dtype=torch.long), torch.zeros(k, dtype=torch.bool)
    iou = pairwise_iou(Boxes(gt_boxes.float()), Boxes(proposal_boxes.float()))  # (K, M)
    if mode == "iou":
        best, index = iou.max(dim=1)
        return index, best >= iou_threshold
    if proposal_scores is None or proposal_scores.shape != (proposal_boxes.shape[0],):
        raise ValueError("proposal matching by score needs one score per proposal")
    eligible = iou > iou_threshold
    masked = torch.where(eligible, proposal_scores.float()[None, :].expand_as(iou),
                         torch.full_like(iou, -math.inf))
    index = masked.argmax(dim=1)
    matched = eligible.any(dim=1)
    return torch.where(matched, index, torch.zeros_like(index)), matched


def crop_box_pixels(box: Sequence[float], width: int, height: int) -> Tuple[int, int, int, int]:
    """The integer pixel rectangle ``(x0, y0, x1, y1)`` of an XYXY box: each coordinate clipped
    to the image, then floor for the top-left and ceil for the bottom-right corner, as
    lorebianchi98/FG-CLIP fgovd_evaluation/inference_on_benchmark.py does before
    ``Image.crop`` (at least one pixel kept)."""
    x0, y0, x1, y1 = (float(v) for v in box)
    xa = int(math.floor(min(max(x0, 0.0), width - 1)))
    ya = int(math.floor(min(max(y0, 0.0), height - 1)))
    xb = max(int(math.ceil(min(x1, float(width)))), xa + 1)
    yb = max(int(math.ceil(min(y1, float(height)))), ya + 1)
    return xa, ya, xb, yb


def clip_crop(image: Image.Image, box: Sequence[float], n_px: int) -> torch.Tensor:
    """One box as CLIP sees it: the crop of :func:`crop_box_pixels`, the short side resized to
    ``n_px`` (bicubic, torchvision on the PIL image) and the central ``n_px x n_px`` - the
    geometric part of CLIP's own preprocess (``Resize(n_px, BICUBIC)``, ``CenterCrop(n_px)``).

    Returns:
        ``(3, n_px, n_px)`` uint8 RGB.
    """
    crop = image.crop(crop_box_pixels(box, image.width, image.height))
    crop = TF.center_crop(TF.resize(crop, n_px, interpolation=InterpolationMode.BICUBIC), n_px)
    return torch.as_tensor(np.asarray(crop.convert("RGB"), dtype=np.uint8).copy()).permute(2, 0, 1)


def resize_image(image: Image.Image, size: int, interpolation: str = "bicubic") -> torch.Tensor:
    """The whole image resized to ``size x size`` with PIL (``Image.resize``; bicubic is its
    default). Returns ``(3, size, size)`` uint8 RGB."""
    if interpolation not in _PIL_INTERPOLATION:
        raise ValueError(f"unknown interpolation {interpolation!r}; valid: {', '.join(_PIL_INTERPOLATION)}")
    out = image.convert("RGB").resize((int(size), int(size)), _PIL_INTERPOLATION[interpolation])
    return torch.as_tensor(np.asarray(out, dtype=np.uint8).copy()).permute(2, 0, 1)


class CaptionEncoder:
    """Caption-sentence embeddings kept in a bounded least-recently-used cache
    (``sparseclip_d2.common.LRUCache``) keyed by ``(text, device)``; one instance per model
    (no module-level state).

    Captions are used as they are (no comma splitting): ``encode(list of M texts) -> (M, D)``
    (e.g. ``TextClassifier.encode``: every template filled with the caption, embeddings
    L2-normalised, averaged over templates and re-normalised).
    """

    def __init__(self, encode: Callable[[List[str]], torch.Tensor], max_size: int = 8192):
        if isinstance(max_size, bool) or int(max_size) < 1:
            raise ValueError(f"MODEL.SPARSECLIP.FGOVD.CAPTION_CACHE_SIZE must be >= 1, got {max_size}")
        self.encode = encode
        self._cache: LRUCache = LRUCache(int(max_size))

    def __len__(self) -> int:
        return len(self._cache)

    @torch.no_grad()
    def __call__(self, captions: Sequence[str], device: torch.device) -> torch.Tensor:
        """``(M,)`` captions, M >= 1 -> ``(M, D)`` float32 unit-norm embeddings on ``device``."""
        if not captions:
            raise ValueError("no captions to encode")
        dev = str(device)
        unique = list(dict.fromkeys(captions))
        todo = [c for c in unique if (c, dev) not in self._cache]
        fresh: Dict[str, torch.Tensor] = {}
        if todo:  # one encoder call for every caption not cached yet
            emb = self.encode(todo).to(device=device, dtype=torch.float32)
            if emb.shape[0] != len(todo):
                raise ValueError(f"caption encoder returned {emb.shape[0]} embeddings for {len(todo)} captions")
            fresh = dict(zip(todo, F.normalize(emb, dim=-1)))
        found = {c: fresh[c] if c in fresh else self._cache.get_or_create((c, dev), lambda c=c: self._encode_one(c, device))
                 for c in unique}
        for c, e in fresh.items():
            self._cache.get_or_create((c, dev), lambda e=e: e)
        return torch.stack([found[c] for c in captions])

    def _encode_one(self, caption: str, device: torch.device) -> torch.Tensor:
        # only reached when an entry was dropped between the membership test and the lookup
        return F.normalize(self.encode([caption]).to(device=device, dtype=torch.float32), dim=-1)[0]


@META_ARCH_REGISTRY.register()
class SparseCLIPFGOVD(nn.Module):
    """Frozen CLIP (modified final attention for the dense protocol) scoring FG-OVD boxes
    against their captions. Inputs: dicts of
    :class:`sparseclip_d2.data.fgovd_mapper.FGOVDDatasetMapper`."""

    @configurable
    def __init__(
        self,
        *,
        encoder: nn.Module,
        caption_encoder: Callable[[List[str]], torch.Tensor],
        pixel_mean: Sequence[float],
        pixel_std: Sequence[float],
        clip_model: Optional[nn.Module] = None,
        protocol: str = "dense",
        resolution: int = 224,
        pooler_resolution: int = 1,
        aligned: bool = True,
        resize_interpolation: str = "bicubic",
        proposal_matching: str = "score",
        iou_threshold: float = 0.5,
        input_format: str = "RGB",
        caption_cache_size: int = 8192,
        crop_batch_size: int = 64,
        random_weights: bool = False,
    ):
        """
        Args:
            encoder: dense encoder, ``(B, 3, H, W)`` normalised -> ``(B, D, H/p, W/p)``, with
                ``patch_size`` and ``embed_dim`` attributes.
            caption_encoder: ``list of M captions -> (M, D)`` embeddings.
            pixel_mean, pixel_std: per-channel RGB normalisation on the 0-255 scale.
            clip_model: the open_clip model (its unmodified ``encode_image`` and
                ``visual.image_size`` serve the crop protocol).
            protocol: "dense" or "crop".
            resolution: dense protocol working resolution R.
            pooler_resolution: RoIAlign output size P (bins averaged).
            aligned: RoIAlign ``aligned`` flag.
            resize_interpolation: dense whole-image resize, "bicubic" or "bilinear" (PIL).
            proposal_matching, iou_threshold: see :func:`match_proposals`.
            input_format: "RGB" or "BGR", channel order of ``input["image"]``.
            caption_cache_size: caption embeddings kept (least recently used dropped).
            crop_batch_size: crops per ``encode_image`` call.
            random_weights: the CLIP weights are random (recorded).
        """
        super().__init__()
        if encoder.needs.first_segmentation:  # the encoder contract (common/needs.py)
            refuse_feedback_spec(encoder.spec, "FG-OVD (SparseCLIPFGOVD)")
        if protocol not in FGOVD_PROTOCOLS:
            raise ValueError(f"unknown MODEL.SPARSECLIP.FGOVD.PROTOCOL {protocol!r}; valid: {', '.join(FGOVD_PROTOCOLS)}")
        if int(resolution) < 1 or int(pooler_resolution) < 1:
            raise ValueError(
                f"MODEL.SPARSECLIP.FGOVD.RESOLUTION ({resolution}) and POOLER_RESOLUTION "
                f"({pooler_resolution}) must be >= 1"
            )
        if not 0.0 <= float(iou_threshold) <= 1.0 or not math.isfinite(float(iou_threshold)):
            raise ValueError(f"MODEL.SPARSECLIP.FGOVD.IOU_THRESHOLD must be in [0, 1], got {iou_threshold}")
        if resize_interpolation not in _PIL_INTERPOLATION:
            raise ValueError(
                f"unknown MODEL.SPARSECLIP.FGOVD.RESIZE_INTERPOLATION {resize_interpolation!r}; "
                f"valid: {', '.join(_PIL_INTERPOLATION)}"
            )
        if proposal_matching not in CONVENTION_CHOICES["proposal_matching"]:
            raise ValueError(
                f"unknown MODEL.SPARSECLIP.FGOVD.PROPOSAL_MATCHING {proposal_matching!r}; valid: "
                f"{', '.join(CONVENTION_CHOICES['proposal_matching'])}"
            )
        check_input_format(input_format)
        if protocol == "crop" and clip_model is None:
            raise ValueError("MODEL.SPARSECLIP.FGOVD.PROTOCOL crop needs clip_model (the unmodified CLIP)")
        if int(crop_batch_size) < 1:
            raise ValueError(f"crop_batch_size must be >= 1, got {crop_batch_size}")
        self.encoder = encoder
        self.clip_model = clip_model
        self.captions = CaptionEncoder(caption_encoder, caption_cache_size)
        self.protocol = protocol
        self.resolution = int(resolution)
        self.pooler_resolution = int(pooler_resolution)
        self.aligned = bool(aligned)
        self.resize_interpolation = resize_interpolation
        self.proposal_matching = proposal_matching
        self.iou_threshold = float(iou_threshold)
        self.input_format = input_format
        self.crop_batch_size = int(crop_batch_size)
        self.random_weights = bool(random_weights)
        self.register_buffer("pixel_mean", torch.tensor(pixel_mean, dtype=torch.float32).view(-1, 1, 1), False)
        self.register_buffer("pixel_std", torch.tensor(pixel_std, dtype=torch.float32).view(-1, 1, 1), False)
        self.eval()

    @classmethod
    def from_config(cls, cfg):
        sc = cfg.MODEL.SPARSECLIP
        f = sc.FGOVD
        conventions = conventions_from_config(cfg)
        refuse_feedback_spec(AttentionSpec.from_config(cfg), "FG-OVD (SparseCLIPFGOVD)")  # before the weights load
        parts = build_clip_parts(cfg)  # validates every user-facing value before the weights load
        encoder = parts.encoder
        text = parts.text_classifier(f.TEMPLATES)
        return {
            "encoder": encoder,
            "caption_encoder": text.encode,
            "pixel_mean": parts.pixel_mean,
            "pixel_std": parts.pixel_std,
            "clip_model": parts.clip_model,
            "protocol": f.PROTOCOL,
            "resolution": f.RESOLUTION,
            "pooler_resolution": f.POOLER_RESOLUTION,
            "aligned": f.ALIGNED,
            "resize_interpolation": conventions.resize_interpolation,
            "proposal_matching": conventions.proposal_matching,
            "iou_threshold": f.IOU_THRESHOLD,
            "input_format": cfg.INPUT.FORMAT,
            "caption_cache_size": f.CAPTION_CACHE_SIZE,
            "random_weights": parts.random_weights,
        }

    @property
    def device(self) -> torch.device:
        return self.pixel_mean.device

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, 3, H, W)`` uint8 RGB -> float32 normalised on ``self.device``."""
        return (images.to(self.device, torch.float32) - self.pixel_mean) / self.pixel_std

    def _pil(self, image: torch.Tensor) -> Image.Image:
        if image.dim() != 3 or image.shape[0] != 3 or image.dtype != torch.uint8:
            raise ValueError(f"expected a (3, H, W) uint8 image, got {tuple(image.shape)} {image.dtype}")
        if self.input_format == "BGR":
            image = image.flip(0)
        return Image.fromarray(image.permute(1, 2, 0).cpu().numpy())

    def _regions(self, inp: dict) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(boxes (K, 4) XYXY in original pixels, matched (K,) bool)`` of one input."""
        gt = inp["instances"].gt_boxes.tensor.float().cpu()
        if "proposals" not in inp:
            return gt, torch.ones(len(gt), dtype=torch.bool)
        props = inp["proposals"]
        boxes = props.proposal_boxes.tensor.float().cpu()
        scores = props.objectness_logits.float().cpu() if props.has("objectness_logits") else None
        index, matched = match_proposals(gt, boxes, self.iou_threshold, scores, self.proposal_matching)
        return (boxes[index] if len(boxes) else gt.clone()), matched

    @torch.no_grad()
    def forward(self, batched_inputs: List[Dict]) -> List[Dict]:
        """
        Args:
            batched_inputs: dicts with ``image`` (3, H, W) uint8 (the original image),
                ``instances`` (``gt_boxes`` XYXY in the image's pixels, ``ann_ids``),
                ``fgovd_captions`` (K lists: positive caption first, then its negatives) and
                optional ``proposals`` (``proposal_boxes``, ``objectness_logits``).

        Returns:
            One dict per input: ``{"fgovd": {"scores": (K, C) float32 CPU, C the longest
            caption list (shorter rows NaN-padded; unmatched boxes all NaN), "num_captions":
            (K,) long, "matched": (K,) bool, "ann_ids": (K,) long}}``.
        """
        for inp in batched_inputs:
            for key in ("image", "instances", "fgovd_captions"):
                if key not in inp:
                    raise KeyError(
                        f"FG-OVD input {inp.get('file_name', '?')} lacks '{key}': build the test loader "
                        f"with sparseclip_d2.data.fgovd_mapper.FGOVDDatasetMapper"
                    )
            caps = inp["fgovd_captions"]
            if len(caps) != len(inp["instances"]) or any(len(c) < 1 for c in caps):
                raise ValueError(
                    f"{inp.get('file_name')}: {len(caps)} caption lists for {len(inp['instances'])} boxes "
                    f"(each needs its positive caption first)"
                )
        images = [self._pil(inp["image"]) for inp in batched_inputs]
        regions, matched = zip(*(self._regions(inp) for inp in batched_inputs))
        counts = [len(r) for r in regions]
        if sum(counts) == 0:
            embs = [None] * len(batched_inputs)
        elif self.protocol == "dense":
            embs = self._dense_embeddings(images, regions)
        else:
            embs = self._crop_embeddings(images, regions)

        results = []
        for inp, emb, m in zip(batched_inputs, embs, matched):
            caps = inp["fgovd_captions"]
            k = len(caps)
            width = max((len(c) for c in caps), default=1)
            scores = torch.full((k, width), float("nan"))
            if k:
                flat = [t for c in caps for t in c]
                cap_emb = self.captions(flat, self.device)
                for i, part in enumerate(cap_emb.split([len(c) for c in caps])):
                    scores[i, : len(part)] = (part @ emb[i].float()).cpu()
            m = m.cpu()
            scores[~m] = float("nan")
            results.append({"fgovd": {
                "scores": scores,
                "num_captions": torch.tensor([len(c) for c in caps], dtype=torch.long),
                "matched": m,
                "ann_ids": inp["instances"].ann_ids.cpu(),
            }})
        return results

    def _dense_embeddings(self, images: List[Image.Image], regions) -> List[torch.Tensor]:
        """Dense protocol: PIL resize to R x R, modified encoder, RoIAlign. B x ``(K_b, D)``."""
        r = self.resolution
        batch = torch.stack([resize_image(im, r, self.resize_interpolation) for im in images])
        feats = self.encoder(self.normalize(batch))  # (B, D, R/p, R/p); the encoder casts
        boxes = []
        for im, reg in zip(images, regions):
            scale = torch.tensor([r / im.width, r / im.height, r / im.width, r / im.height])
            boxes.append((reg * scale).to(self.device))
        return pool_region_embeddings(feats, boxes, int(self.encoder.patch_size), self.pooler_resolution, self.aligned)

    def _crop_embeddings(self, images: List[Image.Image], regions) -> List[torch.Tensor]:
        """Crop protocol: CLIP's preprocessing of each box crop, unmodified encoder. B x ``(K_b, D)``."""
        size = self.clip_model.visual.image_size
        size = (size, size) if isinstance(size, int) else tuple(size)
        if size[0] != size[1]:
            raise ValueError(f"the crop protocol needs a square CLIP input size, got {size}")
        param = next(self.clip_model.visual.parameters(), None)
        dtype = param.dtype if param is not None else torch.float32
        out = []
        for im, reg in zip(images, regions):
            crops = [clip_crop(im, box, int(size[0])) for box in reg.tolist()]
            embs = []
            for i in range(0, len(crops), self.crop_batch_size):
                x = self.normalize(torch.stack(crops[i:i + self.crop_batch_size]))
                embs.append(F.normalize(self.clip_model.encode_image(x.to(dtype)).float(), dim=-1))
            out.append(torch.cat(embs) if embs else torch.zeros((0, int(self.encoder.embed_dim)), device=self.device))
        return out
