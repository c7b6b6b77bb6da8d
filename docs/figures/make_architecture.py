"""Draw docs/figures/architecture.png: the layers of sparseclip_d2 and the path of one
segmentation image and one FG-OVD box through them.

    python docs/figures/make_architecture.py
"""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "architecture.png")

LAYERS = [
    # (title, needs, colour, [(box text), ...])
    ("tools/", "scripts", "#eeeeee", [
        "train_net.py --eval-only\n(loader + evaluator\nper dataset)",
        "demo.py\n(one photo, overlays)",
        "sweep.py / plot.py\n(analysis/)",
        "prepare_datasets.py\n(check, convert)",
    ]),
    ("layer 3: detectron2 parts", "detectron2", "#dbe9f6", [
        "data/\ndatasets (registration),\nmappers, loader builders",
        "modeling/\nSparseCLIP (segmentation)\nSparseCLIPFGOVD (regions)\nsliding window, PAMR",
        "evaluation/\nSemSegEvaluator (public API)\nFGOVDEvaluator, attention\nstatistics, results.json",
    ]),
    ("layer 2: sparseclip_d2.clip", "torch + open_clip (+ timm towers)", "#e2f0d9", [
        "build_clip\n(open_clip name,\nopenai | file | none)",
        "AttentionSpec\n(one grammar, presets:\nsclip, clearclip, naclip,\nmaskclip)",
        "DenseCLIPEncoder\n(wraps the ViT tower,\nany input size)",
        "TextClassifier\n(templates x synonyms)",
    ]),
    ("layer 1: sparseclip_d2.attention", "torch only", "#fbe5d6", [
        "score sources\nqk qq kk vv identity\nand sums (qq+kk)",
        "normalisers\nsoftmax, alpha-entmax\n(C++ kernel), sparsemax,\nrandom_matched",
        "priors\n(gaussian)",
        "attention_weights\n(float32, sum modes)",
    ]),
    ("layer 0: sparseclip_d2.common", "standard library only", "#f2f2f2", [
        "LRUCache\n(bounded in-memory caches)",
        "atomic writes\n(JSON, JSONL, text)",
    ]),
]


def main():
    fig = plt.figure(figsize=(15.8, 9.4), dpi=110)
    ax = fig.add_axes([0, 0, 1, 1])
    ax.set_xlim(0, 15.8)
    ax.set_ylim(0.95, 10.5)
    ax.axis("off")
    ax.text(0.3, 10.15, "sparseclip_d2: layers (each imports only the ones below it)", fontsize=15, weight="bold",
            va="center")

    # --- layers, top to bottom
    band_h, gap, top = 1.5, 0.2, 9.75
    x0, x1 = 0.3, 8.8
    centres = {}
    for i, (title, needs, colour, boxes) in enumerate(LAYERS):
        y_top = top - i * (band_h + gap)
        ax.add_patch(FancyBboxPatch((x0, y_top - band_h), x1 - x0, band_h, boxstyle="round,pad=0.02",
                                    fc=colour, ec="#555555", lw=1.2))
        ax.text(x0 + 0.1, y_top - 0.18, title, fontsize=10.5, weight="bold", va="center")
        ax.text(x1 - 0.1, y_top - 0.18, "needs: " + needs, fontsize=9, va="center", ha="right", style="italic")
        n = len(boxes)
        w = (x1 - x0 - 0.3 - 0.15 * (n - 1)) / n
        for j, text in enumerate(boxes):
            bx = x0 + 0.15 + j * (w + 0.15)
            ax.add_patch(FancyBboxPatch((bx, y_top - band_h + 0.1), w, band_h - 0.45, boxstyle="round,pad=0.02",
                                        fc="white", ec="#888888", lw=0.8))
            ax.text(bx + w / 2, y_top - band_h + 0.1 + (band_h - 0.45) / 2, text, fontsize=8.3, ha="center",
                    va="center")
        centres[i] = y_top - band_h / 2
        if i:
            ax.add_patch(FancyArrowPatch((x0 - 0.12, centres[i - 1] - 0.2), (x0 - 0.12, centres[i] + 0.2),
                                         arrowstyle="-|>", mutation_scale=12, color="#555555"))
    ax.text(x0 - 0.2, (centres[0] + centres[4]) / 2, "imports", rotation=90, fontsize=8, ha="right",
            va="center", color="#555555")

    # --- data flows on the right
    def flow(x, title, steps, colour):
        ax.text(x, 9.6, title, fontsize=11, weight="bold", ha="center")
        y = 9.2
        step_h = 0.78
        for k, (text, layer) in enumerate(steps):
            ax.add_patch(FancyBboxPatch((x - 1.5, y - step_h + 0.12), 3.0, step_h - 0.2, boxstyle="round,pad=0.02",
                                        fc=LAYERS[layer][2], ec=colour, lw=1.1))
            ax.text(x, y - step_h / 2 + 0.02, text, fontsize=7.8, ha="center", va="center")
            if k + 1 < len(steps):
                ax.add_patch(FancyArrowPatch((x, y - step_h + 0.1), (x, y - step_h - 0.04), arrowstyle="-|>",
                                             mutation_scale=9, color=colour))
            y -= step_h + 0.04

    flow(10.75, "one image (segmentation)", [
        ("dataset dict: file_name,\nsem_seg_file_name", 1),
        ("mapper: read (EXIF, RGB),\nresize (d2/PIL or MMSeg/cv2)", 1),
        ("SparseCLIP: normalise,\nsliding windows / whole image", 1),
        ("DenseCLIPEncoder: blocks,\nlast N with AttentionSpec", 2),
        ("attention_weights:\nsource -> normaliser", 3),
        ("patch features -> cosine with\ntext embeddings x logit scale", 2),
        ("merge windows, upsample,\nsynonym max, background rule", 1),
        ("(PAMR) -> sem_seg (C, H, W)", 1),
        ("SemSegEvaluator -> mIoU\nresults.json", 1),
    ], "#2e75b6")
    flow(14.05, "one box (FG-OVD)", [
        ("LVIS-style JSON record:\nbox, caption, negatives", 1),
        ("mapper: image from\ncoco/<file_name>, boxes", 1),
        ("SparseCLIPFGOVD:\nprotocol from from_config", 1),
        ("dense: DenseCLIPEncoder\nfeatures of the image", 2),
        ("attention_weights:\nsource -> normaliser", 3),
        ("RoIAlign of the box ->\nregion embedding (or crop)", 1),
        ("cosine with 1 + N captions\n(TextClassifier)", 2),
        ("scores (K, 1 + N),\nNaN-padded per box", 1),
        ("FGOVDEvaluator -> top-1,\nranks, mHME; results.json", 1),
    ], "#c55a11")

    ax.text(12.4, 1.25, "each step is coloured by the layer that runs it", fontsize=8.5, ha="center",
            style="italic", color="#555555")
    fig.savefig(OUT)
    print(OUT)


if __name__ == "__main__":
    main()
