"""CorrCLIP (Zhang et al., ICCV 2025) as parts on the proxy last block.

zdk258/CorrCLIP @ 103bc18 ``CorrCLIPv1/open_clip/transformer.py`` ``VisionTransformer.forward``
and ``CorrCLIPv1/corrclip_segmentor.py``:

- **region masks** (:func:`load_region_mask`): one ``(H, W)`` integer map per image, read from
  ``<MASK_DIR>/<image stem>.npz`` key ``instance_mask`` (``generate_mask``: ``np.load(os.path.join(
  self.instance_mask_path, Path(img_path).stem + '.npz'))['instance_mask']``); the **minimum**
  value marks the union of unsegmented pixels (``generate_mask``'s comment), every other value one
  region. :func:`write_region_mask` writes that format (``np.savez_compressed``).
- **region merge** (:func:`merge_regions`): the regions' mean proxy features, L2-normalised, are
  clustered by DBSCAN (``metric='precomputed'`` on ``max(S) - S``, eps 0.2, min_samples 1); each
  cluster becomes one region.
- **region-restricted scores** (:data:`REGION_RESTRICTION_REGISTRY`, :func:`restrict_to_regions`):
  any ``(B, N, N)`` score matrix limited to pairs inside one region; a pair touching the
  unsegmented pixels is kept where its score exceeds the image's mean score (``regions``,
  upstream's default, "Method 1") or never (``regions_strict``, upstream's "Method 2"); the rest
  ``-inf``. Any registered normaliser (softmax upstream, entmax alike) then makes weights.
- **CorrCLIP's last block** (:class:`CorrCLIPEncoder`): scores = cosine of the proxy's
  (queries + keys) features x TAU (4), restricted; the *main* branch attends CLIP's values of the
  last block's input, the *spatial* branch those of the mean of lower blocks' outputs (blocks
  ``depth - 2 - NUM_SPATIAL .. depth - 3``); the *semantic* branch runs one mask class token per
  region (CLS copies that read only CLS and their region's patches in every block); the three
  outputs pass the final norm and are summed with weights 1, 1 and 0.5.
- **mode label per mask** (:func:`region_mode_labels`): each region of the file's mask (not the
  merged one) takes its most frequent predicted label (``torch.mode``'s tie rule: the smallest).
"""
import logging
import math
import os
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from fvcore.common.registry import Registry
from torch import nn

from ...clip.encoder import EncoderPass, check_pass_inputs
from ...common.keys import key_field
from ...common.needs import Needs
from ...proxy.attention import resample_grid
from ..proxyclip.encoder import ProxyCLIPEncoder, normalize_proxy_scores

__all__ = [
    "CorrCLIPSettings", "check_corrclip_settings", "REGION_RESTRICTION_REGISTRY", "restrict_to_regions",
    "merge_regions", "region_mode_labels", "load_region_mask", "write_region_mask", "mask_file_for",
    "upstream_num_spatial", "CorrCLIPEncoder", "PAD_LABEL", "MERGED_LABEL_OFFSET", "resolve_mask_dir",
]

logger = logging.getLogger(__name__)

#: Label of the padding pixels of a window (corrclip_segmentor.py forward_slide:
#: ``nn.functional.pad(crop_instance_masks, pad, value=10000)``): a region of its own.
PAD_LABEL = 10000
#: Merged regions are relabelled ``cluster + 10000`` (open_clip/transformer.py ``cluster_v + 10000``).
MERGED_LABEL_OFFSET = 10000
#: The ``.npz`` key of the mask array (corrclip_segmentor.py generate_mask ``['instance_mask']``).
NPZ_KEY = "instance_mask"

REGION_RESTRICTION_REGISTRY = Registry("REGION_RESTRICTION")
REGION_RESTRICTION_REGISTRY.__doc__ = """
Registry of region restrictions ``fn(scores (B, N, N), labels (B, N) int) -> (B, N, N) bool``
(True = the pair may attend). The minimum label of each image marks its unsegmented pixels.
"""


