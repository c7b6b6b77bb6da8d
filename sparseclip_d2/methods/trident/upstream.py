"""Trident's entry in the upstream timing benchmark (``tools/benchmark_methods.py``): its segmentor
(``trident.py``, YuHengsss/Trident at a93b346), driven as its agreement rows drive it
(docs/upstream_agreement.md): DINO ViT-B/16 from the ``--dino`` checkout, SAM ViT-B drawn by its own
vendored ``segment_anything``, both with random weights (seed 0)."""
import os
import sys

from ..registry import UPSTREAM, UpstreamEntry, mmseg_dataset_configs

#: SAM ViT-B's random state dict (seed 0), drawn by the upstream worker beside the VFM's, loaded by both sides
SAM_FILE = "sam_vit_b_seed0.pth"


@UPSTREAM.register("trident")
class TridentUpstream(UpstreamEntry):
    """Trident(clip_type='openai', model_type=<weights file, its name ending in the patch size 16:
    upstream reads the stride as int(model_type[-2:])>, vfm_model='dino', name_path, sam_ckpt=<random
    SAM>, **model dict of configs/cfg_voc21.py over base_config.py); its predict (get_trident_seg,
    postprocess)."""

    repo, commit, marker = "YuHengsss/Trident", "a93b346", "trident.py"
    config = "trident_b16_voc21.yaml"
    upstream_config, class_file = "configs/cfg_voc21.py", "configs/cls_voc21.txt"
    # trident_b16.yaml is COCO-Stuff's (its cfg_coco_stuff164k.py), the others one dataset each
    configs = mmseg_dataset_configs("trident_b16", "coco_stuff", ("voc21", "voc20", "context60", "context59",
                                                                 "coco_object", "cityscapes", "ade20k"))
    # its prob_thd (PROB_THRESHOLD here) at 0 (YuHengsss/Trident @ a93b346 trident.py: seg_pred[max < prob_thd] = 0)
    forcing = {"prob0": (("MODEL.SPARSECLIP.PROB_THRESHOLD", "0.0"), {"prob_thd": 0.0})}
    needs_dino, vfm = "the torch.hub VFM code its upstream loads", "dino_vitb16"
    sample_reads_file = True  # SAM reads the data sample's img_path

    @classmethod
    def project_opts(cls, path, workdir, drawn):
        return ["MODEL.SPARSECLIP.PROXY.WEIGHTS", cls.vfm_file(workdir) if drawn else "none",
                # its own segment_anything draws SAM ViT-B (seed 0) beside DINO
                "MODEL.SPARSECLIP.PROXY.TRIDENT.SAM_WEIGHTS", os.path.join(workdir, SAM_FILE) if drawn else "none"]

    @classmethod
    def build(cls, spec, image, path, kit):
        import types

        import torch

        weights = spec["weights"]
        kit.install_standins()
        skimage = types.ModuleType("skimage")  # seg_utils/utils.py imports it for sam_refinement only (off)
        skimage.measure = types.ModuleType("skimage.measure")
        sys.modules.update({"skimage": skimage, "skimage.measure": skimage.measure})
        kit.random_dino(spec, cls.vfm)
        sam_file = os.path.join(os.path.dirname(spec["vfm_weights"]), SAM_FILE)
        if not os.path.exists(sam_file):
            from segment_anything import sam_model_registry  # Trident's vendored copy
            torch.manual_seed(0)
            torch.save(sam_model_registry["vit_b"](checkpoint=None).state_dict(), sam_file)
        # its constructor casts SAM (and DINO: kit.random_dino rounds that file) to fp16 and encodes the class
        # names with create_model(..., precision='fp16') (YuHengsss/Trident @ a93b346 trident.py): SAM's weights
        # as float16 numbers, which both sides load, and a float32 CLIP for the text, as the project's
        kit.fp16_exact_state_file(sam_file)
        import trident as seg_module
        seg_module.openai_imagenet_template = kit.cut_templates(seg_module.openai_imagenet_template, spec)
        kit.fp32_create_model(seg_module)
        # its constructor's .half() of SAM would round SAM's non-persistent pixel_mean / pixel_std buffers,
        # which no state file holds and .float() does not restore (123.675 -> 123.6875): no module rounding
        kit.fp32_module_half()
        model = kit.upstream_config(path, cls.upstream_config_of(spec))
        model.pop("type", None)
        link = os.path.join(os.path.dirname(spec["vfm_weights"]), "clip_weights_16")
        if not os.path.exists(link):
            os.symlink(weights, link)
        model.update(clip_type="openai", model_type=os.path.basename(link), vfm_model="dino",
                     name_path=os.path.join(path, cls.class_file_of(spec)), device="cpu", sam_ckpt=sam_file,
                     sam_refinement=False)
        model.update(cls.settings_of(spec))
        os.chdir(os.path.dirname(link))  # its create_model takes the weights file by its bare name
        seg = seg_module.Trident(**model)
        seg.clip.float()
        seg.vfm.float()
        seg.sam.float()
        seg.query_features = seg.query_features.float()
        seg.dtype = torch.float32
        torch.Tensor.half = lambda self: self.float()
        seg.eval()
        return kit.path_segmentor_run(seg, image, spec)
