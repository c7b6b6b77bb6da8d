"""PEARL's text-aware Laplacian propagation (TLP) of logits, as PGSmall/PEARL @ c26062b
``pearl/prop.py`` ``TLP`` computes it (no detectron2 import).

Per image, with ``X0`` the ``(C, H, W)`` unscaled logits (cosines) and ``I`` the normalised image,
both at the output size:

1. both average-pooled by ``(sh, sw) = (max(1, round(H / grid)), max(1, round(W / grid)))``
   (``_auto_scale``, ``avg_pool2d`` without ceil mode) when either is > 1;
2. ``p = softmax_c(X0)``, ``conf = max_c p``; the text affinity ``S`` (``bind_text``): cosine of the
   unit text embeddings, row softmax at temperature ``text_temperature``, plus
   ``diagonal_boost * I``, rows renormalised (``S / (sum + eps)``);
3. **what the code computes** (``_semantic_agree``, ``_edge_weights``): ``einsum('cc,bcij->bcij', S, p)``
   reads only the diagonal of ``S``, so ``Sp_c = S_cc p_c``, not ``sum_d S_cd p_d``: the agreement
   is ``a = clamp(sum_c S_cc p_c^2, 0, 1)`` and the edge gain between neighbours ``i, j`` is
   ``1 + clamp(sum_c p_c(j) S_cc p_c(i), 0, 1)``. This module reproduces that;
4. data weight ``Cw = max(conf, 0.05)^2 (1 + a)``; edge weights ``w = clamp(exp(-edge_constant
   g / mean g) * gain, 0, 1)`` with ``g`` the absolute horizontal / vertical difference of the
   grey image ``0.299 R + 0.587 G + 0.114 B`` of the *normalised* input;
5. ``(diag(Cw) + tau L) X = Cw X0`` (``L`` the weighted 4-neighbour graph Laplacian) solved by
   ``cg_steps`` conjugate-gradient steps from ``X0``;
6. bilinearly upsampled back to ``(H, W)`` (``align_corners=False``) when pooled.

``pearl_ovss.py`` applies it to the unscaled logits at the original size, before the logit scale
(40) and the softmax; :class:`~.stage.TextLaplacianStage` divides the pipeline's scaled logits by
the logit scale, propagates, and scales back.
"""
import dataclasses
from typing import Tuple

import torch
import torch.nn.functional as F

from ...common.keys import check_number, key_field

__all__ = ["KEY", "TLPSettings", "check_tlp_settings", "text_affinity", "edge_weights", "apply_laplacian",
           "conjugate_gradient", "text_laplacian_propagation", "TLP_EPS"]

KEY = "MODEL.SPARSECLIP.TLP"
#: pearl/prop.py ``TLP(grid, eps=1e-6)``: the eps of the text-affinity and gradient normalisations.
TLP_EPS = 1e-6


@dataclasses.dataclass(frozen=True)
class TLPSettings:
    """``MODEL.SPARSECLIP.TLP.*`` (defaults: PGSmall/PEARL @ c26062b ``pearl/prop.py`` ``TLP.__init__`` and
    ``forward``, ``pearl_ovss.py`` ``grid=80``).

    Fields:
        grid: target size of the propagation grid (the pooling factor is ``round(H / grid)``).
        text_temperature: temperature of the text affinity's row softmax (``_tau_S``).
        diagonal_boost: added to the text affinity's diagonal before renormalising (``_diag_boost``).
        edge_constant: image edge weight ``exp(-edge_constant g / mean g)`` (``_ke_img``).
        cg_steps: conjugate-gradient steps (``_cg_iters``).
        tau: weight of the Laplacian (``tau = 1`` in ``forward``).
    """

    grid: int = key_field(80, "GRID", "Target grid of the propagation: logits and image are average-pooled by "
                                      "round(H / GRID) x round(W / GRID) (pearl_ovss.py grid=80; Cityscapes 224)")
    text_temperature: float = key_field(0.5, "TEXT_TEMPERATURE", "Temperature of the text affinity's row softmax "
                                                                 "(pearl/prop.py _tau_S = 0.5)")
    diagonal_boost: float = key_field(10.0, "DIAGONAL_BOOST", "Added to the text affinity's diagonal before the rows "
                                                              "are renormalised (pearl/prop.py _diag_boost = 10.0)")
    edge_constant: float = key_field(5.0, "EDGE_CONSTANT", "Image edge weight exp(-EDGE_CONSTANT g / mean g) "
                                                           "(pearl/prop.py _ke_img = 5.0)")
    cg_steps: int = key_field(25, "CG_STEPS", "Conjugate-gradient steps (pearl/prop.py _cg_iters = 25)")
    tau: float = key_field(1.0, "TAU", "Weight of the Laplacian in (diag(Cw) + TAU L) X = Cw X0 "
                                       "(pearl/prop.py forward: tau = 1)")


