#!/usr/bin/env python
"""Run a sweep file: every combination of config values, one ``train_net.py --eval-only`` each.

    python tools/sweep.py configs/sweeps/alpha_depth.yaml
    python tools/sweep.py configs/sweeps/main_table.yaml --num-gpus 4 --compare-paper
    python tools/sweep.py configs/sweeps/alpha_depth.yaml --tables-only --compare-paper
    python tools/sweep.py configs/sweeps/alpha_depth.yaml --set pretrained=none --set max_images=2
    python tools/sweep.py configs/sweeps/main_table.yaml --launcher submitit --partition gpu --time 120
    python tools/sweep.py configs/sweeps/smoke.yaml --launcher submitit --submitit-executor local

Every run is validated first, as the run itself would check it (merged config,
AttentionSpec, depth, templates, datasets found); invalid runs are listed with their errors
and nothing runs (exit 2). ``--dry-run`` lists the runs (done / todo / INVALID, warnings for
settings that change nothing) and exits non-zero when any run is invalid.

Results: ``<out>/results.jsonl`` (one line per finished run, added as it finishes; a
re-started sweep skips runs whose key already has an ok line), ``<out>/results.csv``,
``<out>/results.md`` (the current sweep file's runs only, failed runs with their error), and
with ``--compare-paper`` ``<out>/compare_paper.{csv,md}`` (ours, the paper's number and row,
the difference, or why there is no paper row). ``<out>`` defaults to
``output/sweeps/<sweep name>``. Each run writes ``progress.json`` in its folder (images
done, ETA, exit state): the sweep prints one progress line per run and a sweep ETA from
those files. ``--rerun`` runs finished combinations again. TensorBoard:
``tensorboard --logdir <out>/runs``.

Launchers: ``--launcher local`` (default; ``--num-gpus N`` runs N at a time) or
``--launcher submitit --submitit-executor {slurm,local,debug}`` (default slurm), with the
cluster settings from the sweep file's ``launcher:`` mapping or the flags below. One sweep at a
time per output folder (a second one exits 2, naming the first); on Slurm a later call waits
for the runs' jobs that are still queued or running instead of submitting them again. The sweep
file format is documented in ``sparseclip_d2/sweeps/sweep_file.py``, running on a cluster in
``docs/sweeps.md``.
"""
import argparse
import logging
import os
import sys

import yaml

from sparseclip_d2.sweeps import (LaunchSettings, LocalLauncher, SubmititLauncher, SweepValidationError,
                                  default_hash_cache, load_sweep, read_jsonl, run_sweep, sweep_name)
from sparseclip_d2.sweeps.launchers import SUBMITIT_EXECUTORS, SubmissionError
from sparseclip_d2.sweeps.lock import OutputLockedError
from sparseclip_d2.analysis.tables import write_tables

logger = logging.getLogger("sparseclip_d2.sweep")


def parse_set(items, flag="--set"):
    """``["alpha=1.2", "datasets=[a, b]"]`` -> ``{"alpha": 1.2, "datasets": ["a", "b"]}`` (YAML values)."""
    out = {}
    for item in items or []:
        if "=" not in item:
            raise SystemExit(f"{flag} {item!r}: expected KEY=VALUE (e.g. --set pretrained=none)")
        k, v = item.split("=", 1)
        out[k.strip()] = yaml.safe_load(v)
    return out


