#!/usr/bin/env python
"""Figures of a sweep's JSON-lines file (PNG and PDF).

    python tools/plot.py heatmap    output/sweeps/alpha_depth/results.jsonl -o figs/alpha_depth
    python tools/plot.py gain       output/sweeps/main_table/results.jsonl -o figs/gain --alpha 1.2
    python tools/plot.py same-class output/sweeps/main_table/results.jsonl -o figs/same_class \
        --dataset voc21 --where backbone=B/16
    python tools/plot.py resolution output/sweeps/resolution/results.jsonl -o figs/resolution

Commands: ``heatmap`` (a metric over --y x --x, default alpha x num_layers, best cell
outlined), ``gain`` (entmax gain vs the softmax run's non-class attention mass, least-squares
line), ``same-class`` (same-class attention mass per source, softmax vs entmax), ``resolution``
(a metric vs resolution). ``--where KEY=VALUE`` (repeatable) keeps matching rows (columns of
results.csv, e.g. dataset=voc21, source=qkv, backbone=B/16, num_layers=2, param.alpha=1.2).
``--sweep FILE`` plots exactly the runs of that sweep file (as ``tools/sweep.py`` tabulates
them); without it, the latest record of each run name (older records of a name, from an
earlier version of the sweep, are left out with a note). Runs that differ in any setting
are separate series; partial runs (TEST.MAX_IMAGES) are marked.
"""
import argparse
import os
import sys

from sparseclip_d2.analysis import plots
from sparseclip_d2.common.errors import UserError, run_cli
from sparseclip_d2.analysis.sweep import read_jsonl
from sparseclip_d2.analysis.tables import flatten_records, select_records


def build_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["heatmap", "gain", "same-class", "resolution"])
    p.add_argument("jsonl", help="results.jsonl of tools/sweep.py")
    p.add_argument("-o", "--output", required=True, help="output path without extension (writes .png and .pdf)")
    p.add_argument("--metric", default=None, help="metric column (default: the dataset's headline metric)")
    p.add_argument("--dataset", default=None, help="dataset (short name, e.g. voc21; default: the first)")
    p.add_argument("--x", default=None, help="heatmap columns (default num_layers) / curve x (default resolution)")
    p.add_argument("--y", default="alpha", help="heatmap rows (default alpha)")
    p.add_argument("--alpha", type=float, default=1.2, help="entmax alpha compared with softmax (gain, same-class)")
    p.add_argument("--where", action="append", default=[], metavar="KEY=VALUE", help="keep matching rows only")
    p.add_argument("--sweep", default=None, help="plot exactly the runs of this sweep file (its run keys)")
    p.add_argument("--formats", default="png,pdf", help="comma-separated output formats")
    return p


def check_output(path: str) -> None:
    """Refuse an ``-o`` whose folder cannot be made or written, before any record is read."""
    folder = os.path.dirname(os.path.abspath(path)) or "."
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise UserError(f"-o {path!r}: cannot create the folder {folder!r} ({e.strerror or e}); choose a path "
                        "in a folder you can write to") from None
    if not os.access(folder, os.W_OK):
        raise UserError(f"-o {path!r}: the folder {folder!r} is not writable; choose a path in a folder you can "
                        "write to")


def main(argv=None):
    args = build_parser().parse_args(argv)
    check_output(args.output)
    where = {}
    for item in args.where:
        if "=" not in item:
            raise ValueError(f"--where {item!r}: expected KEY=VALUE")
        k, v = item.split("=", 1)
        where[k] = v
    if not os.path.isfile(args.jsonl):
        raise FileNotFoundError(f"{args.jsonl!r} does not exist (the results.jsonl of a tools/sweep.py run)")
    records = read_jsonl(args.jsonl)
    if args.sweep:
        from sparseclip_d2.analysis.sweep import load_sweep

        run_keys = [r.key for r in load_sweep(args.sweep).runs]
    else:
        latest = {}
        for r in select_records(records)[0]:
            latest[r.get("run_name")] = r.get("run_key")
        run_keys = list(latest.values())
    stale = len(select_records(records, run_keys)[1])
    if stale:
        print(f"note: {stale} record(s) of {args.jsonl} are not current runs and are not plotted", file=sys.stderr)
    rows = plots.filter_rows(flatten_records(records, run_keys=run_keys), where)
    if not rows:
        why = (f" ({stale} record(s) belong to other settings, data, code or versions than the runs of "
               f"{args.sweep}: rerun the sweep)" if args.sweep and stale else "")
        raise ValueError(f"no successful run in {args.jsonl} matches {where or 'anything'}{why}")
    if args.dataset and not plots.filter_rows(rows, {"dataset": args.dataset}):
        have = sorted({str(r.get("dataset")) for r in rows})
        raise ValueError(f"--dataset {args.dataset!r} is not in {args.jsonl}; datasets: {', '.join(have)}")
    if args.command == "heatmap":
        fig = plots.alpha_depth_heatmap(rows, metric=args.metric, dataset=args.dataset,
                                        x=args.x or "num_layers", y=args.y)
    elif args.command == "gain":
        if args.dataset:
            rows = plots.filter_rows(rows, {"dataset": args.dataset})
        fig = plots.gain_scatter(rows, metric=args.metric, alpha=args.alpha)
    elif args.command == "same-class":
        fig = plots.same_class_bars(rows, dataset=args.dataset, alpha=args.alpha)
    else:
        if args.dataset:
            rows = plots.filter_rows(rows, {"dataset": args.dataset})
        fig = plots.resolution_curves(rows, metric=args.metric, x=args.x or "resolution")
    for path in plots.save_figure(fig, args.output, formats=[f for f in args.formats.split(",") if f]):
        print(path)
    return 0


if __name__ == "__main__":
    # a typo in --metric / --dataset, a missing file, an unwritable -o: one error line (common/errors.py)
    sys.exit(run_cli("plot.py", main))