def check_tlp_settings(s: TLPSettings, key: str = KEY) -> TLPSettings:
    """``s`` with every field checked (``ValueError`` naming the key, the value and the valid range)."""
    inf = float("inf")
    check_number(f"{key}.GRID", s.grid, 1, inf, integer=True)
    check_number(f"{key}.TEXT_TEMPERATURE", s.text_temperature, 0, inf, low_open=True)
    check_number(f"{key}.DIAGONAL_BOOST", s.diagonal_boost, 0, inf)
    check_number(f"{key}.EDGE_CONSTANT", s.edge_constant, 0, inf)
    check_number(f"{key}.CG_STEPS", s.cg_steps, 0, inf, integer=True)
    check_number(f"{key}.TAU", s.tau, 0, inf)
    return dataclasses.replace(s, grid=int(s.grid), cg_steps=int(s.cg_steps), text_temperature=float(s.text_temperature),
                               diagonal_boost=float(s.diagonal_boost), edge_constant=float(s.edge_constant),
                               tau=float(s.tau))


def text_affinity(text_emb: torch.Tensor, temperature: float, diagonal_boost: float) -> torch.Tensor:
    """``(C, C)`` text affinity of ``(C, D)`` text embeddings (pearl/prop.py ``bind_text``)."""
    t = F.normalize(text_emb, dim=-1)
    S = torch.softmax((t @ t.t()) / max(temperature, TLP_EPS), dim=1)
    if diagonal_boost > 0:
        S = S + diagonal_boost * torch.eye(S.shape[0], device=S.device, dtype=S.dtype)
        S = S / (S.sum(dim=1, keepdim=True) + TLP_EPS)
    return S


