"""The calibrated last block (SC-CLIP, SFP): outlier repair, an intermediate layer's
patch self-similarity as an attention term and an aggregator, and multi-level fusion.

Active when an ``AttentionSpec`` sets any of ``outlier_detector``, ``similarity_layer``,
``post_similarity_layer`` or ``fusion_layers`` (:func:`is_calibrated`). The blocks before the
last run unchanged, once; then, with ``x`` the last block's input, ``P`` prefix tokens and the
``N`` patches ``p = x[:, P:]`` (tap indices name a block's *input*, so tap ``i`` is the output
of layer ``i`` counted from 1)::

    m    = detector(p)                                 outlier_detector (per image; none = no repair)
    p    = repair(p, m)                                attention.outliers.repair_outliers
    S    = cos(repair(tap[similarity_layer][:, P:], m))                  (B, N, N)
    p    = aggregate(p, S >= similarity_threshold)     attention.similarity.similarity_aggregate
    A(z) = combine(N(similarity_scores(S, similarity_scale)), attention_weights(z's q, k, v))
    y    = block(p; A) + cls_weight * x[:, :1]         the last block on the patches only
    y    = aggregate(y, S_post >= similarity_threshold),  S_post = cos(tap[post_similarity_layer][:, P:])
    f    = sum_l tap[l] over fusion_layers (prefix included)
    y    = y + aggregate(block(f[:, P:]; A') + cls_weight * f[:, :1], S_post ...)

``block(z; A)`` is the last block's attention branch on ``z`` (its ``ln_1``, q / k / v and
output projection) with weights ``A``, plus ``z`` with ``residual`` and the FFN with ``ffn``.
With ``threshold_similarity_term`` the term (and SFP's fusion attention) reads ``S`` with its
entries below ``similarity_threshold`` set to 0 (SFP thresholds ``pre_sim`` in place before
``custom_attn``; SC-CLIP keeps an unthresholded copy, ``mid_simi``).
``A' = A`` (``fusion_attention = "last"``, SC-CLIP) or the normalised similarity term alone
(``"similarity"``, SFP's ``sinkhorn_attn``, which despite its name applies one softmax).
The ``som`` detector reads the softmax attention of the block before the last, computed from
that block's own input (its q, k) while the block runs unchanged. ``combine`` joins the
similarity term to the source's terms by ``sum_mode``:
``normalize_then_mean`` (SC-CLIP: ``(N(S) + N(KK)) / 2``; SFP: ``(N(S) + N(QQ) + N(KK)) / 3``)
or ``normalize_then_sum``; ``N`` is the spec's normaliser, so ``NORMALIZER entmax`` reaches
every softmax of the method. The spec's temperature and prior act on the source terms (the
prior built for the patch grid without prefix tokens). Without ``similarity_layer`` the
weights are the source's alone.

The output keeps the token layout ``(B, P + N, C)``: the prefix tokens are the last block's
input prefix tokens (the patches never attend to them), so ``dense`` reads the patches as
for every spec; the returned weights are ``(B, heads, P + N, P + N)`` with the patch block
``A`` and identity rows for the prefix tokens. Supported towers: open_clip ViTs and timm ViTs
(rotary-embedding EVA towers are refused). Upstream (SuleBai/SC-CLIP @ 0417ba9 ``clip/model.py``
``VisionTransformer.forward``) runs one window at a time; here every step is per image.
"""
from typing import Dict, Optional, Sequence, Tuple

import torch

from ..common.activity import report
from ..attention import apply_attention, attention_weights, build_prior, get_normalizer
from ..attention.outliers import detect_outliers, needs_attention, repair_outliers
from ..attention.similarity import cosine_similarity_map, similarity_aggregate, similarity_scores

__all__ = ["is_calibrated", "check_calibrated", "calibrated_layers", "run_calibrated", "calibrated_attention"]


def is_calibrated(spec) -> bool:
    """Whether ``spec`` runs the calibrated last block (any of its parts is set)."""
    return spec.calibration.active


