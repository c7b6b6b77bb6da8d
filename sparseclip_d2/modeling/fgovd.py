"""FG-OVD inference: region embeddings of the boxes and their caption scores.

Entry point :func:`fgovd_inference`, called by the ``SparseCLIP`` META_ARCH when the inputs
come from a dataset whose metadata has ``evaluator_type == "fgovd"``. The inputs are the
dicts of :class:`sparseclip_d2.data.fgovd_mapper.FGOVDDatasetMapper`; each carries the
run's :class:`~sparseclip_d2.data.fgovd_mapper.FGOVDOptions` (``fgovd_options``).

Regions (ground-truth boxes, or with proposals the proposal of highest IoU >= threshold with
each box):

- ``dense`` protocol: the (R x R) image goes through the modified dense encoder, giving
  ``(B, D, R/p, R/p)`` patch embeddings; each box is RoIAligned on that grid
  (``spatial_scale = 1/p``, adaptive sampling, ``P x P`` bins averaged) and L2-normalised.
- ``crop`` protocol (baseline): each box is cropped from the original image, resized to the
  CLIP input size and encoded by the *unmodified* image encoder ``clip_model.encode_image``.

Captions are encoded as they are (full sentences, commas included: no synonym splitting),
optionally through templates, and cached per (model, templates, device, dtype) by text.
"""
import logging
import math
import weakref
from typing import Dict, List, Sequence, Tuple

import torch
import torch.nn.functional as F
from detectron2.structures import Boxes, pairwise_iou
from torchvision.ops import roi_align

__all__ = [
    "fgovd_inference",
    "pool_region_embeddings",
    "match_proposals",
    "crop_boxes",
    "CaptionEncoder",
    "score_regions",
]

logger = logging.getLogger(__name__)

