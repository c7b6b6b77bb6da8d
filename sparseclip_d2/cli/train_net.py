"""Evaluate sparseclip_d2 (training-free) on the datasets of a config.

    python tools/train_net.py --eval-only --config-file configs/entmax_qq_l14.yaml
    sparseclip-train-net --eval-only --config-file entmax_qq_l14       # installed: configs by name
    python tools/train_net.py --eval-only --config-file configs/fgovd/b16_qkv_entmax1.2.yaml
    python tools/train_net.py --eval-only --config-file configs/demo.yaml \
        MODEL.SPARSECLIP.CLIP.PRETRAINED none OUTPUT_DIR output/demo

For every dataset in DATASETS.TEST (as detectron2's plain_train_net ``do_test``): the test
loader and the evaluator its metadata ``evaluator_type`` selects
(``sparseclip_d2.data.build_test_loader``, ``sparseclip_d2.evaluation.build_evaluator``),
``inference_on_dataset``, detectron2's ``print_csv_format`` table; then the run-level
summaries (``finalize_summaries``, e.g. FG-OVD mHME) and ``OUTPUT_DIR/results.json``.
Every dataset (files, images, and every segmentation mask: mode, size, label range) is
checked before the model is built. The method has nothing
to train: without ``--eval-only`` the script exits with a message. ``--num-gpus N`` runs N
processes through detectron2's ``launch``; on machines without CUDA, ``--num-machines M``
(one process per machine, e.g. the tasks of a Slurm job) joins the M processes with gloo
(``sparseclip_d2.cli.launch``). ``--max-images N`` = ``TEST.MAX_IMAGES N``.

The terminal shows what the run was given (the keys that differ from the defaults, the
weights, the datasets, the method), progress and results; the environment and the full
config go to ``OUTPUT_DIR/config.yaml`` and to ``OUTPUT_DIR/log.txt`` (debug level).
``--verbose`` prints them on the terminal too.

Mistakes in the config, the data or the weights end the run with one ``error: ...`` line
and exit status 2 (``sparseclip_d2.common.errors``); Ctrl-C ends it with one line saying
how to resume; anything else (a bug) keeps its traceback. ``SPARSECLIP_TRACEBACK=1``
shows the traceback of the former too. Either way a failing run leaves
``OUTPUT_DIR/error.json`` (the original exception) and no ``results.json``.
"""
import contextlib
import glob
import logging
import os
import sys
import time
from collections import OrderedDict

import torch

from sparseclip_d2.common.errors import STAGE_ATTRIBUTE, explain, run_cli, unknown_name
from sparseclip_d2.common.logs import console_level, dropping_log_records, quiet_library_imports

with quiet_library_imports():
    from detectron2.config import get_cfg
    from detectron2.data import DatasetCatalog
    from detectron2.engine import default_argument_parser
    from detectron2.evaluation import DatasetEvaluators, inference_on_dataset, print_csv_format
    from detectron2.modeling import build_model
    from detectron2.utils import comm
    from detectron2.utils.collect_env import collect_env_info
    from detectron2.utils.env import seed_all_rng
    from detectron2.utils.file_io import PathManager
    from detectron2.utils.logger import setup_logger

from sparseclip_d2 import add_sparseclip_config
from sparseclip_d2.cli.launch import launch
from sparseclip_d2.user_config import merge_user_config, run_summary
from sparseclip_d2.data import build_test_loader, check_meta_architecture
from sparseclip_d2.data.datasets import DatasetNotFoundError
from sparseclip_d2.data.datasets.fgovd import FGOVDFormatError
from sparseclip_d2.data.ground_truth import check_ground_truth
from sparseclip_d2.evaluation import build_evaluator, build_results, dataset_summary, finalize_summaries, write_results
from sparseclip_d2.evaluation.results import RecordFailures, begin_results
from sparseclip_d2.evaluation.attention_stats import build_attention_stats_evaluator
from sparseclip_d2.evaluation.progress import RunProgress
from sparseclip_d2.evaluation.checkpoint import evaluate_resumable, remove_checkpoint
from sparseclip_d2.common.outputs import OutputFolder, OutputFolderError
from sparseclip_d2.data.image_io import BadInputFile
from sparseclip_d2.modeling import SparseCLIP, resolve_device

logger = logging.getLogger("sparseclip_d2.train_net")

