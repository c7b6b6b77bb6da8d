#!/usr/bin/env python
"""Evaluate sparseclip_d2 (training-free) on the datasets of a config.

    python tools/train_net.py --eval-only --config-file configs/entmax_qq_l14.yaml
    python tools/train_net.py --eval-only --config-file configs/demo.yaml \
        MODEL.SPARSECLIP.CLIP.PRETRAINED none OUTPUT_DIR output/demo

For every dataset in DATASETS.TEST: one evaluator (``build_evaluator``: detectron2's
SemSegEvaluator for segmentation, FG-OVD's own for FG-OVD), ``inference_on_dataset``,
detectron2's ``print_csv_format`` table; then ``OUTPUT_DIR/results.json``. The method has
nothing to train: without ``--eval-only`` the script exits with a message.
``--num-gpus N`` runs N processes through detectron2's ``launch`` (``--num-machines``,
``--machine-rank``, ``--dist-url`` for several machines; see docs/reliability.md).
``--max-images N`` evaluates the first N images of each dataset (= ``TEST.MAX_IMAGES N``;
recorded in results.json as ``max_images`` / ``partial``).
"""
import logging
import os
import sys
import time
from collections import OrderedDict

import torch

from detectron2.config import get_cfg
from detectron2.data import DatasetCatalog, build_detection_test_loader
from detectron2.engine import default_argument_parser, default_setup, launch
from detectron2.evaluation import DatasetEvaluators, inference_on_dataset, print_csv_format
from detectron2.modeling import build_model
from detectron2.utils import comm
from detectron2.utils.logger import setup_logger

from sparseclip_d2 import add_sparseclip_config
from sparseclip_d2.data import SparseCLIPTestMapper
from sparseclip_d2.data.fgovd_mapper import FGOVDDatasetMapper, attach_fgovd_proposals, is_fgovd_dataset
from sparseclip_d2.evaluation import add_mhme, build_evaluator, build_results, dataset_summary, write_results
from sparseclip_d2.evaluation.results import RecordFailures, begin_results
from sparseclip_d2.evaluation.attention_stats import build_attention_stats_evaluator
from sparseclip_d2.modeling import resolve_device

logger = logging.getLogger("sparseclip_d2.train_net")

TRAINING_FREE = (
    "sparseclip_d2 is training-free: there is nothing to train. Run with --eval-only, e.g.\n"
    "  python tools/train_net.py --eval-only --config-file configs/entmax_qq_l14.yaml"
)


def setup(args):
    """Config from defaults + ``add_sparseclip_config`` + file + command-line overrides."""
    cfg = get_cfg()
    add_sparseclip_config(cfg)
    cfg.merge_from_file(args.config_file)
    cfg.merge_from_list(args.opts)
    if getattr(args, "max_images", None) is not None:
        if args.max_images < 0:
            raise ValueError(f"--max-images must be >= 0 (0 = all images), got {args.max_images}")
        cfg.TEST.MAX_IMAGES = args.max_images
    cfg.MODEL.DEVICE = resolve_device(cfg.MODEL.DEVICE)
    cfg.freeze()
    default_setup(cfg, args)
    setup_logger(output=cfg.OUTPUT_DIR, distributed_rank=comm.get_rank(), name="sparseclip_d2")
    return cfg


def check_datasets(cfg):
    """Load every test dataset's dicts before building the model (a missing dataset fails
    fast with the expected path and the preparation command). Returns {name: dicts}."""
    if not cfg.DATASETS.TEST:
        raise ValueError("DATASETS.TEST is empty: name at least one registered dataset")
    out = OrderedDict()
    for name in cfg.DATASETS.TEST:
        if name not in DatasetCatalog.list():
            raise KeyError(f"dataset {name!r} is not registered; registered: {', '.join(sorted(DatasetCatalog.list()))}")
        dicts = DatasetCatalog.get(name)
        if cfg.TEST.MAX_IMAGES > 0:
            dicts = dicts[: cfg.TEST.MAX_IMAGES]
        out[name] = dicts
    return out


