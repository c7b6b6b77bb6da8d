"""FSA (feedback self-adaptive attention, ICCV 2025) on the ProxyCLIP last block.

chi-chi-zx/FSA @ dbd2da5 ``open_clip/transformer.py`` (``custom_attn``, ``FSA``,
``SparseAtten``, ``kl_divergence``, ``attend_v_ens``, ``compute_logits``): after ProxyCLIP's
proxy attention ``A_vfm`` (:class:`~.proxyclip.ProxyCLIPEncoder`),

1. the branch output ``o = out_proj(A_vfm V)`` and the output of a uniform attention
   ``u = out_proj(mean_j V_j)`` are classified (final norm, projection, L2 norm, cosine with
   the class texts) at scales 20 and 35 (``compute_logits(..., logits_scale=20 | 35)``);
2. per patch, ``P_i = softmax_c(20 cos(o_i, t_c) - 35 cos(u, t_c))``;
   ``sim_ij = 1 / (1 + max(0, KL(P_i || P_j)))`` (:func:`kl_similarity`);
3. each row of ``sim`` is pruned to its top-p nucleus (:func:`~sparseclip_d2.attention.nucleus_prune`,
   ``p`` 0.45), the kept entries scored ``sim * exp(lambda * sim)`` (lambda 3), the rest
   ``-inf`` (:func:`fsa_scores`), and normalised (softmax upstream; any registered normaliser
   here, e.g. entmax) into ``A_new``;
4. the weights actually applied to ``V`` are ``(A_new A_vfm + A_vfm A_new + A_new) / 3``
   (:func:`fsa_ensemble`), then ``out_proj``; no residual, no FFN upstream.

The KL matrix is computed term by term as upstream does, in blocks of rows (a few ``(rows, N,
classes)`` float32 temporaries of about 32 MiB) instead of upstream's whole ``(N, N, classes)``
broadcast (2 GiB for DINO B/8 on a 336 px window with COCO-Stuff's 171 classes in float32).
"""
import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ...attention import get_normalizer
from ...attention.nucleus import TOP_P_DEFAULT, check_top_p, nucleus_mask
from ...common.keys import key_field
from ...common.needs import Needs
from ..proxyclip.encoder import ProxyCLIPEncoder

__all__ = ["FSASettings", "check_fsa_settings", "kl_similarity", "fsa_scores", "fsa_ensemble", "FSAEncoder"]

# chi-chi-zx/FSA @ dbd2da5 open_clip/transformer.py kl_divergence: torch.log(patch_probs + 1e-10)
_LOG_EPS = 1e-10
# bytes of one (rows, N, classes) float32 block of the KL computation (upstream: one (N, N, classes) tensor)
_KL_BLOCK_BYTES = 32 << 20


@dataclass(frozen=True)
class FSASettings:
    """FSA's values (``MODEL.SPARSECLIP.PROXY.FSA.*``), defaults from chi-chi-zx/FSA @ dbd2da5.

    Fields: top_p (``SparseAtten(sim, p=0.45)``), lamda (``FSA_Proxy_segmentor.py``
    ``lamda=3.0``; ``hyper_param.txt``: 3.0 for SAM / DINO / DINOv2 with ViT-B/16, 4.5 for MAE),
    patch_scale and uniform_scale (``custom_attn``: ``compute_logits(..., logits_scale=20)`` and
    ``logits_scale=35``), normalizer (of the FSA scores; ``""`` = the spec's normaliser;
    upstream ``F.softmax``).
    """

    top_p: float = key_field(TOP_P_DEFAULT, "TOP_P", "Top-p nucleus of each row of the KL similarity "
                             "(SparseAtten(sim, p=0.45)), in (0, 1].")
    lamda: float = key_field(3.0, "LAMBDA", "Scores sim * exp(LAMBDA * sim) (FSA_Proxy_segmentor.py lamda=3.0; "
                             "hyper_param.txt: MAE 4.5).")
    patch_scale: float = key_field(20.0, "PATCH_SCALE", "Cosine-logit scale of the proxy-attention output "
                                   "(custom_attn: compute_logits(..., logits_scale=20)).")
    uniform_scale: float = key_field(35.0, "UNIFORM_SCALE", "Cosine-logit scale of the uniform-attention output "
                                     "(custom_attn: logits_scale=35).")
    normalizer: str = key_field("", "NORMALIZER", 'Normaliser of the FSA scores: "" = ATTENTION.NORMALIZER '
                                "(upstream: softmax), or any registered one (entmax uses ATTENTION.ALPHA).")