def _diagonal_product(S_diag: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """``einsum('cc,bcij->bcij', S, probs)``: the repeated index takes S's diagonal, ``S_cc p_c``."""
    return S_diag.view(1, -1, 1, 1) * probs


def edge_weights(gray: torch.Tensor, probs: torch.Tensor, S_diag: torch.Tensor, edge_constant: float
                 ) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(w_h (B, 1, H, W), w_v (B, 1, H, W))``: column / row 0 is 1, entry ``j`` the weight of the
    edge between pixels ``j - 1`` and ``j`` (pearl/prop.py ``_edge_weights``)."""
    gx = torch.abs(gray[:, :, :, 1:] - gray[:, :, :, :-1])
    gy = torch.abs(gray[:, :, 1:, :] - gray[:, :, :-1, :])
    gx = gx / (gx.mean() + TLP_EPS)
    gy = gy / (gy.mean() + TLP_EPS)
    w_h_img = torch.exp(-edge_constant * gx)
    w_v_img = torch.exp(-edge_constant * gy)
    g_h = (probs[:, :, :, 1:] * _diagonal_product(S_diag, probs[:, :, :, :-1])).sum(dim=1, keepdim=True)
    g_v = (probs[:, :, 1:, :] * _diagonal_product(S_diag, probs[:, :, :-1, :])).sum(dim=1, keepdim=True)
    w_h = (w_h_img * (1.0 + g_h.clamp(0.0, 1.0))).clamp_(0.0, 1.0)
    w_v = (w_v_img * (1.0 + g_v.clamp(0.0, 1.0))).clamp_(0.0, 1.0)
    w_h = torch.cat([torch.ones_like(w_h[:, :, :, :1]), w_h], dim=3)
    w_v = torch.cat([torch.ones_like(w_v[:, :, :1, :]), w_v], dim=2)
    return w_h, w_v


def apply_laplacian(X: torch.Tensor, w_h: torch.Tensor, w_v: torch.Tensor) -> torch.Tensor:
    """``L X`` for the weighted 4-neighbour graph Laplacian (pearl/prop.py ``_apply_laplacian``, same
    accumulation order)."""
    diff_h = X[:, :, :, 1:] - X[:, :, :, :-1]
    wh = w_h[:, :, :, 1:]
    out = torch.zeros_like(X)
    out[:, :, :, 1:] += wh * diff_h
    out[:, :, :, :-1] -= wh * diff_h
    diff_v = X[:, :, 1:, :] - X[:, :, :-1, :]
    wv = w_v[:, :, 1:, :]
    out[:, :, 1:, :] += wv * diff_v
    out[:, :, :-1, :] -= wv * diff_v
    return out


def conjugate_gradient(apply_A, B: torch.Tensor, X0: torch.Tensor, steps: int) -> torch.Tensor:
    """``steps`` conjugate-gradient steps on ``A X = B`` from ``X0``, per batch item over (C, H, W)
    (pearl/prop.py ``_cg_solve``: the 1e-12 guards of both divisions, no early stop)."""
    X = X0.clone()
    R = B - apply_A(X)
    P = R.clone()
    rsold = (R * R).sum(dim=(1, 2, 3), keepdim=True)
    for _ in range(int(steps)):
        AP = apply_A(P)
        alpha = rsold / ((P * AP).sum(dim=(1, 2, 3), keepdim=True) + 1e-12)
        X = X + alpha * P
        R = R - alpha * AP
        rsnew = (R * R).sum(dim=(1, 2, 3), keepdim=True)
        P = R + (rsnew / (rsold + 1e-12)) * P
        rsold = rsnew
    return X


def text_laplacian_propagation(image: torch.Tensor, logits: torch.Tensor, S: torch.Tensor,
                               s: TLPSettings) -> torch.Tensor:
    """Propagated ``(B, C, H, W)`` logits (module docstring) of ``(B, C, H, W)`` unscaled logits, the
    ``(B, 3, H, W)`` normalised RGB image and the ``(C, C)`` text affinity; float32 (float64 for
    float64 inputs), returned in ``logits``' dtype."""
    B, C, H, W = logits.shape
    if image.shape[0] != B or image.shape[-2:] != logits.shape[-2:]:
        raise ValueError(f"image {tuple(image.shape)} and logits {tuple(logits.shape)} must share batch and size")
    if tuple(S.shape) != (C, C):
        raise ValueError(f"the text affinity is {tuple(S.shape)}, the logits have {C} rows")
    work = torch.float64 if logits.dtype == torch.float64 else torch.float32
    sh, sw = max(1, round(H / float(s.grid))), max(1, round(W / float(s.grid)))
    img, x0 = image.to(work), logits.to(work)
    if sh > 1 or sw > 1:
        img = F.avg_pool2d(img, kernel_size=(sh, sw), stride=(sh, sw), ceil_mode=False, count_include_pad=False)
        x0 = F.avg_pool2d(x0, kernel_size=(sh, sw), stride=(sh, sw), ceil_mode=False, count_include_pad=False)
    S_diag = S.to(device=x0.device, dtype=work).diagonal()
    probs = torch.softmax(x0, dim=1)
    conf = probs.max(dim=1, keepdim=True)[0]
    agree = (probs * _diagonal_product(S_diag, probs)).sum(dim=1, keepdim=True).clamp(0.0, 1.0)
    Cw = (conf.clamp_min(0.05) ** 2) * (1.0 + agree)
    gray = 0.299 * img[:, 0:1] + 0.587 * img[:, 1:2] + 0.114 * img[:, 2:3]
    w_h, w_v = edge_weights(gray, probs, S_diag, s.edge_constant)

    def apply_A(X):
        return Cw * X + s.tau * apply_laplacian(X, w_h, w_v)

    out = conjugate_gradient(apply_A, Cw * x0, x0, s.cg_steps)
    if sh > 1 or sw > 1:
        out = F.interpolate(out, size=(H, W), mode="bilinear", align_corners=False)
    return out.to(logits.dtype)