# RoIAlign sampling ratio: 0 = adaptive (ceil(bin size) samples per bin and axis), as in
# detectron2's ROIAlignV2 pooler. A box covering exactly one patch with P = 1 is sampled
# once, at the patch centre.
_SAMPLING_RATIO = 0
# Crops encoded per encode_image call.
_CROP_BATCH = 64


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
    gt_boxes: torch.Tensor, proposal_boxes: torch.Tensor, iou_threshold: float
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The proposal standing for each ground-truth box: highest IoU, if >= threshold.

    Args:
        gt_boxes: ``(K, 4)`` XYXY.
        proposal_boxes: ``(M, 4)`` XYXY (M may be 0).
        iou_threshold: minimum IoU.

    Returns:
        ``(index (K,) long, matched (K,) bool)``; ``index`` is the proposal of highest IoU
        (the first one, i.e. the higher objectness, on IoU ties; 0 when unmatched).
    """
    k = gt_boxes.shape[0]
    if k == 0 or proposal_boxes.shape[0] == 0:
        return torch.zeros(k, dtype=torch.long), torch.zeros(k, dtype=torch.bool)
    iou = pairwise_iou(Boxes(gt_boxes.float()), Boxes(proposal_boxes.float()))  # (K, M)
    best, index = iou.max(dim=1)
    return index, best >= iou_threshold


def crop_boxes(image: torch.Tensor, boxes: torch.Tensor, size: Tuple[int, int]) -> torch.Tensor:
    """Crop boxes out of an image and resize each crop to ``size``.

    The crop is the integer pixel rectangle enclosing the box (floor / ceil, clipped to the
    image, at least 1 pixel), resized with antialiased bicubic interpolation (no aspect
    preservation: the whole box is seen).

    Args:
        image: ``(C, H, W)`` float.
        boxes: ``(K, 4)`` XYXY pixels.
        size: ``(S_h, S_w)``.

    Returns:
        ``(K, C, S_h, S_w)`` float.
    """
    _, H, W = image.shape
    crops = []
    for x0, y0, x1, y1 in boxes.tolist():
        xa = min(max(int(math.floor(x0)), 0), W - 1)
        ya = min(max(int(math.floor(y0)), 0), H - 1)
        xb = max(min(int(math.ceil(x1)), W), xa + 1)
        yb = max(min(int(math.ceil(y1)), H), ya + 1)
        crop = image[None, :, ya:yb, xa:xb]
        crops.append(F.interpolate(crop, size=size, mode="bicubic", align_corners=False, antialias=True))
    if not crops:
        return image.new_zeros((0, image.shape[0], *size))
    return torch.cat(crops)


class CaptionEncoder:
    """Caption-sentence embeddings, cached by (text, device).

    Captions are used as they are (no comma splitting): they go through
    ``TextClassifier.encode``, which takes already-split prompts (every template filled with
    the caption, L2-normalised embeddings averaged over templates and re-normalised; prompts
    longer than the text context are truncated by the tokenizer, with a warning).
    """

    def __init__(self, text_classifier):
        """
        Args:
            text_classifier: a ``sparseclip_d2.clip.TextClassifier`` (uses its ``encode``).
        """
        self.text_classifier = text_classifier
        self._cache: Dict[Tuple[str, str], torch.Tensor] = {}

    @torch.no_grad()
    def __call__(self, captions: Sequence[str], device: torch.device) -> torch.Tensor:
        """``(M,)`` captions, M >= 1 -> ``(M, D)`` float32 unit-norm embeddings on ``device``."""
        if not captions:
            raise ValueError("no captions to encode")
        key_dev = str(device)
        todo = sorted({c for c in captions if (c, key_dev) not in self._cache})
        if todo:
            emb = self.text_classifier.encode(todo).to(device=device, dtype=torch.float32)
            for c, e in zip(todo, emb):
                self._cache[(c, key_dev)] = e
        return torch.stack([self._cache[(c, key_dev)] for c in captions])


def score_regions(regions: torch.Tensor, captions: torch.Tensor) -> torch.Tensor:
    """Cosine scores of each region against its own captions.

    Args:
        regions: ``(K, D)`` unit-norm region embeddings.
        captions: ``(K, C, D)`` unit-norm caption embeddings (C = 1 + N, positive first).

    Returns:
        ``(K, C)`` float32.
    """
    return torch.einsum("kd,kcd->kc", regions.float(), captions.float())


# One CaptionEncoder per (clip model, templates); dropped with the model.
_CAPTION_ENCODERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _caption_encoder(model, templates_name: str) -> CaptionEncoder:
    """The cached :class:`CaptionEncoder` of ``model`` for a template set (captions are encoded
    whole through the META_ARCH's text classifier, never split into synonyms)."""
    per_model = _CAPTION_ENCODERS.setdefault(model.clip_model, {})
    if templates_name not in per_model:
        per_model[templates_name] = CaptionEncoder(model.text_classifier(templates_name))
    return per_model[templates_name]


def _regions(inp: dict, options) -> Tuple[torch.Tensor, torch.Tensor]:
    """Boxes to pool for one input, and which ground-truth boxes have a region.

    Returns ``(boxes (K, 4) XYXY in the mapped image, matched (K,) bool)``.
    """
    gt = inp["instances"].gt_boxes.tensor
    if "proposals" not in inp:
        return gt, torch.ones(len(gt), dtype=torch.bool)
    props = inp["proposals"].proposal_boxes.tensor
    index, matched = match_proposals(gt, props, options.iou_threshold)
    boxes = props[index] if len(props) else gt.clone()
    return boxes, matched


@torch.no_grad()
def fgovd_inference(model, batched_inputs: List[dict]) -> List[dict]:
    """Score every box of every input against its ``1 + N`` captions.

    Args:
        model: the ``SparseCLIP`` META_ARCH (uses ``encoder``, ``clip_model``, ``device``,
            ``normalize_image(s)`` and its tokenizer).
        batched_inputs: dicts from :class:`FGOVDDatasetMapper` (``image``, ``instances``,
            ``fgovd_captions``, ``fgovd_options``, optional ``proposals``).

    Returns:
        One dict per input: ``{"fgovd": {"scores": (K, 1 + N) float32 CPU, "matched": (K,)
        bool, "ann_ids": (K,) long}}``; unmatched boxes (proposal mode) have NaN scores.
    """
    for inp in batched_inputs:
        for key in ("image", "instances", "fgovd_captions", "fgovd_options"):
            if key not in inp:
                raise KeyError(
                    f"FG-OVD input {inp.get('file_name', '?')} lacks '{key}': build the test loader "
                    f"with sparseclip_d2.data.fgovd_mapper.FGOVDDatasetMapper"
                )
    options = batched_inputs[0]["fgovd_options"]
    if any(inp["fgovd_options"] != options for inp in batched_inputs):
        raise ValueError("FG-OVD inputs of one batch carry different fgovd_options")

    regions, matched = zip(*(_regions(inp, options) for inp in batched_inputs))
    counts = [len(r) for r in regions]
    if sum(counts) == 0:
        embs = [None] * len(batched_inputs)
    elif options.protocol == "dense":
        embs = _dense_embeddings(model, batched_inputs, regions, options)
    else:
        embs = _crop_embeddings(model, batched_inputs, regions)

    results = []
    for inp, emb, m, k in zip(batched_inputs, embs, matched, counts):
        caps = inp["fgovd_captions"]
        if len(caps) != k:
            raise ValueError(f"{inp.get('file_name')}: {len(caps)} caption lists for {k} boxes")
        c = len(caps[0]) if caps else 1
        if any(len(x) != c for x in caps):
            raise ValueError(f"{inp.get('file_name')}: boxes have different numbers of captions")
        if k:
            encoder = _caption_encoder(model, options.templates)
            cap_emb = encoder([t for x in caps for t in x], model.device).view(k, c, -1)
            scores = score_regions(emb, cap_emb).cpu()
        else:
            scores = torch.zeros((0, c))
        m = m.cpu()
        scores[~m] = float("nan")
        results.append(
            {"fgovd": {"scores": scores, "matched": m, "ann_ids": inp["instances"].ann_ids.cpu()}}
        )
    return results


def _encoder_dtype(module) -> torch.dtype:
    param = next(module.parameters(), None)
    return param.dtype if param is not None else torch.float32


def _dense_embeddings(model, batched_inputs, regions, options) -> List[torch.Tensor]:
    """Dense protocol: encode the (R x R) images, RoIAlign the regions. B x ``(K_b, D)``.

    ``model.normalize_images`` pads bottom/right to a patch multiple, which leaves the box
    coordinates valid.
    """
    shapes = {tuple(inp["image"].shape[-2:]) for inp in batched_inputs}
    if len(shapes) != 1:
        raise ValueError(
            f"FG-OVD dense inputs of a batch must share one size (RESOLUTION x RESOLUTION), got {sorted(shapes)}"
        )
    images = model.normalize_images(batched_inputs).tensor
    feats = model.encoder(images.to(_encoder_dtype(model.encoder)))  # (B, D, H'/p, W'/p)
    boxes = [r.to(model.device) for r in regions]
    return pool_region_embeddings(
        feats, boxes, int(model.encoder.patch_size), options.pooler_resolution, options.aligned
    )


def _crop_embeddings(model, batched_inputs, regions) -> List[torch.Tensor]:
    """Crop protocol: encode each box crop with the unmodified encoder. B x ``(K_b, D)``.

    Crops are cut from the uint8 image, resized to the CLIP input size, then normalised
    exactly like whole images (``model.normalize_image``).
    """
    if model.clip_model is None:
        raise ValueError("MODEL.SPARSECLIP.FGOVD.PROTOCOL crop needs model.clip_model (the unmodified CLIP)")
    visual = model.clip_model.visual
    size = visual.image_size
    size = (int(size), int(size)) if isinstance(size, int) else tuple(int(s) for s in size)
    dtype = _encoder_dtype(visual)
    out = []
    for inp, boxes in zip(batched_inputs, regions):
        img = inp["image"].to(model.device).float()
        crops = crop_boxes(img, boxes.to(img.device), size).clamp_(0, 255)
        embs = []
        for i in range(0, len(crops), _CROP_BATCH):
            c = torch.stack([model.normalize_image(x) for x in crops[i:i + _CROP_BATCH]])
            embs.append(F.normalize(model.clip_model.encode_image(c.to(dtype)).float(), dim=-1))
        out.append(torch.cat(embs) if embs else img.new_zeros((0, int(model.encoder.embed_dim))))
    return out
