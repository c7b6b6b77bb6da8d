"""CLIP Surgery's text-side "feature surgery" on cosine maps: ``feature_surgery``.

xmed-lab/CLIP_Surgery @ d4696d4 ``clip/clip.py`` ``clip_feature_surgery(image_features,
text_features, t=2)`` (with ``redundant_feats=None``): per image, the class weights
``w = p / mean(p)`` with ``p = softmax(2 * cos(CLS, text))`` over the texts; the
element-wise products ``f_i * t_n * w_n`` of each (L2-normalised) token feature and text
embedding lose their mean over the texts, and are summed over the channels. Summing first,
that is ``w_n cos(f_i, t_n) - mean_m w_m cos(f_i, t_m)``, which is what is computed here from
the cosine maps, for any method's features (the CLS or pooled embedding gives ``p``).
"""
import math

import torch

__all__ = ["feature_surgery", "check_surgery_scale", "check_surgery_options"]


def check_surgery_scale(scale) -> float:
    """``scale`` as a float when it is a finite number > 0; ``ValueError`` naming the valid range otherwise."""
    ok = isinstance(scale, (int, float)) and not isinstance(scale, bool) and math.isfinite(float(scale))
    if not ok or not float(scale) > 0:
        raise ValueError(f"MODEL.SPARSECLIP.FEATURE_SURGERY.CLS_SCALE = {scale!r} is invalid; valid: a number > 0 "
                         "(CLIP Surgery: 2)")
    return float(scale)


def feature_surgery(patch_cos: torch.Tensor, cls_cos: torch.Tensor, cls_scale: float = 2.0) -> torch.Tensor:
    """Feature-surgery similarities from cosine maps.

    Args:
        patch_cos: ``(N, S, h, w)`` cosines of the L2-normalised patch features with the S
            L2-normalised text embeddings.
        cls_cos: ``(N, S)`` cosines of each image's L2-normalised CLS (pooled) embedding with them.
        cls_scale: the factor on ``cls_cos`` before the softmax (CLIP Surgery's ``t``, 2).
    Returns:
        ``(N, S, h, w)`` float32: ``w_n c_n - mean_m w_m c_m`` with ``w = p / mean(p)``,
        ``p = softmax(cls_scale * cls_cos)`` over the S texts.
    """
    if patch_cos.dim() != 4 or cls_cos.dim() != 2 or tuple(cls_cos.shape) != tuple(patch_cos.shape[:2]):
        raise ValueError(f"feature_surgery takes patch cosines (N, S, h, w) and CLS cosines (N, S), got "
                         f"{tuple(patch_cos.shape)} and {tuple(cls_cos.shape)}")
    cls_scale = check_surgery_scale(cls_scale)
    p = torch.softmax(cls_scale * cls_cos.float(), dim=-1)
    w = (p / p.mean(dim=-1, keepdim=True))[:, :, None, None]
    weighted = w * patch_cos.float()
    return weighted - weighted.mean(dim=1, keepdim=True)


def check_surgery_options(cfg) -> None:
    """Validate ``cfg.MODEL.SPARSECLIP.FEATURE_SURGERY.*`` (duck-typed) before any model is
    built; ``ValueError`` naming the key, the value and the valid choices."""
    fs = cfg.MODEL.SPARSECLIP.FEATURE_SURGERY
    if not isinstance(fs.ENABLED, bool):
        raise ValueError(f"MODEL.SPARSECLIP.FEATURE_SURGERY.ENABLED = {fs.ENABLED!r} is invalid; valid: True, False")
    check_surgery_scale(fs.CLS_SCALE)
