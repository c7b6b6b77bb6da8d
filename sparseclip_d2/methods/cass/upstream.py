"""CASS's entry in the upstream timing benchmark (``tools/benchmark_methods.py``): its segmentor
(``cass_segmentor.py``, MICV-yonsei/CASS at 228ecdd), driven as its agreement rows drive it
(docs/upstream_agreement.md), with DINO ViT-B/8's random weights in place of the release file."""
import os
import sys

from ..registry import UPSTREAM, UpstreamEntry, mmseg_dataset_configs


@UPSTREAM.register("cass")
class CASSUpstream(UpstreamEntry):
    """CASS_segmentor(clip_path, name_path, device, dataset=<cfg file>, pamr_steps=0, **model dict of
    configs/cfg_voc21.py over base_config.py); its predict (whole image for voc21, slide_crop=0)."""

    repo, commit, marker = "MICV-yonsei/CASS", "228ecdd", "cass_segmentor.py"
    config = "cass_b16_voc21.yaml"
    upstream_config, class_file = "configs/cfg_voc21.py", "configs/cls_voc21.txt"
    # cass_b16.yaml is Context59's (its configs/cfg_context59.py), the others one dataset each
    configs = mmseg_dataset_configs("cass_b16", "context59", ("voc21", "voc20", "context60", "coco_object",
                                                             "coco_stuff", "cityscapes", "ade20k"))
    # its prob_thd (PROB_THRESHOLD here) at 0 (MICV-yonsei/CASS @ 228ecdd cass_segmentor.py: seg_pred[max < prob_thd] = 0)
    forcing = {"prob0": (("MODEL.SPARSECLIP.PROB_THRESHOLD", "0.0"), {"prob_thd": 0.0})}
    # its DinoSelfAttention loads DINO's release file: the random weights drawn by the --dino hub code
    needs_dino, vfm = "DINO's release weights, drawn at random by the hub code", "dino_vitb8"

    @classmethod
    def project_opts(cls, path, workdir, drawn):
        return ["MODEL.SPARSECLIP.PROXY.WEIGHTS", cls.vfm_file(workdir) if drawn else "none"]

    @classmethod
    def row_opts(cls, root, model):
        # upstream builds DINO's key graph in fp16 (MICV-yonsei/CASS @ 228ecdd clip/model.py forward:
        # dino_attn = dino_attn.half(), on the CPU too); the project's default is fp32 (cass_b16.yaml)
        return ["MODEL.SPARSECLIP.PROXY.CASS.KEY_PRECISION", "fp16"]

    @staticmethod
    def _assignment(args, kwargs, out):
        """What upstream's ``linear_sum_assignment(cost_matrix_cpu)`` chose: its columns (rows are
        0..H-1) and the float32 cost matrix it was given (clip/model.py _apply_spectral_strategy)."""
        import numpy as np

        rows, cols = out
        if list(rows) != list(range(len(rows))):
            raise RuntimeError(f"upstream's assignment returned rows {list(rows)}, not 0..{len(rows) - 1}")
        return {"cols": [int(c) for c in cols], "cost": np.asarray(args[0], dtype=np.float64).tolist()}

    @classmethod
    def build(cls, spec, image, path, kit):
        import types

        import torch

        kit.install_standins()
        sys.modules.setdefault("requests", types.ModuleType("requests"))  # dino/dino_attention.py: imported, unused
        dino_file = kit.random_dino(spec, cls.vfm)
        # DinoSelfAttention without a weights file loads the release through load_state_dict_from_url
        torch.hub.load_state_dict_from_url = lambda url, *a, **k: torch.load(dino_file, map_location="cpu")
        kit.tensor_cuda_standin()
        import cass_segmentor as seg_module
        # the agreement driver replays upstream's head assignment where it ties with the project's
        # (docs/agreement/cass.md): record it, as clip/model.py imported scipy's function
        kit.record_returns(sys.modules["clip.model"], "linear_sum_assignment", "assignment", cls._assignment)
        # and the random generator each window's torch.svd_lowrank draws start from (optimal_q, unseeded
        # upstream; the project re-seeds per window with PROXY.CASS.SEED): the same draws on both sides
        kit.record_returns(sys.modules["clip.model"].VisionTransformer, "_apply_spectral_strategy", "random state",
                           lambda args, kwargs, out: torch.get_rng_state().tolist(), before=True)
        seg_module.openai_imagenet_template = kit.cut_templates(seg_module.openai_imagenet_template, spec)
        model = kit.upstream_config(path, cls.upstream_config_of(spec))
        for k in ("type", "clip_path", "name_path"):
            model.pop(k, None)
        seg = seg_module.CASS_segmentor(clip_path=spec["weights"], name_path=os.path.join(path, cls.class_file_of(spec)),
                                        device="cpu", dataset="./" + cls.upstream_config_of(spec), pamr_steps=0,
                                        **dict(model, **cls.settings_of(spec)))
        seg.eval()
        return kit.segmentor_run(seg, image, spec)