def calibrated_layers(spec) -> Tuple[int, ...]:
    """The tap indices the calibrated block reads (similarity, post-similarity, fusion)."""
    out = set(spec.calibration.fusion_layers)
    for i in (spec.calibration.similarity_layer, spec.calibration.post_similarity_layer):
        if i >= 0:
            out.add(i)
    return tuple(sorted(out))


def check_calibrated(spec, tower_kind: str, depth: int) -> None:
    """Refuse a calibrated spec this tower cannot run, naming why.

    Raises:
        ValueError: a tap index outside ``[0, depth - 1]``, or a rotary-embedding tower.
    """
    if not is_calibrated(spec):
        return
    bad = [i for i in calibrated_layers(spec) if i > depth - 1]
    if bad:
        raise ValueError(f"similarity_layer / post_similarity_layer / fusion_layers {bad} are not block inputs of a "
                         f"tower of depth {depth}; valid: 0-based tap indices 0..{depth - 1} (tap i = the input of "
                         "block i = the output of layer i counted from 1)")
    if tower_kind == "timm_eva":
        raise ValueError("the calibrated last block (outlier repair / similarity layers / fusion, SC-CLIP) runs the "
                         "last block on the patch tokens alone, which rotary-embedding (timm Eva) towers do not "
                         "support; use an open_clip or timm ViT tower")


def calibrated_attention(spec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sim: Optional[torch.Tensor],
                         prior: Optional[torch.Tensor], generator: Optional[torch.Generator]) -> torch.Tensor:
    """The calibrated block's weights ``(B, heads, N, N)`` float32.

    Args:
        spec: the ``AttentionSpec``.
        q, k, v: ``(B, heads, N, d)`` projections of the patch tokens.
        sim: ``(B, N, N)`` similarity map of ``similarity_layer`` or None.
        prior: additive prior ``(N, N)`` of the source terms or None.
        generator: for ``random_matched``.
    """
    sum_mode = "normalize_then_sum" if spec.sum_mode == "normalize_then_mean" and sim is not None else spec.sum_mode
    w = attention_weights(q, k, v, source=spec.source, normalizer=spec.normalizer, alpha=spec.alpha,
                          temperature=spec.temperature, prior=prior, sum_mode=sum_mode, generator=generator,
                          source_options=spec.source_options(0))  # patch tokens only: no prefix
    if sim is None:
        return w
    norm = get_normalizer(spec.normalizer)
    scores = similarity_scores(sim, spec.calibration.similarity_scale)
    w_sim = norm(scores, alpha=spec.alpha, generator=generator).float()
    out = w_sim + w  # (B, 1, N, N) + (B, heads, N, N)
    if spec.sum_mode == "normalize_then_mean":
        out = out / (1 + len(spec.terms))
    return out


def _block(tower, blk, z: torch.Tensor, spec, sim, prior, generator, similarity_only: bool = False
           ) -> Tuple[torch.Tensor, torch.Tensor]:
    """The last block on patch tokens ``z`` (B, N, C) with the calibrated weights (with
    ``similarity_only``, the normalised similarity term alone: SFP's fusion branch)."""
    B, N, _ = z.shape
    y = tower.norm1(blk, z)
    q, k, v = tower.qkv(blk, y, None)
    if similarity_only:
        norm = get_normalizer(spec.normalizer)
        scores = similarity_scores(sim, spec.calibration.similarity_scale)
        weights = norm(scores, alpha=spec.alpha, generator=generator).float()
        weights = weights.expand(B, q.shape[1], N, N)
    else:
        weights = calibrated_attention(spec, q, k, v, sim, prior, generator)
    out = tower.attn_out(blk, y, apply_attention(weights, v).transpose(1, 2).reshape(B, N, -1))
    z = z + out if spec.residual else out
    if spec.ffn:
        z = z + tower.ffn(blk, z)
    return z, weights


