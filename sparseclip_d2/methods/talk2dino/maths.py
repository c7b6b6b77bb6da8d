"""Talk2DINO's maths (lorebianchi98/Talk2DINO @ 4918c2d): the learned text projection, the
sigmoid masks of DINOv2 patch tokens against projected text, and the background cleaning with the
last block's attention heads. Talk2DINO is NOT training-free: the projection is learned (its
weights are a file of the upstream release, ``weights/vitb_mlp_infonce.pth``).
"""
import logging
import os
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["TextProjection", "load_projection", "random_projection", "PROJECTION_KEYS", "cls_attention_maps",
           "sigmoid_masks", "clean_background"]

logger = logging.getLogger(__name__)

#: The state-dict keys of upstream's ``src/model.py`` ``ProjectionLayer`` with ``hidden_layer: True``
#: (``configs/vitb_mlp_infonce.yaml``: act tanh, hidden_layer True, dino_embed_dim 768; clip_embed_dim
#: defaults to 512), as ``weights/vitb_mlp_infonce.pth`` holds them.
PROJECTION_KEYS = ("linear_layer.weight", "linear_layer.bias", "hidden_layers.0.weight", "hidden_layers.0.bias")
# ProjectionLayer.load_state_dict renames an older checkpoint's linear_layer2.* to hidden_layers.0.*
_LEGACY = {"linear_layer2.weight": "hidden_layers.0.weight", "linear_layer2.bias": "hidden_layers.0.bias"}


class TextProjection(nn.Module):
    """CLIP text embedding -> DINOv2 space: ``Linear(clip_dim, dino_dim)``, tanh, ``Linear(dino_dim,
    dino_dim)`` (upstream ``ProjectionLayer.project_clip_txt`` with one hidden layer), in float32."""

    def __init__(self, clip_dim: int = 512, dino_dim: int = 768):
        super().__init__()
        self.linear_layer = nn.Linear(clip_dim, dino_dim)
        self.hidden_layers = nn.ModuleList([nn.Linear(dino_dim, dino_dim)])
        self.requires_grad_(False)

    @property
    def clip_dim(self) -> int:
        return int(self.linear_layer.in_features)

    @property
    def dino_dim(self) -> int:
        return int(self.linear_layer.out_features)

    def forward(self, text: torch.Tensor) -> torch.Tensor:
        x = self.linear_layer(text.float())
        for layer in self.hidden_layers:
            x = layer(torch.tanh(x))
        return x


