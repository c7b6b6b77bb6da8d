"""CASS's object-presence prompt adjustment: a text-side adjustment usable after any encoder.

MICV-yonsei/CASS @ 228ecdd ``cass_segmentor.py`` (``hierarchical_clustering``,
``hierarchical_prompt``, ``forward_feature``). With unit synonym embeddings ``t_s``, unit patch
embeddings ``f_n`` of a window and an image-level embedding ``g`` (the CLS embedding of the
window, or of the whole image):

1. the synonyms are clustered once per vocabulary: Ward linkage of their cosine distances,
   cut at ``CLUSTER_THRESHOLD`` (scipy ``linkage(..., 'ward')``, ``fcluster(..., criterion=
   'distance')``) (:func:`text_clusters`);
2. in each cluster the synonym ``c`` most similar to ``g`` is the one "present"; its embedding
   becomes ``normalize((1 - a) t_c + a m)`` with ``m`` the normalised mean of the ``TOP_K``
   patches most similar to ``t_c`` and ``a = MEAN_WEIGHT`` (:func:`object_presence_text`);
3. the patch logits are ``(1 - w) cos(f_n, t'_s) + w cos(g, t_s)`` with ``w = GLOBAL_WEIGHT``
   (:func:`object_presence_logits`), then times the logit scale as any logits.
"""
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ...common.keys import Key, Section, key_field, switch_is_on
from ..registry import CONFIG_SECTIONS

__all__ = ["OBJECT_PRESENCE_GLOBALS", "OBJECT_PRESENCE_SECTION", "ObjectPresence", "check_object_presence",
           "object_presence_from_config", "text_clusters",
           "object_presence_text", "object_presence_logits"]

#: Where the image-level embedding ``g`` comes from (``OBJECT_PRESENCE.GLOBAL``): ``image`` = the
#: unmodified CLIP's CLS embedding of the whole image (upstream with the sliding window:
#: ``encode_image(whole_img, ..., return_cls=True)``), ``window`` = the encoder's pooled embedding
#: of the window itself (upstream without the sliding window, and on city_scapes: ``x_last``).
OBJECT_PRESENCE_GLOBALS = ("image", "window")


@dataclass(frozen=True)
class ObjectPresence:
    """``MODEL.SPARSECLIP.OBJECT_PRESENCE.*`` (defaults: CASS ``cass_segmentor.py`` ``__init__``,
    ``_compute_topk_similarities(..., k=2)``)."""

    global_weight: float = key_field(0.0, "GLOBAL_WEIGHT", "logits = (1 - GLOBAL_WEIGHT) cos(patch, adjusted text) "
                                     "+ GLOBAL_WEIGHT cos(image, text) (global_semantics_weight; per dataset in "
                                     "configs/cfg_*.py).")
    mean_weight: float = key_field(0.0, "MEAN_WEIGHT", "The present synonym of each cluster moves MEAN_WEIGHT towards "
                                   "its TOP_K best patches' mean (mean_vector_weight).")
    top_k: int = key_field(2, "TOP_K", "Patches averaged for the mean (_compute_topk_similarities k=2).")
    cluster_threshold: float = key_field(0.0, "CLUSTER_THRESHOLD", "Ward-linkage distance at which the synonyms are "
                                         "cut into clusters (h_threshold).")
    global_source: str = key_field("image", "GLOBAL", 'The image-level embedding: "image" (CLIP\'s CLS of the whole '
                                   'image; upstream with the sliding window) or "window" (the encoder\'s pooled '
                                   "embedding of the window; upstream without it and on city_scapes).")


