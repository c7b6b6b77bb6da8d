"""LPOSS's entry in the upstream timing benchmark (``tools/benchmark_methods.py``): LPOSS
(vladan-stojnic/LPOSS at e489a74) built from ``configs/lposs.yaml`` and its sliding-window
inference, DINO ViT-B/16 from the ``--dino`` checkout, and the stand-ins of its GPU libraries and
mmcv / mmseg imports (:func:`lposs_standins`, :func:`lposs_gpu_standins`; docs/upstream_agreement.md,
"LPOSS")."""
import os
import sys

from ..registry import UPSTREAM, UpstreamEntry


#: project dataset -> its dataset config in segmentation/configs/_base_/datasets/ (configs/lposs.yaml evaluate:)
_DATASET_CONFIGS = {"voc21": "pascal_voc12", "voc20": "pascal_voc12_20", "context60": "pascal_context",
                    "context59": "pascal_context59", "coco_object": "coco", "coco_stuff": "stuff",
                    "cityscapes": "cityscapes", "ade20k": "ade20k"}


@UPSTREAM.register("lposs")
class LPOSSUpstream(UpstreamEntry):
    """LPOSS built from configs/lposs.yaml, or configs/lposs_plus.yaml (clip_backbone =
    configs/maskclip.yaml with decode_head.pretrained = the weights file), with the CLASSES and
    test_cfg of the row's dataset config, LPOSS_Infrencer(model, cfg, num_classes, test_cfg) and
    its slide_inference on the resized photo / 255 (ImageToTensorV2), as
    segmentation/evaluation/builder.py."""

    repo, commit, marker = "vladan-stojnic/LPOSS", "e489a74", "segmentation/evaluation/lposs_eval.py"
    # the upstream config of a row is its dataset config (segmentation/configs/_base_/datasets/, as
    # configs/lposs.yaml's evaluate: section names them: its dataset_type, test_pipeline, test_cfg);
    # the model config is configs/lposs.yaml, or configs/lposs_plus.yaml (setting model_config)
    config, upstream_config = "lposs_b16_voc21.yaml", "segmentation/configs/_base_/datasets/pascal_voc12.py"
    model_config = "configs/lposs.yaml"
    # segmentation/datasets/pascal_voc.py PascalVOCDataset.CLASSES (";" between synonyms)
    class_tuple = ("segmentation/datasets/pascal_voc.py", "PascalVOCDataset")
    # dataset_type of a dataset config -> the file whose class of that name holds its CLASSES: the
    # checkout's segmentation/datasets/ (its __init__ imports them), else its copy of mmseg's datasets
    class_files = {"PascalVOCDataset": "segmentation/datasets/pascal_voc.py",
                   "PascalVOCDataset20": "segmentation/datasets/pascal_voc20.py",
                   "PascalContextDataset": "segmentation/datasets/pascal_context.py",
                   "PascalContextDataset59": "segmentation/datasets/pascal_context.py",
                   "COCOObjectDataset": "segmentation/datasets/coco_object.py",
                   "COCOStuffDataset": "segmentation/datasets/coco_stuff.py",
                   "ADE20KDataset": "mmseg/datasets/ade.py", "CityscapesDataset": "mmseg/datasets/cityscapes.py"}
    configs = {f"{m}_b16_{d}.yaml": f"segmentation/configs/_base_/datasets/{f}.py"
               for m in ("lposs", "lposs_plus") for d, f in _DATASET_CONFIGS.items()}
    config_settings = {f"lposs_plus_b16_{d}.yaml": {"model_config": "configs/lposs_plus.yaml"} for d in _DATASET_CONFIGS}
    needs_dino, vfm = "the torch.hub VFM code its upstream loads", "dino_vitb16"

    @staticmethod
    def dataset_config(root, rel):
        """The names a dataset config file (mmcv 0.x style, ``dict(...)`` only) defines."""
        ns = {"dict": dict}
        exec(compile(open(os.path.join(root, rel)).read(), os.path.join(root, rel), "exec"), ns)
        return ns

    @classmethod
    def class_tuple_of(cls, root, upstream_config):
        dataset_type = cls.dataset_config(root, upstream_config)["dataset_type"]
        if dataset_type not in cls.class_files:
            raise SystemExit(f"{upstream_config}: dataset_type {dataset_type!r} has no class file; known: "
                             f"{', '.join(cls.class_files)}")
        return cls.class_files[dataset_type], dataset_type

    @classmethod
    def project_opts(cls, path, workdir, drawn):
        return ["MODEL.SPARSECLIP.LABEL_PROPAGATION.VFM.WEIGHTS", cls.vfm_file(workdir) if drawn else "none"]

    @classmethod
    def build(cls, spec, image, path, kit):
        import importlib.util

        import numpy as np
        import torch

        lposs_standins(path)
        knn = lposs_gpu_standins(kit)
        kit.random_dino(spec, cls.vfm)
        from omegaconf import OmegaConf
        workdir = os.path.dirname(spec["vfm_weights"])
        os.makedirs(os.path.join(workdir, "configs"), exist_ok=True)
        mc = OmegaConf.load(os.path.join(path, "configs", "maskclip.yaml"))
        mc.model.decode_head.pretrained = spec["weights"]
        OmegaConf.save(mc, os.path.join(workdir, "configs", "maskclip_bench.yaml"))
        up_cfg = OmegaConf.load(os.path.join(path, cls.settings_of(spec).get("model_config", cls.model_config)))
        up_cfg.model.clip_backbone = "maskclip_bench"
        os.chdir(workdir)  # LPOSS reads configs/{clip_backbone}.yaml from the working directory
        import models  # noqa: F401  (the checkout's models/)
        mcm = sys.modules["models.maskclip.maskclip"]
        mcm.imagenet_templates = kit.cut_templates(mcm.imagenet_templates, spec)
        from models.builder import build_model
        dset = cls.upstream_config_of(spec)
        classes = kit.dataset_classes(path, *cls.class_tuple_of(path, dset))
        lspec = importlib.util.spec_from_file_location("lposs_eval", os.path.join(path, "segmentation", "evaluation",
                                                                                  "lposs_eval.py"))
        le = importlib.util.module_from_spec(lspec)
        lspec.loader.exec_module(le)
        le.faiss.knn_gpu = knn  # after its `import faiss.contrib.torch_utils`, which installs a GPU-only knn_gpu
        lposs = build_model(up_cfg.model, class_names=classes).eval()

        class TestCfg(dict):  # mmcv's Config: its loop reads test_cfg['mode'] and test_cfg.stride
            __getattr__ = dict.__getitem__
        seg = le.LPOSS_Infrencer(lposs, up_cfg, num_classes=len(classes),
                                 test_cfg=TestCfg(cls.dataset_config(path, dset)["test_cfg"]))
        x01 = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1).float()[None] / 255.0
        metas = [dict(ori_shape=tuple(spec["out_size"]))]
        return lambda: seg.slide_inference(x01, metas, True).argmax(1)


