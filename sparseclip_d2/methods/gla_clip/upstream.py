"""GLA-CLIP's entry in the upstream timing benchmark (``tools/benchmark_methods.py``) and the upstream
side of its agreement rows (``tools/agreement_gla_clip.py``): its segmentor
(``gla_clip_segmentor.py`` ``GLA_CLIPSegmentation``, 2btlFe/GLA-CLIP at ba74915) built as its ``eval.py``
builds it with the flags of ``predict.sh``, DINO ViT-B/8 answered from the ``--dino`` checkout with
random weights. Nothing heavy is imported at module level; no project model code at all."""
import os
import sys
import types

from ..registry import UPSTREAM, UpstreamEntry

__all__ = ["GLAUpstream", "PREDICT_FLAGS", "build_gla_segmentor", "run_segmentor", "run_thresholds"]

#: ``predict.sh``'s flags as ``eval.py`` sets them on the model config (2btlFe/GLA-CLIP @ ba74915): its
#: ``initial_crit_pos=0.6`` is a shell variable never passed, so eval.py's default 0.55 runs; the keys
#: eval.py sets that predict.sh leaves at their defaults (smoothing False, vfm_model 'dino',
#: checkpoint None, lbl_size 28) as eval.py's defaults.
PREDICT_FLAGS = dict(CLIP_type="ProxyCLIP", lbl_size=(28, 28), token_norm=True, KV_token_extension=True,
                     proxy_sim=True, smoothing=False, mini_iters=2, initial_crit_pos=0.55, vfm_model="dino",
                     checkpoint=None, dynamic_beta=True, dynamic_gamma=True, beta_alpha=0.3, gamma_alpha=30.0)


def _standins() -> None:
    """``openpyxl`` / ``ipdb``: imported by ``myutils.py`` and ``open_clip/transformer.py``, never used."""
    for name in ("openpyxl", "ipdb"):
        sys.modules.setdefault(name, types.ModuleType(name))


def build_gla_segmentor(path: str, upstream_config: str, class_file: str, weights: str, templates: str, kit,
                        config_reader):
    """``GLA_CLIPSegmentation`` of ``upstream_config`` (its ``model`` dict over ``base_config.py``, read
    by ``config_reader(path, file)``) as ``eval.py`` builds it: ``ModelConfig(**cfg.model)`` with
    :data:`PREDICT_FLAGS`, ``name_path`` the checkout's ``class_file``, on the CPU; CLIP from
    ``weights`` through its ``create_model(..., pretrained='openai', precision='fp16')`` (the file by its
    bare name from its folder: its create_model turns "/" of a name into "-"); DINO through
    ``torch.hub.load`` as the caller has answered it (``kit.random_dino``). ``templates`` "single": the
    first of its 80 templates (the benchmark's cut); "project_single": the project's one template
    (``clip/templates.py`` "single", the agreement rows). Returns the segmentor, still in fp16
    (``kit.upstream_to_fp32`` casts)."""
    import importlib

    import torch

    _standins()
    if "mmseg" not in sys.modules:  # installed once per process
        kit.install_standins()
    seg_module = importlib.import_module("gla_clip_segmentor")
    if templates == "single":  # the benchmark's cut: its first template ('a bad photo of a {}.')
        seg_module.openai_imagenet_template = seg_module.openai_imagenet_template[:1]
    elif templates == "project_single":  # the agreement rows: the project's one ('a photo of a {}.')
        seg_module.openai_imagenet_template = [lambda c: f"a photo of a {c}."]
    ModelConfig = importlib.import_module("cfg").ModelConfig
    model = config_reader(path, upstream_config)
    model_cfg = ModelConfig(**model)
    for k, v in PREDICT_FLAGS.items():
        setattr(model_cfg, k, v)
    model_cfg.name_path = os.path.join(path, class_file)
    model_cfg.device = "cpu"
    model_cfg.model_type = os.path.basename(weights)
    model_cfg.work_dir = ""
    here = os.getcwd()
    os.chdir(os.path.dirname(os.path.abspath(weights)))
    try:
        args = {k: v for k, v in model.items() if k != "type"}
        args.update(name_path=model_cfg.name_path, device=torch.device("cpu"), model_type=model_cfg.model_type)
        seg = seg_module.GLA_CLIPSegmentation(model_cfg=model_cfg, **args)
    finally:
        os.chdir(here)
    return seg


def run_segmentor(seg, image, out_size):
    """``run()``: the segmentor's data preprocessor and ``predict`` on the resized RGB photo ``image``;
    its data sample carries the ``img_path`` its ``forward_kv_expansion`` reads (a name only)."""
    import numpy as np

    bgr = np.ascontiguousarray(image[:, :, ::-1])  # mmseg's LoadImageFromFile gives BGR

    class Sample:
        def __init__(self):
            self.metainfo = dict(ori_shape=tuple(out_size), img_path="photo.png")

        def set_data(self, d):
            self.__dict__.update(d)

    def run():
        return seg.predict(seg.data_preprocessor(bgr), [Sample()])
    return run