def do_test(cfg, model, datasets):
    """One evaluator per dataset, ``inference_on_dataset``, ``print_csv_format``.

    Returns:
        ``(results, summaries)``: the evaluators' dicts and the results.json entries.
    """
    results, summaries = OrderedDict(), OrderedDict()
    for name, dicts in datasets.items():
        if cfg.TEST.MAX_IMAGES > 0:
            logger.warning("PARTIAL RUN: %s evaluated on its first %d images only (TEST.MAX_IMAGES)", name, len(dicts))
        if is_fgovd_dataset(name):
            dicts = attach_fgovd_proposals(cfg, name, dicts)
            mapper = FGOVDDatasetMapper(cfg, name)
        else:
            mapper = SparseCLIPTestMapper(cfg, name)
        loader = build_detection_test_loader(dicts, mapper=mapper, num_workers=cfg.DATALOADER.NUM_WORKERS)
        evaluator = build_evaluator(cfg, name, os.path.join(cfg.OUTPUT_DIR, "inference", name))
        attention_evaluator = build_attention_stats_evaluator(cfg, name)  # None unless enabled
        if attention_evaluator is not None:
            evaluator = DatasetEvaluators([evaluator, attention_evaluator])
        start = time.perf_counter()
        res = inference_on_dataset(model, loader, evaluator)
        seconds = time.perf_counter() - start
        results[name] = res
        if comm.is_main_process():
            logger.info("Evaluation results for %s in csv format:", name)
            print_csv_format(res)
            summaries[name] = dataset_summary(res, len(dicts), seconds / max(len(dicts), 1))
    if comm.is_main_process():
        summaries = add_mhme(summaries)
        if "fgovd_mHME" in summaries:
            logger.info("FG-OVD mHME (mean top1 of Hard, Medium, Easy):")
            print_csv_format({"fgovd_mHME": summaries["fgovd_mHME"]})
    return results, summaries


def main(args):
    if not args.eval_only:
        raise SystemExit(TRAINING_FREE)
    cfg = setup(args)
    begin_results(cfg.OUTPUT_DIR)  # no results.json of an earlier run survives this one
    datasets = check_datasets(cfg)
    if cfg.MODEL.WEIGHTS:
        raise ValueError(
            f"MODEL.WEIGHTS={cfg.MODEL.WEIGHTS!r} is not used by this training-free method; set the CLIP "
            "weights with MODEL.SPARSECLIP.CLIP.PRETRAINED (an open_clip tag, a local file, or none)"
        )
    # Random-weight (PRETRAINED none) models are drawn from a fixed seed (SEED, or 0 when
    # SEED < 0): identical in every run and on every rank. default_setup seeds SEED + rank.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.SEED if cfg.SEED >= 0 else 0)
        model = build_model(cfg)
    random_weights = bool(getattr(model, "random_weights", False))
    if random_weights:
        logger.warning("RANDOM WEIGHTS (MODEL.SPARSECLIP.CLIP.PRETRAINED=%r): every number below is meaningless.",
                       cfg.MODEL.SPARSECLIP.CLIP.PRETRAINED)
    results, summaries = do_test(cfg, model, datasets)
    if comm.is_main_process():
        path = write_results(build_results(summaries, cfg, random_weights=random_weights), cfg.OUTPUT_DIR)
        if random_weights:
            logger.warning("RANDOM WEIGHTS: results in %s are a smoke test (random_weights: true).", path)
        logger.info("wrote %s", path)
        print(f"results.json: {os.path.abspath(path)}")
    return results


def build_parser():
    parser = default_argument_parser(epilog=__doc__)
    parser.add_argument("--max-images", type=int, default=None, metavar="N",
                        help="evaluate only the first N images of each dataset (sets TEST.MAX_IMAGES; "
                             "recorded in results.json)")
    return parser


if __name__ == "__main__":
    args = build_parser().parse_args()
    if not args.eval_only:
        sys.exit(TRAINING_FREE)
    launch(
        RecordFailures(main),  # an exception is written to OUTPUT_DIR/error.json
        args.num_gpus,
        num_machines=args.num_machines,
        machine_rank=args.machine_rank,
        dist_url=args.dist_url,
        args=(args,),
    )