def lposs_standins(path: str):
    """LPOSS's CUDA-only and mmcv / mmseg imports on the CPU (docs/upstream_agreement.md, "LPOSS"):
    ``cupy`` -> numpy, ``cupyx.scipy.sparse`` -> ``scipy.sparse``, its ``linalg.cg(A, b, tol, maxiter)``
    -> scipy's ``cg`` with ``rtol=tol`` (cupy stops at ``||r|| <= tol ||b||``), ``mmseg.ops.resize`` =
    the checkout's own ``mmseg/ops/wrappers.py``, ``mmseg.models.EncoderDecoder`` = ``nn.Module`` (its
    ``__init__`` only is called), ``mmcv.utils.Registry`` = ``register_module`` / ``build``."""
    import importlib.util
    import types

    import numpy as np
    import scipy.sparse
    import scipy.sparse.linalg
    import torch.nn as nn

    def module(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        sys.modules[name] = m
        return m

    def asarray(x):
        return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)

    module("cupy", asarray=asarray, array=np.array, zeros=np.zeros, sqrt=np.sqrt, isnan=np.isnan, isinf=np.isinf)

    def cg(A, b, x0=None, tol=1e-5, maxiter=None, M=None, callback=None, atol=None):
        return scipy.sparse.linalg.cg(A, b, x0=x0, rtol=tol, maxiter=maxiter, M=M, callback=callback,
                                      atol=0.0 if atol is None else atol)
    linalg = module("cupyx.scipy.sparse.linalg", cg=cg)
    sparse = module("cupyx.scipy.sparse", csr_matrix=scipy.sparse.csr_matrix, diags=scipy.sparse.diags,
                    eye=scipy.sparse.eye, coo_matrix=scipy.sparse.coo_matrix, linalg=linalg)
    module("cupyx.scipy", sparse=sparse)
    module("cupyx", scipy=sys.modules["cupyx.scipy"])

    class Registry:
        def __init__(self, name):
            self.name, self._m = name, {}

        def register_module(self, name=None, force=False, module=None):
            def deco(cls):
                self._m[name or cls.__name__] = cls
                return cls
            return deco

        def build(self, cfg, default_args=None):
            args = dict(cfg)
            typ = args.pop("type")
            for k, v in (default_args or {}).items():
                args.setdefault(k, v)
            return self._m[typ](**args)
    module("mmcv.utils", Registry=Registry)
    module("mmcv", utils=sys.modules["mmcv.utils"])
    wrappers = importlib.util.spec_from_file_location("_lposs_mmseg_wrappers", os.path.join(path, "mmseg", "ops", "wrappers.py"))
    wmod = importlib.util.module_from_spec(wrappers)
    wrappers.loader.exec_module(wmod)
    module("mmseg.ops", resize=wmod.resize)

    class EncoderDecoder(nn.Module):
        pass
    module("mmseg.models", EncoderDecoder=EncoderDecoder)
    module("mmseg", ops=sys.modules["mmseg.ops"], models=sys.modules["mmseg.models"])


def lposs_gpu_standins(kit):
    """faiss-gpu's ``StandardGpuResources`` (a no-op) and ``knn_gpu`` (faiss-cpu's exact ``faiss.knn``),
    ``Tensor.to('cuda')``, ``torch.as_tensor(..., device=)`` and ``Module.cuda`` on the CPU. Returns the
    ``knn_gpu`` stand-in (installed after LPOSS's own ``import faiss.contrib.torch_utils``)."""
    import faiss
    import numpy as np
    import torch

    class GpuResources:  # faiss-gpu's; faiss-cpu's exact knn below needs none
        def setDefaultNullStreamAllDevices(self):
            pass

        def setTempMemory(self, n):
            pass

    def knn(res, xq, xb, k, metric=faiss.METRIC_L2):  # knn_gpu: exact brute force, as faiss.knn
        D, I = faiss.knn(np.ascontiguousarray(xq.detach().cpu().numpy(), dtype=np.float32),
                         np.ascontiguousarray(xb.detach().cpu().numpy(), dtype=np.float32), int(k), metric=metric)
        return torch.from_numpy(D), torch.from_numpy(I)
    faiss.StandardGpuResources = GpuResources
    kit.tensor_cuda_standin()
    as_tensor = torch.as_tensor
    torch.as_tensor = lambda x, *a, device=None, **k: as_tensor(x, *a, **k)  # as_tensor(..., device="cuda")
    torch.nn.Module.cuda = lambda self, *a, **k: self
    return knn
