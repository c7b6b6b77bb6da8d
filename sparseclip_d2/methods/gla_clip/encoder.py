"""``WindowSetEncoder``: ProxyCLIP's proxy last block (:class:`~..proxyclip.ProxyCLIPEncoder`) whose
keys and values span **all** windows it is given, which the ``window_set`` stage (:mod:`.parts`)
makes the windows of one image.

The last block (2btlFe/GLA-CLIP @ ba74915 ``open_clip/transformer.py`` L653-711,
``Custom_Attn_Model_Type.forward`` with ``CLIP_type ProxyCLIP`` and ``KV_token_extension``): the
CLS token dropped, ``ln_1``, CLIP's values of each window resized bilinearly from CLIP's grid to
the proxy's (14 x 14 -> 28 x 28 on a 224 px window), the window-set attention of
:func:`.window_set.window_set_attend` over the proxy's final normed tokens of every window
(``gla_clip_segmentor.py forward_feature``: ``get_intermediate_layers(imgs_norm)[0]``, CLS
dropped), ``out_proj``, no residual, no FFN, then ``ln_post`` and ``proj``.

Padding: upstream pads each window, centred, to multiples of 56 (``compute_padsize(H, W, 56)``), which
only runs when the padded window is 224 x 224 (``crop_indices.view(h_grids, w_grids, 1, 28, 28)``
fails otherwise, and 56 is no multiple of CLIP's patch 16); the project pads, centred, to multiples
of CLIP's and the proxy's patch (16), as ProxyCLIP. Both give every window of the protocols (short
side >= 224, windows 224 x 224) unpadded.
"""
from typing import Dict, Optional, Tuple

import torch

from ...clip.spec import AttentionSpec
from ...proxy.second_backbone import ProxyBackbone, to_proxy_input
from ..proxyclip.encoder import ProxyCLIPEncoder, normalize_proxy_scores
from .window_set import WindowSetSettings, check_window_set_settings, window_set_attend

__all__ = ["WindowSetEncoder"]


class WindowSetEncoder(ProxyCLIPEncoder):
    """Dense CLIP features of a set of windows whose last block attends over all of them.

    Args:
        visual, spec, proxy, crop_size, pos_embed_interp, attn_pool_dense: as for
            :class:`~..proxyclip.ProxyCLIPEncoder` (the spec's normaliser, alpha and temperature
            act on the window-set scores; upstream: softmax).
        settings: :class:`~.window_set.WindowSetSettings`.

    ``forward(images)``: ``images`` ``(B, 3, H, W)`` are the windows of **one** image; returns
    ``(B, D, h', w')`` on the proxy's grid. ``return_attention`` is not supported (the weights are
    computed in row blocks, ``(B * h'w')^2`` of them).
    """

    def __init__(self, visual, spec: Optional[AttentionSpec], proxy: ProxyBackbone, *,
                 settings: WindowSetSettings = WindowSetSettings(), crop_size: Optional[int] = None,
                 pos_embed_interp: str = "size", attn_pool_dense: str = "value"):
        super().__init__(visual, spec, proxy, crop_size=crop_size, pos_embed_interp=pos_embed_interp,
                         attn_pool_dense=attn_pool_dense)
        self.settings = check_window_set_settings(settings, "MODEL.SPARSECLIP.PROXY.GLA")

    def extra_repr(self) -> str:
        s = self.settings
        return (f"{super().extra_repr()}, window set: threshold={s.threshold:g}, iterations={s.iterations}, "
                f"beta_alpha={s.beta_alpha:g}, gamma_alpha={s.gamma_alpha:g}, precision={s.precision}")

    def _init_kwargs(self) -> Dict:
        kw = super()._init_kwargs()
        kw.pop("beta"), kw.pop("gamma")
        return dict(kw, settings=self.settings)

    def describe(self) -> str:
        from ...clip.spec import describe_spec

        s = self.settings
        rest = describe_spec(self.spec).split(", ", 1)[1]
        return (f"window-set proxy {self.proxy.opts.name} {self.proxy.opts.feature} of block {self.proxy.opts.layer}: "
                f"all windows' keys, anchor > {s.threshold:g} x {s.iterations}, (S - (1 + {s.beta_alpha:g} "
                f"log1p(windows)) mean+ S) x (1 + {s.gamma_alpha:g} / count), below min(max, 0) -inf, {rest}, "
                f"{s.precision}")

    def proxy_weights(self, images: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int]]:
        """The proxy's features of the windows (the window-set weights are formed in :meth:`attend`,
        in row blocks): ``((B, C, h', w'), (h', w'))``."""
        _, _, H, W = images.shape
        size = self.proxy.input_size(H, W, self.crop_size)
        feats = self.proxy(to_proxy_input(images, self.image_mean, self.image_std, self.proxy, size))
        return feats, (int(feats.shape[-2]), int(feats.shape[-1]))

    def attend(self, blk, y: torch.Tensor, v: torch.Tensor, feats: torch.Tensor):
        """Every window's rows attend over all windows' values (heads side by side, one weight
        matrix shared by the heads, as upstream's ``einsum('bsn,hnd->hsbd')``)."""
        B, heads, n, d = v.shape
        values = v.transpose(1, 2).reshape(B, n, heads * d)
        out = window_set_attend(feats, values, self.settings, lambda s: normalize_proxy_scores(s, self.spec))
        return self._tower.attn_out(blk, y, out.to(v.dtype)), None