TRAINING_FREE = (
    "sparseclip_d2 is training-free: there is nothing to train. Run with --eval-only, e.g.\n"
    "  python tools/train_net.py --eval-only --config-file configs/entmax_qq_l14.yaml"
)

# Exceptions that mean a mistake in what the user gave, per stage of the run.
CONFIG_ERRORS = (KeyError, ValueError, AssertionError, OSError)  # yacs/detectron2 merge use all four
DATA_ERRORS = (KeyError, ValueError, OSError)  # DatasetNotFoundError is an OSError
MODEL_ERRORS = (ValueError, OSError, RuntimeError)  # bad values; weights that cannot be loaded
INFERENCE_ERRORS = (DatasetNotFoundError, FGOVDFormatError, BadInputFile)
# The lock of OUTPUT_DIR, held for the whole run by the main process (released when it ends).
_OUTPUT_FOLDER = None


_STAGE = STAGE_ATTRIBUTE  # attribute naming the stage of a user mistake (common/errors.py reads it)


@contextlib.contextmanager
def user_errors(what: str, types):
    """Mark an exception of ``types`` raised inside as a user mistake of stage ``what``
    (``user_mistake(e)`` then gives ``"<what>: <message>"``); it propagates unchanged."""
    try:
        yield
    except types as e:
        if getattr(e, _STAGE, None) is None:
            setattr(e, _STAGE, what)
        raise


def user_mistake(e: BaseException):
    """``"<stage>: <message on one line>"`` for an exception marked by :func:`user_errors`,
    else None (a bug): :func:`sparseclip_d2.common.errors.explain` in its strict form."""
    return explain(e, strict=True)


def setup(args):
    """Config from defaults + ``add_sparseclip_config`` + file + command-line overrides;
    ``MODEL.DEVICE`` resolved here, once (CPU when no GPU)."""
    with user_errors("config", CONFIG_ERRORS):
        cfg = get_cfg()
        add_sparseclip_config(cfg)
        # ints accepted for float keys; config names too; unknown keys name the closest ones
        merge_user_config(cfg, args.config_file, args.opts, opts_name="the command-line overrides")
        if getattr(args, "max_images", None) is not None:
            if args.max_images < 0:
                raise ValueError(f"--max-images must be >= 0 (0 = all images), got {args.max_images}")
            cfg.TEST.MAX_IMAGES = args.max_images
    lock_output_dir(cfg)  # before log.txt, config.yaml or results.json is touched
    with user_errors("config", CONFIG_ERRORS):
        # the package's logger first, so that resolve_device's notice reaches log.txt
        setup_logger(output=cfg.OUTPUT_DIR, distributed_rank=comm.get_rank(), name="sparseclip_d2")
        quiet_terminal(args)
        cfg.MODEL.DEVICE = resolve_device(cfg.MODEL.DEVICE)
        cfg.freeze()
    setup_run(cfg, args)
    return cfg


def lock_output_dir(cfg):
    """Take the lock of ``OUTPUT_DIR`` (main process) before anything is written there: a
    second run on the same folder stops with one error line instead of interleaving its
    log and overwriting results.json (``sparseclip_d2.common.outputs``)."""
    global _OUTPUT_FOLDER
    if cfg.OUTPUT_DIR and comm.is_main_process():
        if _OUTPUT_FOLDER is not None:  # an earlier run in this process (main() called again)
            if _OUTPUT_FOLDER.path == os.path.abspath(cfg.OUTPUT_DIR):
                return
            _OUTPUT_FOLDER.release()
            _OUTPUT_FOLDER = None
        with user_errors("output", (OutputFolderError,)):
            _OUTPUT_FOLDER = OutputFolder(cfg.OUTPUT_DIR, "train_net.py", option="OUTPUT_DIR").acquire()