def build_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep_file", help="YAML sweep file (see configs/sweeps/)")
    p.add_argument("--output", default="", help="output folder (default output/sweeps/<sweep name>)")
    p.add_argument("--num-gpus", type=int, default=0,
                   help="run N combinations at a time, one per GPU (0/1 = sequential)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override applied to every run (alias or full config key); part of the run key")
    p.add_argument("--compare-paper", action="store_true",
                   help="also write compare_paper.{csv,md}: ours vs the paper's numbers")
    p.add_argument("--tables-only", action="store_true", help="only rewrite the tables from results.jsonl")
    p.add_argument("--dry-run", action="store_true",
                   help="validate and list the runs (and which are finished) and exit; non-zero exit when a run "
                        "is invalid")
    p.add_argument("--no-retry-failed", action="store_true", help="skip combinations that failed before")
    p.add_argument("--timeout", type=float, default=None, help="seconds per run before it is killed")
    p.add_argument("--train-net", default=None, help="evaluation script (default: tools/train_net.py)")
    p.add_argument("--rerun", action="store_true",
                   help="run every combination again, also the finished ones (their new records are added)")
    p.add_argument("--progress-interval", type=float, default=30.0, metavar="S",
                   help="seconds between two progress reports (default 30)")
    g = p.add_argument_group("launching (flags override the sweep file's launcher: mapping)")
    g.add_argument("--launcher", choices=("local", "submitit"), default="local",
                   help="local: this machine (default); submitit: submitit's executor (--submitit-executor)")
    g.add_argument("--submitit-executor", choices=SUBMITIT_EXECUTORS, default="slurm",
                   help="slurm (default): one Slurm job array; local: local submitit jobs; debug: in this process")
    g.add_argument("--partition", default=None, help="Slurm partition")
    g.add_argument("--time", default=None, help="time limit per run: minutes or [D-]H:MM:SS (required on Slurm)")
    g.add_argument("--gpus-per-run", type=int, default=None, help="GPUs per node of a run (default 1; >1 uses "
                   "detectron2's launch inside the job)")
    g.add_argument("--nodes", type=int, default=None, help="nodes per run (multi-node detectron2 launch)")
    g.add_argument("--tasks-per-node", type=int, default=None,
                   help="Slurm tasks per node of a run, each one train_net process (> 1: CPU runs, gloo; default 1)")
    g.add_argument("--cpus-per-run", type=int, default=None, help="CPUs per node of a run")
    g.add_argument("--mem-gb", type=float, default=None, help="memory per node of a run, GB")
    g.add_argument("--array-parallelism", type=int, default=None,
                   help="runs at a time (Slurm: the job array's %%N; local executor: jobs at a time, default 1)")
    g.add_argument("--slurm-option", action="append", default=[], metavar="KEY=VALUE",
                   help="extra #SBATCH option, e.g. --slurm-option account=myproj --slurm-option qos=high")
    g.add_argument("--signal-delay", type=int, default=None, metavar="S",
                   help="Slurm: seconds before the time limit at which the job is told to checkpoint and requeue "
                        "(submitit's default 90)")
    g.add_argument("--no-wait", action="store_true",
                   help="Slurm: submit and exit; the jobs write their records, a later call resumes")
    return p


def launch_settings(sweep, args):
    """The sweep file's launcher settings, overridden by the command line."""
    settings = LaunchSettings.from_mapping(sweep.launcher, f"sweep file {sweep.path!r} launcher")
    flags = {"partition": args.partition, "time": args.time, "gpus_per_run": args.gpus_per_run,
             "nodes": args.nodes, "tasks_per_node": args.tasks_per_node, "cpus_per_run": args.cpus_per_run, "mem_gb": args.mem_gb,
             "array_parallelism": args.array_parallelism, "signal_delay_s": args.signal_delay}
    for key, value in flags.items():
        settings.set(key, value, f"--{key.replace('_', '-')}")
    if args.slurm_option:
        settings.set("slurm_options", parse_set(args.slurm_option, "--slurm-option"), "--slurm-option")
    return settings


def check_num_gpus(num_gpus):
    """``--num-gpus`` checked as ``train_net`` checks it: N > 1 needs N GPUs here."""
    if num_gpus < 0:
        raise ValueError(f"--num-gpus {num_gpus}: expected 0 or more (0/1 = one run at a time)")
    if num_gpus > 1:
        import torch

        have = torch.cuda.device_count()
        if num_gpus > have:
            raise ValueError(f"--num-gpus {num_gpus} needs {num_gpus} GPUs on this machine; it has {have}"
                             f"{' (CUDA is not available)' if not torch.cuda.is_available() else ''}: use --num-gpus "
                             "0 (one run at a time, on the CPU when there is no GPU)")


def build_launcher(sweep, args, out):
    settings = launch_settings(sweep, args)
    if args.launcher == "local":
        if args.no_wait:
            raise ValueError("--no-wait needs --launcher submitit (Slurm)")
        check_num_gpus(args.num_gpus)
        return LocalLauncher(args.num_gpus, settings.gpus_per_run)
    if args.num_gpus:
        raise ValueError("--num-gpus is for --launcher local; with submitit, --gpus-per-run sets the GPUs of a run "
                         "and --array-parallelism the runs at a time")
    return SubmititLauncher(args.submitit_executor, os.path.join(out, "submitit"), settings,
                            sweep_name=sweep.name, wait=not args.no_wait)


