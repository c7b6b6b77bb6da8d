#!/usr/bin/env python
"""Write region masks in CorrCLIP's ``.npz`` format (``np.savez_compressed(<stem>.npz,
instance_mask=...)``, an (H, W) integer map at the image's size, 0 = unsegmented) for every
image of a registered dataset, or for image files, with a fixed **grid x brightness
partition**: cells of ``--cell`` pixels, each split into its pixels darker / not darker than
mid-grey (luma 128), and grey pixels (max - min channel < ``--grey``) left unsegmented.

This is a deterministic stand-in for smoke runs and agreement checks (sparseclip_d2's demo
data, docs/upstream_agreement.md "CorrCLIP"), **not** a mask generator: CorrCLIP's numbers
need SAM2 masks (its README: the pre-generated ``region_masks`` of huggingface.co/datasets/
dk258/CorrCLIP, or SAM2 / EntitySeg / Mask2Former run by its ``corrclip_segmentor.py``).

    python tools/write_region_masks.py --dataset sparseclip_demo_voc --out datasets/region_masks/demo
    python tools/write_region_masks.py --images a.jpg b.png --out /tmp/masks [--cell 48]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--dataset", help="a registered sparseclip_d2 dataset name (its images' file_name)")
    src.add_argument("--images", nargs="+", help="image files")
    p.add_argument("--out", required=True, help="output directory (MODEL.SPARSECLIP.PROXY.CORRCLIP.MASK_DIR)")
    p.add_argument("--cell", type=int, default=48, help="grid cell side in pixels (default 48)")
    p.add_argument("--grey", type=int, default=16, help="pixels with max - min channel below this are unsegmented")
    a = p.parse_args(argv)
    from sparseclip_d2.data.image_io import read_image_rgb
    from sparseclip_d2.methods.corrclip.encoder import write_region_mask
    from sparseclip_d2.proxy.region_partition import grid_brightness_partition

    if a.dataset:
        import sparseclip_d2  # noqa: F401  (registers the datasets)
        from detectron2.data import DatasetCatalog

        if a.dataset not in DatasetCatalog.list():
            valid = ", ".join(sorted(n for n in DatasetCatalog.list() if n.startswith("sparseclip_")))
            raise SystemExit(f"--dataset {a.dataset!r} is not registered; valid: {valid}")
        files = [d["file_name"] for d in DatasetCatalog.get(a.dataset)]
    else:
        files = a.images
    os.makedirs(a.out, exist_ok=True)
    stems = {}
    for f in files:
        stem = os.path.splitext(os.path.basename(f))[0]
        if stems.setdefault(stem, f) != f:
            raise SystemExit(f"two images share the stem {stem!r} ({stems[stem]}, {f}): CorrCLIP reads masks by stem")
        out = os.path.join(a.out, stem + ".npz")
        write_region_mask(out, grid_brightness_partition(read_image_rgb(f), a.cell, a.grey))
        print(out)


if __name__ == "__main__":
    main()
