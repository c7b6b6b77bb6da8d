"""LPOSS / LPOSS+ as post-processing of any method's window logits (no detectron2 import).

vladan-stojnic/LPOSS @ e489a74 ``segmentation/evaluation/lposs_eval.py``
``LPOSS_Infrencer.slide_inference``, per image:

1. every sliding window is encoded: the method's patch logits (LPOSS: MaskCLIP's raw cosine with
   the synonym embeddings) and the VFM's features (DINO ViT-B/16 values of the last block);
   logits on another grid than the VFM's are resized to it bilinearly;
2. one graph over the patches of *all* windows (:func:`~.graph.knn_affinity`: k nearest
   neighbours by VFM cosine times a geometric affinity of the patch centres), ``(I - alpha Wn)
   X = Y`` solved by conjugate gradient (:func:`~.graph.conjugate_gradient`);
3. each window's propagated patch logits are upsampled into the image and averaged where
   windows overlap (the META_ARCH's ``dense_logits``, unchanged);
4. LPOSS+ only: the pixel logits are propagated again over the image's Lab-colour pixel graph
   (:func:`~.graph.pixel_affinity`, square neighbourhood of side ``RADIUS``, ``n = RADIUS // 2``).

Everything is linear in the logits, so a logit scale commutes with the propagation.
Stages are registered in :data:`PROPAGATION_STAGE_REGISTRY`; :data:`PROPAGATION_KINDS` names
the stages of each ``MODEL.SPARSECLIP.LABEL_PROPAGATION.KIND``.
"""
import dataclasses
import logging
import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from fvcore.common.registry import Registry
from torch import nn

from ...common.activity import active_record, report
from ...common.keys import key_field
from ...proxy.second_backbone import ProxyBackbone, lcm, to_proxy_input
from ...propagation.graph import (conjugate_gradient, knn_affinity, normalized_affinity, patch_centres, pixel_affinity,
                    propagation_operator)

__all__ = ["LabelPropagationSettings", "LabelPropagation", "PROPAGATION_KINDS", "PROPAGATION_STAGE_REGISTRY",
           "check_label_propagation_settings", "propagate_patches", "propagate_pixels"]

logger = logging.getLogger(__name__)

KEY = "MODEL.SPARSECLIP.LABEL_PROPAGATION"

PROPAGATION_STAGE_REGISTRY = Registry("LABEL_PROPAGATION_STAGE")
PROPAGATION_STAGE_REGISTRY.__doc__ = """
Stages of label propagation. ``patch_knn``: ``fn(logits (N, S) patch logits of all windows,
feats (N, C) VFM features, centres (N, 2), settings) -> (N, S)``; ``pixel_lab``: ``fn(logits
(S, H, W), rgb (3, H, W) in [0, 1], settings) -> (S, H, W)``.
"""
#: ``KIND`` -> the stages it runs (``""`` = off).
PROPAGATION_KINDS: Dict[str, Tuple[str, ...]] = {
    "lposs": ("patch_knn",),          # lposs.yaml pixel_refine: false
    "lposs_plus": ("patch_knn", "pixel_lab"),  # lposs_plus.yaml pixel_refine: true
}


#: ``REDUCE_SYNONYMS``: where the synonym logits become class logits (``SparseCLIP.score_maps``).
#: "after_resize": ScoreMaps' rule (at the output size); "before_resize": LPOSS's
#: (lposs_eval.py ``slide_inference``: ``reduce_to_true_classes`` at the working resolution, then ``resize``).
REDUCE_SYNONYMS_CHOICES: Tuple[str, ...] = ("after_resize", "before_resize")