def run_calibrated(tower, spec, blocks: Sequence, x: torch.Tensor, rope, grid: Tuple[int, int],
                   generator: Optional[torch.Generator], want: Sequence[int] = ()
                   ) -> Tuple[torch.Tensor, torch.Tensor, Dict[int, torch.Tensor]]:
    """Run all blocks with the calibrated last block.

    Args:
        tower: the tower adapter (``towers.make_tower``).
        spec: a calibrated ``AttentionSpec`` (:func:`is_calibrated`).
        blocks: the tower's blocks.
        x: ``(B, P + h*w, C)`` embedded tokens.
        rope: the tower's rotary embedding (None: rotary towers are refused).
        grid: ``(h, w)``.
        generator: for ``random_matched``.
        want: block indices whose input tokens to record (``depth`` = the output).
    Returns:
        ``(tokens (B, P + N, C) before the final norm, weights (B, heads, P + N, P + N)
        float32, taps {index: (B, P + N, C)})``.
    """
    depth = len(blocks)
    P = tower.num_prefix_tokens
    cal = spec.calibration
    need = set(calibrated_layers(spec)) | set(want)
    taps: Dict[int, torch.Tensor] = {}
    producing = None  # the softmax attention of the block before the last (SFP's SOM detector reads it)
    for i, blk in enumerate(blocks[:-1]):
        if i in need:
            taps[i] = x
        if i == depth - 2 and needs_attention(cal.outlier_detector):
            q, k, v = tower.qkv(blk, tower.norm1(blk, x), rope)
            producing = attention_weights(q, k, v, source="qk", normalizer="softmax")
        x = tower.run_native(blk, x, rope)
    if depth - 1 in need:
        taps[depth - 1] = x
    blk = blocks[-1]
    B = x.shape[0]
    patches = x[:, P:]
    mask = None
    if cal.outlier_detector != "none":
        mask = detect_outliers(cal.outlier_detector, patches, neighbors=cal.outlier_neighbors,
                               contamination=cal.outlier_contamination, count=cal.outlier_count,
                               cls_scale=cal.outlier_cls_scale, attention=producing, num_prefix_tokens=P)
        patches = repair_outliers(patches, mask, grid)
        for window in mask:  # the stage-activity record: outlier tokens repaired in each window
            n = int(window.sum())
            report("outliers repaired", n > 0, outliers=n)
    sim = None
    if cal.similarity_layer >= 0:
        ref = taps[cal.similarity_layer][:, P:]
        if mask is not None:
            ref = repair_outliers(ref, mask, grid)
        sim = cosine_similarity_map(ref)
        patches = similarity_aggregate(patches, sim, cal.similarity_threshold).to(x.dtype)
        if cal.threshold_similarity_term:  # SFP: the attention term reads the thresholded map
            sim = sim.masked_fill(sim < cal.similarity_threshold, 0.0)
    post = None
    if cal.post_similarity_layer >= 0:
        post = cosine_similarity_map(taps[cal.post_similarity_layer][:, P:])
    prior = build_prior(spec.prior, grid, std=spec.prior_std, num_prefix_tokens=0, device=x.device)
    cls = x[:, :1]
    out, weights = _block(tower, blk, patches, spec, sim, prior, generator)
    if spec.cls_weight:
        out = out + spec.cls_weight * cls
    if post is not None:
        out = similarity_aggregate(out, post, cal.similarity_threshold).to(x.dtype)
    if cal.fusion_layers:
        fused = None
        for i in cal.fusion_layers:
            fused = taps[i] if fused is None else fused + taps[i]
        extra, _ = _block(tower, blk, fused[:, P:], spec, sim, prior, generator,
                          similarity_only=cal.fusion_attention == "similarity")
        if spec.cls_weight:
            extra = extra + spec.cls_weight * fused[:, :1]
        if post is not None:
            extra = similarity_aggregate(extra, post, cal.similarity_threshold).to(x.dtype)
        out = out + extra
    tokens = torch.cat([x[:, :P], out], dim=1)
    if P:
        L = P + out.shape[1]
        full = torch.zeros(B, weights.shape[1], L, L, dtype=weights.dtype, device=weights.device)
        full[:, :, P:, P:] = weights
        idx = torch.arange(P, device=weights.device)
        full[:, :, idx, idx] = 1.0
        weights = full
    if depth in want:
        taps[depth] = tokens
    taps = {i: t for i, t in taps.items() if i in set(want)}
    return tokens, weights, taps