def setup_run(cfg, args):
    """What detectron2's ``default_setup`` does for an evaluation, in plain text: the output
    folder, the loggers (fvcore, detectron2, sparseclip_d2; ``OUTPUT_DIR/log.txt``), rank,
    environment, arguments and the merged config in the log, ``OUTPUT_DIR/config.yaml``.

    Unlike ``default_setup`` it writes no terminal colour codes into ``log.txt`` (the config
    is logged uncoloured) and seeds the RNGs only when ``SEED >= 0``: evaluation draws no
    random numbers, and random-weight models are seeded where they are built (:func:`main`).
    """
    rank = comm.get_rank()
    if comm.is_main_process() and cfg.OUTPUT_DIR:
        PathManager.mkdirs(cfg.OUTPUT_DIR)
    setup_logger(cfg.OUTPUT_DIR, distributed_rank=rank, name="fvcore")
    d2_logger = setup_logger(cfg.OUTPUT_DIR, distributed_rank=rank)
    quiet_terminal(args)
    d2_logger.debug("Rank of current process: %d. World size: %d", rank, comm.get_world_size())
    # collect_env_info imports torch.utils.cpp_extension, which logs "No CUDA runtime is
    # found" on machines without CUDA: the environment table below says so already.
    with dropping_log_records("torch.utils.cpp_extension", "No CUDA runtime is found"):
        env_info = collect_env_info()
    d2_logger.debug("Environment info:\n%s", env_info)
    d2_logger.debug("Command line arguments: %s", args)
    for line in run_summary(cfg, args.config_file):
        logger.info("%s", line)
    if comm.is_main_process() and cfg.OUTPUT_DIR:
        path = os.path.join(cfg.OUTPUT_DIR, "config.yaml")
        d2_logger.debug("Running with full config:\n%s", cfg.dump())
        with PathManager.open(path, "w") as f:
            f.write(cfg.dump())
        logger.info("full config: %s%s", path, "" if getattr(args, "verbose", False) else
                    " (and the environment: log.txt, or --verbose)")
    if cfg.SEED >= 0:
        seed_all_rng(cfg.SEED + rank)


def quiet_terminal(args) -> None:
    """The terminal shows INFO and above of the run's loggers, ``--verbose`` DEBUG too (the
    environment, the arguments, the full config); ``log.txt`` always gets DEBUG."""
    console_level(("detectron2", "fvcore", "sparseclip_d2"),
                  logging.DEBUG if getattr(args, "verbose", False) else logging.INFO)


def unknown_dataset(name: str) -> str:
    """The message of a ``DATASETS.TEST`` name that is not registered: the closest names,
    this package's datasets first, then how many detectron2 builtins there are."""
    registered = sorted(DatasetCatalog.list())
    ours = [d for d in registered if d.startswith("sparseclip_")]
    from sparseclip_d2.data.datasets.mess_benchmark import MESS_REQUIREMENT, mess_available

    fix = "docs/datasets.md lists them and where their files go"
    if not mess_available():
        fix += f" (MESS's 22 datasets need its package, the mess extra: pip install {MESS_REQUIREMENT!r})"
    return unknown_name("dataset", name, registered, ours=ours, ours_label="sparseclip_d2's",
                        where=" in DATASETS.TEST", others="detectron2 builtins", fix=fix)


def check_datasets(cfg, skip_bad=False):
    """Load every test dataset's dicts (their loaders check files and images), check every
    ground-truth mask and that the META_ARCH consumes its inputs, all before the model is
    built. Returns ``({name: dicts}, {name: skipped})``: with ``skip_bad`` the records whose
    mask or image is unusable are left out and listed in ``skipped``."""
    with user_errors("data", DATA_ERRORS):
        if not cfg.DATASETS.TEST:
            raise ValueError("DATASETS.TEST is empty: name at least one registered dataset")
        out, skipped = OrderedDict(), {}
        for name in cfg.DATASETS.TEST:
            if name not in DatasetCatalog.list():
                raise KeyError(unknown_dataset(name))
            dicts = DatasetCatalog.get(name)
            if cfg.TEST.MAX_IMAGES > 0:
                dicts = dicts[: cfg.TEST.MAX_IMAGES]
            gt = check_ground_truth(name, dicts, cache_dir=cfg.OUTPUT_DIR or None,  # every mask, before inference
                                    skip_bad=skip_bad)
            bad = {id(s["record"]) for s in gt.get("skipped", [])}
            skipped[name] = [{"file": s["file"], "error": s["error"]} for s in gt.get("skipped", [])]
            out[name] = [d for d in dicts if id(d) not in bad]
        check_meta_architecture(cfg.MODEL.META_ARCHITECTURE, list(out))
        if cfg.MODEL.WEIGHTS:
            raise ValueError(
                f"MODEL.WEIGHTS={cfg.MODEL.WEIGHTS!r} is not used by this training-free method; set the CLIP "
                "weights with MODEL.SPARSECLIP.CLIP.PRETRAINED (an open_clip tag, a local file, or none)"
            )
    return out, skipped