@dataclass(frozen=True)
class CorrCLIPSettings:
    """CorrCLIP's values (``MODEL.SPARSECLIP.PROXY.CORRCLIP.*``), defaults from zdk258/CorrCLIP @
    103bc18 ``CorrCLIPv1/open_clip/transformer.py`` ``VisionTransformer.forward``.

    Fields: mask_dir (``.npz`` region masks, one per image stem), tau (``TAU = 4``), spatial_weight
    and semantic_weight (``ALPHA, BETA = 1.0, 0.5``), num_spatial (-1 = upstream's rule by depth,
    :func:`upstream_num_spatial`), dbscan_eps / dbscan_min_samples (``EPS, MIN_SAMPLES = 0.2, 1``),
    restriction (:data:`REGION_RESTRICTION_REGISTRY`), mode_vote (corrclip_segmentor.py
    ``postprocess_result`` "Map Correction").
    """

    mask_dir: str = key_field("", "MASK_DIR", "Directory of region masks, one <image stem>.npz per image with an "
                              "(H, W) integer array 'instance_mask' at the image's original size, minimum = "
                              "unsegmented (as CorrCLIP reads its pre-generated SAM2 masks: generate_mask, "
                              "instance_mask_path). Required when enabled.")
    tau: float = key_field(4.0, "TAU", "Scores = proxy cosine x TAU within the regions, then ATTENTION.NORMALIZER "
                           "(TAU = 4).")
    spatial_weight: float = key_field(1.0, "SPATIAL_WEIGHT", "Weight of the spatial branch (ALPHA = 1.0).")
    semantic_weight: float = key_field(0.5, "SEMANTIC_WEIGHT", "Weight of the semantic branch (BETA = 0.5).")
    num_spatial: int = key_field(-1, "NUM_SPATIAL", "Lower blocks averaged by the spatial branch; -1 = upstream's "
                                 "rule (12 blocks: 5, 24: 12, 32: 28, else depth - 4).")
    dbscan_eps: float = key_field(0.2, "DBSCAN_EPS", "DBSCAN region merge on max(S) - S of the regions' mean proxy "
                                  "features (EPS = 0.2).")
    dbscan_min_samples: int = key_field(1, "DBSCAN_MIN_SAMPLES", "DBSCAN's MIN_SAMPLES (1).")
    restriction: str = key_field("regions", "RESTRICTION", 'Region restriction of the scores: "regions" (upstream: '
                                 "unsegmented patches attend where the score is above the mean) or "
                                 "\"regions_strict\" (upstream's commented alternative).")
    mode_vote: bool = key_field(True, "MODE_VOTE", "Each mask region takes its most frequent label "
                                "(corrclip_segmentor.py \"Map Correction\").")