@dataclasses.dataclass(frozen=True)
class LabelPropagationSettings:
    """``MODEL.SPARSECLIP.LABEL_PROPAGATION.*`` (defaults: vladan-stojnic/LPOSS @ e489a74
    ``configs/lposs.yaml`` and ``lposs_eval.py`` ``dfs_search``).

    Fields:
        kind: a key of :data:`PROPAGATION_KINDS`.
        k: neighbours per patch (``k: 400``).
        sigma, pix_dist_pow: geometric affinity ``exp(-sigma * dist ** pix_dist_pow)`` (0.01, 1.0).
        gamma: feature affinity ``max(cos, 0) ** gamma`` (3.0).
        alpha: propagation strength in ``I - alpha Wn`` (0.95), both stages.
        tol, max_iter: conjugate gradient's relative tolerance and step limit (1e-6, 10).
        tau: pixel affinity ``exp(-lab distance / tau)`` (0.01), LPOSS+.
        radius: side of the pixel neighbourhood square; each pixel reaches ``radius // 2`` pixels
            each way (``r: 13``, ``neigh=self.config.r // 2``), LPOSS+.
        reduce_synonyms: a value of :data:`REDUCE_SYNONYMS_CHOICES` (LPOSS's configs: "before_resize").
    """

    kind: str = key_field("lposs", "KIND", '"" (off), "lposs" (the kNN patch graph over all windows), '
                          '"lposs_plus" (then the Lab pixel graph).')
    k: int = key_field(400, "K", "Neighbours per patch by VFM cosine (lposs.yaml k: 400).")
    sigma: float = key_field(0.01, "SIGMA", "Geometric affinity exp(-SIGMA * pixel distance ** PIX_DIST_POW) "
                             "(sigma: 0.01).")
    pix_dist_pow: float = key_field(1.0, "PIX_DIST_POW", "Exponent of the geometric affinity (pix_dist_pow: 1.0).")
    gamma: float = key_field(3.0, "GAMMA", "Feature affinity max(cos, 0) ** GAMMA (gamma: 3.0).")
    alpha: float = key_field(0.95, "ALPHA", "(I - ALPHA Wn) X = Y, both stages (alpha: 0.95), in [0, 1).")
    tol: float = key_field(1e-6, "TOL", "Conjugate gradient's relative tolerance (lposs_eval.py dfs_search "
                           "tol=1e-6).")
    max_iter: int = key_field(10, "MAX_ITER", "Conjugate gradient's steps (lposs_eval.py dfs_search maxiter=10).")
    tau: float = key_field(0.01, "TAU", "LPOSS+ pixel affinity exp(-Lab distance / TAU) (tau: 0.01).")
    radius: int = key_field(13, "RADIUS", "LPOSS+ pixel neighbourhood: a RADIUS x RADIUS square (r: 13).")
    reduce_synonyms: str = key_field("after_resize", "REDUCE_SYNONYMS", "Where the propagated synonym logits become "
                                     "class logits (the max over each class's synonyms): \"after_resize\" "
                                     "(ScoreMaps' rule, as for every method: the synonyms resized to the output size, "
                                     "the softmax over them, the max over each class's) or \"before_resize\" "
                                     "(LPOSS's order: lposs_eval.py slide_inference applies reduce_to_true_classes, "
                                     "the max of the synonym logits, at the working resolution, then resizes to the "
                                     "photo's size; the softmax is then over classes).")

    @property
    def stages(self) -> Tuple[str, ...]:
        return PROPAGATION_KINDS[self.kind]


def _bad(name: str, value, valid: str) -> ValueError:
    return ValueError(f"{KEY}.{name} = {value!r} is invalid; valid: {valid}")