def checkpoint_folder(cfg, name):
    """Where a dataset's per-image checkpoint lives (None: not used)."""
    if not cfg.OUTPUT_DIR:
        return None
    return os.path.join(cfg.OUTPUT_DIR, "inference", name, "checkpoint")


def do_test(cfg, model, datasets, *, skip_bad=False, resume=True, pre_skipped=None):
    """One loader and evaluator per dataset, ``inference_on_dataset`` (with per-image
    checkpoints and ``--skip-bad``: ``sparseclip_d2.evaluation.checkpoint``),
    ``print_csv_format``.

    Returns:
        ``(results, summaries)``: the evaluators' dicts and the results.json entries.
    """
    results, summaries = OrderedDict(), OrderedDict()
    # OUTPUT_DIR/progress.json: images done and ETA, read by tools/sweep.py
    progress = RunProgress(cfg.OUTPUT_DIR, {name: len(d) for name, d in datasets.items()},
                           world_size=comm.get_world_size(), is_main=comm.is_main_process())
    single = comm.get_world_size() == 1
    if not single:
        logger.info("per-image checkpoints are off with %d processes (a rerun starts from image 0)",
                    comm.get_world_size())
    for name, dicts in datasets.items():
        if cfg.TEST.MAX_IMAGES > 0:
            logger.warning("PARTIAL RUN: %s evaluated on its first %d images only (TEST.MAX_IMAGES)", name, len(dicts))
        evaluator = build_evaluator(cfg, name, os.path.join(cfg.OUTPUT_DIR, "inference", name))
        extras = evaluator.results_extras() if hasattr(evaluator, "results_extras") else {}
        attention_evaluator = build_attention_stats_evaluator(cfg, name)  # None unless enabled
        evaluator = DatasetEvaluators([e for e in (evaluator, attention_evaluator) if e is not None]
                                      + [progress.evaluator(name)])
        folder = checkpoint_folder(cfg, name) if single else None
        if folder is not None and not resume:
            remove_checkpoint(folder)
        start = time.perf_counter()
        res, info = evaluate_resumable(model, cfg, name, dicts, evaluator,
                                       lambda remaining: build_test_loader(cfg, name, remaining),
                                       folder=folder, skip_bad=skip_bad)
        seconds = time.perf_counter() - start
        results[name] = res
        if comm.is_main_process():
            logger.info("Evaluation results for %s in csv format:", name)
            print_csv_format(res)
            extras = dict(extras)
            pre = list((pre_skipped or {}).get(name, []))  # left out by the ground-truth check
            skipped = pre + list(info["skipped"])
            if skip_bad:
                extras["skipped"] = skipped
                if pre:  # the count over the whole dataset (evaluate_resumable saw only the rest)
                    logger.warning("%s: skipped %d of %d images (--skip-bad): %s", name, len(skipped),
                                   len(dicts) + len(pre), ", ".join(s["file"] for s in skipped))
            if info["resumed_images"]:
                extras["resumed_images"] = info["resumed_images"]
            evaluated = len(dicts) - len(info["skipped"])
            summaries[name] = dataset_summary(res, evaluated, seconds / max(info["evaluated_now"], 1), extras)
    if comm.is_main_process():
        summaries = finalize_summaries(summaries)
    return results, summaries


def main(args):
    """The evaluation (``--eval-only`` is checked by the caller, once)."""
    cfg = setup(args)
    begin_results(cfg.OUTPUT_DIR)  # no results.json of an earlier run survives this one
    datasets, pre_skipped = check_datasets(cfg, skip_bad=getattr(args, "skip_bad", False))
    # Random-weight (PRETRAINED none) models are drawn from a fixed seed (SEED, or 0 when
    # SEED < 0): identical in every run and on every rank. setup_run seeds SEED + rank.
    # The builder logs the one "RANDOM WEIGHTS" warning of the run.
    with user_errors("model", MODEL_ERRORS), torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.SEED if cfg.SEED >= 0 else 0)
        model = build_model(cfg)
    random_weights = bool(model.random_weights)  # both META_ARCHs (SparseCLIP, SparseCLIPFGOVD) record it
    if isinstance(model, SparseCLIP):  # the segmentation META_ARCH describes its parts (FG-OVD scores boxes)
        logger.info("method: %s: %s", cfg.MODEL.SPARSECLIP.CLIP.NAME, model.describe())
    with user_errors("data", INFERENCE_ERRORS):
        results, summaries = do_test(cfg, model, datasets, skip_bad=getattr(args, "skip_bad", False),
                                      resume=not getattr(args, "restart", False), pre_skipped=pre_skipped)
    if comm.is_main_process():
        path = write_results(build_results(summaries, cfg, random_weights=random_weights), cfg.OUTPUT_DIR)
        logger.info("wrote %s", path)
        # finished: results.json holds them; under a sweep's runner, which sets
        # SPARSECLIP_KEEP_CHECKPOINT (sweeps/runner.py), they go once its record is written
        if os.environ.get("SPARSECLIP_KEEP_CHECKPOINT") != "1":
            for name in datasets:
                remove_checkpoint(checkpoint_folder(cfg, name))
        note = "  (RANDOM WEIGHTS: a smoke test, random_weights: true)" if random_weights else ""
        print(f"results.json: {os.path.abspath(path)}{note}")
    return results