def load_projection(path: str, key: str = "PROJECTION") -> TextProjection:
    """The projection in ``path``, a state dict in upstream's layout (:data:`PROJECTION_KEYS`).

    Raises:
        FileNotFoundError: no such file (named with ``key``).
        ValueError: not a state dict with exactly those keys and consistent shapes (the message
            names the file, what it holds and the expected keys).
    """
    path = os.path.expanduser(str(path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{key} = {path!r}: no such file; give upstream's weights/vitb_mlp_infonce.pth "
                                "(lorebianchi98/Talk2DINO) or 'random' for a random projection (a smoke run)")
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # not a torch file at all
        raise ValueError(f"{key} = {path!r} is not a torch state dict ({type(e).__name__}: {e}); expected keys "
                         f"{', '.join(PROJECTION_KEYS)}") from e
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise ValueError(f"{key} = {path!r} holds a {type(sd).__name__}, not a state dict of tensors; expected keys "
                         f"{', '.join(PROJECTION_KEYS)}")
    sd = {_LEGACY.get(k, k): v for k, v in sd.items()}
    if sorted(sd) != sorted(PROJECTION_KEYS):
        raise ValueError(f"{key} = {path!r} has keys {sorted(sd)[:8]}; expected exactly {', '.join(PROJECTION_KEYS)} "
                         "(upstream src/model.py ProjectionLayer with one hidden layer, e.g. weights/vitb_mlp_infonce.pth)")
    w1, b1, w2, b2 = (sd[k] for k in PROJECTION_KEYS)
    if w1.dim() != 2 or b1.shape != (w1.shape[0],) or w2.shape != (w1.shape[0], w1.shape[0]) or b2.shape != b1.shape:
        raise ValueError(f"{key} = {path!r}: shapes {[tuple(sd[k].shape) for k in PROJECTION_KEYS]} of "
                         f"{', '.join(PROJECTION_KEYS)} do not form Linear(c, d), tanh, Linear(d, d)")
    proj = TextProjection(int(w1.shape[1]), int(w1.shape[0]))
    proj.load_state_dict({k: v.float() for k, v in sd.items()}, strict=True)
    return proj


def random_projection(seed: int = 0, clip_dim: int = 512, dino_dim: int = 768) -> TextProjection:
    """A projection with nn.Linear's default initialisation drawn after ``torch.manual_seed(seed)``
    on a private generator state (the global RNG is restored), announced loudly."""
    logger.warning("RANDOM WEIGHTS: the text projection (PROXY.TALK2DINO.PROJECTION random) is drawn at random "
                   "(seed %d): a smoke run, every number it produces is meaningless.", seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        return TextProjection(clip_dim, dino_dim)


def cls_attention_maps(qkv: torch.Tensor, num_heads: int, num_prefix_tokens: int, scale: float) -> torch.Tensor:
    """The CLS token's attention scores on the patch tokens, per head, before any softmax: from the
    last block's fused ``qkv`` output ``(B, T, 3 C)`` -> ``(B, heads, T - prefix)``
    (upstream ``dinotext.py`` ``process_self_attention``: ``(q * scale) @ k^T``, row 0, columns
    after the ``num_global_tokens``)."""
    B, T, C3 = qkv.shape
    d = C3 // (3 * num_heads)
    qkv = qkv.reshape(B, T, 3, num_heads, d).permute(2, 0, 3, 1, 4)
    q, k = qkv[0] * scale, qkv[1]
    return (q[:, :, :1] @ k.transpose(-2, -1))[:, :, 0, num_prefix_tokens:]


def sigmoid_masks(feats: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    """``sigmoid(cos(patch, text))``: ``(B, C, h, w)`` features, ``(N, C)`` unit text -> ``(B, N, h, w)``
    (upstream ``masker.py`` ``DINOTextMasker.forward_seg`` with ``DINOTextSim2Mask``, soft masks)."""
    f = F.normalize(feats, dim=1)
    return torch.sigmoid(torch.einsum("bchw,nc->bnhw", f, text))


def clean_background(mask: torch.Tensor, feats: torch.Tensor, attn_maps: torch.Tensor, text: torch.Tensor,
                     lambda_bg: float) -> torch.Tensor:
    """Talk2DINO's background cleaning of one batch of windows, each on its own (upstream runs one
    window at a time: ``dinotext.py`` ``similarity_assignment_weighted``).

    For each window: head embeddings ``e_m = mean_p A_mp f_p`` (unit), their text affinities
    ``s_nm = softmax_m(t_n . e_m)``, per class the head-weighted attention ``a_np = softmax_p(sum_m
    s_nm A_mp / sum_m s_nm)``, rescaled to the masks' range: ``a' = (a - min a) / max(max a, max a -
    min a) * (max M - min M) + min M`` (min / max over the window's classes and patches), and
    ``(M + lambda a') / (1 + lambda)``.

    Args:
        mask: ``(B, N, h, w)`` sigmoid masks; feats: ``(B, C, h, w)`` patch tokens (not normalised);
        attn_maps: ``(B, heads, h*w)`` raw CLS scores (:func:`cls_attention_maps`); text: ``(N, C)``;
        lambda_bg: the weight (upstream ``lambda_bg=0.2``).
    Returns:
        ``(B, N, h, w)``.
    """
    B, C, h, w = feats.shape
    hw = h * w
    f = feats.reshape(B, C, hw)
    out = []
    for b in range(B):
        A = attn_maps[b]  # (M, P)
        head = (A.unsqueeze(1) * f[b].unsqueeze(0)).mean(dim=-1)  # (M, C)
        head = head / head.norm(dim=-1, keepdim=True)
        sim = (text @ head.T).softmax(dim=-1)  # (N, M)
        per_class = (sim.unsqueeze(-1) * A.unsqueeze(0)).sum(dim=1) / sim.sum(dim=-1, keepdim=True)
        per_class = per_class.softmax(dim=-1)  # (N, P)
        lo, hi = per_class.min(), per_class.max()
        hi = torch.maximum(hi, hi - lo)
        m = mask[b].reshape(-1, hw)
        per_class = (per_class - lo) / hi * (m.max() - m.min()) + m.min()
        out.append(((m + lambda_bg * per_class) / (1 + lambda_bg)).reshape(-1, h, w))
    return torch.stack(out)