def check_fsa_settings(s: FSASettings, key: str = "MODEL.SPARSECLIP.PROXY.FSA") -> FSASettings:
    """Validate ``s``; ``ValueError`` naming ``key.<FIELD>``, the value and the valid choices."""
    check_top_p(s.top_p, f"{key}.TOP_P")
    for name, value, positive in (("LAMBDA", s.lamda, False), ("PATCH_SCALE", s.patch_scale, True),
                                  ("UNIFORM_SCALE", s.uniform_scale, True)):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value))
        if not ok or (positive and not float(value) > 0):
            raise ValueError(f"{key}.{name} = {value!r} is invalid; valid: a finite number"
                             + (" > 0" if positive else ""))
    if not isinstance(s.normalizer, str):
        raise ValueError(f"{key}.NORMALIZER = {s.normalizer!r} is invalid; valid: '' (= ATTENTION.NORMALIZER) or "
                         "a registered normaliser")
    if s.normalizer:
        try:
            get_normalizer(s.normalizer)
        except ValueError as e:
            raise ValueError(f"{key}.NORMALIZER: {e} (or '' = ATTENTION.NORMALIZER)") from None
    return s


def kl_similarity(patch_logits: torch.Tensor, uniform_logits: torch.Tensor) -> torch.Tensor:
    """FSA's patch-pair similarity from class logits.

    Args:
        patch_logits: ``(B, N, S)`` scaled cosine logits of each patch.
        uniform_logits: ``(B, N, S)`` (or ``(B, 1, S)``) logits of the uniform-attention output.
    Returns:
        ``(B, N, N)`` float32 ``1 / (1 + max(0, KL(P_i || P_j)))`` with
        ``P = softmax(patch_logits - uniform_logits)`` over the classes and
        ``KL(P_i || P_j) = sum_c P_ic (log(P_ic + 1e-10) - log(P_jc + 1e-10))``.
    """
    prob = torch.softmax((patch_logits - uniform_logits).float(), dim=-1)
    logp = torch.log(prob + _LOG_EPS)
    B, N, S = prob.shape
    # sum_c P_ic (log P_ic - log P_jc) term by term, as upstream (no cancellation between two
    # entropies), in blocks of rows so that the (rows, N, S) temporaries stay near _KL_BLOCK_BYTES
    rows = max(1, _KL_BLOCK_BYTES // max(1, N * S * 4))
    kl = prob.new_empty(B, N, N)
    for r in range(0, N, rows):
        kl[:, r:r + rows] = (prob[:, r:r + rows, None] * (logp[:, r:r + rows, None] - logp[:, None])).sum(-1)
    return 1.0 / (kl.clamp(min=0.0) + 1.0)


def fsa_scores(sim: torch.Tensor, top_p: float = TOP_P_DEFAULT, lamda: float = 3.0) -> torch.Tensor:
    """FSA's scores of the new attention: ``sim * exp(lamda * sim)`` on each row's top-p
    nucleus of ``sim`` (:func:`~sparseclip_d2.attention.nucleus_mask`), ``-inf`` elsewhere.
    ``(..., N)`` -> ``(..., N)`` float32."""
    sim = sim.float()
    keep = nucleus_mask(sim, top_p)
    return (sim * torch.exp(lamda * sim)).masked_fill(~keep, float("-inf"))


def fsa_ensemble(new: torch.Tensor, vfm: torch.Tensor) -> torch.Tensor:
    """FSA's ensemble of the new and the proxy attention: ``(new @ vfm + vfm @ new + new) / 3``.
    ``(B, N, N)`` each -> ``(B, N, N)`` float32 (rows sum to 1 when theirs do)."""
    new, vfm = new.float(), vfm.float()
    return (torch.matmul(new, vfm) + torch.matmul(vfm, new) + new) / 3.0


class FSAEncoder(ProxyCLIPEncoder):
    """The ProxyCLIP last block with FSA's feedback attention (see the module docstring).

    Args: those of :class:`~.proxyclip.ProxyCLIPEncoder`, and ``fsa`` (:class:`FSASettings`).
    The class texts are an input of the block: ``forward(images, text_emb=(S, D))`` (the
    META_ARCH passes its classifier's unit synonym embeddings, as upstream passes its
    ``query_features``). The spec's ``normalizer`` / ``alpha`` / ``temperature`` act on the
    proxy scores as for ProxyCLIP; ``fsa.normalizer`` (``""`` = the spec's) with the spec's
    ``alpha`` on the FSA scores. Attention returned: the ensemble, shared by every head.
    """

    #: the pipeline passes ``text_emb`` to this encoder (common/needs.py)
    needs = Needs(text=True)

    def __init__(self, visual: nn.Module, spec, proxy, *, fsa: Optional[FSASettings] = None, **kw):
        super().__init__(visual, spec, proxy, **kw)
        self.fsa = check_fsa_settings(fsa if fsa is not None else FSASettings())

    def extra_repr(self) -> str:
        f = self.fsa
        return super().extra_repr() + (f", fsa(top_p={f.top_p:g}, lambda={f.lamda:g}, scales={f.patch_scale:g}/"
                                       f"{f.uniform_scale:g}, normalizer={f.normalizer or self.spec.normalizer})")

    def _init_kwargs(self):
        return dict(super()._init_kwargs(), fsa=self.fsa)

    def describe(self) -> str:
        f = self.fsa
        norm = f.normalizer or self.spec.normalizer
        if norm in ("entmax", "random_matched"):
            norm = f"{norm} \u03b1={self.spec.alpha:g}"
        return (super().describe() + f"; FSA: top-p {f.top_p:g} of 1 / (1 + KL) (scales {f.patch_scale:g} / "
                f"{f.uniform_scale:g}), sim exp({f.lamda:g} sim), {norm}, ensembled with the proxy attention")

    def _classify(self, branch: torch.Tensor, text_emb: torch.Tensor, scale: float) -> torch.Tensor:
        """``scale * cos(final_norm(branch) projected, text)``: ``(B, n, C)`` -> ``(B, n, S)`` float32
        (upstream ``compute_logits(..., soft_max=False)``)."""
        emb = F.normalize(self._dense_patches(self._tower.final_norm(branch)).float(), dim=-1)
        return scale * torch.matmul(emb, text_emb.t())

    def forward_pass(self, images: torch.Tensor, tap_layers=(), text_emb: Optional[torch.Tensor] = None):
        """:meth:`ProxyCLIPEncoder.forward_pass` with the class texts ``text_emb`` ``(S, D)`` (required)."""
        if text_emb is None:
            raise ValueError("FSA (MODEL.SPARSECLIP.PROXY.FSA.ENABLED) classifies patches inside the last block: "
                             "call the encoder with text_emb=(S, D) class embeddings (the SparseCLIP META_ARCH "
                             "does)")
        if text_emb.dim() != 2:
            raise ValueError(f"text_emb must be (S, D) class embeddings, got shape {tuple(text_emb.shape)}")
        return super().forward_pass(images, tap_layers, text_emb=text_emb)

    def attend(self, blk: nn.Module, y: torch.Tensor, v: torch.Tensor, weights: torch.Tensor,
               text_emb: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """FSA's branch: ``((B, N', C), (B, heads, N', N') ensemble weights)``; see
        :meth:`ProxyCLIPEncoder.attend` and the module docstring. ``text_emb``: ``(S, D)``."""
        text = F.normalize(text_emb.to(device=v.device, dtype=torch.float32), dim=-1)
        B, heads, n = v.shape[0], v.shape[1], v.shape[2]
        vv = v.float().transpose(1, 2).reshape(B, n, -1)  # (B, N', heads*d): the heads side by side
        tower = self._tower
        first = tower.attn_out(blk, y, torch.matmul(weights, vv).to(v.dtype))
        # the uniform attention (softmax of ones) gives every patch the mean of the values
        uniform = tower.attn_out(blk, y, vv.mean(dim=1, keepdim=True).expand(B, n, -1).to(v.dtype))
        sim = kl_similarity(self._classify(first, text, self.fsa.patch_scale),
                            self._classify(uniform, text, self.fsa.uniform_scale))
        scores = fsa_scores(sim, self.fsa.top_p, self.fsa.lamda)
        spec = self.spec
        name = self.fsa.normalizer or spec.normalizer
        generator = None
        if name == "random_matched":
            generator = torch.Generator(device=scores.device).manual_seed(spec.seed)
        new = get_normalizer(name)(scores, alpha=spec.alpha, generator=generator).float()
        ens = fsa_ensemble(new, weights)
        out = torch.matmul(ens, vv).to(v.dtype)
        return tower.attn_out(blk, y, out), ens.unsqueeze(1).expand(B, heads, n, n)