def resume_hint(args) -> str:
    """What Ctrl-C prints: whether images are kept in per-image checkpoints and how to resume."""
    out = _OUTPUT_FOLDER.path if _OUTPUT_FOLDER is not None else None
    # the per-image records of evaluation/checkpoint.py: NNNNNNNN.pt per finished image
    kept = len(glob.glob(os.path.join(out, "inference", "*", "checkpoint", "[0-9]*.pt"))) if out else 0
    if kept:
        return (f"{kept} evaluated image(s) are kept in {os.path.join(out, 'inference', '*', 'checkpoint')}; "
                "run the same command again to resume from there (--restart starts from image 0)")
    return "no image was finished yet; run the same command again to start over"


def run(args):
    """:func:`main` with failures recorded in ``error.json`` (``RecordFailures``), user
    mistakes turned into one ``error:`` line and exit status 2, and Ctrl-C into one line
    saying how to resume (``sparseclip_d2.common.errors.run_cli``)."""
    return run_cli("train_net.py", RecordFailures(main), args, strict=True, interrupted=lambda: resume_hint(args))


def build_parser():
    parser = default_argument_parser(epilog=__doc__)
    parser.add_argument("--max-images", type=int, default=None, metavar="N",
                        help="evaluate only the first N images of each dataset (sets TEST.MAX_IMAGES; "
                             "recorded in results.json)")
    parser.add_argument("--skip-bad", action="store_true",
                        help="skip images (or ground-truth files) that cannot be read, listing them in results.json "
                             "(\"skipped\") and the log; without it the first one stops the run, naming the file")
    parser.add_argument("--verbose", action="store_true",
                        help="also print the environment, the arguments and the full config (always in "
                             "OUTPUT_DIR/log.txt and OUTPUT_DIR/config.yaml)")
    parser.add_argument("--restart", action="store_true",
                        help="ignore the per-image checkpoint of an interrupted run in OUTPUT_DIR and start from "
                             "image 0 (by default a rerun with the same config, data and code resumes)")
    return parser


def cli_main(argv=None) -> None:
    """The ``sparseclip-train-net`` console script and ``tools/train_net.py``."""
    args = build_parser().parse_args(argv)
    if not args.eval_only:
        sys.exit(TRAINING_FREE)
    if args.num_gpus > 1 and args.num_gpus > torch.cuda.device_count():
        # detectron2's launch would fail 10-20 s later inside torch.multiprocessing, with a traceback
        print(f"train_net.py: error: --num-gpus {args.num_gpus} needs {args.num_gpus} GPUs on this machine; it has "
              f"{torch.cuda.device_count()}{' (CUDA is not available)' if not torch.cuda.is_available() else ''}: "
              "use --num-gpus 1 (one process, on the CPU when there is no GPU)", file=sys.stderr)
        sys.exit(2)
    if args.num_machines > 1 and not 0 <= args.machine_rank < args.num_machines:
        print(f"train_net.py: error: --machine-rank {args.machine_rank} is not in 0..{args.num_machines - 1} "
              f"(--num-machines {args.num_machines})", file=sys.stderr)
        sys.exit(2)
    launch(
        run,
        args.num_gpus,
        num_machines=args.num_machines,
        machine_rank=args.machine_rank,
        dist_url=args.dist_url,
        args=(args,),
    )


if __name__ == "__main__":
    cli_main()
