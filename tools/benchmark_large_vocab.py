#!/usr/bin/env python
"""Peak resident memory (RSS) and time of ``tools/train_net.py --eval-only`` on one planted
ADE20K-847 image (847 classes, 1281 synonyms), the whole evaluation path: dataset registration,
the ground-truth check, the model, 80-template class embeddings, sliding-window logits, the label
map in bands, the evaluator (mIoU, zero-IoU share, boundary IoU) and results.json.

Plants, in a temporary ``$DETECTRON2_DATASETS``, ``ADE20K_2021_17_01/images_detectron2/validation``
with one random ``--width x --height`` JPEG and ``annotations_detectron2/validation`` with its
uint16 TIFF labels (random 64 px blocks of the 847 classes and a band of 65535 = ignore), i.e.
the layout ``tools/prepare_datasets.py ade847`` writes. Weights are random (``PRETRAINED none``,
``PROXY.WEIGHTS none``, ``PROXY.TRIDENT.SAM_WEIGHTS none``): the numbers measure memory and time only.

The text embeddings come from the project's disk cache (``SPARSECLIP_TEXT_CACHE``, a temporary
folder): with ``--plant-text-cache`` (default) a first process builds the same model (the same
seeded random weights as train_net) and writes random unit embeddings under the cache file name
the run will look up, as an earlier run that encoded the 1281 x 80 prompts would have left it (on
a 2-core CPU the encoding itself takes hours); ``--no-plant-text-cache`` measures the encoding too.
train_net runs in a child process that reports its own peak RSS (``ru_maxrss``); the parent also
reads the child's ``VmHWM`` every 0.2 s, so a run that is killed still says how high it got::

    python tools/benchmark_large_vocab.py                      # ProxyCLIP's ADE-847 config
    python tools/benchmark_large_vocab.py --config-file configs/baselines/trident_b16_ade847.yaml

Prints one JSON line.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

DATASET = "sparseclip_ade847_val"
RANDOM = ["MODEL.SPARSECLIP.CLIP.PRETRAINED", "none", "MODEL.SPARSECLIP.PROXY.WEIGHTS", "none",
          "MODEL.SPARSECLIP.PROXY.TRIDENT.SAM_WEIGHTS", "none",  # Trident's SAM (unused by other configs)
          "MODEL.DEVICE", "cpu", "DATALOADER.NUM_WORKERS", "0"]


def plant_dataset(root: str, height: int, width: int, seed: int = 0) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    base = os.path.join(root, "ADE20K_2021_17_01")
    images = os.path.join(base, "images_detectron2", "validation")
    labels = os.path.join(base, "annotations_detectron2", "validation")
    os.makedirs(images)
    os.makedirs(labels)
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(
        os.path.join(images, "ADE_val_00000001.jpg"))
    blocks = rng.integers(0, 847, (height // 64 + 1, width // 64 + 1))
    lab = np.repeat(np.repeat(blocks, 64, 0), 64, 1)[:height, :width].astype(np.uint16)
    lab[:, :16] = 65535
    Image.fromarray(lab).save(os.path.join(labels, "ADE_val_00000001.tif"), format="TIFF")


def _cfg(config_file, opts):
    from detectron2.config import get_cfg

    from sparseclip_d2.config import add_sparseclip_config, merge_config

    cfg = get_cfg()
    add_sparseclip_config(cfg)
    return merge_config(cfg, config_file, list(opts))


def plant_text_cache(config_file: str, opts) -> dict:
    """Build the model as train_net does (its seeded random weights) and write random unit
    embeddings under the cache file name its text classifier looks up for the dataset's vocabulary."""
    import torch
    from detectron2.data import MetadataCatalog
    from detectron2.modeling import build_model

    import sparseclip_d2  # noqa: F401  (registers the datasets and parts)
    from sparseclip_d2.clip.text import split_synonyms

    cfg = _cfg(config_file, opts)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.SEED if cfg.SEED >= 0 else 0)  # tools/train_net.py main()
        model = build_model(cfg)
    classifier = model.text_classifier(None)
    vocabulary = list(MetadataCatalog.get(DATASET).stuff_classes)
    synonyms, _ = split_synonyms(vocabulary)
    path = classifier._disk_path(synonyms)
    dim = int(model.text_classifier_for(["x"])[0].shape[1])
    emb = torch.nn.functional.normalize(torch.randn(len(synonyms), dim), dim=-1)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save({"embeddings": emb, "synonyms": synonyms, "templates": classifier.templates}, path)
    return {"path": path, "synonyms": len(synonyms), "templates": len(classifier.templates)}