@UPSTREAM.register("gla_clip")
class GLAUpstream(UpstreamEntry):
    """GLA_CLIPSegmentation of configs/cfg_voc21.py with predict.sh's flags (:func:`build_gla_segmentor`),
    in float32 with its fp16-rounded weights; its predict."""

    repo, commit, marker = "2btlFe/GLA-CLIP", "ba74915", "gla_clip_segmentor.py"
    config = "gla_clip_b16_voc21.yaml"
    upstream_config, class_file = "configs/cfg_voc21.py", "configs/cls_voc21.txt"
    # its segmentor loads its VFM with torch.hub.load('facebookresearch/dino:main', 'dino_vitb8')
    needs_dino, vfm = "the torch.hub VFM code its upstream loads", "dino_vitb8"

    @classmethod
    def project_opts(cls, path, workdir, drawn):
        return ["MODEL.SPARSECLIP.PROXY.WEIGHTS", cls.vfm_file(workdir) if drawn else "none"]

    @classmethod
    def build(cls, spec, image, path, kit):
        kit.random_dino(spec, cls.vfm)
        seg = build_gla_segmentor(path, cls.upstream_config, cls.class_file, spec["weights"], spec["templates"], kit,
                                  kit.upstream_config)
        kit.upstream_to_fp32(seg, seg.vfm)
        seg.iq_dotproduct.float()  # its text-feature buffer (upstream_to_fp32 casts query_features)
        return run_segmentor(seg, image, spec["out_size"])


def run_thresholds(config_threshold: float, spec: dict) -> list:
    """The probability thresholds of an agreement row, highest first: ``spec['thresholds']`` when given
    (both sides set to each: a threshold between random weights' top probabilities splits the pixels, so
    that the threshold stage acts), else the config's and 0, or 0 alone with ``spec['zero_only']``."""
    if spec.get("thresholds"):
        return sorted({float(t) for t in spec["thresholds"]}, reverse=True)
    return sorted({0.0} if spec.get("zero_only") else {float(config_threshold), 0.0}, reverse=True)


def agreement_worker(spec: dict, kit) -> None:
    """The upstream side of ``tools/agreement_gla_clip.py``, in its own process (upstream's vendored
    ``open_clip`` would shadow the project's).

    First :func:`build_gla_segmentor` as upstream builds it (fp16, one class name): its CLIP and DINO state dicts, as
    its loaders leave them (fp16-rounded), are saved in float32 to ``spec['clip_as_loaded']`` /
    ``spec['dino_as_loaded']`` (the project side loads those), and both models are cast to float32.
    Then, for each ``spec['runs']`` item (``name, upstream_config, class_file``), the segmentor is
    constructed again by its own ``__init__`` with ``Tensor.half`` answering float32 and its two
    loaders (``create_model``, ``torch.hub.load``) answering those float32 models (the same weights;
    so its text features are encoded in float32 too), and run on each resized photo
    (``spec['photos']``: ``{name: (npy file, [out_h, out_w])}``) at the thresholds of
    :func:`run_thresholds`; label
    maps and class probabilities go to ``<spec['out']>/<name>_<photo>_<thd>.npz``."""
    import importlib

    import numpy as np
    import torch

    path = spec["path"]
    sys.path.insert(0, path)
    os.chdir(path)
    kit.random_dino(spec, GLAUpstream.vfm)
    if int(spec.get("threads", 0)):
        torch.set_num_threads(int(spec["threads"]))
    one = os.path.join(spec["out"], "one_class.txt")  # the loaders' models are all this build is for
    with open(one, "w") as f:
        f.write("thing\n")
    templates = "project_single" if spec["templates"] == "single" else spec["templates"]
    seg = build_gla_segmentor(path, spec["runs"][0][1], one, spec["weights"], templates, kit,
                              kit.upstream_config)
    torch.save({k: v.float() for k, v in seg.clip.state_dict().items()}, spec["clip_as_loaded"])
    torch.save({k: v.float() for k, v in seg.vfm.state_dict().items()}, spec["dino_as_loaded"])
    clip, vfm = seg.clip.float(), seg.vfm.float()
    torch.Tensor.half = lambda self: self.float()  # kit.upstream_to_fp32's cast, for every construction below
    seg_module = importlib.import_module("gla_clip_segmentor")
    seg_module.create_model = lambda *a, **k: clip
    torch.hub.load = lambda *a, **k: vfm
    for run_name, upstream_config, class_file in spec["runs"]:
        seg = build_gla_segmentor(path, upstream_config, class_file, spec["weights"], templates, kit,
                                  kit.upstream_config)
        kit.upstream_to_fp32(seg, seg.vfm)
        for thd in run_thresholds(float(seg.prob_thd), spec):
            seg.prob_thd = thd
            for photo, (npy, out_size) in spec["photos"].items():
                result = run_segmentor(seg, np.load(npy), out_size)()[0]
                np.savez(os.path.join(spec["out"], f"{run_name}_{photo}_{thd:g}.npz"),
                         labels=result.pred_sem_seg.data[0].numpy(), probs=result.seg_logits.data.float().numpy())
                print("upstream", run_name, photo, thd, flush=True)