def _finite(key: str, value, positive: bool = False, nonneg: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise ValueError(f"{key} = {value!r} is invalid; valid: a finite number")
    if positive and not value > 0:
        raise ValueError(f"{key} = {value!r} is invalid; valid: a number > 0")
    if nonneg and value < 0:
        raise ValueError(f"{key} = {value!r} is invalid; valid: a number >= 0")
    return float(value)


def check_corrclip_settings(s: CorrCLIPSettings, key: str = "MODEL.SPARSECLIP.PROXY.CORRCLIP") -> CorrCLIPSettings:
    """Validate ``s`` (no file is read); returns them.

    Raises:
        ValueError: naming ``key.<FIELD>``, the value and the valid choices.
        FileNotFoundError: ``mask_dir`` is not a directory (naming the key and the path).
    """
    _finite(f"{key}.TAU", s.tau, positive=True)
    _finite(f"{key}.SPATIAL_WEIGHT", s.spatial_weight, nonneg=True)
    _finite(f"{key}.SEMANTIC_WEIGHT", s.semantic_weight, nonneg=True)
    _finite(f"{key}.DBSCAN_EPS", s.dbscan_eps, positive=True)
    for name, v, lo in (("NUM_SPATIAL", s.num_spatial, -1), ("DBSCAN_MIN_SAMPLES", s.dbscan_min_samples, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo or (name == "NUM_SPATIAL" and v == 0):
            valid = "-1 (upstream's rule by CLIP depth) or a number of blocks >= 1" if name == "NUM_SPATIAL" else \
                "an integer >= 1"
            raise ValueError(f"{key}.{name} = {v!r} is invalid; valid: {valid}")
    if s.restriction not in REGION_RESTRICTION_REGISTRY:
        raise ValueError(f"{key}.RESTRICTION = {s.restriction!r} is invalid; valid: "
                         f"{', '.join(sorted(n for n, _ in REGION_RESTRICTION_REGISTRY))}")
    if not isinstance(s.mode_vote, bool):
        raise ValueError(f"{key}.MODE_VOTE = {s.mode_vote!r} is invalid; valid: True, False")
    if not isinstance(s.mask_dir, str) or not s.mask_dir.strip():
        raise ValueError(f"{key}.MASK_DIR = {s.mask_dir!r}: CorrCLIP needs one region mask per image; valid: a "
                         "directory of <image stem>.npz files (key 'instance_mask', as CorrCLIP writes them; "
                         "tools/write_region_masks.py writes such files)")
    path = resolve_mask_dir(s.mask_dir)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{key}.MASK_DIR = {s.mask_dir!r}: no such directory ({os.path.abspath(path)}; a "
                                "relative MASK_DIR is read under $DETECTRON2_DATASETS, default ./datasets)")
    return s


def resolve_mask_dir(mask_dir: str) -> str:
    """``MASK_DIR`` as a path: absolute (or ``~``) as given; relative under the dataset root
    ``$DETECTRON2_DATASETS`` (default ``datasets``), where the datasets themselves are read."""
    d = os.path.expanduser(str(mask_dir).strip())
    if os.path.isabs(d):
        return d
    return os.path.join(os.path.expanduser(os.getenv("DETECTRON2_DATASETS", "datasets")), d)


def upstream_num_spatial(depth: int) -> int:
    """Lower blocks averaged by the spatial branch (transformer.py: 12 blocks -> 5, 24 -> 12,
    32 -> 28, otherwise depth - 4)."""
    return {12: 5, 24: 12, 32: 28}.get(int(depth), int(depth) - 4)


# ----------------------------------------------------------------------------- mask files
def mask_file_for(mask_dir: str, image_file: str) -> str:
    """``<mask_dir>/<stem of image_file>.npz`` (corrclip_segmentor.py ``Path(img_path).stem + '.npz'``)."""
    stem = os.path.splitext(os.path.basename(str(image_file)))[0]
    return os.path.join(resolve_mask_dir(mask_dir), stem + ".npz")


def load_region_mask(path: str, key: str = "MODEL.SPARSECLIP.PROXY.CORRCLIP.MASK_DIR",
                     image_hw: Optional[Tuple[int, int]] = None) -> torch.Tensor:
    """The ``(H, W)`` int64 region mask in ``path`` (``np.load(path)['instance_mask']``).

    Raises:
        FileNotFoundError: no file (naming ``key`` and the path).
        ValueError: no ``instance_mask`` array, not a 2-D integer array, a label >= 10000 (the
            padding / merged labels), or a size other than ``image_hw`` (all naming the file).
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{key}: no region mask {path!r} for this image (CorrCLIP reads <MASK_DIR>/<image "
                                "stem>.npz; write one per image, e.g. with tools/write_region_masks.py)")
    with np.load(path) as z:
        if NPZ_KEY not in z.files:
            raise ValueError(f"region mask {path!r} has no array {NPZ_KEY!r} (it holds {z.files}); CorrCLIP's files "
                             f"store the mask as np.savez(..., {NPZ_KEY}=array)")
        m = z[NPZ_KEY]
    if m.ndim != 2 or not np.issubdtype(m.dtype, np.integer) and m.dtype != np.bool_:
        raise ValueError(f"region mask {path!r}: {NPZ_KEY} is a {m.ndim}-D {m.dtype} array; valid: a 2-D integer "
                         "(H, W) map (minimum = unsegmented, every other value one region)")
    m = m.astype(np.int64)
    if m.size and int(m.max()) >= PAD_LABEL:
        raise ValueError(f"region mask {path!r} holds label {int(m.max())}; valid: labels < {PAD_LABEL} (CorrCLIP "
                         f"labels window padding {PAD_LABEL} and merged regions {MERGED_LABEL_OFFSET} + cluster)")
    if image_hw is not None and tuple(m.shape) != tuple(int(v) for v in image_hw):
        raise ValueError(f"region mask {path!r} is {m.shape[0]}x{m.shape[1]} (HxW) but its image is "
                         f"{image_hw[0]}x{image_hw[1]}; a mask must have its image's original size")
    return torch.from_numpy(m)


def write_region_mask(path: str, mask) -> None:
    """Write an ``(H, W)`` integer mask as CorrCLIP reads it (``np.savez_compressed(path,
    instance_mask=mask)``)."""
    m = np.asarray(mask)
    if m.ndim != 2 or not np.issubdtype(m.dtype, np.integer):
        raise ValueError(f"a region mask is a 2-D integer array, got a {m.ndim}-D {m.dtype} array")
    np.savez_compressed(path, **{NPZ_KEY: m})


# ----------------------------------------------------------------------------- parts
def _outer_same_region(labels: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(same (B, N, N) bool: both in one segmented region, unseg (B, N) bool)``."""
    lo = labels.min(dim=1, keepdim=True).values
    unseg = labels == lo
    same = (labels[:, :, None] == labels[:, None, :]) & ~unseg[:, :, None]
    return same, unseg


@REGION_RESTRICTION_REGISTRY.register()
def regions(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """CorrCLIP's scope (transformer.py "Method 1"): pairs inside one segmented region, and pairs
    with an unsegmented patch on either side whose score exceeds the image's mean score."""
    same, unseg = _outer_same_region(labels)
    above = scores > scores.mean(dim=(1, 2), keepdim=True)
    return same | ((unseg[:, :, None] | unseg[:, None, :]) & above)


@REGION_RESTRICTION_REGISTRY.register()
def regions_strict(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """transformer.py "Method 2": pairs inside one region, the unsegmented pixels forming one more
    region (no attention across the boundary of the unsegmented area)."""
    return labels[:, :, None] == labels[:, None, :]


def restrict_to_regions(scores: torch.Tensor, labels: torch.Tensor, restriction: str = "regions") -> torch.Tensor:
    """``scores`` with every pair the restriction forbids set to ``-inf``.

    Args:
        scores: ``(B, N, N)`` any score source's scores (float32 result).
        labels: ``(B, N)`` integer region label of each token (minimum = unsegmented).
        restriction: a name in :data:`REGION_RESTRICTION_REGISTRY`.
    Returns:
        ``(B, N, N)`` float32; every row keeps at least its diagonal unless it is unsegmented and
        nothing in its row is above the mean (then :class:`ValueError`).
    """
    if restriction not in REGION_RESTRICTION_REGISTRY:
        raise ValueError(f"unknown region restriction {restriction!r}; valid: "
                         f"{', '.join(sorted(n for n, _ in REGION_RESTRICTION_REGISTRY))}")
    if scores.dim() != 3 or labels.shape != scores.shape[:2] or scores.shape[1] != scores.shape[2]:
        raise ValueError(f"scores must be (B, N, N) and labels (B, N), got {tuple(scores.shape)} and "
                         f"{tuple(labels.shape)}")
    s = scores.float()
    keep = REGION_RESTRICTION_REGISTRY.get(restriction)(s, labels)
    if bool((~keep).all(dim=-1).any()):
        raise ValueError("region restriction left a token with nothing to attend to (an unsegmented patch whose "
                         "scores are all at or below the mean); use RESTRICTION regions_strict")
    return s.masked_fill(~keep, float("-inf"))


def merge_regions(labels: torch.Tensor, feats: torch.Tensor, eps: float = 0.2, min_samples: int = 1) -> torch.Tensor:
    """CorrCLIP's DBSCAN region merge of one image.

    Args:
        labels: ``(h, w)`` integer region labels on the proxy grid (minimum = unsegmented).
        feats: ``(h*w, C)`` L2-normalised proxy features (row-major).
        eps, min_samples: DBSCAN's (upstream 0.2, 1).
    Returns:
        ``(h, w)`` int64: with more than two distinct labels, every region but the unsegmented
        one relabelled ``10000 + its DBSCAN cluster`` (noise, -1, keeps its label); the
        clustering runs on the distance ``max(S) - S`` of the regions' cosine similarity ``S``
        (their mean features, L2-normalised; the unsegmented region left out).
    """
    from sklearn.cluster import DBSCAN

    values = torch.unique(labels)
    out = labels.clone().long()
    if values.numel() <= 2:
        return out
    flat = labels.reshape(-1)
    masks = [flat == v for v in values]
    inst = torch.stack([feats[m].mean(dim=0) for m in masks])
    inst = F.normalize(inst.float(), dim=1)[1:]
    sim = inst @ inst.T
    cluster = DBSCAN(metric="precomputed", eps=float(eps), min_samples=int(min_samples)).fit_predict(
        (sim.max() - sim).cpu().numpy())
    o = out.reshape(-1)
    for m, c in zip(masks[1:], cluster):
        if c != -1:
            o[m] = int(c) + MERGED_LABEL_OFFSET
    return out


def region_mode_labels(labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each region of ``mask`` (every value but the minimum) takes its most frequent label
    (ties: the smallest, as ``torch.mode``); unsegmented pixels keep theirs.

    Args:
        labels: ``(H, W)`` int64 predicted labels.
        mask: ``(H, W)`` integer region mask of the same size.
    """
    if labels.shape != mask.shape:
        raise ValueError(f"labels {tuple(labels.shape)} and region mask {tuple(mask.shape)} differ in size")
    out = labels.clone()
    flat_l, flat_m = out.reshape(-1), mask.reshape(-1).to(out.device)
    values = torch.unique(flat_m)
    n = int(flat_l.max()) + 1 if flat_l.numel() else 1
    for v in values[1:]:
        sel = flat_m == v
        flat_l[sel] = int(torch.bincount(flat_l[sel], minlength=n).argmax())
    return out


def _nearest(labels: torch.Tensor, size: Tuple[int, int]) -> torch.Tensor:
    """``(B, H, W)`` integer maps resized by nearest neighbour (``F.interpolate(mode='nearest')``)."""
    if tuple(labels.shape[-2:]) == tuple(size):
        return labels.long()
    return F.interpolate(labels[:, None].double(), size=tuple(size), mode="nearest")[:, 0].long()


# ----------------------------------------------------------------------------- the encoder
class CorrCLIPEncoder(ProxyCLIPEncoder):
    """CorrCLIP's last block on a :class:`~.proxyclip.ProxyCLIPEncoder` (see the module).

    Args:
        visual, spec, proxy, crop_size, pos_embed_interp, attn_pool_dense: as for
            ``ProxyCLIPEncoder``; the spec's normaliser (softmax upstream), alpha and
            temperature act on the restricted scores; ``RESIDUAL`` / ``FFN`` must be False
            (upstream has neither; the three branches are combined after the final norm).
        settings: :class:`CorrCLIPSettings` (``mask_dir`` is not read here).

    ``forward(images, region_masks=...)``: ``region_masks`` ``(B, H, W)`` integer labels of each
    window's pixels (padding pixels :data:`PAD_LABEL`); returns ``(B, D, h', w')`` on the proxy
    grid. Open_clip ViT towers only (the semantic branch builds its attention from the tower's
    own projections).
    """

    #: the pipeline cuts ``input["region_mask"]`` into the windows (common/needs.py)
    needs = Needs(region_mask=True)

    def __init__(self, visual: nn.Module, spec, proxy, *, settings: CorrCLIPSettings = CorrCLIPSettings(),
                 crop_size: Optional[int] = None, pos_embed_interp: str = "size", attn_pool_dense: str = "value"):
        super().__init__(visual, spec, proxy, crop_size=crop_size, pos_embed_interp=pos_embed_interp,
                         attn_pool_dense=attn_pool_dense)
        if self.tower_kind != "open_clip_vit":
            raise ValueError(f"CorrCLIP's semantic branch needs an open_clip ViT tower, got {self.tower_kind!r}")
        if self.spec.residual or self.spec.ffn:
            raise ValueError("MODEL.SPARSECLIP.PROXY.CORRCLIP.ENABLED: the last block has no residual and no FFN "
                             "(CorrCLIP sums three branches after the final norm); set BLOCK.RESIDUAL False, "
                             "BLOCK.FFN False")
        if self.spec.num_layers != 1:
            raise ValueError(f"MODEL.SPARSECLIP.PROXY.CORRCLIP.ENABLED with ATTENTION.NUM_LAYERS "
                             f"{self.spec.num_layers}: CorrCLIP modifies the last block only; valid: 1")
        self.settings = settings
        ns = settings.num_spatial if settings.num_spatial > 0 else upstream_num_spatial(self.depth)
        if not 1 <= ns <= self.depth - 2:
            raise ValueError(f"MODEL.SPARSECLIP.PROXY.CORRCLIP.NUM_SPATIAL = {ns}: the spatial branch averages blocks "
                             f"depth-2-N .. depth-3 of this {self.depth}-block tower; valid: 1 .. {self.depth - 2}")
        self.num_spatial = ns

    def _init_kwargs(self):
        kw = super()._init_kwargs()
        kw.pop("beta"), kw.pop("gamma")
        return dict(kw, settings=self.settings)

    def extra_repr(self) -> str:
        s = self.settings
        return (super().extra_repr() + f", corrclip(tau={s.tau:g}, spatial={s.spatial_weight:g} x {self.num_spatial} "
                f"blocks, semantic={s.semantic_weight:g}, restriction={s.restriction})")

    def describe(self) -> str:
        from ...clip.spec import describe_spec

        s = self.settings
        rest = describe_spec(self.spec).split(", ", 1)[1]
        return (f"CorrCLIP: proxy {self.proxy.opts.name} {self.proxy.opts.feature} cosine x {s.tau:g} within "
                f"DBSCAN-merged regions ({s.restriction}), {rest}, + {s.spatial_weight:g} spatial + "
                f"{s.semantic_weight:g} semantic")

    def region_weights(self, images: torch.Tensor, region_masks: torch.Tensor):
        """``(weights (B, N', N') float32, proxy grid (h', w'), merged labels (B, h', w'))``."""
        _, _, H, W = images.shape
        size = self.proxy.input_size(H, W, self.crop_size)
        from ...proxy.second_backbone import to_proxy_input

        feats = self.proxy(to_proxy_input(images, self.image_mean, self.image_std, self.proxy, size))
        B, C, h, w = feats.shape
        f = F.normalize(feats.float().flatten(2).transpose(1, 2), dim=-1)  # (B, N', C)
        labels = _nearest(region_masks, (h, w))
        merged = torch.stack([merge_regions(labels[b], f[b], self.settings.dbscan_eps,
                                            self.settings.dbscan_min_samples) for b in range(B)])
        sim = torch.einsum("bmc,bnc->bmn", f, f)
        scores = restrict_to_regions(sim, merged.flatten(1), self.settings.restriction) * self.settings.tau
        weights = normalize_proxy_scores(scores, self.spec)
        return weights, (h, w), merged

    def _mct_block(self, blk, mct: torch.Tensor, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """One block on the mask class tokens ``mct`` ``(1, M, C)``: their queries attend the
        keys / values of the stream ``x`` ``(1, L, C)`` where ``allowed`` ``(M, L)`` (CLS and the
        region's patches; never the class tokens themselves), then the residual and the FFN."""
        tower = self._tower
        ym = tower.norm1(blk, mct)
        q, _, _ = tower.qkv(blk, ym, None)
        _, k, v = tower.qkv(blk, tower.norm1(blk, x), None)
        d = q.shape[-1]
        s = torch.matmul(q.float(), k.float().transpose(-1, -2)) / math.sqrt(d)
        s = s.masked_fill(~allowed, float("-inf"))
        out = torch.matmul(s.softmax(dim=-1), v.float()).to(v.dtype)  # (1, heads, M, d)
        out = out.transpose(1, 2).reshape(1, mct.shape[1], -1)
        mct = mct + tower.attn_out(blk, ym, out)
        return mct + tower.ffn(blk, mct)

    def forward_pass(self, images: torch.Tensor, tap_layers: Sequence[int] = (), *,
                     region_masks: Optional[torch.Tensor] = None) -> EncoderPass:
        """One forward: the region-restricted proxy weights, CLIP's blocks with the mask class
        tokens alongside, the three branches of the last block.

        Returns an ``EncoderPass`` whose ``tokens`` are ``(B, h'*w', C)`` (proxy grid, after the
        final norm, the branches summed), ``attn`` ``(B, heads, N', N')``; ``taps`` as for
        ``ProxyCLIPEncoder`` (index ``depth``: the main branch's output before the final norm).
        """
        if region_masks is None:
            raise ValueError("CorrCLIPEncoder needs region_masks (B, H, W) for its windows "
                             "(MODEL.SPARSECLIP.PROXY.CORRCLIP.MASK_DIR)")
        want = check_pass_inputs(images, tap_layers, self.depth)
        B, _, H, W = images.shape
        if tuple(region_masks.shape) != (B, H, W):
            raise ValueError(f"region_masks must be (B, H, W) = {(B, H, W)}, got {tuple(region_masks.shape)}")
        grid = self.grid_for(H, W)
        weights, pgrid, merged = self.region_weights(images, region_masks.to(images.device))
        tower = self._tower
        x, rope = tower.embed(images, grid)
        P = self.num_prefix_tokens
        # mask class tokens: one per region of the merged labels on CLIP's grid
        # (transformer.py: masks interpolated 'nearest' to token_size, torch.unique order)
        clip_labels = _nearest(merged, grid).flatten(1)  # (B, h*w)
        regions_c, allowed, mct = [], [], []
        for b in range(B):
            vals = torch.unique(clip_labels[b])
            r = clip_labels[b][None, :] == vals[:, None]  # (M, h*w)
            a = torch.zeros(r.shape[0], P + r.shape[1], dtype=torch.bool, device=x.device)
            a[:, 0] = True  # the CLS token
            a[:, P:] = r
            regions_c.append(r)
            allowed.append(a)
            mct.append(x[b:b + 1, :1].expand(1, r.shape[0], -1))
        lo, hi = self.depth - 2 - self.num_spatial, self.depth - 3
        spatial = []
        taps = {}
        for i, blk in enumerate(tower.blocks[:-1]):
            if i in want:
                taps[i] = x
            mct = [self._mct_block(blk, mct[b], x[b:b + 1], allowed[b]) for b in range(B)]
            x = tower.run_native(blk, x, rope)
            if lo <= i <= hi:
                spatial.append(x)
        if self.depth - 1 in want:
            taps[self.depth - 1] = x
        blk = tower.blocks[-1]
        mct = [self._mct_block(blk, mct[b], x[b:b + 1], allowed[b]) for b in range(B)]
        x_sp = torch.stack(spatial).mean(0)
        outs = []
        for stream in (x, x_sp):
            y = tower.norm1(blk, stream)
            _, _, v = tower.qkv(blk, y, rope)
            v = resample_grid(v[:, :, P:], grid, pgrid)
            out, attn = self.attend(blk, resample_grid(y[:, P:], grid, pgrid), v, weights)
            outs.append(out)
        main, x_spatial = outs
        if self.depth in want:
            taps[self.depth] = main
        # each proxy-grid patch takes the class token of its region (regions on CLIP's grid
        # resized 'nearest' to the proxy grid: expand_masks.T @ mct)
        sem = []
        for b in range(B):
            r = regions_c[b].reshape(-1, grid[0], grid[1])
            e = _nearest(r.long(), pgrid).flatten(1).to(mct[b].dtype)  # (M, N')
            sem.append(e.T @ mct[b][0])
        x_sem = torch.stack(sem)
        s = self.settings
        tokens = (tower.final_norm(main) + tower.final_norm(x_spatial) * s.spatial_weight
                  + tower.final_norm(x_sem) * s.semantic_weight)
        return EncoderPass(tokens, pgrid, attn, taps, {})

    def forward_tokens(self, images: torch.Tensor, **block_kw):
        p = self.forward_pass(images, **block_kw)
        return p.tokens, p.grid, p.attn
