"""CLIPtrase's patch self-correlation map (pure torch): the map its cluster vote clusters.

From one block's per-head projections ``q, k, v`` the map is the head mean of
``(cos(q_i, q_j) + cos(k_i, k_j) + cos(v_i, v_j)) / 3``; the CLS token's row is then
subtracted from every patch row and negatives are set to 0 ("global patch" removal):

    M = mean_h (C_qq + C_kk + C_vv) / 3           (B, L, L)
    R = max(M[:, P:, P:] - M[:, :1, P:], 0)       (B, N, N), N = L - P patches

leaves162/CLIPtrase @ 2b7de61 ``clip_utils/attn2.py`` ``multi_head_attention_forward`` with
``self_out_weight=True`` (``torch.cosine_similarity`` per head, ``(qq_cos+kk_cos+vv_cos)/3.0``,
``.sum(dim=1) / num_heads``), taken at layer 11 of 12 (``clip_utils/model.py``
``VisionTransformer.forward``, ``idx==11``; ``clip_self_correlation.py`` ``attn_weights[-2]``,
``attn_weights - cls_weights``, ``attn_weights[attn_weights<0] = 0``).
"""
import torch

__all__ = ["self_correlation_map", "cls_denoised_correlation", "COSINE_EPS"]

#: ``torch.cosine_similarity``'s default ``eps``: a token norm below it is clamped to it.
COSINE_EPS = 1e-8


def _cosine(a: torch.Tensor) -> torch.Tensor:
    """``(B, H, L, d)`` -> ``(B, H, L, L)`` cosine similarities of the rows (float32)."""
    n = a.norm(dim=-1, keepdim=True).clamp_min(COSINE_EPS)
    a = a / n
    return torch.matmul(a, a.transpose(-1, -2))


def self_correlation_map(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Head mean of the mean of the Q-Q, K-K and V-V cosine maps.

    Args:
        q, k, v: ``(B, H, L, d)`` per-head projections of one block (any float dtype).
    Returns:
        ``(B, L, L)`` float32, symmetric, diagonal 1 (for non-zero tokens).
    """
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"q, k, v must share a (B, H, L, d) shape, got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    m = (_cosine(q.float()) + _cosine(k.float()) + _cosine(v.float())) / 3.0
    return m.mean(dim=1)


def cls_denoised_correlation(corr: torch.Tensor, num_prefix_tokens: int = 1) -> torch.Tensor:
    """CLIPtrase's "global patch" removal: each patch row minus the CLS row, negatives -> 0.

    Args:
        corr: ``(B, L, L)`` a :func:`self_correlation_map` (CLS token first).
        num_prefix_tokens: ``P`` prefix tokens (CLS first; >= 1).
    Returns:
        ``(B, N, N)`` float32 over the ``N = L - P`` patch tokens.
    """
    if corr.dim() != 3 or corr.shape[1] != corr.shape[2]:
        raise ValueError(f"corr must be (B, L, L), got {tuple(corr.shape)}")
    P = int(num_prefix_tokens)
    if P < 1:
        raise ValueError(f"the CLS-row removal needs a CLS token, but num_prefix_tokens={num_prefix_tokens!r}; "
                         "the self-correlation cluster vote runs on towers with a CLS token")
    if corr.shape[1] <= P:
        raise ValueError(f"corr has {corr.shape[1]} tokens, no patch after the {P} prefix tokens")
    corr = corr.float()
    return (corr[:, P:, P:] - corr[:, :1, P:]).clamp_min(0.0)