def _vm_hwm_mib(pid: int) -> float:
    """``VmHWM`` (peak resident set) of a running process, MiB; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def _child_train_net(rss_file: str, argv) -> None:
    """Run tools/train_net.py in this process; write this process's peak RSS (MiB) on exit."""
    import resource
    import runpy

    sys.argv = [os.path.join(ROOT, "tools", "train_net.py")] + list(argv)
    code = 0
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        with open(rss_file, "w") as f:
            f.write(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0))
    sys.exit(code)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config-file", default=os.path.join(ROOT, "configs", "baselines", "proxyclip_b16_ade847.yaml"))
    p.add_argument("--height", type=int, default=1536)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--plant-text-cache", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--limit-mib", type=float, default=3072.0, help="the bound the run is checked against")
    p.add_argument("--_plant", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("opts", nargs=argparse.REMAINDER, help="config overrides KEY VALUE ...")
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--_child"]:  # train_net's own arguments follow the RSS file
        _child_train_net(argv[1], argv[2:])
        return {}
    a = p.parse_args(argv)
    if a._plant:
        print(json.dumps(plant_text_cache(a.config_file, a.opts)))
        return {}
    with tempfile.TemporaryDirectory(prefix="sparseclip_bigvocab_") as tmp:
        root = os.path.join(tmp, "datasets")
        plant_dataset(root, a.height, a.width)
        env = dict(os.environ, DETECTRON2_DATASETS=root, SPARSECLIP_TEXT_CACHE=os.path.join(tmp, "text_cache"),
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        opts = RANDOM + ["DATASETS.TEST", f"('{DATASET}',)", "OUTPUT_DIR", os.path.join(tmp, "out")] + list(a.opts)
        planted = None
        if a.plant_text_cache:
            res = subprocess.run([sys.executable, __file__, "--_plant", "--config-file", a.config_file] + opts,
                                 env=env, capture_output=True, text=True)
            if res.returncode != 0:
                sys.exit(f"planting the text cache failed:\n{res.stderr[-3000:]}")
            planted = json.loads(res.stdout.strip().splitlines()[-1])
        rss_file = os.path.join(tmp, "rss")
        start = time.perf_counter()
        log_path = os.path.join(tmp, "child.log")
        with open(log_path, "w") as log:
            child = subprocess.Popen([sys.executable, __file__, "--_child", rss_file, "--eval-only", "--config-file",
                                      a.config_file] + opts, env=env, stdout=log, stderr=subprocess.STDOUT)
            hwm = 0.0
            while child.poll() is None:  # the kernel's high-water mark, also for a child that is killed
                hwm = max(hwm, _vm_hwm_mib(child.pid))
                time.sleep(0.2)
        wall = time.perf_counter() - start
        with open(log_path) as f:
            log = f.read()
        if child.returncode != 0:
            print(json.dumps({"config": os.path.relpath(a.config_file, ROOT), "failed": child.returncode,
                              "peak_rss_mib_seen": round(hwm, 1), "wall_s": round(wall, 1)}))
            sys.exit(f"train_net failed ({child.returncode}); its peak RSS (VmHWM) was at least {hwm:.0f} MiB:\n"
                     f"{log[-3000:]}")
        with open(rss_file) as f:
            peak = float(f.read())
        with open(os.path.join(tmp, "out", "results.json")) as f:
            results = json.load(f)
        entry = results[DATASET]
        out = {
            "config": os.path.relpath(a.config_file, ROOT), "image": f"{a.width}x{a.height}", "classes": 847,
            "text_cache": "planted" if planted else "encoded in the run",
            "synonyms": planted["synonyms"] if planted else None,
            "templates": planted["templates"] if planted else None,
            "peak_rss_mib": round(peak, 1), "under_limit": peak < a.limit_mib, "limit_mib": a.limit_mib,
            "train_net_wall_s": round(wall, 1), "seconds_per_image": entry.get("seconds_per_image"),
            "random_weights": results.get("random_weights"),
            "label_map_output": "sem_seg_labels" in log or None,
            "mIoU": entry.get("mIoU"), "zero_IoU_share": entry.get("zero_IoU_share"),
            "boundary_IoU": entry.get("boundary_IoU"), "boundary_width_max": entry.get("boundary_width_max"),
            "torch_threads": os.environ.get("OMP_NUM_THREADS"),
        }
        print(json.dumps(out))
        return out


if __name__ == "__main__":
    main()
