"""The parallel-path block mode (GEM, CLIP Surgery): a second path over the last k blocks.

With ``spec.parallel.layers = k`` the tower's main stream ``x`` runs every block unchanged.
A branch ``b`` starts as the main stream's input of block ``depth - k``; at each of the last
k blocks ``i`` it reads that block's normed *main-stream* input ``y_i = norm1(x_i)`` and adds
(``spec.residual``) or takes (no residual) the block's attention branch computed from
``y_i`` with the spec's attention::

    a_i     = attn_out(A_spec(q_i, k_i, v_i) @ v_i)          # q, k, v = the block's own projections of y_i
    b       = b + a_i          (residual)   or   b = a_i      (no residual)
    b       = b + ffn_i(b)     (only with spec.ffn)
    x_{i+1} = block_i(x_i)                                    # the main stream, unchanged

(the main stream's block is recomposed from the same ``q_i, k_i, v_i`` with softmax, as the
encoder's in-sequence blocks are, so the projections are computed once).

The output tokens are ``b`` with its prefix (CLS) tokens replaced by the main stream's when
``spec.parallel.cls == "main"`` (CLIP Surgery), then the tower's final norm. ``A_spec`` is
:func:`~sparseclip_d2.attention.attention_weights` (``qkv_norm='none'``) or
:func:`~sparseclip_d2.attention.cosine_attention_weights` (``qkv_norm='l2'``, GEM) with the
spec's normaliser, so entmax composes with either. Every tower kind of :mod:`.towers` is
supported: the branch uses the adapter's ``norm1`` / ``qkv`` / ``attn_out`` / ``ffn``
(post-norm EVA blocks read ``x`` itself, as their attention does); ``parallel_cls='main'``
needs prefix tokens and is refused on towers without them (SigLIP).
"""
from typing import Dict, Optional, Sequence, Tuple

import torch

from ..attention import apply_attention, attention_weights, cosine_attention_weights, adaptive_inverse_temperature

__all__ = ["check_parallel", "run_parallel", "parallel_attention"]


def check_parallel(spec, tower_kind: str, num_prefix_tokens: int, depth: int) -> None:
    """Refuse a parallel-path spec this tower cannot run, naming why.

    Raises:
        ValueError: ``parallel_layers`` beyond ``depth``, or ``parallel_cls='main'`` on a
            tower without prefix tokens.
    """
    if not spec.parallel.layers:
        return
    if spec.parallel.layers > depth:
        raise ValueError(f"parallel_layers={spec.parallel.layers} is outside [0, {depth}] for a tower of depth {depth}")
    if spec.parallel.cls == "main" and num_prefix_tokens < 1:
        raise ValueError(f"parallel_cls='main' takes the CLS token from the main stream, but this {tower_kind} tower "
                         "has no prefix tokens; use parallel_cls='parallel'")


def parallel_attention(spec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, y: torch.Tensor,
                       prior: Optional[torch.Tensor], generator: Optional[torch.Generator],
                       prefix_tokens: int = 1) -> torch.Tensor:
    """The branch's attention weights ``(B, heads, L, L)`` float32 for one block.

    Args:
        spec: the ``AttentionSpec``.
        q, k, v: ``(B, heads, L, d)`` the block's projections of ``y``.
        y: ``(B, L, C)`` the block's normed main-stream input (GEM's adaptive temperature).
        prior: additive prior ``(L, L)`` or None.
        generator: for ``random_matched``.
        prefix_tokens: the tower's prefix (CLS) tokens, for the ``procrustes`` source's weights.
    """
    if spec.parallel.qkv_norm == "l2":
        s = spec.parallel.cosine_scale if spec.parallel.cosine_scale > 0 else adaptive_inverse_temperature(y, q.shape[-1])
        return cosine_attention_weights(
            q, k, v, source=spec.source, normalizer=spec.normalizer, alpha=spec.alpha, inverse_temperature=s,
            temperature=spec.temperature, iterations=spec.parallel.self_iterations, prior=prior, sum_mode=spec.sum_mode,
            generator=generator)
    return attention_weights(q, k, v, source=spec.source, normalizer=spec.normalizer, alpha=spec.alpha,
                             temperature=spec.temperature, prior=prior, sum_mode=spec.sum_mode, generator=generator,
                             source_options=spec.source_options(prefix_tokens))


def run_parallel(tower, spec, blocks: Sequence, x: torch.Tensor, rope, prior: Optional[torch.Tensor],
                 generator: Optional[torch.Generator], want: Sequence[int] = ()
                 ) -> Tuple[torch.Tensor, torch.Tensor, Dict[int, torch.Tensor]]:
    """Run all blocks with a parallel path over the last ``spec.parallel.layers``.

    Args:
        tower: the tower adapter (``towers.make_tower``).
        spec: the ``AttentionSpec`` (``parallel_layers >= 1``).
        blocks: the tower's blocks.
        x: ``(B, P + h*w, C)`` embedded tokens.
        rope: the tower's rotary embedding or None.
        prior: the branch's additive prior ``(L, L)`` or None.
        generator: for ``random_matched``.
        want: block indices whose main-stream input tokens to record (``depth`` = the output).
    Returns:
        ``(tokens (B, L, C) before the final norm, weights (B, heads, L, L) float32 of the last
        block's branch, taps {index: (B, L, C)})``.
    """
    depth = len(blocks)
    first = depth - spec.parallel.layers
    P = tower.num_prefix_tokens
    want = set(want)
    taps: Dict[int, torch.Tensor] = {}
    branch = None
    weights = None
    for i, blk in enumerate(blocks):
        if i in want:
            taps[i] = x
        if i < first:
            x = tower.run_native(blk, x, rope)
            continue
        if branch is None:
            branch = x
        B, L, _ = x.shape
        y = tower.norm1(blk, x)
        q, k, v = tower.qkv(blk, y, rope)
        weights = parallel_attention(spec, q, k, v, y, prior, generator, tower.num_prefix_tokens)
        out = tower.attn_out(blk, y, apply_attention(weights, v).transpose(1, 2).reshape(B, L, -1))
        branch = branch + out if spec.residual else out
        if spec.ffn:
            branch = branch + tower.ffn(blk, branch)
        # the main stream, unchanged: the block's own softmax(q k^T / sqrt(d)) from the same q, k, v
        # (the projections are not computed twice), as the in-sequence blocks recompose it
        main = attention_weights(q, k, v, source="qk", normalizer="softmax")
        x = x + tower.attn_out(blk, y, apply_attention(main, v).transpose(1, 2).reshape(B, L, -1))
        x = x + tower.ffn(blk, x)
    if spec.parallel.cls == "main" and P:
        branch = torch.cat([x[:, :P], branch[:, P:]], dim=1)
    if depth in want:
        taps[depth] = branch
    return branch, weights, taps