def check_label_propagation_settings(s: LabelPropagationSettings) -> LabelPropagationSettings:
    """Raise ``ValueError`` naming the key, the value and the valid choices for a bad field."""
    if s.kind not in PROPAGATION_KINDS:
        raise _bad("KIND", s.kind, "'' (off), " + ", ".join(PROPAGATION_KINDS))

    def number(name, value, low, high=math.inf, integer=False, low_open=False, high_open=False):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value))
        ok = ok and (not integer or float(value).is_integer())
        ok = ok and (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
        if not ok:
            lo, hi = "(" if low_open else "[", ")" if high_open or math.isinf(high) else "]"
            raise _bad(name, value, f"{'an integer' if integer else 'a number'} in {lo}{low:g}, {high:g}{hi}")

    number("K", s.k, 1, integer=True)
    number("SIGMA", s.sigma, 0)
    number("PIX_DIST_POW", s.pix_dist_pow, 0, low_open=True)
    number("GAMMA", s.gamma, 0, low_open=True)
    # alpha < 1 keeps I - alpha Wn positive definite (the eigenvalues of Wn lie in [-1, 1])
    number("ALPHA", s.alpha, 0, 1, high_open=True)
    number("TOL", s.tol, 0, low_open=True)
    number("MAX_ITER", s.max_iter, 1, integer=True)
    number("TAU", s.tau, 0, low_open=True)
    number("RADIUS", s.radius, 3, integer=True)
    if s.reduce_synonyms not in REDUCE_SYNONYMS_CHOICES:
        raise _bad("REDUCE_SYNONYMS", s.reduce_synonyms, ", ".join(REDUCE_SYNONYMS_CHOICES))
    return s


@PROPAGATION_STAGE_REGISTRY.register()
def patch_knn(logits: np.ndarray, feats: np.ndarray, centres: np.ndarray,
              s: LabelPropagationSettings) -> np.ndarray:
    """LPOSS's joint propagation over the patches of all windows: ``(N, S)`` logits, ``(N, C)``
    VFM features (L2-normalised here), ``(N, 2)`` patch centres -> ``(N, S)`` float64
    (``get_lposs_laplacian`` + ``perform_lp``)."""
    f = feats / np.maximum(np.linalg.norm(feats, axis=1, keepdims=True), 1e-12)
    w = knn_affinity(f.astype(np.float32), centres, k=s.k, sigma=s.sigma, pix_dist_pow=s.pix_dist_pow,
                     gamma=s.gamma)
    op = propagation_operator(normalized_affinity(w), s.alpha)
    return conjugate_gradient(op, logits, tol=s.tol, maxiter=s.max_iter)


@PROPAGATION_STAGE_REGISTRY.register()
def pixel_lab(logits: torch.Tensor, rgb: torch.Tensor, s: LabelPropagationSettings) -> torch.Tensor:
    """LPOSS+'s pixel stage: ``(S, H, W)`` logits, ``(3, H, W)`` RGB in [0, 1] -> ``(S, H, W)``
    float32 (``get_lposs_plus_laplacian`` + ``perform_lp``)."""
    S, H, W = logits.shape
    if tuple(rgb.shape) != (3, H, W):
        raise ValueError(f"pixel_lab: the image is {tuple(rgb.shape)}, the logits {tuple(logits.shape)}")
    w = pixel_affinity(rgb, neighbourhood=s.radius // 2, tau=s.tau)
    op = propagation_operator(normalized_affinity(w), s.alpha)
    del w
    y = logits.detach().double().cpu().reshape(S, H * W).T.numpy()
    x = conjugate_gradient(op, y, tol=s.tol, maxiter=s.max_iter)
    return torch.from_numpy(np.ascontiguousarray(x.T)).reshape(S, H, W).to(logits.device, torch.float32)


def propagate_patches(window_logits: Sequence[torch.Tensor], window_feats: Sequence[torch.Tensor],
                      origins: Sequence[Tuple[float, float]], cells: Sequence[Tuple[float, float]],
                      s: LabelPropagationSettings) -> List[torch.Tensor]:
    """The patch stage over windows: per window ``(S, h, w)`` logits on the VFM grid, ``(C, h, w)``
    features, its origin (pixel ``(y, x)`` of its padded top-left corner) and cell size (pixels
    per grid step) -> per window ``(S, h, w)`` float32 propagated logits."""
    grids = [tuple(l.shape[-2:]) for l in window_logits]
    for l, f in zip(window_logits, window_feats):
        if tuple(f.shape[-2:]) != tuple(l.shape[-2:]):
            raise ValueError(f"propagate_patches: logits on grid {tuple(l.shape[-2:])}, features on {tuple(f.shape[-2:])}")
    y = np.concatenate([l.detach().double().cpu().flatten(1).T.numpy() for l in window_logits])
    f = np.concatenate([t.detach().float().cpu().flatten(1).T.numpy() for t in window_feats])
    x = PROPAGATION_STAGE_REGISTRY.get("patch_knn")(y, f, patch_centres(origins, grids, cells), s)
    out, start = [], 0
    for l, (h, w) in zip(window_logits, grids):
        out.append(torch.from_numpy(np.ascontiguousarray(x[start:start + h * w].T)).reshape(-1, h, w)
                   .to(l.device, torch.float32))
        start += h * w
    return out


def propagate_pixels(logits: torch.Tensor, rgb: torch.Tensor, s: LabelPropagationSettings) -> torch.Tensor:
    """The pixel stage (LPOSS+), see :func:`pixel_lab`."""
    return PROPAGATION_STAGE_REGISTRY.get("pixel_lab")(logits, rgb, s)


class LabelPropagation(nn.Module):
    """LPOSS / LPOSS+ around a method's window logits: holds the frozen VFM and the settings.

    ``forward(logits_fn, dense_fn, windows, pad_origin, rgb, crop_size)``: see :meth:`forward`.
    """

    def __init__(self, settings: LabelPropagationSettings, vfm: ProxyBackbone, clip_mean: Sequence[float],
                 clip_std: Sequence[float]):
        """
        Args:
            settings: validated :class:`LabelPropagationSettings`.
            vfm: the frozen VFM whose features build the patch graph.
            clip_mean, clip_std: the 0-1 RGB mean / std the windows are normalised with (undone
                before the VFM's own normalisation, :func:`~sparseclip_d2.proxy.to_proxy_input`).
        """
        super().__init__()
        self.settings = check_label_propagation_settings(settings)
        self.vfm = vfm
        self.clip_mean, self.clip_std = tuple(clip_mean), tuple(clip_std)

    def extra_repr(self) -> str:
        return f"settings={self.settings}"

    def describe(self) -> str:
        """One line for titles and logs, e.g. ``"then LPOSS+ (k 400, vit_base_patch16_224.dino values)"``."""
        name = {"lposs": "LPOSS", "lposs_plus": "LPOSS+"}.get(self.settings.kind, self.settings.kind)
        return f"then {name} (k {self.settings.k}, {self.vfm.name} {self.vfm.feature})"

    def window_multiple(self, clip_patch: int) -> int:
        """Windows are padded to multiples of this (the CLIP and the VFM patch, unless the VFM
        resizes its input)."""
        if self.vfm.opts.input_size != 0:
            return int(clip_patch)
        vp = self.vfm.patch_size if isinstance(self.vfm.patch_size, int) else max(self.vfm.patch_size)
        return lcm(int(clip_patch), int(vp))

    def vfm_features(self, crops: torch.Tensor, crop_size: Optional[int]) -> torch.Tensor:
        """``(n, 3, h, w)`` CLIP-normalised windows -> ``(n, C, gh, gw)`` float32 VFM features."""
        size = self.vfm.input_size(crops.shape[-2], crops.shape[-1], crop_size)
        return self.vfm(to_proxy_input(crops, self.clip_mean, self.clip_std, self.vfm, size))

    def forward(self, logits_fn: Callable[[torch.Tensor], torch.Tensor],
                dense_fn: Callable[[Callable[[torch.Tensor], torch.Tensor]], torch.Tensor],
                windows: Sequence[Tuple[int, int, int, int]], pad_origin: Tuple[int, int],
                rgb: Optional[torch.Tensor], crop_size: Optional[int]) -> torch.Tensor:
        """Propagated ``(S, H, W)`` pixel logits of one image.

        Args:
            logits_fn: the method's ``(n, 3, h, w)`` windows -> ``(n, S, h/p, w/p)`` patch logits.
            dense_fn: ``fn -> (K, H, W)``: the META_ARCH's window loop (``dense_logits``) over the
                CLIP-normalised image, windows padded to :meth:`window_multiple`; it calls ``fn``
                on batches of windows in the order of ``windows``.
            windows: the ``(y1, y2, x1, x2)`` windows ``dense_fn`` visits, in order.
            pad_origin: ``(top, left)`` padding of each window before encoding.
            rgb: ``(3, H, W)`` RGB in [0, 1] (LPOSS+), else unused.
            crop_size: the sliding-window crop (for VFMs that resize to it), or None.
        """
        s = self.settings
        logits_w: List[torch.Tensor] = []
        feats_w: List[torch.Tensor] = []
        sizes: List[Tuple[int, int]] = []

        def encode(crops: torch.Tensor) -> torch.Tensor:
            logits = logits_fn(crops).float()
            feats = self.vfm_features(crops, crop_size)
            if tuple(logits.shape[-2:]) != tuple(feats.shape[-2:]):  # upstream resizes CLIP's features
                logits = F.interpolate(logits, size=feats.shape[-2:], mode="bilinear", align_corners=False)
            logits_w.extend(logits.unbind(0))
            feats_w.extend(feats.unbind(0))
            sizes.extend([tuple(crops.shape[-2:])] * crops.shape[0])
            return logits.new_zeros((crops.shape[0], 1, 1, 1))

        dense_fn(encode)
        if len(logits_w) != len(windows):
            raise RuntimeError(f"label propagation: {len(logits_w)} windows encoded, {len(windows)} expected")
        top, left = pad_origin
        origins = [(y1 - top, x1 - left) for (y1, _, x1, _) in windows]
        cells = [(hh / l.shape[-2], ww / l.shape[-1]) for l, (hh, ww) in zip(logits_w, sizes)]
        propagated = propagate_patches(logits_w, feats_w, origins, cells, s)
        if active_record() is not None:  # the stage-activity record: patches whose arg-max class changed
            changed = sum(int((a.argmax(0) != b.argmax(0)).sum()) for a, b in zip(logits_w, propagated))
            report("label propagation (patches)", changed > 0, changed_patches=changed)
        out = iter(propagated)

        def replay(crops: torch.Tensor) -> torch.Tensor:
            return torch.stack([next(out) for _ in range(crops.shape[0])])

        full = dense_fn(replay)
        if "pixel_lab" in s.stages:
            if rgb is None:
                raise ValueError(f"{KEY}.KIND {s.kind!r} needs the RGB image for its pixel stage")
            before = full
            full = propagate_pixels(full, rgb, s)
            if active_record() is not None:
                changed = int((before.argmax(0) != full.argmax(0)).sum())
                report("label propagation (pixels)", changed > 0, changed_pixels=changed)
        return full