def print_dry_run(sweep, jsonl, launcher):
    """List every run (done / todo / INVALID, its errors and warnings); exit status 2 when a
    run is invalid."""
    done = {r.get("run_key") for r in read_jsonl(jsonl) if r.get("status") == "ok"}
    for run in sweep.runs:
        state = "INVALID" if run.errors else "done" if run.key in done else "todo"
        opts = " ".join(f"{k} {v}" for k, v in run.opts)
        print(f"{state:7s}  {run.key}  {run.name}  ::  {opts}")
        for e in run.errors:
            print(f"         error: {e}")
        for w in run.warnings:
            print(f"         warning: {w}")
    invalid = len(sweep.invalid_runs)
    print(f"{len(sweep.runs)} runs, {sum(r.key in done for r in sweep.runs)} finished, {invalid} invalid; "
          f"base {sweep.base}")
    if isinstance(launcher, SubmititLauncher):
        print(f"launcher: {launcher.name} {launcher.parameters}")
    return 2 if invalid else 0


def fail(message):
    """One ``sweep.py: error:`` line on stderr; exit status 2."""
    print(f"sweep.py: error: {message}", file=sys.stderr)
    return 2


def check_sweep_file(path):
    """The sweep file exists, is readable YAML and not empty (else a one-line error)."""
    if not os.path.isfile(path):
        raise ValueError(f"sweep file {path!r} not found" + (" (it is a folder)" if os.path.isdir(path) else ""))
    try:
        with open(path) as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"sweep file {path!r} cannot be read: {e}") from None
    if not text.strip():
        raise ValueError(f"sweep file {path!r} is empty; it needs at least 'base: <config file>' (see configs/sweeps/)")
    try:
        yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"sweep file {path!r} is not valid YAML: {' '.join(str(e).split())}") from None


def check_output(out):
    """The output folder can be created and written (else a one-line error naming it)."""
    try:
        os.makedirs(out, exist_ok=True)
        probe = os.path.join(out, f".write_test.{os.getpid()}")
        with open(probe, "w") as f:
            f.write("")
        os.remove(probe)
    except OSError as e:
        raise ValueError(f"--output {out!r} cannot be written: {e.strerror or e}") from None


def main(argv=None):
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s %(name)s] %(message)s", datefmt="%H:%M:%S")
    try:
        if args.launcher == "local":
            check_num_gpus(args.num_gpus)
        check_sweep_file(args.sweep_file)
        out = args.output or os.path.join("output", "sweeps", sweep_name(args.sweep_file))
        check_output(out)
        sweep = load_sweep(args.sweep_file, extra=parse_set(args.set), hash_cache=default_hash_cache(out))
    except (ValueError, OSError) as e:  # the sweep file's mistakes (base missing, unknown keys, ...)
        return fail(e)
    jsonl = os.path.join(out, "results.jsonl")
    try:
        launcher = build_launcher(sweep, args, out)
    except ValueError as e:
        return fail(e)

    run_keys = [r.key for r in sweep.runs]

    def tables(_record=None):
        return write_tables(read_jsonl(jsonl), out, title=sweep.name, compare_paper=args.compare_paper,
                            run_keys=run_keys)

    if args.dry_run:
        return print_dry_run(sweep, jsonl, launcher)
    counts = None
    if not args.tables_only:
        try:
            counts = run_sweep(sweep, out, launcher=launcher, train_net=args.train_net,
                               retry_failed=not args.no_retry_failed, timeout=args.timeout, on_record=tables,
                               rerun=args.rerun, progress_interval=args.progress_interval)
        except SweepValidationError as e:
            print(str(e), file=sys.stderr)
            print("nothing was run; fix the sweep file (python tools/sweep.py --dry-run lists every run)",
                  file=sys.stderr)
            return 2
        except (OutputLockedError, SubmissionError) as e:
            return fail(e)
    paths = tables()
    stale = paths.pop("stale")
    for k, v in paths.items():
        print(f"{k}: {os.path.abspath(v)}")
    print(f"jsonl: {os.path.abspath(jsonl)}")
    if stale:
        print(f"stale: {stale} record(s) of {jsonl} are not runs of the current sweep file (other settings, "
              "data, code or versions); left out of the tables")
    if counts is not None and "submitted" in counts:
        adopted = f", {counts['adopted']} still queued or running from an earlier call (jobs " \
                  f"{', '.join(launcher.adopted)})" if counts.get("adopted") else ""
        print(f"runs: {counts['total']} total, {counts['skipped']} already finished, {counts['submitted']} submitted "
              f"({launcher.name} jobs {', '.join(launcher.job_ids) or 'none'}){adopted}; when they have finished, "
              "--tables-only writes the tables (the same command again waits for these jobs instead of submitting "
              "their runs again)")
        return 0
    if counts is not None:
        print(f"runs: {counts['total']} total, {counts['skipped']} already finished, {counts['ok']} ok, "
              f"{counts['failed']} failed")
        return 1 if counts["failed"] else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