def check_object_presence(p: ObjectPresence, key: str = "MODEL.SPARSECLIP.OBJECT_PRESENCE") -> ObjectPresence:
    """Validate ``p``; ``ValueError`` naming ``key.<FIELD>``, the value and the valid choices."""
    import math

    for name, value in (("GLOBAL_WEIGHT", p.global_weight), ("MEAN_WEIGHT", p.mean_weight)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= float(value) <= 1:
            raise ValueError(f"{key}.{name} = {value!r} is invalid; valid: a number in [0, 1]")
    t = p.cluster_threshold
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(float(t)) or float(t) < 0:
        raise ValueError(f"{key}.CLUSTER_THRESHOLD = {t!r} is invalid; valid: a finite number >= 0 (a Ward "
                         "linkage distance)")
    if isinstance(p.top_k, bool) or not isinstance(p.top_k, int) or p.top_k < 1:
        raise ValueError(f"{key}.TOP_K = {p.top_k!r} is invalid; valid: an integer >= 1")
    if p.global_source not in OBJECT_PRESENCE_GLOBALS:
        raise ValueError(f"{key}.GLOBAL = {p.global_source!r} is invalid; valid: {', '.join(OBJECT_PRESENCE_GLOBALS)}")
    return p


def text_clusters(text_emb: torch.Tensor, threshold: float) -> np.ndarray:
    """Cluster ids ``0..K-1`` of the ``(S, D)`` unit synonym embeddings: Ward linkage of the
    cosine distances ``1 - cos`` (clipped to [0, 2], diagonal 0, in float64), flat clusters at
    distance ``threshold``. One synonym: ``[0]``."""
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    t = F.normalize(text_emb.detach().double().cpu(), dim=-1).numpy()
    if t.shape[0] == 1:
        return np.zeros(1, dtype=np.int64)
    d = np.clip(1.0 - t @ t.T, 0.0, 2.0)
    d = (d + d.T) / 2
    np.fill_diagonal(d, 0.0)
    z = linkage(squareform(d, checks=False), method="ward")
    return (fcluster(z, t=float(threshold), criterion="distance") - 1).astype(np.int64)


def object_presence_text(feats: torch.Tensor, text_emb: torch.Tensor, global_sim: torch.Tensor,
                         clusters: np.ndarray, mean_weight: float, top_k: int = 2) -> torch.Tensor:
    """The adjusted synonym embeddings of one window.

    Args:
        feats: ``(N, D)`` unit patch embeddings.
        text_emb: ``(S, D)`` unit synonym embeddings.
        global_sim: ``(S,)`` cosine of the image-level embedding with each synonym.
        clusters: ``(S,)`` ids from :func:`text_clusters`.
        mean_weight: ``a``; top_k: patches averaged (at most ``N``).
    Returns:
        ``(S, D)`` float32: each cluster's most present synonym replaced (module docstring).
    """
    feats, text = feats.float(), text_emb.float()
    out = text.clone()
    sims = global_sim.detach().float().cpu()
    k = min(int(top_k), feats.shape[0])
    for c in range(int(clusters.max()) + 1):
        idx = np.nonzero(clusters == c)[0]
        if idx.size == 0:
            continue
        best = int(idx[int(torch.argmax(sims[torch.as_tensor(idx)]))])
        t = F.normalize(text[best], dim=0)
        top = torch.topk(F.normalize(feats, dim=1) @ t, k).indices
        m = F.normalize(feats[top].mean(dim=0), dim=0)
        out[best] = F.normalize((1 - mean_weight) * t + mean_weight * m, dim=0)
    return out


def object_presence_logits(feats: torch.Tensor, global_emb: torch.Tensor, text_emb: torch.Tensor,
                           clusters: np.ndarray, p: ObjectPresence) -> torch.Tensor:
    """Cosine logits of windows with the object-presence adjustment (before the logit scale).

    Args:
        feats: ``(B, D, h, w)`` unit patch embeddings.
        global_emb: ``(B, D)`` or ``(1, D)`` unit image-level embeddings.
        text_emb: ``(S, D)`` unit synonym embeddings; clusters: :func:`text_clusters` of them.
    Returns:
        ``(B, S, h, w)`` float32 ``(1 - w) cos(f, t') + w cos(g, t)``.
    """
    B, D, h, w = feats.shape
    text = text_emb.float()
    g = global_emb.float().expand(B, -1) @ text.T  # (B, S)
    out = []
    for b in range(B):
        f = feats[b].float().flatten(1).T  # (N, D)
        adj = object_presence_text(f, text, g[b], clusters, p.mean_weight, p.top_k)
        lg = (f @ adj.T) * (1 - p.global_weight) + g[b][None] * p.global_weight
        out.append(lg.T.reshape(-1, h, w))
    return torch.stack(out)


_KEY = "MODEL.SPARSECLIP.OBJECT_PRESENCE"
#: ``MODEL.SPARSECLIP.OBJECT_PRESENCE``: ``ENABLED`` then :class:`ObjectPresence`'s keys. With
#: ``ENABLED False`` the others must keep their defaults (a key set without the adjustment would
#: change nothing and is refused).
OBJECT_PRESENCE_SECTION = CONFIG_SECTIONS.register(_KEY)(Section(ObjectPresence, switch="ENABLED",
                                                                  before=(Key("ENABLED", False),)))


def object_presence_from_config(cfg):
    """The validated :class:`ObjectPresence` of ``cfg`` (duck-typed config), or None when
    ``OBJECT_PRESENCE.ENABLED`` is False.

    Raises:
        ValueError: a key set while disabled; a bad value (naming the key and the valid choices);
            ``GLOBAL window`` with a proxy block that has no CLS token (ProxyCLIP, FSA). The other
            logit heads and stages it cannot join are refused by ``methods.check_parts``.
    """
    sc = cfg.MODEL.SPARSECLIP
    o = sc.OBJECT_PRESENCE
    if not switch_is_on(o, OBJECT_PRESENCE_SECTION, _KEY):
        return None
    p = check_object_presence(ObjectPresence(global_weight=o.GLOBAL_WEIGHT, mean_weight=o.MEAN_WEIGHT,
                                             cluster_threshold=o.CLUSTER_THRESHOLD, top_k=o.TOP_K,
                                             global_source=o.GLOBAL), _KEY)
    if p.global_source == "window" and sc.PROXY.NAME and not sc.PROXY.CASS.ENABLED:
        raise ValueError(f"{_KEY}.GLOBAL = 'window' reads the encoder's CLS embedding, which the proxy last block "
                         f"(MODEL.SPARSECLIP.PROXY.NAME {sc.PROXY.NAME!r} without PROXY.CASS) does not output; valid: "
                         "image")
    return p
