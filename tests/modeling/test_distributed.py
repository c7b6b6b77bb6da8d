"""Every evaluator gives the same result with 1 and 2 processes.

detectron2 0.6's ``launch`` hard-codes NCCL, so the two CPU processes start their own gloo
group (``torch.distributed.init_process_group("gloo")``); everything else is detectron2's
machinery: ``build_detection_test_loader`` (its ``InferenceSampler`` splits the dataset
across ranks by ``comm.get_rank()``), ``inference_on_dataset`` and the evaluators'
``comm.gather`` / ``comm.all_gather``. Evaluators covered: the segmentation evaluator
(detectron2's ``SemSegEvaluator`` confusion matrix through the tiny random-weight model),
``AttentionStatsEvaluator`` (the tiny model's real last-block attention) and
``FGOVDEvaluator`` (planted scores, sharded like the InferenceSampler shards).
"""
import json
import os
from datetime import timedelta

import numpy as np
import pytest
import torch
from PIL import Image

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SEG = "reliability_dist_seg"
CLASSES = ["sky", "grass, lawn", "person"]
N_IMAGES = 5  # odd: the shards differ in size (3 + 2)


def make_dataset(folder):
    """N_IMAGES random images of varying size with label maps over 3 classes + ignore."""
    rng = np.random.default_rng(0)
    dicts = []
    for i in range(N_IMAGES):
        h, w = 48 + 8 * i, 64 - 4 * i
        img, gt = os.path.join(folder, f"img{i}.png"), os.path.join(folder, f"gt{i}.png")
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(img)
        lab = np.zeros((h, w), np.uint8)
        lab[:, w // 3:] = 1
        lab[h // 2:, : w // 2] = 2
        lab[:3] = 255
        Image.fromarray(lab).save(gt)
        dicts.append({"file_name": img, "sem_seg_file_name": gt, "image_id": i})
    return dicts


def fgovd_planted(index):
    """Planted FG-OVD output of image ``index``: a few boxes with scores over 1 + 3 captions;
    on odd images the first box has only 2 negatives (dropped with N = 3)."""
    g = torch.Generator().manual_seed(100 + index)
    n = 2 + index % 3
    scores = torch.rand(n, 4, generator=g)
    scores[0, 0] = scores[0].max()  # ties in some rows
    num_captions = torch.full((n,), 4)
    if index % 2:
        num_captions[0] = 3
        scores[0, 3] = float("nan")
    matched = torch.ones(n, dtype=torch.bool)
    if index == 3:
        matched[-1] = False
        scores[-1] = float("nan")
    inp = {"image_id": index}
    out = {"fgovd": {"scores": scores, "num_captions": num_captions, "matched": matched,
                     "ann_ids": torch.arange(n) + 10 * index}}
    return inp, out


def worker(rank, world_size, init_file, folder, out_file):
    import torch.distributed as dist

    torch.set_num_threads(1)
    if world_size > 1:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=300))
    try:
        from detectron2.config import get_cfg
        from detectron2.data import build_detection_test_loader
        from detectron2.data.samplers import InferenceSampler
        from detectron2.evaluation import DatasetEvaluators, inference_on_dataset
        from detectron2.modeling import build_model
        from detectron2.utils import comm

        import sparseclip_d2
        from sparseclip_d2.data import SparseCLIPTestMapper
        from sparseclip_d2.data.datasets import fgovd as _fgovd  # noqa: F401  (registers the splits)
        from sparseclip_d2.evaluation.attention_stats import AttentionStatsEvaluator
        from sparseclip_d2.evaluation.build import build_evaluator
        from sparseclip_d2.evaluation.fgovd_evaluation import FGOVDEvaluator

        assert comm.get_world_size() == world_size and comm.get_rank() == rank
        dicts = make_dataset(folder) if rank == 0 else None
        if world_size > 1:
            dist.barrier()
        dicts = make_dataset(folder) if dicts is None else dicts  # same files, written once
        from conftest import register_sem_seg

        register_sem_seg(SEG, dicts, CLASSES)

        cfg = get_cfg()
        sparseclip_d2.add_sparseclip_config(cfg)
        cfg.merge_from_file(os.path.join(ROOT, "configs", "Base-SparseCLIP.yaml"))
        cfg.merge_from_list([
            "MODEL.SPARSECLIP.CLIP.NAME", "sparseclip-tiny-vit", "MODEL.SPARSECLIP.CLIP.PRETRAINED", "none",
            "MODEL.SPARSECLIP.TEXT.CACHE_DIR", "off", "MODEL.DEVICE", "cpu", "INPUT.MIN_SIZE_TEST", "64",
            "MODEL.SPARSECLIP.ATTENTION.SOURCE", "qq", "MODEL.SPARSECLIP.ATTENTION.NORMALIZER", "entmax",
            "TEST.ATTENTION_STATS.ENABLED", "True",
        ])
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = build_model(cfg)

        loader = build_detection_test_loader(dicts, mapper=SparseCLIPTestMapper(cfg, SEG), num_workers=0)
        seen = [x["image_id"] for batch in loader for x in batch]
        evaluator = DatasetEvaluators([build_evaluator(cfg, SEG), AttentionStatsEvaluator(SEG, distributed=True)])
        seg = inference_on_dataset(model, loader, evaluator)

        fg = FGOVDEvaluator("sparseclip_fgovd_hard", num_negatives=3)
        fg.reset()
        for i in InferenceSampler(N_IMAGES):  # the shard of this rank
            inp, out = fgovd_planted(i)
            fg.process([inp], [out])
        fg_res = fg.evaluate()

        all_seen = comm.gather(seen, dst=0)
        if comm.is_main_process():
            with open(out_file, "w") as f:
                json.dump({"seg": seg, "fgovd": fg_res, "seen": all_seen}, f)
        else:
            assert seg == {} and not fg_res, (seg, fg_res)  # only the main process reports
        if world_size > 1:
            # no rank tears the group down while another still uses it (rank 1 destroying it
            # while rank 0 gathers ends rank 0 with SIGABRT)
            dist.barrier()
    finally:
        if world_size > 1:
            dist.destroy_process_group()


def _run(tmp_path, world_size):
    import torch.multiprocessing as mp

    folder = tmp_path / f"data{world_size}"
    folder.mkdir()
    out = str(tmp_path / f"res{world_size}.json")
    mp.spawn(worker, args=(world_size, str(tmp_path / f"init{world_size}"), str(folder), out),
             nprocs=world_size, join=True)
    with open(out) as f:
        return json.load(f)


def test_evaluators_identical_with_one_and_two_processes(tmp_path):
    one, two = _run(tmp_path, 1), _run(tmp_path, 2)
    assert one["seen"] == [list(range(N_IMAGES))]
    assert two["seen"] == [[0, 1, 2], [3, 4]]  # InferenceSampler's contiguous shards
    for key in ("sem_seg", "attention_stats"):
        assert key in one["seg"] and one["seg"][key] == two["seg"][key], key
    assert one["seg"]["attention_stats"]["attention_images"] == N_IMAGES
    assert one["fgovd"] == two["fgovd"]
    assert one["fgovd"]["fgovd"]["num_boxes"] == sum(2 + i % 3 for i in range(N_IMAGES)) - 2
    assert one["fgovd"]["fgovd"]["num_missed"] == 1 and one["fgovd"]["fgovd"]["num_dropped"] == 2
    miou = one["seg"]["sem_seg"]["mIoU"]
    assert miou == pytest.approx(two["seg"]["sem_seg"]["mIoU"], abs=0) and 0 <= miou <= 100
